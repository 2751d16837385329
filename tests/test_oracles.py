"""The notebooks' oracles: each agrees with the code it checks on real inputs, and each fails
on a wrong input (a check that cannot fail checks nothing)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis.metrics import oracles
from analysis.metrics.bounds import ideal_bound


def test_checks_table_passes_and_fails():
    checks = oracles.Checks()
    checks.add("two equal numbers", 3, 3)
    assert list(checks.assert_all()["holds"]) == [True]
    checks.add("a wrong number", 3, 4)
    with pytest.raises(AssertionError, match="1 of 2 claims fail: a wrong number"):
        checks.assert_all()
    with pytest.raises(AssertionError, match="no checks"):
        oracles.Checks().assert_all()


def test_brute_force_hits_identical_and_different_prompts():
    prompt = list(range(40))
    assert oracles.brute_force_hits([prompt] * 3, 16).tolist() == [0, 32, 32]
    other = [1000 + t for t in prompt]
    assert oracles.brute_force_hits([prompt, other], 16).tolist() == [0, 0]
    # a prompt of exactly 2 blocks can hit only 1: its last token is always recomputed
    assert oracles.brute_force_hits([prompt[:32]] * 2, 16).tolist() == [0, 16]


def test_brute_force_counts_the_reply_except_its_last_token():
    prompt, reply = list(range(30)), list(range(30, 35))  # 34 tokens computed: 2 blocks
    follow = prompt + reply + [99]
    hits = oracles.brute_force_hits([prompt, follow], 16, responses=[reply, []])
    assert hits.tolist() == [0, 32]
    short = oracles.brute_force_hits([prompt, follow], 16, responses=[reply[:2], []])
    assert short.tolist() == [0, 16]


def test_brute_force_equals_the_ideal_bound_on_real_traces(tmp_path):
    """Two independent computations of the infinite-cache hits agree on real ShareGPT turns
    (the packaged ShareGPT, the real tokenizer and template; built here, so that the test
    never depends on another one having built data/traces first)."""
    from analysis.data.sharegpt import load_conversations
    from analysis.data.traces import TraceOptions, build_traces

    conversations, _ = load_conversations(source="package", max_conversations=120, progress=False)
    trace = build_traces(conversations, TraceOptions(), progress=False).multi.head(300)
    assert len(trace) == 300 and trace["turn_index"].max() >= 1
    ours = oracles.brute_force_hits(trace["prompt_ids"], 16, trace["response_ids"])
    theirs = ideal_bound(trace, 16, include_outputs=True)
    assert int(ours.sum()) == theirs.hit_tokens
    wrong = oracles.brute_force_hits(trace["prompt_ids"], 16)  # replies left out
    assert int(wrong.sum()) != theirs.hit_tokens


def test_closed_forms_give_seed_002():
    assert np.allclose(oracles.legacy_closed_form(40, 16, 7), [k / (k + 1) for k in range(7)])
    tokens = oracles.identical_requests_closed_form(40, 16, 3)
    assert np.allclose(tokens, [0, 32 / 80, 64 / 120])
    assert not np.allclose(tokens, oracles.legacy_closed_form(40, 16, 3))
    assert oracles.legacy_closed_form(10, 16, 3).tolist() == [0, 0, 0]


def test_plain_sharegpt_counts_reads_whole_records_of_a_cut_file(tmp_path):
    records = [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": "hi"},
                {"from": "gpt"},
                {"from": "human", "value": " "},
            ],
        },
        {"id": "b", "conversations": [{"from": "gpt", "value": "only a reply"}]},
        {
            "id": "c",
            "conversations": [
                {"from": "human", "value": "a"},
                {"from": "gpt"},
                {"from": "human", "value": "b"},
            ],
        },
    ]
    text = json.dumps(records)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('{"id": "c"') + 20])
    assert oracles.plain_sharegpt_counts(path) == {
        "records": 2,
        "records_with_user_turn": 1,
        "user_turns": 1,
    }
    path.write_text(text)
    assert oracles.plain_sharegpt_counts(path)["user_turns"] == 3
    path.write_text('{"not": "a list"}')
    with pytest.raises(ValueError):
        oracles.plain_sharegpt_counts(path)


@pytest.mark.engine
def test_vllm_refuses_one_block_fewer_than_the_minimum():
    """vLLM's own start-up check: ceil(2048 / 32) + 1 = 65 blocks run, 64 are refused."""
    assert oracles.vllm_refusal(2048, 32, 65) is None
    message = oracles.vllm_refusal(2048, 32, 64)
    assert message is not None and "max seq len (2048)" in message


def _points(first_hits: int, exported_rate: float) -> pd.DataFrame:
    row = {
        "trace": "t",
        "limit": np.nan,
        "block_size": 16,
        "outputs": "recorded",
        "max_model_len": 8192,
        "max_output_tokens": np.nan,
        "num_blocks": 1000,
        "engine": "replay",
        "preemptions": 0,
        "first_prefill_hits": first_hits,
        "all_prefill_hits": first_hits,
        "first_prefill_rate": first_hits / 120,
        "exported_rate": exported_rate,
    }
    return pd.DataFrame([row])


def test_check_sweep_points_holds_for_the_ideal_and_fails_otherwise():
    prompt = list(range(40))
    trace = pd.DataFrame(
        {
            "conversation_id": ["a", "b", "c"],
            "prompt_ids": [prompt, prompt, prompt],
            "response_ids": [[], [], []],
            "prompt_tokens": [40, 40, 40],
        }
    )
    good = oracles.Checks()
    oracles.check_sweep_points(_points(64, 64 / 120), good, {"t": trace})
    assert all(c.holds for c in good.items)
    too_many = oracles.Checks()  # more hits than an infinite cache allows
    oracles.check_sweep_points(_points(80, 80 / 120), too_many, {"t": trace})
    assert not all(c.holds for c in too_many.items)
    exported_differs = oracles.Checks()
    oracles.check_sweep_points(_points(64, 0.9), exported_differs, {"t": trace})
    assert [c.holds for c in exported_differs.items].count(False) == 1
