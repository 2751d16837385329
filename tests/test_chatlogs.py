"""Conversations rebuilt from OpenAI chat-completions request logs (and hub chat data sets):
cumulative requests become turns, every bad line or message is counted, and the trace command
builds both traces from a log as it does from ShareGPT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis import cli
from analysis.data.chatlogs import (
    ChatLogError,
    conversations_from_dataset,
    load_chat_log,
    load_hf_conversations,
)
from analysis.data.sharegpt import Conversation, Message, load_conversations
from analysis.data.tokenizer import load_tokenizer
from analysis.data.traces import TraceOptions, build_traces, load_manifest, load_trace

EOT_ID = 128_009

# one conversation, as ShareGPT stores it and as a chat client sends it turn by turn
SYSTEM = "You are terse."
TURNS = [
    ("What is a KV cache?", "Saved keys and values of earlier tokens."),
    ("Why share it between requests?", "A shared prefix is computed once."),
    ("And when it is full?", "Blocks are evicted, least recently used first."),
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def chat(turns: list[tuple[str, str]], upto: int, system: str | None = SYSTEM) -> list[dict]:
    """The messages a client sends for turn `upto` (0-based): all earlier turns, then the user's."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    for user, assistant in turns[:upto]:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return [*messages, {"role": "user", "content": turns[upto][0]}]


def write_log(path: Path, lines: list) -> Path:
    """A JSONL log: dicts are dumped, strings and bytes written as they are."""
    with open(path, "wb") as handle:
        for line in lines:
            if isinstance(line, bytes):
                handle.write(line + b"\n")
            elif isinstance(line, str):
                handle.write(line.encode() + b"\n")
            else:
                handle.write(json.dumps(line).encode() + b"\n")
    return path


def cumulative_log(path: Path, key: str | None = "c1", reply: bool = True) -> Path:
    """The conversation logged as 3 requests, each repeating the whole history; the last line
    carries its response as vLLM's and many gateways' logs do."""
    lines = []
    for turn in range(len(TURNS)):
        line: dict = {"messages": chat(TURNS, turn), "timestamp": 100.0 + turn}
        if key is not None:
            line["conversation_id"] = key
        lines.append(line)
    if reply:
        lines[-1]["response"] = TURNS[-1][1]
    return write_log(path, lines)


def sharegpt_file(path: Path) -> Path:
    messages = [{"from": "system", "value": SYSTEM}]
    for user, assistant in TURNS:
        messages += [{"from": "human", "value": user}, {"from": "gpt", "value": assistant}]
    path.write_text(json.dumps([{"id": "c1", "conversations": messages}]))
    return path


def as_lists(column) -> list[list[int]]:
    return [np.asarray(ids).tolist() for ids in column]


def texts(conversation: Conversation) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in conversation.messages]


# ----------------------------------------------------------------------------- rebuilding


def test_cumulative_requests_rebuild_the_sharegpt_conversation_and_its_trace(tmp_path, tokenizer):
    rebuilt, report = load_chat_log(cumulative_log(tmp_path / "log.jsonl"), progress=False)
    shared, _ = load_conversations("file", sharegpt_file(tmp_path / "sg.json"), progress=False)
    assert rebuilt == shared  # id, system, 6 alternating messages
    assert len(rebuilt) == 1 and len(rebuilt[0].messages) == 6
    assert (report.records_seen, report.records_used, report.conversations_kept) == (3, 3, 1)
    assert report.replies_from_next_request == 2 and report.final_replies_recorded == 1
    assert (report.final_replies_missing, report.turns_not_logged) == (0, 0)
    assert report.keys == {"conversation_id": 3} and report.groups_by_timestamp == 1
    assert report.dropped == {} and report.repairs == {}

    options = TraceOptions()
    from_log = build_traces(rebuilt, options, tokenizer, progress=False).multi
    from_sharegpt = build_traces(shared, options, tokenizer, progress=False).multi
    assert from_log["request_id"].tolist() == ["c1/0", "c1/1", "c1/2"]
    assert as_lists(from_log["prompt_ids"]) == as_lists(from_sharegpt["prompt_ids"])
    assert as_lists(from_log["response_ids"]) == as_lists(from_sharegpt["response_ids"])
    prompts, replies = as_lists(from_log["prompt_ids"]), as_lists(from_log["response_ids"])
    last_reply = tokenizer.encode(TURNS[-1][1], add_special_tokens=False).ids
    assert replies[2] == [*last_reply, EOT_ID]
    for turn in (1, 2):  # teacher forcing: prompt + reply opens the next prompt
        assert prompts[turn][: len(prompts[turn - 1]) + len(replies[turn - 1])] == (
            prompts[turn - 1] + replies[turn - 1]
        )


def test_without_a_recorded_response_the_last_turn_is_kept_unanswered(tmp_path):
    conversations, report = load_chat_log(
        cumulative_log(tmp_path / "log.jsonl", reply=False), progress=False
    )
    assert texts(conversations[0])[-1] == ("user", TURNS[-1][0])
    assert len(conversations[0].messages) == 5
    assert (report.final_replies_recorded, report.final_replies_missing) == (0, 1)


def interleaved(keys: bool) -> list[dict]:
    """Two conversations whose requests alternate in the log: a1 b1 a2 b2 a3."""
    a = [("a: first", "ra1"), ("a: second", "ra2"), ("a: third", "ra3")]
    b = [("b: first", "rb1"), ("b: second", "rb2")]
    lines = []
    for upto, (turns, key) in [(0, (a, "A")), (0, (b, "B")), (1, (a, "A")), (1, (b, "B"))]:
        lines.append({"messages": chat(turns, upto, system=None), "conversation_id": key})
    lines.append({"messages": chat(a, 2, system=None), "conversation_id": "A"})
    if not keys:
        for line in lines:
            del line["conversation_id"]
    return lines


@pytest.mark.parametrize("keys", [True, False])
def test_interleaved_conversations_are_told_apart(tmp_path, keys):
    log = write_log(tmp_path / "log.jsonl", interleaved(keys))
    conversations, report = load_chat_log(log, progress=False)
    assert [c.id for c in conversations] == (["A", "B"] if keys else ["line-1", "line-2"])
    assert [len(c.messages) for c in conversations] == [5, 3]  # no replies recorded
    assert texts(conversations[0]) == [
        ("user", "a: first"),
        ("assistant", "ra1"),
        ("user", "a: second"),
        ("assistant", "ra2"),
        ("user", "a: third"),
    ]
    assert texts(conversations[1])[1] == ("assistant", "rb1")
    assert (report.records_used, report.replies_from_next_request) == (5, 3)
    assert report.final_replies_missing == 2
    assert report.groups_by_file_order == (2 if keys else 1)


def test_keys_group_first_then_timestamps_order_each_group(tmp_path):
    lines = interleaved(keys=True)
    for stamp, line in zip([10, 11, 12, 13, 14], lines, strict=True):
        line["timestamp"] = stamp
    shuffled = [lines[3], lines[4], lines[0], lines[1], lines[2]]  # b2 a3 a1 b1 a2
    names = ["session_id", "chat_id", "conversation_id", "session_id", "chat_id"]
    for line, key in zip(shuffled, names, strict=True):
        line[key] = line.pop("conversation_id")  # any of the three key names
    conversations, report = load_chat_log(write_log(tmp_path / "log.jsonl", shuffled), False)
    assert [c.id for c in conversations] == ["A", "B"]  # A's first request is on line 3
    assert [len(c.messages) for c in conversations] == [5, 3]
    assert report.groups_by_timestamp == 2 and report.turns_not_logged == 0
    assert report.keys == {"chat_id": 2, "conversation_id": 1, "session_id": 2}


def test_identical_openings_need_a_key(tmp_path):
    """Two users both open with "hi": without a key the second is a repeat, and the second
    conversation starts with a turn the log never sent on its own; with keys all is exact."""
    one = [("hi", "hello 1"), ("tell me more", "more")]
    two = [("hi", "hello 2"), ("bye", "bye!")]
    lines = [
        {"messages": chat(one, 0, None), "session_id": "u1"},
        {"messages": chat(two, 0, None), "session_id": "u2"},
        {"messages": chat(one, 1, None), "session_id": "u1"},
        {"messages": chat(two, 1, None), "session_id": "u2"},
    ]
    keyed, report = load_chat_log(write_log(tmp_path / "keyed.jsonl", lines), False)
    assert [len(c.messages) for c in keyed] == [3, 3] and report.dropped == {}
    assert report.turns_not_logged == 0
    for line in lines:
        del line["session_id"]
    unkeyed, report = load_chat_log(write_log(tmp_path / "unkeyed.jsonl", lines), False)
    assert [c.id for c in unkeyed] == ["line-1", "line-4"]
    assert [texts(c)[1] for c in unkeyed] == [("assistant", "hello 1"), ("assistant", "hello 2")]
    assert report.dropped == {"repeated_request": 1}
    assert (report.records_seen, report.records_used, report.turns_not_logged) == (4, 3, 1)


def test_the_longest_extended_request_wins(tmp_path):
    """A request that extends two conversations' latest requests continues the longer one."""
    lines = [
        {"messages": chat(TURNS, 1)},
        {"messages": chat(TURNS, 0)},
        {"messages": chat(TURNS, 2)},
    ]
    conversations, report = load_chat_log(write_log(tmp_path / "log.jsonl", lines), False)
    assert [c.id for c in conversations] == ["line-1", "line-2"]
    assert [len(c.messages) for c in conversations] == [5, 1]
    assert report.replies_from_next_request == 1 and report.turns_not_logged == 1


def test_a_repeated_request_lends_its_recorded_reply(tmp_path):
    lines = [{"messages": chat(TURNS, 0)}, {"messages": chat(TURNS, 0), "response": "late"}]
    conversations, report = load_chat_log(write_log(tmp_path / "log.jsonl", lines), False)
    assert texts(conversations[0]) == [("user", TURNS[0][0]), ("assistant", "late")]
    assert report.dropped == {"repeated_request": 1} and report.final_replies_recorded == 1


def test_a_request_that_skips_turns_continues_and_counts_them(tmp_path):
    lines = [{"messages": chat(TURNS, 0)}, {"messages": chat(TURNS, 2)}]  # turn 1 not logged
    conversations, report = load_chat_log(write_log(tmp_path / "log.jsonl", lines), False)
    assert len(conversations) == 1 and len(conversations[0].messages) == 5
    assert report.turns_not_logged == 1 and report.replies_from_next_request == 1


def test_a_recorded_reply_that_differs_from_the_next_request_is_counted(tmp_path):
    first = {"messages": chat(TURNS, 0), "response": "something else"}
    lines = [first, {"messages": chat(TURNS, 1)}]
    conversations, report = load_chat_log(write_log(tmp_path / "log.jsonl", lines), False)
    assert texts(conversations[0])[1] == ("assistant", TURNS[0][1])  # what the engine saw
    assert report.recorded_replies_differing == 1


def test_batch_file_shape_and_completion_objects(tmp_path):
    def batch(custom_id: str, upto: int) -> dict:
        body = {"model": "m", "messages": chat(TURNS, upto), "metadata": {"session_id": "s"}}
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                "body": body}  # fmt: skip

    last = batch("r3", 2)
    last["response"] = {
        "status_code": 200,
        "body": {"choices": [{"message": {"role": "assistant", "content": TURNS[2][1]}}]},
    }
    log = write_log(tmp_path / "batch.jsonl", [batch("r1", 0), batch("r2", 1), last])
    conversations, report = load_chat_log(log, progress=False)
    assert conversations[0].id == "s" and len(conversations[0].messages) == 6
    assert report.batch_shaped == 3 and report.keys == {"session_id": 3}
    assert report.final_replies_recorded == 1

    plain = {"messages": chat(TURNS, 0), "choices": [{"message": {"content": "top level"}}]}
    log = write_log(tmp_path / "plain.jsonl", [{**batch("r1", 0), "body": {"x": 1}}, plain])
    conversations, report = load_chat_log(log, progress=False)
    assert conversations[0].id == "line-2" and texts(conversations[0])[-1][1] == "top level"
    assert report.dropped == {"missing_messages": 1}


# ----------------------------------------------------------------------------- bad input


def bad_lines() -> list:
    """One line for each request drop reason, a blank line, and one conversation ("k") of two
    requests whose messages need every message-level rule, the second request sent twice."""
    first = [
        {"role": "system", "content": "S"},
        {"role": "assistant", "content": "Welcome!"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "at this"},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                {"type": "file", "file": {"file_id": "f"}},
            ],
        },
    ]
    second = [
        *first,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t", "type": "function"}]},
        {"role": "tool", "tool_call_id": "t", "content": "42"},
        {"role": "assistant", "content": "It is 42."},
        {"role": "narrator", "content": "Later that day"},
        {"role": "user", "content": "   "},
        {"role": "user", "content": "Thanks"},
    ]
    return [
        "not json at all",
        "[1, 2]",
        {"model": "m"},
        {"messages": "hi"},
        {"messages": []},
        {"messages": ["hi"]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "assistant", "content": "hello"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        "",
        {"messages": first, "chat_id": "k"},
        {"messages": second, "chat_id": "k"},
        {"messages": second, "chat_id": "k"},
    ]


def test_every_bad_line_and_message_is_counted(tmp_path):
    conversations, report = load_chat_log(write_log(tmp_path / "bad.jsonl", bad_lines()), False)
    assert conversations == [
        Conversation(
            id="k",
            messages=(
                Message("user", "Look\nat this"),
                Message("assistant", "It is 42."),
                Message("user", "Thanks"),
            ),
            system="S",
        )
    ]
    assert report.dropped == {
        "malformed_json": 1,
        "malformed_message": 1,
        "messages_not_a_list": 1,
        "missing_messages": 1,
        "no_messages": 1,
        "no_user_message": 1,
        "non_text_content": 1,
        "not_an_object": 1,
        "not_ending_with_user": 1,
        "repeated_request": 1,
    }
    assert report.repairs == {  # the first request's fixes are repeated in the second
        "empty_message_dropped": 1,
        "image_url_part_dropped": 2,
        "input_audio_part_dropped": 2,
        "leading_assistant_dropped": 2,
        "other_part_dropped": 2,
        "tool_calls_dropped": 1,
        "tool_message_dropped": 1,
        "unknown_role_dropped": 1,
    }
    assert (report.records_seen, report.records_used, report.records_repaired) == (12, 2, 2)
    assert report.records_seen == report.records_used + report.records_dropped
    assert report.blank_lines == 1 and report.final_replies_missing == 1
    assert report.roles == {"user": 9, "assistant": 9, "system": 3, "narrator": 2, "tool": 2}
    assert "dropped 10 (malformed_json 1," in report.summary()


def test_system_messages_and_same_role_runs_are_joined(tmp_path):
    messages = [
        {"role": "developer", "content": "A"},
        {"role": "user", "content": "u"},
        {"role": "system", "content": "B"},
        {"role": "user", "content": "v"},
    ]
    log = write_log(tmp_path / "log.jsonl", [{"messages": messages}])
    conversations, report = load_chat_log(log, progress=False)
    assert conversations[0].system == "A\n\nB"
    assert texts(conversations[0]) == [("user", "u\n\nv")]
    assert report.repairs == {"same_role_merged": 1, "system_joined": 1, "system_moved_to_front": 1}


def test_bad_bytes_keys_and_timestamps_are_repaired_and_counted(tmp_path):
    line = b'{"messages": [{"role": "user", "content": "caf\xe9 \\ud800"}], "timestamp": "noon",'
    line += b' "conversation_id": {"nested": 1}, "session_id": 7}'
    conversations, report = load_chat_log(write_log(tmp_path / "log.jsonl", [line]), False)
    assert conversations[0].id == "7" and texts(conversations[0]) == [("user", "caf\ufffd \ufffd")]
    assert report.repairs == {
        "invalid_unicode_replaced": 1,
        "invalid_utf8_replaced": 1,
        "key_unusable": 1,
        "timestamp_unusable": 1,
    }
    assert report.keys == {"session_id": 1} and report.groups_by_file_order == 1


def test_a_log_without_a_usable_request_is_a_one_line_error(tmp_path):
    log = write_log(tmp_path / "bad.jsonl", bad_lines()[:9])
    with pytest.raises(ChatLogError) as caught:
        load_chat_log(log, progress=False)
    message = str(caught.value)
    assert "\n" not in message and str(log) in message
    assert "no usable conversation: 9 records read, 9 dropped (malformed_json 1," in message
    with pytest.raises(ChatLogError, match="chat log not found"):
        load_chat_log(tmp_path / "missing.jsonl", progress=False)


# ----------------------------------------------------------------------------- hub data sets


def test_hub_data_sets_refuse_at_once_when_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ChatLogError) as caught:
        load_hf_conversations("lmsys/lmsys-chat-1m", limit=10)
    message = str(caught.value)
    assert "\n" not in message
    assert "'lmsys/lmsys-chat-1m' needs a network (HF_HUB_OFFLINE is set)" in message


def test_a_dataset_with_a_messages_column_becomes_conversations():
    from datasets import Dataset

    def m(role: str, content: str) -> dict:
        return {"role": role, "content": content}

    rows = Dataset.from_list(
        [
            {"conversation_id": "x", "conversation": [m("user", "hi"), m("assistant", "yo")]},
            {"conversation_id": "x", "conversation": [m("system", "S"), m("user", "q")]},
            {"conversation_id": "", "conversation": []},
            {"conversation_id": None, "conversation": [m("assistant", "a"), m("user", "b")]},
        ]
    )
    conversations, report = conversations_from_dataset(rows, "conversation", source="hf:test")
    assert [c.id for c in conversations] == ["x", "x#2", "row-3"]
    assert texts(conversations[0]) == [("user", "hi"), ("assistant", "yo")]
    assert conversations[1].system == "S" and texts(conversations[2]) == [("user", "b")]
    assert report.dropped == {"no_messages": 1}
    assert report.repairs == {"duplicate_id_renamed": 1, "leading_assistant_dropped": 1}
    assert (report.records_seen, report.records_used, report.conversations_kept) == (4, 3, 3)
    assert (report.final_replies_recorded, report.final_replies_missing) == (1, 2)
    with pytest.raises(ChatLogError, match="no usable conversation"):
        conversations_from_dataset([{"other": 1}], "conversation")


# ----------------------------------------------------------------------------- command


def test_the_trace_command_builds_both_traces_from_a_log(tmp_path, monkeypatch, capsys, tokenizer):
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    log = cumulative_log(tmp_path / "log.jsonl")
    out = tmp_path / "traces"
    argv = ["traces", "--source", "openai-jsonl", "--path", str(log), "--out", str(out)]
    assert cli.main([*argv, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "chat log (openai-jsonl): 1 conversations from 3 of 3 requests" in printed
    manifest = load_manifest(out)
    assert manifest["request"]["data"]["source"] == "openai-jsonl"
    assert manifest["source"]["source"] == "openai-jsonl"
    assert manifest["source"]["records_used"] == 3
    assert manifest["counts"]["multi_turn"]["requests"] == 3
    assert manifest["counts"]["single_turn"]["requests"] == 1

    shared, _ = load_conversations("file", sharegpt_file(tmp_path / "sg.json"), progress=False)
    expected = build_traces(shared, TraceOptions(), tokenizer, progress=False)
    multi, single = load_trace(out / "multi_turn.parquet"), load_trace(out / "single_turn.parquet")
    assert as_lists(multi["prompt_ids"]) == as_lists(expected.multi["prompt_ids"])
    assert as_lists(multi["response_ids"]) == as_lists(expected.multi["response_ids"])
    assert as_lists(single["prompt_ids"]) == as_lists(expected.single["prompt_ids"])

    assert cli.main([*argv, "--no-progress"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_the_trace_command_errors_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    out = ["--out", str(tmp_path / "traces"), "--no-progress"]
    assert cli.main(["traces", "--source", "openai-jsonl", *out]) == 2
    assert "needs --path" in capsys.readouterr().err
    missing = str(tmp_path / "missing.jsonl")
    assert cli.main(["traces", "--source", "openai-jsonl", "--path", missing, *out]) == 2
    assert "chat log not found" in capsys.readouterr().err
    bad = write_log(tmp_path / "bad.jsonl", bad_lines()[:9])
    assert cli.main(["traces", "--source", "openai-jsonl", "--path", str(bad), *out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no usable conversation" in err


def test_a_line_over_the_size_limit_is_a_counted_skip(tmp_path, monkeypatch, capsys):
    """Probe 12.14 (2026-11-26): one 100 MB message was read and tokenized whole (5.2 GB, then
    "memory allocation ... failed" and SIGABRT) although no context window takes it. A line
    over the limit (here lowered to 4 KiB) is dropped unread and counted as line_too_long."""
    import analysis.data.chatlogs as chatlogs

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    monkeypatch.setattr(chatlogs, "MAX_LINE_BYTES", 4096, raising=False)
    log = cumulative_log(tmp_path / "log.jsonl")
    huge = {"conversation_id": "huge", "messages": [{"role": "user", "content": "word " * 2000}]}
    with open(log, "a") as handle:
        handle.write(json.dumps(huge) + "\n")
    out = tmp_path / "traces"
    argv = ["traces", "--source", "openai-jsonl", "--path", str(log), "--out", str(out)]
    assert cli.main([*argv, "--no-progress"]) == 0
    assert "from 3 of 4 requests; dropped 1 (line_too_long 1)" in capsys.readouterr().out
    manifest = load_manifest(out)
    assert manifest["source"]["dropped"] == {"line_too_long": 1}
    assert manifest["counts"]["multi_turn"]["requests"] == 3
