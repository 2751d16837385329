"""Any chat template, rendered as vLLM's server renders it: the Llama path equals the fast
builder, ChatML keeps prefixes, a template that drops reasoning or counts turns breaks them,
a tokenizer-only break is told apart, and a model folder's own template and tokenizer work
(a tokenizer trained here, offline)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis.data.sharegpt.conversations import Conversation, Message
from analysis.data.template_render import (
    Renderer,
    Template,
    render_conversation,
    template_from_folder,
    templates,
)
from analysis.data.traces.templated import templated_traces
from analysis.platform.errors import TraceError


@pytest.fixture(scope="module")
def conversations():
    from analysis.data.sharegpt import load_conversations

    loaded, _ = load_conversations(source="package", max_conversations=30, progress=False)
    return loaded


def test_the_llama_template_rendered_turn_by_turn_equals_the_fast_builder(conversations):
    from analysis.data.traces import TraceOptions, build_traces

    built = build_traces(conversations, TraceOptions(max_conversations=30), progress=False)
    rendered = templated_traces(conversations, templates()["llama3.2"])
    assert len(rendered.multi) == len(built.multi)
    for column in ("prompt_ids", "response_ids"):
        for ours, theirs in zip(rendered.multi[column], built.multi[column], strict=True):
            assert np.array_equal(ours, theirs)
    assert set(rendered.turns["break_kind"]) == {"none"}


@pytest.mark.parametrize("name", ["llama3", "llama3.2", "chatml"])
def test_templates_that_re_render_history_keep_every_prefix(conversations, name):
    turns = templated_traces(conversations, templates()[name]).turns
    assert len(turns) > 20
    assert (turns["break_kind"] == "none").all()
    assert (turns["lost_tokens"] == 0).all()


def test_dropping_earlier_reasoning_breaks_where_the_reply_began(conversations):
    traces = templated_traces(conversations, templates()["chatml-reasoning"])
    turns = traces.turns.merge(
        traces.multi[["conversation_id", "turn_index", "prompt_tokens"]],
        on=["conversation_id", "turn_index"],
    )
    assert (turns["break_kind"] == "template").all()
    assert (turns["extends"] == turns["prompt_tokens"]).all()  # the reply's first token differs


def test_a_turn_counter_in_the_preamble_breaks_near_the_start():
    counter = Template(
        "counter",
        "{{ 'Turn ' + (messages | length) | string + '<|eot_id|>' }}"
        "{% for m in messages %}{{ m.role + ': ' + m.content + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}",
        "a test template",
        "<|eot_id|>",
    )
    turns = render_conversation(Renderer(counter), None, [("hi there", "hello"), ("more", "ok")])
    assert turns[0].break_kind == "template"
    assert turns[0].next_extends == 2  # "Turn" and the space are shared, the count is not
    assert turns[1].next_extends is None  # the last turn has no next prompt


def test_a_break_of_the_tokens_alone_is_told_from_the_templates():
    glued = Template(  # the reply is glued to the role name: its first letters merge with it
        "glued",
        "{% for m in messages %}{{ m.role + m.content + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant' }}{% endif %}",
        "a test template",
        "<|eot_id|>",
    )
    renderer = Renderer(glued)
    turns = render_conversation(renderer, None, [("hi", "s are great"), ("again", "ok")])
    assert renderer.ids("assistants") != renderer.ids("assistant") + renderer.ids("s")
    assert turns[0].break_kind == "tokenizer"
    assert turns[0].next_extends == len(turns[0].prompt_ids) - 1  # "assistant" itself is lost


def test_a_failing_template_is_one_line():
    broken = Template("broken", "{{ raise_exception('no system role') }}", "test", "<|eot_id|>")
    with pytest.raises(TraceError, match="failed to render: no system role"):
        Renderer(broken).text([{"role": "user", "content": "hi"}])


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, conversations):
    """A model folder of its own: a BPE tokenizer trained here on ShareGPT text, with ChatML's
    markup as special tokens, and Qwen2.5's template in its tokenizer_config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("chatml-model")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(
        (m.text for c in conversations for m in c.messages), trainer=trainer
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "chat_template": templates()["chatml"].jinja,
        "eos_token": {"content": "<|im_end|>"},
        "bos_token": None,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_model_folders_own_template_and_tokenizer(model_folder, conversations):
    template = template_from_folder(model_folder)
    assert template.end_of_turn == "<|im_end|>"
    traces = templated_traces(conversations[:10], template, str(model_folder))
    assert (traces.turns["break_kind"] == "none").all()
    first = traces.multi["prompt_ids"].iloc[0]
    assert int(first[0]) == 1  # <|im_start|>, the trained tokenizer's own id
    assert max(int(ids.max()) for ids in traces.multi["prompt_ids"]) < 2000


def test_a_folder_without_a_template_is_refused(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(TraceError, match="has no chat_template"):
        template_from_folder(tmp_path)


def test_a_prompt_too_long_ends_its_conversation_counted():
    chat = Conversation(
        "c",
        (
            Message("user", "word " * 50),
            Message("assistant", "ok"),
            Message("user", "word " * 500),
            Message("assistant", "ok"),
        ),
        None,
    )
    traces = templated_traces([chat], templates()["llama3"], max_model_len=200)
    assert len(traces.multi) == 1 and traces.too_long == 1


def test_traces_from_a_request_log_through_a_model_folder(model_folder, tmp_path, monkeypatch):
    """`traces --source openai-jsonl --path LOG --model FOLDER` builds both traces, every turn
    rendered with the folder's own template and tokenizer."""
    from analysis.cli import main
    from analysis.data.traces import load_trace

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    first = [{"role": "user", "content": "How do I sort a list in Python?"}]
    second = [
        *first,
        {"role": "assistant", "content": "Use sorted(items) or items.sort()."},
        {"role": "user", "content": "And in reverse order?"},
    ]
    other = [{"role": "user", "content": "Name three prime numbers."}]
    log = tmp_path / "log.jsonl"
    lines = [{"messages": first}, {"messages": other}, {"messages": second}]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "traces"
    argv = ["traces", "--source", "openai-jsonl", "--path", str(log), "--model",
            str(model_folder), "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    multi, single = load_trace(out / "multi_turn.parquet"), load_trace(out / "single_turn.parquet")
    assert multi["turn_index"].tolist() == [0, 1, 0] and len(single) == 2
    renderer = Renderer(template_from_folder(model_folder), str(model_folder))
    expected = renderer.ids(renderer.text(second))
    assert multi["prompt_ids"].iloc[1].tolist() == expected
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["template"]["source"].endswith("tokenizer_config.json")
    assert manifest["counts"]["prefix_breaks"] == {"none": 1}


def test_a_model_folder_without_its_config_is_one_line(tmp_path, capsys):
    from analysis.cli import main

    assert main(["traces", "--model", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no tokenizer_config.json there" in capsys.readouterr().err


def test_a_hub_model_offline_and_not_cached_is_one_line(tmp_path, capsys, monkeypatch):
    from analysis.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["traces", "--model", "nobody/no-such-model", "--out", str(tmp_path)]) == 2
    assert "HF_HUB_OFFLINE is set" in capsys.readouterr().err


# --- a model folder's faults and options (probes 13.6-13.15 of 2026-11-26) --------------------


def question(c: int, k: int) -> str:
    return f"question {k} of chat {c} " * 3


def write_chat_log(path, conversations: int = 6, turns: int = 4):
    """A request log of `conversations` chats of `turns` turns, one request per turn."""
    lines = []
    for c in range(conversations):
        messages = []
        for k in range(turns):
            messages.append({"role": "user", "content": question(c, k)})
            lines.append({"conversation_id": f"c{c}", "messages": list(messages)})
            messages.append({"role": "assistant", "content": f"answer {k} of chat {c}"})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def folder_like(model_folder, target, **config):
    """A copy of the model folder with its tokenizer_config.json changed by `config`."""
    target.mkdir()
    (target / "tokenizer.json").write_bytes((model_folder / "tokenizer.json").read_bytes())
    base = json.loads((model_folder / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**base, **config}))
    return target


def build_from_log(tmp_path, model, *extra):
    """`traces --source openai-jsonl` of a fresh log through `model`: (status, stderr, out)."""
    from analysis.cli import main

    tmp_path.mkdir(exist_ok=True)
    log = write_chat_log(tmp_path / "log.jsonl")
    out = tmp_path / "traces"
    argv = ["traces", "--source", "openai-jsonl", "--path", str(log), "--out", str(out),
            "--no-progress", *(["--model", str(model)] if model else []), *extra]  # fmt: skip
    return main(argv), out


def one_line(capsys, code):
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_an_eos_token_outside_the_vocabulary_is_one_line(model_folder, tmp_path, capsys):
    """Probe 13.6: a TypeError traceback (a reply ending with a None id)."""
    folder = folder_like(model_folder, tmp_path / "m", eos_token="<|nope|>")
    code, out = build_from_log(tmp_path, folder)
    err = one_line(capsys, code)
    assert "end-of-turn token '<|nope|>'" in err and "not in the tokenizer's vocabulary" in err
    assert not (out / "multi_turn.parquet").exists()


def test_a_tokenizer_json_cut_in_half_is_one_line(model_folder, tmp_path, capsys):
    """Probe 13.8: "Exception: EOF while parsing a list", a traceback from transformers."""
    folder = folder_like(model_folder, tmp_path / "m")
    text = (folder / "tokenizer.json").read_bytes()
    (folder / "tokenizer.json").write_bytes(text[: len(text) // 2])
    err = one_line(capsys, build_from_log(tmp_path, folder)[0])
    assert f"{folder / 'tokenizer.json'} is not a tokenizers JSON file" in err


def test_a_template_that_renders_nothing_is_refused(model_folder, tmp_path, capsys):
    """Probe 13.10: a trace of 0 prompt tokens written with rc 0, which run and bounds refuse."""
    folder = folder_like(model_folder, tmp_path / "m", chat_template="{% if false %}x{% endif %}")
    code, out = build_from_log(tmp_path, folder)
    err = one_line(capsys, code)
    assert "renders an empty prompt (conversation 'c0', turn 0)" in err
    assert not (out / "multi_turn.parquet").exists()


def test_every_turn_too_long_through_a_model_is_one_line(model_folder, tmp_path, capsys):
    """Probe 13.13: KeyError 'turn_index' when every turn is over --max-model-len."""
    err = one_line(capsys, build_from_log(tmp_path, model_folder, "--max-model-len", "16")[0])
    assert "every request was dropped" in err and "24 requests excluded" in err
    assert err.rstrip().endswith("lower --min-turns or raise --max-model-len")  # no truncate


def test_single_turn_sampled_through_a_model_draws_the_default_builders_turns(
    model_folder, tmp_path
):
    """Probe 13.14: `--single-turn sampled --seed 3` with --model gave every first turn while
    the manifest said "sampled"; now the same turns as the default builder, rendered alone."""
    from analysis.data.traces import load_trace

    options = ("--single-turn", "sampled", "--seed", "3")
    assert build_from_log(tmp_path / "m", model_folder, *options)[0] == 0
    assert build_from_log(tmp_path / "d", None, *options)[0] == 0
    model = load_trace(tmp_path / "m" / "traces" / "single_turn.parquet")
    default = load_trace(tmp_path / "d" / "traces" / "single_turn.parquet")
    chosen = list(zip(model["conversation_id"], model["turn_index"], strict=True))
    assert chosen == list(zip(default["conversation_id"], default["turn_index"], strict=True))
    assert any(turn > 0 for _, turn in chosen)
    row = model[model["turn_index"] > 0].iloc[0]
    renderer = Renderer(template_from_folder(model_folder), str(model_folder))
    alone = question(int(row["conversation_id"][1:]), int(row["turn_index"]))
    expected = renderer.ids(renderer.text([{"role": "user", "content": alone}]))
    assert row["prompt_ids"].tolist() == expected


def test_truncate_through_a_model_is_refused(model_folder, tmp_path, capsys):
    """Probe 13.15: --policy truncate with --model dropped the long turn, yet the manifest
    said "truncate"; a model's template renders whole turns, so the option is refused."""
    code, out = build_from_log(tmp_path, model_folder, "--policy", "truncate")
    err = one_line(capsys, code)
    assert "policy 'truncate'" in err and "--policy exclude" in err
    assert not out.exists()


def test_the_reasoning_drop_check_fails_when_the_drop_is_within_a_preambles_move():
    import pandas as pd

    from analysis.metrics.template_reuse import reasoning_drop_check

    ideals = {"llama3": 0.530, "llama3.2": 0.533, "chatml": 0.534, "chatml-reasoning": 0.283}
    table = pd.DataFrame({"template": list(ideals), "multi_ideal": list(ideals.values())})
    claim, oracle, holds = reasoning_drop_check(table)
    assert holds and "(25.1% vs 0.3%)" in claim
    close = table.assign(multi_ideal=[0.530, 0.560, 0.534, 0.520])  # a 1.4-point drop, 3 moved
    assert not reasoning_drop_check(close)[2]
    assert reasoning_drop_check(table[table["template"] != "llama3"]) is None
