"""`replay` is vLLM: the real CPU engine (`vllm.LLM`, a random-weight Llama, the real tokenizer)
and the model-free replay give the same counts on the same trace and configuration.

Each case starts the real engine once (~10-20 s on 2 cores). Replies are short so that the
real model's steps stay few; block size 32, as the CPU engine requires.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.engines import RunConfig, RunResult
from analysis.engines.synthetic import identical_requests, synthetic_trace
from analysis.runs import run

pytestmark = pytest.mark.engine

BASE = {"block_size": 32, "max_model_len": 1024, "max_output_tokens": 24}


def both(trace: pd.DataFrame, **changes) -> tuple[RunResult, RunResult]:
    config = RunConfig(trace="test", engine="vllm", **{**BASE, **changes})
    real = run(trace, config, progress=False)
    outputs = real.generated_outputs() if config.outputs == "free" else None
    replayed = run(trace, config.with_(engine="replay"), outputs=outputs, progress=False)
    return real, replayed


def hash_events(result: RunResult) -> pd.DataFrame:
    events = result.block_events.drop(columns=["time_s", "block_id"])
    return events.sort_values(["step", "event", "block_hash", "request_index"]).reset_index(
        drop=True
    )


def assert_same_accounting(real: RunResult, replayed: RunResult) -> None:
    for key in ("first_prefill", "all_prefill", "exported", "preemptions", "readmissions"):
        assert real.summary[key] == replayed.summary[key], key
    assert real.counters["exported"] == replayed.counters["exported"]
    assert real.counters["prefix_cache_stats"] == replayed.counters["prefix_cache_stats"]
    np.testing.assert_array_equal(
        real.requests["cached_tokens"].to_numpy(), replayed.requests["cached_tokens"].to_numpy()
    )
    np.testing.assert_array_equal(
        real.requests["preemptions"].to_numpy(), replayed.requests["preemptions"].to_numpy()
    )
    pd.testing.assert_frame_equal(
        real.admissions.drop(columns=["time_s"]), replayed.admissions.drop(columns=["time_s"])
    )
    pd.testing.assert_frame_equal(hash_events(real), hash_events(replayed))
    assert real.manifest["engine"]["num_cached_tokens_mismatches"] == 0
    assert real.manifest["engine"]["resolved"] == replayed.manifest["engine"]["resolved"]


CASES = {
    # everything at once into a cache of 39 usable blocks: heavy preemption (recompute)
    "batch-heavy-preemption": (
        dict(num_conversations=8, turns=(1, 3), user_tokens=(20, 80), shared_prefix=40),
        dict(mode="batch", num_blocks=40, max_output_tokens=96),
    ),
    # three clients, turns released as the previous one finishes; recorded replies forced
    "closed-loop-recorded": (
        dict(num_conversations=8, turns=(2, 4), user_tokens=(20, 150), shared_prefix=64),
        dict(mode="closed-loop", concurrency=3, num_blocks=64),
    ),
    # the model generates its own tokens; replay is given exactly those tokens
    "batch-free-outputs": (
        dict(num_conversations=8, turns=(1, 3), user_tokens=(30, 200)),
        dict(mode="batch", num_blocks=48, outputs="free"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_replay_counts_equal_the_real_engine(case):
    shape, changes = CASES[case]
    trace = synthetic_trace(seed=11, reply_tokens=(20, 120), **shape)
    real, replayed = both(trace, **changes)
    assert real.summary["requests_finished"] == len(trace)
    assert_same_accounting(real, replayed)
    if case == "batch-heavy-preemption":
        assert real.summary["preemptions"] >= 5
        assert real.summary["all_prefill"]["rate"] > real.summary["first_prefill"]["rate"]
    if case == "batch-free-outputs":
        generated = real.generated_outputs()
        assert len(generated) == len(trace)
        recorded = dict(zip(trace["request_id"], trace["response_ids"], strict=False))
        assert any(list(recorded[r][:24]) != tokens for r, tokens in generated.items())


def test_runs_on_one_shared_engine_count_as_each_alone():
    """Inside `shared_engines()` the second run finds the first one's engine with its prefix
    cache reset, its steps from 0 and nothing wrapped twice: both still equal replay."""
    from analysis.engines.vllm_engine import shared_engines

    shape, changes = CASES["closed-loop-recorded"]
    trace = synthetic_trace(seed=11, reply_tokens=(20, 120), **shape)
    with shared_engines():
        first, replayed_first = both(trace, **changes)
        second, replayed_second = both(trace, **{**changes, "mode": "batch"})
    assert_same_accounting(first, replayed_first)
    assert_same_accounting(second, replayed_second)
    assert first.summary["first_prefill"]["hits"] > 0  # the runs share prefixes: a reset shows
    assert not first.manifest["engine"]["shared_engine"]
    assert second.manifest["engine"]["shared_engine"]
    assert second.manifest["engine"]["warmup_seconds"] is None


def test_identical_prompts_on_the_real_engine():
    length, block = 150, 32
    trace = identical_requests(6, length, reply_tokens=4)
    real, replayed = both(trace, mode="closed-loop", concurrency=1, num_blocks=64)
    full = (length - 1) // block * block
    assert real.requests["cached_tokens"].tolist() == [0] + [full] * 5
    from analysis.metrics import hitrates

    rates = hitrates.cumulative(real.admissions)["cumulative_rate"].to_numpy()
    np.testing.assert_allclose(rates, [(k - 1) * full / (k * length) for k in range(1, 7)])
    # the rate vLLM's logger shows is this cumulative rate (fewer than 1000 requests)
    assert real.counters["logged_window_hit_rate"] == pytest.approx(rates[-1])
    assert hitrates.windowed(real.admissions)["window_rate"].iloc[-1] == pytest.approx(rates[-1])
    # and vLLM's own LoggingStatLogger, fed by the engine, shows it too
    assert real.counters["logger_window_hit_rate"] == pytest.approx(rates[-1])
    assert_same_accounting(real, replayed)
    # a CPU resolves Model Runner V1, so the recorded replies are forced by the logits processor
    engine = real.manifest["engine"]
    assert (engine["model_runner"], engine["forcing"]) == ("v1", "logits-processor")
    assert engine["forced_output_mismatches"] == 0


def test_real_sharegpt_sample_on_both_engines():
    """Real ShareGPT conversations, the real Llama 3.2 tokenizer and chat template."""
    from analysis.data.sharegpt import load_conversations
    from analysis.data.traces import TraceOptions, build_traces

    conversations, _ = load_conversations(max_conversations=40, progress=False)
    multi = [c for c in conversations if sum(m.role == "user" for m in c.messages) >= 2][:5]
    traces = build_traces(multi, TraceOptions(max_model_len=4096), progress=False)
    trace = traces.multi
    assert trace["turn_index"].max() >= 1
    real, replayed = both(
        trace,
        mode="closed-loop",
        concurrency=2,
        max_model_len=4096,
        num_blocks=400,
        max_output_tokens=16,
    )
    assert_same_accounting(real, replayed)
    # teacher forcing: each turn hits what the previous turn computed (its prompt and the
    # forced reply tokens, but never the last sampled token), in whole blocks
    requests = real.requests
    assert (requests["status"] == "finished").all() and requests["preemptions"].sum() == 0
    for earlier, later in zip(
        requests.iloc[:-1].itertuples(), requests.iloc[1:].itertuples(), strict=False
    ):
        if later.conversation_id != earlier.conversation_id:
            continue
        computed = earlier.prompt_tokens + earlier.output_tokens - 1
        assert later.cached_tokens >= computed // 32 * 32
    assert requests.loc[requests["turn_index"] > 0, "cached_tokens"].sum() > 0


def test_the_minimum_number_of_blocks_is_the_one_vllm_accepts():
    """validate()'s minimum, ceil(max_model_len / block_size) + 1, against vLLM itself: the
    real engine refuses one block fewer and starts with exactly that many."""
    from analysis.engines.vllm_engine import build_llm

    config = RunConfig(engine="vllm", block_size=32, max_model_len=1024, num_blocks=64)
    smallest = config.min_num_blocks
    assert smallest == 1024 // 32 + 1
    with pytest.raises(ValueError, match=r"max seq len \(1024\)"):
        build_llm(config.with_(num_blocks=smallest - 1), forced=False)
    llm = build_llm(config.with_(num_blocks=smallest), forced=False)
    try:
        core = llm.llm_engine.engine_core.engine_core
        assert core.scheduler.kv_cache_manager.block_pool.num_gpu_blocks == smallest
    finally:
        llm.llm_engine.engine_core.shutdown()
