"""ShareGPT loading: every record accounted for, damaged files recovered, roles normalised."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.data.sharegpt import (
    Conversation,
    LoadReport,
    Message,
    ShareGPTSourceError,
    hub_dataset_path,
    load_conversations,
    packaged_dataset_path,
)
from analysis.platform.errors import AnalysisError


def turn(role: str, text: str) -> dict:
    return {"from": role, "value": text}


def record(rid: object, *messages: dict) -> dict:
    return {"id": rid, "conversations": list(messages)}


def array_file(path: Path, records: list, ensure_ascii: bool = True) -> tuple[bytes, list[int]]:
    """Write records as the packaged file is laid out; return its bytes and each record's start."""
    parts = [b"[\n"]
    starts = []
    for i, rec in enumerate(records):
        if i:
            parts.append(b",\n")
        starts.append(sum(map(len, parts)))
        parts.append(json.dumps(rec, indent=2, ensure_ascii=ensure_ascii).encode("utf-8"))
    parts.append(b"\n]\n")
    data = b"".join(parts)
    path.write_bytes(data)
    return data, starts


def load_file(path: Path, **kwargs) -> tuple[list[Conversation], LoadReport]:
    conversations, report = load_conversations("file", path, progress=False, **kwargs)
    assert_accounted(report, conversations)
    return conversations, report


def assert_accounted(report: LoadReport, conversations: list[Conversation]) -> None:
    assert report.records_seen == report.conversations_kept + sum(report.dropped.values())
    assert report.conversations_kept == len(conversations)
    assert report.messages_kept == sum(len(c.messages) for c in conversations)
    assert len({c.id for c in conversations}) == len(conversations)
    for conversation in conversations:
        roles = [m.role for m in conversation.messages]
        assert roles and roles == [("user", "assistant")[i % 2] for i in range(len(roles))]
        assert all(m.text.strip() for m in conversation.messages)
        assert conversation.system is None or conversation.system.strip()


GOOD_RECORDS = [
    record("a_0", turn("human", "Hello"), turn("gpt", "Hi! How can I help?")),
    record(
        "b_0",
        turn("system", "Be brief."),
        turn("human", "Ünïcödé, 漢字 and emoji 😀"),
        turn("gpt", 'Quotes " and \\ backslashes\nand\ttabs'),
        turn("human", "Thanks"),
    ),
    {
        "id": "c_1",
        "score": -1.5e-3,
        "flag": True,
        "none": None,
        "conversations": [turn("gpt", "continued"), turn("human", "q"), turn("gpt", "a")],
    },
    record("d_0", turn("human", "one"), turn("human", "two"), turn("bard", "reply")),
    record("e_0", turn("user", "last"), turn("chatgpt", "done")),
]


# ----------------------------------------------------------------------------- roles and repairs


def test_roles_are_normalised_whatever_their_case(tmp_path: Path) -> None:
    path = tmp_path / "roles.json"
    roles = [
        "Human",
        "GPT",
        " user ",
        "ChatGPT",
        "HUMAN",
        "bing",
        "human",
        "Bard",
        "User",
        "assistant",
    ]
    array_file(path, [record("r", *(turn(r, f"text {i}") for i, r in enumerate(roles)))])
    (conversation,), report = load_file(path)
    assert [m.role for m in conversation.messages] == ["user", "assistant"] * 5
    assert [m.text for m in conversation.messages] == [f"text {i}" for i in range(10)]
    assert report.repairs == {}
    assert report.roles["Human"] == 1 and report.roles[" user "] == 1


def test_system_messages_become_the_system_prompt(tmp_path: Path) -> None:
    path = tmp_path / "system.json"
    records = [
        record("one", turn("system", "S1"), turn("human", "u"), turn("gpt", "a")),
        record("two", turn("SYSTEM", "S1"), turn("system", "S2"), turn("human", "u")),
        record("late", turn("human", "u"), turn("system", "S3"), turn("gpt", "a")),
    ]
    array_file(path, records)
    conversations, report = load_file(path)
    assert [c.system for c in conversations] == ["S1", "S1\n\nS2", "S3"]
    assert conversations[2].messages == (Message("user", "u"), Message("assistant", "a"))
    assert report.repairs == {"system_joined": 1, "system_moved_to_front": 1}
    assert report.conversations_repaired == 2

    strict, strict_report = load_file(path, repair=False)
    assert [c.id for c in strict] == ["one"]
    assert strict_report.dropped == {"several_system_messages": 1, "system_not_first": 1}


def test_repairs_keep_the_valid_part_and_count_each_change(tmp_path: Path) -> None:
    path = tmp_path / "repairs.json"
    records = [
        record("lead", turn("gpt", "orphan 1"), turn("gpt", "orphan 2"), turn("human", "q")),
        record("same", turn("human", "a"), turn("human", "b"), turn("gpt", "c"), turn("gpt", "d")),
        record("hole", turn("human", "q1"), turn("gpt", "  \n"), turn("human", "q2")),
        record(
            "odd", turn("human", "q"), turn("tool", "out"), {"value": "no role"}, turn("gpt", "a")
        ),
        {"conversations": [turn("human", "no id")]},
        record(7, turn("human", "numeric id")),
        record("dup", turn("human", "first")),
        record("dup", turn("human", "second")),
        record("dup#2", turn("human", "literal dup#2")),
        record("bad\udcff", turn("human", "bad byte \udcff and lone \ud800 escape")),
    ]
    array_file(path, records)
    conversations, report = load_file(path)
    by_id = {c.id: c for c in conversations}
    assert list(by_id) == [
        "lead", "same", "hole", "odd", "record-4", "7", "dup", "dup#2", "dup#2#2", "bad\ufffd"
    ]  # fmt: skip
    assert by_id["lead"].messages == (Message("user", "q"),)
    assert by_id["same"].messages == (Message("user", "a\n\nb"), Message("assistant", "c\n\nd"))
    assert by_id["hole"].messages == (Message("user", "q1\n\nq2"),)
    assert by_id["odd"].messages == (Message("user", "q"), Message("assistant", "a"))
    assert by_id["bad\ufffd"].messages[0].text == "bad byte \ufffd and lone \ufffd escape"
    assert report.repairs == {
        "duplicate_id_renamed": 2,
        "empty_message_dropped": 1,
        "invalid_unicode_replaced": 2,
        "leading_assistant_dropped": 2,
        "missing_id": 1,
        "same_role_merged": 3,
        "unknown_role_dropped": 2,
    }
    assert report.dropped == {}

    strict, strict_report = load_file(path, repair=False)
    assert [c.id for c in strict] == ["record-4", "7", "dup", "dup#2", "dup#2#2", "bad\ufffd"]
    assert strict_report.dropped == {
        "empty_message": 1,
        "leading_assistant": 1,
        "same_role_in_a_row": 1,
        "unknown_role": 1,
    }


def test_every_kind_of_bad_record_is_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    records = [
        42,
        "a string",
        [turn("human", "in a list")],
        {"id": "no conversations"},
        {"id": "null conversations", "conversations": None},
        {"id": "not a list", "conversations": "human: hi"},
        record("empty list"),
        record("message not an object", turn("human", "q"), "gpt: a"),
        record("null value", turn("human", None)),
        record("number value", turn("human", "q"), turn("gpt", 5)),
        record("no value", {"from": "human"}),
        record("blank texts", turn("human", ""), turn("gpt", " \n\t")),
        record("assistant only", turn("gpt", "a")),
        record("system only", turn("system", "s")),
        record("unknown only", turn("robot", "beep")),
        record("kept", turn("human", "q"), turn("gpt", "a")),
    ]
    array_file(path, records)
    conversations, report = load_file(path)
    assert [c.id for c in conversations] == ["kept"]
    assert report.records_seen == len(records)
    assert report.dropped == {
        "conversations_not_a_list": 1,
        "empty": 2,
        "malformed_message": 1,
        "missing_conversations": 2,
        "no_user_message": 2,
        "non_text_value": 3,
        "not_an_object": 3,
        "unknown_role": 1,
    }
    assert report.repairs == {} and not report.truncated and report.bytes_skipped == 0


def test_messages_key_and_openai_style_fields_are_read(tmp_path: Path) -> None:
    path = tmp_path / "openai.json"
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    array_file(path, [{"id": "m", "messages": messages}])
    (conversation,), _ = load_file(path)
    assert conversation.messages == (Message("user", "q"), Message("assistant", "a"))


# ----------------------------------------------------------------------------- damaged files


def expected_after_cut(full: list[Conversation], records: list, starts: list[int], cut: int):
    """The conversations of the records that end before byte `cut`, and the bytes of the rest."""
    ends = [
        start + len(json.dumps(r, indent=2).encode())
        for start, r in zip(starts, records, strict=True)
    ]
    complete = sum(end <= cut for end in ends)
    partial_start = starts[complete] if complete < len(starts) else None
    tail = cut - partial_start if partial_start is not None and cut > partial_start else 0
    ids = {r["id"] for r in records[:complete]}
    return [c for c in full if c.id in ids], tail


def test_a_file_cut_at_every_byte_keeps_every_complete_record(tmp_path: Path) -> None:
    data, starts = array_file(tmp_path / "full.json", GOOD_RECORDS)
    full, full_report = load_file(tmp_path / "full.json")
    assert len(full) == len(GOOD_RECORDS) and not full_report.truncated
    assert full_report.bytes_unparsed_tail == 0
    closing = data.rindex(b"]")
    cut_path = tmp_path / "cut.json"
    for cut in range(1, closing + 1):
        cut_path.write_bytes(data[:cut])
        expected, tail = expected_after_cut(full, GOOD_RECORDS, starts, cut)
        if not expected:  # cut inside the first record: nothing usable, a one-line error
            with pytest.raises(ShareGPTSourceError, match="0 records read"):
                load_file(cut_path)
            continue
        conversations, report = load_file(cut_path)
        assert conversations == expected, cut
        assert report.truncated, cut
        assert report.bytes_unparsed_tail == tail, cut
        assert report.records_seen == len(expected) and report.bytes_skipped == 0, cut


def test_a_raw_utf8_file_cut_inside_characters_is_recovered(tmp_path: Path) -> None:
    data, starts = array_file(tmp_path / "full.json", GOOD_RECORDS, ensure_ascii=False)
    full, _ = load_file(tmp_path / "full.json")
    cut_path = tmp_path / "cut.json"
    multibyte_cuts = [i for i in range(1, len(data)) if data[i] & 0xC0 == 0x80]
    assert multibyte_cuts
    for cut in multibyte_cuts:
        cut_path.write_bytes(data[:cut])
        if sum(s < cut for s in starts) == 1:  # inside the first record: nothing usable
            with pytest.raises(ShareGPTSourceError, match="no usable conversation"):
                load_file(cut_path)
            continue
        conversations, report = load_file(cut_path)
        assert report.truncated and report.bytes_unparsed_tail > 0
        assert conversations == full[: len(conversations)]
        assert len(conversations) == sum(s < cut for s in starts) - 1


def test_garbage_between_records_is_skipped_and_counted(tmp_path: Path) -> None:
    pieces = [json.dumps(r) for r in GOOD_RECORDS[:4]]
    garbage_1 = 'oops {"from": "human", "value": "orphan"} }'
    broken = pieces[1][:40] + "\x00 <<corrupt>> " + pieces[1][60:]  # a record damaged inside
    text = f"[{pieces[0]}, {garbage_1}, {broken},\n{pieces[2]}, {pieces[3]} , trailing junk ]\n"
    path = tmp_path / "garbage.json"
    path.write_text(text, encoding="utf-8")
    conversations, report = load_file(path)
    assert [c.id for c in conversations] == ["a_0", "c_1", "d_0"]
    assert report.dropped == {"malformed_json": 3}
    assert report.bytes_skipped == len(garbage_1) + len(broken) + len("trailing junk")
    assert not report.truncated and report.bytes_unparsed_tail == 0

    path.write_text(text.rstrip() + "\n[ more after the end", encoding="utf-8")
    _, after_end = load_file(path)
    assert after_end.dropped == {"malformed_json": 3} and not after_end.truncated


def test_invalid_utf8_bytes_inside_a_text_are_replaced_and_counted(tmp_path: Path) -> None:
    data, _ = array_file(tmp_path / "f.json", GOOD_RECORDS[:2])
    path = tmp_path / "bad_bytes.json"
    path.write_bytes(data.replace(b"Hello", b"He\xffl\xc3lo"))
    conversations, report = load_file(path)
    assert conversations[0].messages[0].text == "He\ufffdl\ufffdlo"
    assert report.repairs["invalid_unicode_replaced"] == 1 and report.bytes_read == len(data) + 2


def test_jsonl_lines_are_records_and_bad_lines_are_counted(tmp_path: Path) -> None:
    lines = [json.dumps(r, ensure_ascii=False) for r in GOOD_RECORDS]
    lines[1:1] = ["{not json", "", "[1, 2]", json.dumps(GOOD_RECORDS[0]) + " extra"]
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path = tmp_path / "conversations.jsonl"
    path.write_bytes(data)
    conversations, report = load_file(path)
    assert report.format == "jsonl"
    assert [c.id for c in conversations] == [r["id"] for r in GOOD_RECORDS]
    assert report.dropped == {"malformed_json": 2, "not_an_object": 1}
    assert not report.truncated

    last_line_start = data.rindex(b"\n", 0, len(data) - 1) + 1
    for cut in range(last_line_start + 1, len(data) - 1):
        path.write_bytes(data[:cut])
        cut_conversations, cut_report = load_file(path)
        assert cut_conversations == conversations[:-1], cut
        assert cut_report.truncated and cut_report.bytes_unparsed_tail == cut - last_line_start


def test_max_conversations_stops_early(tmp_path: Path) -> None:
    array_file(tmp_path / "f.json", [record("x", turn("gpt", "a"))] + GOOD_RECORDS)
    conversations, report = load_file(tmp_path / "f.json", max_conversations=2)
    assert [c.id for c in conversations] == ["a_0", "b_0"]
    assert report.stopped_at_limit and report.dropped == {"no_user_message": 1}
    everything, _ = load_file(tmp_path / "f.json", max_conversations=100)
    assert len(everything) == len(GOOD_RECORDS)


def test_report_table_and_summary(tmp_path: Path) -> None:
    array_file(tmp_path / "f.json", [*GOOD_RECORDS, record("empty")])
    conversations, report = load_file(tmp_path / "f.json")
    table = report.to_frame()
    assert list(table.columns) == ["outcome", "reason", "count"]
    counts = table.groupby("outcome")["count"].sum().to_dict()
    assert counts["kept"] + counts["dropped"] == report.records_seen == len(GOOD_RECORDS) + 1
    assert counts["repaired"] == sum(report.repairs.values()) > 0
    summary = report.summary()
    assert "\n" not in summary and f"kept {len(conversations)} of 6 records" in summary
    assert json.loads(json.dumps(report.to_dict()))["records_seen"] == 6


# ----------------------------------------------------------------------------- sources


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "not found"), (b"", "empty"), (b" \n", "empty"), (b"hello", "not JSON")],
)
def test_unreadable_files_give_one_line_errors(tmp_path: Path, content, message) -> None:
    path = tmp_path / "input.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ShareGPTSourceError, match=message) as caught:
        load_conversations("file", path, progress=False)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("records", "counts"),
    [
        ([], "0 records read, 0 dropped (none)"),
        (
            [record("a", turn("gpt", "only a reply")), record("b"), 7],
            "3 records read, 3 dropped (empty 1, no_user_message 1, not_an_object 1)",
        ),
    ],
)
def test_a_file_without_usable_conversation_is_a_one_line_error(tmp_path, records, counts):
    path = tmp_path / "nothing.json"
    path.write_text(json.dumps(records))
    with pytest.raises(ShareGPTSourceError) as caught:
        load_conversations("file", path, progress=False)
    message = str(caught.value)
    assert message.startswith(f"{path}: no usable conversation: {counts}")
    assert "\n" not in message
    assert load_conversations("file", path, max_conversations=0, progress=False)[0] == []


def test_bad_arguments_give_one_line_errors(tmp_path: Path) -> None:
    for source, path, message in [
        ("web", None, "unknown ShareGPT source"),
        ("file", None, "needs path"),
        ("package", tmp_path, "only used with source='file'"),
        ("file", tmp_path, "not a file"),
    ]:
        with pytest.raises(ShareGPTSourceError, match=message):
            load_conversations(source, path, progress=False)
    assert issubclass(ShareGPTSourceError, AnalysisError)  # the CLI prints it as one line


def test_hub_offline_fails_at_once_naming_the_offline_default(monkeypatch, tmp_path) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ShareGPTSourceError) as caught:
        load_conversations("hub", progress=False)
    text = str(caught.value)
    assert text.startswith("could not reach the Hugging Face hub")
    assert "source='package', the offline default" in text and "\n" not in text


def test_hub_without_network_fails_at_once(monkeypatch, tmp_path) -> None:
    from huggingface_hub import constants

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ALL_PROXY", raising=False)
    monkeypatch.delenv("all_proxy", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused
    with pytest.raises(ShareGPTSourceError, match="127.0.0.1:9.*offline default") as caught:
        hub_dataset_path(cache_dir=tmp_path, connect_timeout=2.0)
    assert "\n" not in str(caught.value)


def test_importing_the_module_stays_light() -> None:
    code = (
        "import sys, analysis.data.sharegpt; "
        "print(sorted(m for m in ('vllm', 'torch', 'pandas') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "vllm" not in result.stdout and "torch" not in result.stdout


# ----------------------------------------------------------------------------- the real data

USER_ROLES = {"human", "user"}


@pytest.fixture(scope="module")
def packaged() -> tuple[list[Conversation], LoadReport]:
    return load_conversations(progress=False)


@pytest.fixture(scope="module")
def plain_pass() -> dict:
    """The packaged file read without the loader: plain `json` over the records before the
    cut-off one (found by the file's own layout), and the counts computed from them directly."""
    from collections import Counter

    data = packaged_dataset_path().read_bytes()
    cut_record = data.rindex(b'\n  {\n    "id": ')  # the last record start: the truncated one
    records = json.loads(data[:cut_record].rstrip().rstrip(b",") + b"\n]")
    with pytest.raises(json.JSONDecodeError):  # the tail really is a cut-off record
        json.loads(data[cut_record:].strip())

    def text(m: dict) -> bool:
        return bool(str(m["value"]).strip())

    kept = [
        r for r in records if any(m["from"] in USER_ROLES and text(m) for m in r["conversations"])
    ]
    leading = merged = 0
    for r in kept:
        said = [m for m in r["conversations"] if m["from"] != "system" and text(m)]
        first_user = next(i for i, m in enumerate(said) if m["from"] in USER_ROLES)
        leading += first_user
        users = [m["from"] in USER_ROLES for m in said[first_user:]]
        merged += sum(a == b for a, b in zip(users, users[1:], strict=False))
    empty = sum(not r["conversations"] for r in records)
    return {
        "bytes": len(data),
        "tail": len(data) - data.index(b"{", cut_record),
        "records": len(records),
        "roles": dict(Counter(m["from"] for r in records for m in r["conversations"])),
        "dropped": {"empty": empty, "no_user_message": len(records) - empty - len(kept)},
        "kept": len(kept),
        "repairs": {
            "empty_message_dropped": sum(not text(m) for r in kept for m in r["conversations"]),
            "leading_assistant_dropped": leading,
            "same_role_merged": merged,
        },
        "with_system": sum(any(m["from"] == "system" for m in r["conversations"]) for r in kept),
        "first_id": kept[0]["id"],
    }


def test_packaged_file_end_to_end(packaged, plain_pass) -> None:
    conversations, report = packaged
    assert_accounted(report, conversations)
    assert report.path == str(packaged_dataset_path())
    assert report.bytes_read == plain_pass["bytes"]
    assert report.truncated and report.bytes_unparsed_tail == plain_pass["tail"]
    assert report.records_seen == plain_pass["records"]
    assert report.roles == plain_pass["roles"]
    assert report.dropped == plain_pass["dropped"]
    assert report.conversations_kept == plain_pass["kept"]
    assert report.repairs == plain_pass["repairs"]
    assert sum(c.system is not None for c in conversations) == plain_pass["with_system"]
    assert conversations[0].id == plain_pass["first_id"]


def test_packaged_file_matches_the_documented_facts(plain_pass) -> None:
    """The facts file's numbers (shared/facts/data.md), from the plain pass, not the loader."""
    assert plain_pass["bytes"] == 125_509_632 and plain_pass["records"] == 17_671
    assert plain_pass["roles"]["human"] == 61_420 and plain_pass["roles"]["gpt"] == 67_594


def test_packaged_file_without_repairs(packaged) -> None:
    conversations, report = load_conversations(progress=False, repair=False)
    assert_accounted(report, conversations)
    assert report.records_seen == 17_671 and report.repairs == {}
    kept_ids = {c.id for c in conversations}
    repaired = {c.id for c in packaged[0]} - kept_ids
    assert len(repaired) == report.records_dropped - packaged[1].records_dropped
    assert set(conversations) <= set(packaged[0])
