"""Request traces from real ShareGPT conversations with the real Llama 3.2 tokenizer."""

from __future__ import annotations

import argparse
import hashlib
import json
import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.commands import traces as traces_command
from analysis.data.chat_template import (
    LLAMA32_CHAT_TEMPLATE,
    ChatTemplate,
    header,
    message_body,
    render,
)
from analysis.data.sharegpt import Conversation, Message, load_conversations
from analysis.data.tokenizer import load_tokenizer, packaged_tokenizer_file
from analysis.data.traces import (
    TRACE_COLUMNS,
    TraceError,
    TraceOptions,
    build_traces,
    export_jsonl,
    load_manifest,
    load_trace,
    save_traces,
    shared_prefix_tokens,
    trace_stats,
    trace_table,
)
from analysis.platform.errors import AnalysisError
from analysis.platform.manifest import file_sha256

EOT_ID = 128_009
BOS_ID = 128_000


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def real_conversations() -> list[Conversation]:
    conversations, _ = load_conversations(progress=False)
    return conversations


@pytest.fixture(scope="module")
def sample(real_conversations) -> list[Conversation]:
    """50 conversations drawn at random, plus real ones with a system prompt and with a last
    user message left unanswered, so that those cases are always covered."""
    small = [c for c in real_conversations if sum(len(m.text) for m in c.messages) < 12_000]
    rng = random.Random(20240601)
    chosen = rng.sample(small, 50)
    with_system = [c for c in small if c.system is not None][:3]
    unanswered = [c for c in small if c.messages[-1].role == "user" and len(c.messages) > 1][:3]
    many_turns = sorted(small, key=lambda c: -len(c.messages))[:2]
    picked = {c.id: c for c in [*chosen, *with_system, *unanswered, *many_turns]}
    return list(picked.values())


@pytest.fixture(scope="module")
def sample_traces(sample, tokenizer):
    return build_traces(sample, TraceOptions(), tokenizer, progress=False)


def chat(conversation: Conversation, upto: int | None = None) -> list[dict[str, str]]:
    """The conversation's messages (system first) in chat-template form, `upto` messages."""
    messages = [{"role": m.role, "content": m.text} for m in conversation.messages[:upto]]
    if conversation.system is not None:
        messages.insert(0, {"role": "system", "content": conversation.system})
    return messages


def user_positions(conversation: Conversation) -> list[int]:
    return [i for i, m in enumerate(conversation.messages) if m.role == "user"]


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def words(n: int) -> str:
    """n tokens with the Llama 3 tokenizer ("hello" then " hello" n - 1 times)."""
    return " ".join(["hello"] * n)


# ----------------------------------------------------------------------------- template


ODD_CHATS = [
    [{"role": "user", "content": "  spaces, tabs\t and a trailing newline\n"}],
    [
        {"role": "system", "content": "\n Be brief.  "},
        {"role": "user", "content": "Ünïcödé 你好 🙂 <b>html</b> {{ not jinja }} {% raw %}"},
        {"role": "assistant", "content": "A reply that mentions <|eot_id|> as text."},
        {"role": "user", "content": "\r\nwindows line ends\r\n"},
    ],
    [{"role": "system", "content": ""}, {"role": "user", "content": "empty system message"}],
]


def reference_renderer(jinja: str):
    """transformers' own renderer over a reference Jinja text (the oracle for our Python)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(packaged_tokenizer_file()),
        bos_token="<|begin_of_text|>",
        chat_template=jinja,
    )


@pytest.mark.parametrize(
    "template", [ChatTemplate(), ChatTemplate(date="01 Feb 2025"), ChatTemplate("llama3")]
)
def test_template_equals_transformers_apply_chat_template(sample, template):
    """Byte for byte, on real multi-turn conversations and on odd texts, against the reference
    Jinja (Llama 3.2's as published, with the date passed the way a renderer would)."""
    hf = reference_renderer(template.jinja)
    chats = ODD_CHATS + [
        chat(conversation, position + 1)
        for conversation in sample
        for position in user_positions(conversation)
    ]
    checked_system = 0
    for messages in chats:
        expected = hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, date_string=template.date
        )
        assert template.render(messages) == expected
        checked_system += messages[0]["role"] == "system"
    assert checked_system > 0


def test_the_engine_template_states_the_fixed_date():
    """What an engine serves (no date passed, the clock available) equals the trace's text."""
    template = ChatTemplate(date="03 Mar 2025")
    hf = reference_renderer(template.engine_jinja())
    for messages in ODD_CHATS:
        rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert rendered == template.render(messages)
        assert "Today Date: 03 Mar 2025\n\n" in rendered


def test_llama32_system_block_is_shared_and_dated():
    """Every Llama 3.2 prompt opens with the same system block (the cache can share it), and
    the block changes with the date (yesterday's cached prompts stop matching)."""
    one = render([{"role": "user", "content": "a"}])
    other = render([{"role": "user", "content": "b"}])
    block = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
    assert block in one and block in other
    assert ChatTemplate(date="27 Jul 2024").render([{"role": "user", "content": "a"}]) != one
    assert ChatTemplate("llama3").render([{"role": "user", "content": "a"}]).count("system") == 0
    assert LLAMA32_CHAT_TEMPLATE.startswith("{{- bos_token }}")


@pytest.mark.parametrize("bad", ["2024-07-26", "26 July 2024", "6 Jul 2024", ""])
def test_template_date_must_be_written_like_the_template(bad):
    with pytest.raises(ValueError, match="template date"):
        ChatTemplate(date=bad)
    with pytest.raises(ValueError, match="template must be one of"):
        ChatTemplate("llama3.1")


def test_llama3_option_traces_tokenise_the_llama3_render(sample, tokenizer):
    options = TraceOptions(template="llama3")
    traces = build_traces(sample[:10], options, tokenizer, progress=False)
    by_id = {c.id: c for c in sample}
    for row in traces.multi.itertuples(index=False):
        conversation = by_id[row.conversation_id]
        position = user_positions(conversation)[row.turn_index]
        text = options.chat_template.render(chat(conversation, position + 1))
        assert row.prompt_ids.tolist() == encode(tokenizer, text), row.request_id


# ----------------------------------------------------------------------------- ids


def test_assembled_ids_equal_tokenising_the_rendered_prompt(sample, sample_traces, tokenizer):
    by_id = {c.id: c for c in sample}
    multi = sample_traces.multi
    assert len(multi) == sum(len(user_positions(c)) for c in sample)
    for row in multi.itertuples(index=False):
        conversation = by_id[row.conversation_id]
        position = user_positions(conversation)[row.turn_index]
        expected = encode(tokenizer, render(chat(conversation, position + 1)))
        assert row.prompt_ids.tolist() == expected, row.request_id
        assert row.prompt_tokens == len(expected)
    single = sample_traces.single
    for row in single.itertuples(index=False):
        conversation = by_id[row.conversation_id]
        expected = encode(tokenizer, render(chat(conversation, 1)))
        assert row.turn_index == 0 and row.prompt_ids.tolist() == expected


def test_response_ids_are_the_reply_then_eot(sample, sample_traces, tokenizer):
    by_id = {c.id: c for c in sample}
    empty = 0
    for row in sample_traces.multi.itertuples(index=False):
        conversation = by_id[row.conversation_id]
        following = user_positions(conversation)[row.turn_index] + 1
        if following < len(conversation.messages):
            reply = conversation.messages[following].text
            assert row.response_ids.tolist() == encode(tokenizer, message_body(reply))
            assert row.response_ids[-1] == EOT_ID
        else:
            assert len(row.response_ids) == 0
            empty += 1
        assert row.response_tokens == len(row.response_ids)
    assert empty == sample_traces.counts["multi_turn"]["responses_empty"] >= 3


def test_prompt_plus_response_prefixes_the_next_prompt_on_real_data(real_conversations):
    trace = build_traces(real_conversations[:1000], TraceOptions(), progress=False).multi
    pairs = 0
    previous = None
    for row in trace.itertuples(index=False):
        if previous is not None and previous.conversation_id == row.conversation_id:
            assert row.turn_index == previous.turn_index + 1
            joined = np.concatenate([previous.prompt_ids, previous.response_ids])
            assert np.array_equal(row.prompt_ids[: len(joined)], joined), row.request_id
            assert len(row.prompt_ids) > len(joined)
            pairs += 1
        previous = row
    assert pairs > 2000
    assert trace["prompt_ids"].map(lambda ids: ids[0]).eq(BOS_ID).all()
    assert trace["timestamp"].is_monotonic_increasing


def test_rows_follow_the_schema(sample_traces):
    for frame in sample_traces.frames().values():
        assert tuple(frame.columns) == TRACE_COLUMNS
        assert frame["turn_index"].dtype == np.int32
        assert frame["prompt_tokens"].dtype == np.int32
        assert frame["timestamp"].dtype == np.float64
        assert (
            frame["request_id"] == frame["conversation_id"] + "/" + frame["turn_index"].astype(str)
        ).all()
        assert frame["prompt_ids"].map(lambda ids: ids.dtype == np.int32).all()
        assert frame["timestamp"].tolist() == [float(i) for i in range(len(frame))]


# ----------------------------------------------------------------------------- single turn


def test_single_turn_has_one_first_turn_per_conversation(sample, sample_traces):
    single, multi = sample_traces.single, sample_traces.multi
    assert single["conversation_id"].is_unique
    assert len(single) == len(sample)
    first_turns = multi[multi["turn_index"] == 0].reset_index(drop=True)
    assert single["request_id"].tolist() == first_turns["request_id"].tolist()
    for a, b in zip(single["prompt_ids"], first_turns["prompt_ids"], strict=True):
        assert np.array_equal(a, b)


def test_sampled_single_turn_drops_the_history(sample, tokenizer):
    options = TraceOptions(single_turn="sampled", seed=3)
    single = build_traces(sample, options, tokenizer, progress=False).single
    by_id = {c.id: c for c in sample}
    assert single["conversation_id"].is_unique and len(single) == len(sample)
    assert (single["turn_index"] > 0).any()
    for row in single.itertuples(index=False):
        conversation = by_id[row.conversation_id]
        position = user_positions(conversation)[row.turn_index]
        messages = [{"role": "user", "content": conversation.messages[position].text}]
        if conversation.system is not None:
            messages.insert(0, {"role": "system", "content": conversation.system})
        assert row.prompt_ids.tolist() == encode(tokenizer, render(messages))
    again = build_traces(sample, options, tokenizer, progress=False).single
    assert again["turn_index"].tolist() == single["turn_index"].tolist()
    other_options = TraceOptions(single_turn="sampled", seed=4)
    other = build_traces(sample, other_options, tokenizer, progress=False)
    assert other.single["turn_index"].tolist() != single["turn_index"].tolist()


# ----------------------------------------------------------------------------- max_model_len


def synthetic_conversations() -> list[Conversation]:
    """A: its second turn does not fit 128 tokens; B: its first turn does not fit;
    C: fits; D: fits, but its reply must be capped."""
    return [
        Conversation(
            "A",
            (
                Message("user", words(20)),
                Message("assistant", words(30)),
                Message("user", words(80)),
                Message("assistant", words(5)),
                Message("user", words(5)),
            ),
            None,
        ),
        Conversation("B", (Message("user", words(200)), Message("assistant", words(3))), None),
        Conversation(
            "C", (Message("user", words(10)), Message("assistant", words(10))), "Be brief."
        ),
        Conversation("D", (Message("user", words(10)), Message("assistant", words(300))), None),
    ]


@pytest.fixture(scope="module")
def unlimited(tokenizer):
    """The synthetic traces with no length limit: the whole prompts, for expected counts."""
    return build_traces(
        synthetic_conversations(), TraceOptions(max_model_len=10_000), tokenizer, progress=False
    ).multi.set_index("request_id")


def test_exclude_cuts_conversations_at_the_first_turn_that_does_not_fit(tokenizer, unlimited):
    limit = 128
    built = build_traces(
        synthetic_conversations(), TraceOptions(max_model_len=limit), tokenizer, progress=False
    )
    multi, counts = built.multi, built.counts["multi_turn"]
    assert multi["request_id"].tolist() == ["A/0", "C/0", "D/0"]
    assert (multi["prompt_tokens"] < limit).all()
    assert (multi["prompt_tokens"] + multi["response_tokens"] <= limit).all()
    dropped = ["A/1", "A/2", "B/0"]
    assert (unlimited.loc[dropped, "prompt_tokens"] >= limit).all()
    assert counts["requests_candidate"] == 6
    assert counts["requests"] == 3
    assert counts["requests_excluded"] == 3
    assert counts["requests_truncated"] == 0
    assert counts["conversations"] == 3
    assert counts["conversations_cut"] == 1  # A
    assert counts["conversations_excluded"] == 1  # B
    assert counts["prompt_tokens"] == int(multi["prompt_tokens"].sum())
    assert counts["prompt_tokens_excluded"] == int(unlimited.loc[dropped, "prompt_tokens"].sum())
    d_reply = int(unlimited.loc["D/0", "response_tokens"])
    d_row = multi.set_index("request_id").loc["D/0"]
    assert counts["responses_capped"] == 1
    assert counts["response_tokens_capped"] == d_reply - (limit - int(d_row["prompt_tokens"]))
    assert d_row["prompt_tokens"] + d_row["response_tokens"] == limit
    assert built.counts["single_turn"]["requests_excluded"] == 1  # B's first turn


def test_a_prompt_must_leave_one_token_to_generate(tokenizer, unlimited):
    """vLLM refuses a prompt of max_model_len tokens: one output token must fit."""
    conversations = synthetic_conversations()[2:3]  # C
    length = int(unlimited.loc["C/0", "prompt_tokens"])
    at_limit = build_traces(
        conversations, TraceOptions(max_model_len=length), tokenizer, progress=False
    )
    assert at_limit.multi.empty and at_limit.counts["multi_turn"]["requests_excluded"] == 1
    one_more = build_traces(
        conversations, TraceOptions(max_model_len=length + 1), tokenizer, progress=False
    )
    assert one_more.multi["prompt_tokens"].tolist() == [length]
    assert one_more.multi["response_tokens"].tolist() == [1]


def test_truncate_cuts_the_last_user_message_and_keeps_the_prefix(tokenizer, unlimited):
    limit = 128
    built = build_traces(
        synthetic_conversations(),
        TraceOptions(max_model_len=limit, policy="truncate"),
        tokenizer,
        progress=False,
    )
    multi = built.multi.set_index("request_id")
    counts = built.counts["multi_turn"]
    assert list(multi.index) == ["A/0", "A/1", "B/0", "C/0", "D/0"]
    assistant_header = encode(tokenizer, header("assistant"))
    for rid in ("A/1", "B/0"):
        prompt = multi.loc[rid, "prompt_ids"].tolist()
        assert len(prompt) == limit - 1 == multi.loc[rid, "prompt_tokens"]
        assert prompt[-len(assistant_header) - 1 :] == [EOT_ID, *assistant_header]
        full = unlimited.loc[rid, "prompt_ids"].tolist()
        kept = limit - 1 - len(assistant_header) - 1
        assert prompt[:kept] == full[:kept]  # the history and the message's start, unchanged
        assert multi.loc[rid, "response_tokens"] == 1  # capped to what fits
    a0 = multi.loc["A/0"]
    joined = np.concatenate([a0["prompt_ids"], a0["response_ids"]])
    assert np.array_equal(multi.loc["A/1", "prompt_ids"][: len(joined)], joined)
    assert counts["requests_truncated"] == 2
    assert counts["requests_excluded"] == 1  # A/2: later turns are never kept
    assert counts["conversations_cut"] == 1 and counts["conversations_excluded"] == 0
    full_lengths = unlimited.loc[["A/1", "B/0"], "prompt_tokens"]
    assert counts["prompt_tokens_truncated"] == int((full_lengths - (limit - 1)).sum())
    assert counts["prompt_tokens_excluded"] == int(unlimited.loc["A/2", "prompt_tokens"])


def test_min_turns_and_max_conversations_are_counted(tokenizer):
    conversations = synthetic_conversations()
    built = build_traces(
        conversations, TraceOptions(min_turns=2, max_conversations=3), tokenizer, progress=False
    )
    assert built.counts["conversations"] == {
        "input": 4,
        "skipped_max_conversations": 1,
        "skipped_min_turns": 2,
        "used": 1,
    }
    assert set(built.multi["conversation_id"]) == {"A"}


def test_options_are_validated():
    for bad in (
        {"policy": "drop"},
        {"single_turn": "last"},
        {"max_model_len": 8},
        {"min_turns": 0},
        {"max_conversations": -1},
    ):
        with pytest.raises(ValueError):
            TraceOptions(**bad)


# ----------------------------------------------------------------------------- files


def test_save_and_load_round_trip(tmp_path, sample, sample_traces, tokenizer):
    paths = save_traces(sample_traces, tmp_path, {"source": {"note": "test"}}, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json",
        "multi_turn.parquet",
        "single_turn.parquet",
    ]
    for name, frame in sample_traces.frames().items():
        loaded = load_trace(paths[name])
        assert tuple(loaded.columns) == TRACE_COLUMNS
        assert loaded["turn_index"].dtype == np.int32
        pd.testing.assert_frame_equal(
            loaded.drop(columns=["prompt_ids", "response_ids"]),
            frame.drop(columns=["prompt_ids", "response_ids"]),
        )
        for column in ("prompt_ids", "response_ids"):
            for a, b in zip(loaded[column], frame[column], strict=True):
                assert np.array_equal(a, b) and a.dtype == np.int32
        kind = pq.read_schema(paths[name]).field("prompt_ids").type
        assert pa.types.is_list(kind) and kind.value_type == pa.int32()
    manifest = load_manifest(tmp_path)
    assert manifest["counts"] == json.loads(json.dumps(sample_traces.counts))
    assert manifest["parameters"] == sample_traces.options.to_dict()
    assert manifest["tokenizer"]["sha256"] == file_sha256(packaged_tokenizer_file())
    # the recorded template is the one the prompts were built with: its hash recomputed here,
    # and its text, rendered by transformers, tokenizes to the first request's prompt
    template = manifest["template"]
    digest = hashlib.sha256(f"{template['jinja']}\0{template['date']}".encode()).hexdigest()
    assert template["sha256"] == digest
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_file=str(packaged_tokenizer_file()),
        bos_token="<|begin_of_text|>",
        chat_template=template["jinja"],
    )
    last = sample_traces.multi.iloc[-1]
    conversation = next(c for c in sample if c.id == last["conversation_id"])
    upto = user_positions(conversation)[last["turn_index"]] + 1
    rendered = hf.apply_chat_template(
        chat(conversation, upto),
        tokenize=False,
        add_generation_prompt=True,
        date_string=template["date"],
    )
    assert encode(tokenizer, rendered) == last["prompt_ids"].tolist()
    assert manifest["source"] == {"note": "test"}
    assert {"tokenizers", "pyarrow", "pandas"} <= set(manifest["package_versions"])
    for name in ("multi_turn", "single_turn"):
        entry = manifest["files"][name]
        assert entry["sha256"] == file_sha256(tmp_path / entry["file"])
        assert entry["rows"] == len(sample_traces.frames()[name])


def test_jsonl_export_has_the_seeds_fields(tmp_path, sample, sample_traces, tokenizer):
    frame = sample_traces.multi
    path = export_jsonl(frame, tmp_path / "multi_turn.jsonl", tokenizer, progress=False)
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(records) == len(frame)
    by_id = {c.id: c for c in sample}
    for record, row in zip(records, frame.itertuples(index=False), strict=True):
        assert set(record) == {"prompt", "response", "conversation_id", "turn_index", "timestamp"}
        assert record["conversation_id"] == row.conversation_id
        assert record["turn_index"] == row.turn_index
        assert record["timestamp"] == row.timestamp
        conversation = by_id[row.conversation_id]
        position = user_positions(conversation)[row.turn_index]
        assert record["prompt"] == render(chat(conversation, position + 1))
        following = position + 1
        if following < len(conversation.messages):
            assert record["response"] == conversation.messages[following].text.strip()
        else:
            assert record["response"] == ""


def test_load_trace_errors_are_one_line(tmp_path, sample_traces):
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "missing.parquet")
    partial = tmp_path / "partial.parquet"
    pq.write_table(trace_table(sample_traces.single).drop_columns(["response_ids"]), partial)
    with pytest.raises(TraceError, match="lacks columns"):
        load_trace(partial)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(TraceError, match="not a readable Parquet"):
        load_trace(garbage)


@pytest.mark.parametrize(
    ("column", "values", "message"),
    [
        ("prompt_ids", lambda ids: [[str(t) for t in row] for row in ids], "wrong type"),
        ("prompt_ids", lambda ids: [[float(t) + 0.5 for t in row] for row in ids], "wrong type"),
        ("prompt_ids", lambda ids: [[int(t) + 2**40 for t in row] for row in ids], "wrong type"),
        ("turn_index", lambda ids: ["first"] * len(ids), "wrong type"),
        ("prompt_ids", lambda ids: [[-int(t) - 1 for t in row] for row in ids], "negative"),
    ],
)
def test_a_trace_with_wrong_dtypes_is_a_one_line_error(
    tmp_path, sample_traces, column, values, message
):
    frame = sample_traces.single.head(3).copy()
    frame[column] = values(frame["prompt_ids"].tolist())
    path = tmp_path / "wrong.parquet"
    frame.to_parquet(path)  # plain pandas: the types as written, not the trace schema's
    with pytest.raises(TraceError, match=message) as caught:
        load_trace(path)
    assert str(caught.value).startswith(f"trace {path}") and "\n" not in str(caught.value)


def test_a_build_that_drops_every_request_is_a_one_line_error(tmp_path):
    data = tmp_path / "one_turn.json"
    data.write_text(
        json.dumps(
            [{"id": f"c{i}", "conversations": [{"from": "human", "value": "hi"}]} for i in range(3)]
        )
    )
    with pytest.raises(TraceError) as caught:
        run_command(
            "--source",
            "file",
            "--path",
            str(data),
            "--min-turns",
            "2",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        )
    message = str(caught.value)
    assert message.startswith(f"{data}: every request was dropped: 0 of 3 conversations used")
    assert "3 with fewer than min_turns=2" in message and "\n" not in message
    assert load_manifest(tmp_path / "out") is None


# ----------------------------------------------------------------------------- statistics


def test_trace_stats_history_share(sample_traces):
    multi = sample_traces.multi
    stats = trace_stats(multi)
    table = stats.per_request
    first = table["turn_index"] == 0
    assert (table.loc[first, "history_tokens"] == 0).all()
    later = table[~first]
    assert len(later) > 50
    previous = multi.shift(1)[~first]
    expected = previous["prompt_tokens"] + previous["response_tokens"]
    assert (later["history_tokens"] == expected.astype(np.int64)).all()
    assert ((later["history_share"] > 0) & (later["history_share"] < 1)).all()
    assert stats.by_turn.loc[stats.by_turn["turn_index"] == 0, "mean_history_share"].item() == 0
    assert stats.summary["requests"] == len(multi)
    assert stats.summary["prompt_tokens"] == int(multi["prompt_tokens"].sum())
    assert stats.per_conversation["turns"].sum() == len(multi)
    single_stats = trace_stats(sample_traces.single)
    assert single_stats.summary["history_tokens"] == 0


# ----------------------------------------------------------------------------- command


def run_command(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    traces_command.configure(parser)
    return traces_command.main(parser.parse_args(list(argv)))


def test_command_builds_then_skips_then_rebuilds(tmp_path, capsys):
    out = tmp_path / "traces"
    args = ("--max-conversations", "25", "--out", str(out), "--no-progress")
    assert run_command(*args) == 0
    first = capsys.readouterr().out
    assert "built in" in first and "multi_turn:" in first and "kept 25" in first
    manifest = load_manifest(out)
    assert manifest["counts"]["conversations"]["used"] == 25
    assert manifest["source"]["conversations_kept"] == 25
    assert run_command(*args) == 0
    assert "up to date" in capsys.readouterr().out
    assert load_manifest(out)["created"] == manifest["created"]
    assert run_command(*args, "--max-model-len", "4096") == 0  # other parameters: rebuilt
    assert "built in" in capsys.readouterr().out
    assert load_manifest(out)["parameters"]["max_model_len"] == 4096
    assert run_command(*args, "--max-model-len", "4096", "--force", "--jsonl") == 0
    assert "built in" in capsys.readouterr().out
    assert (out / "multi_turn.jsonl").is_file() and (out / "single_turn.jsonl").is_file()


def test_command_errors_are_one_line(tmp_path):
    with pytest.raises(AnalysisError, match="not found"):
        run_command("--tokenizer", str(tmp_path / "none.json"), "--out", str(tmp_path))
    with pytest.raises(AnalysisError, match="max_model_len"):
        run_command("--max-model-len", "4", "--out", str(tmp_path))
    with pytest.raises(AnalysisError, match="not found"):
        run_command("--source", "file", "--path", str(tmp_path / "none.json"))


def test_shared_prefix_tokens_is_what_every_prompt_opens_with():
    assert shared_prefix_tokens([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 3]]) == 3
    assert shared_prefix_tokens([[1, 2], [3]]) == 0
    assert shared_prefix_tokens([[5, 6, 7]]) == 3
    assert shared_prefix_tokens([]) == 0
    frame = pd.DataFrame({"prompt_ids": [np.array([7, 8, 9]), np.array([7, 8])]})
    assert shared_prefix_tokens(frame) == 2
