"""Hit-rate definitions on hand-made tables (fast), and the logged window against vLLM's own."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.metrics import hitrates


def admissions(rows: list[tuple[str, str, int, str, int, int, int]]) -> pd.DataFrame:
    """rows: (request_id, conversation_id, turn, kind, queried, hit, step)."""
    frame = pd.DataFrame(
        rows,
        columns=[
            "request_id",
            "conversation_id",
            "turn_index",
            "kind",
            "tokens_queried",
            "tokens_hit",
            "step",
        ],
    )
    frame["time_s"] = frame["step"] * 0.5
    return frame


PREEMPTED = admissions(
    [
        ("a/0", "a", 0, "first", 100, 0, 1),
        ("b/0", "b", 0, "first", 200, 32, 1),
        ("a/0", "a", 0, "readmission", 110, 96, 3),  # 10 tokens generated before preemption
        ("a/1", "a", 1, "first", 300, 96, 5),
    ]
)


def test_first_prefill_counts_first_admissions_only():
    rate = hitrates.first_prefill(PREEMPTED)
    assert (rate.hits, rate.queries) == (128, 600)
    assert rate.rate == pytest.approx(128 / 600)


def test_all_prefill_counts_readmissions():
    every = hitrates.all_prefill(PREEMPTED)
    assert (every.hits, every.queries) == (224, 710)
    assert every.rate > hitrates.first_prefill(PREEMPTED).rate  # this re-admission hit more
    no_preemption = PREEMPTED[PREEMPTED["kind"] == "first"]
    assert hitrates.all_prefill(no_preemption) == hitrates.first_prefill(no_preemption)


def test_all_prefill_falls_below_first_prefill_when_a_readmission_hits_less():
    evicted = PREEMPTED.copy()
    evicted.loc[evicted["kind"] == "readmission", "tokens_hit"] = 0  # its blocks were evicted
    assert hitrates.all_prefill(evicted).rate == pytest.approx(128 / 710)
    assert hitrates.all_prefill(evicted).rate < hitrates.first_prefill(evicted).rate


@pytest.mark.engine
def test_vllm_scheduler_can_give_all_prefill_below_first_prefill():
    """16 requests sharing a 300-token prefix, all at once into 70 blocks: preempted requests
    come back after the prefix and their own blocks were evicted, and hit less than at first.
    The rates are checked against vLLM's own PrefixCacheStats, not against our tables."""
    from analysis.engines import RunConfig
    from analysis.engines.synthetic import synthetic_trace
    from analysis.runs import run

    trace = synthetic_trace(
        16, turns=1, user_tokens=(10, 40), reply_tokens=(60, 100), seed=0, shared_prefix=300
    )
    config = RunConfig(
        trace="synthetic",
        engine="replay",
        block_size=16,
        num_blocks=70,
        max_model_len=512,
        mode="batch",
        max_output_tokens=100,
    )
    result = run(trace, config, progress=False)
    admissions = result.admissions
    first = admissions[admissions["kind"] == "first"].set_index("request_id")
    again = admissions[admissions["kind"] == "readmission"]
    first_share = first["tokens_hit"] / first["tokens_queried"]
    again_share = again["tokens_hit"] / again["tokens_queried"]
    assert (again_share.to_numpy() < first_share[again["request_id"]].to_numpy()).any()
    stats = result.counters["prefix_cache_stats"]  # vLLM's per-step stats, summed
    first_rate = stats["hits"] / stats["queries"]
    all_rate = (stats["hits"] + stats["preempted_hits"]) / (
        stats["queries"] + stats["preempted_queries"]
    )
    assert stats["preempted_requests"] > 0
    assert all_rate < first_rate
    assert hitrates.first_prefill(admissions).rate == pytest.approx(first_rate)
    assert hitrates.all_prefill(admissions).rate == pytest.approx(all_rate)


def test_empty_rate_is_nan_not_an_error():
    assert math.isnan(hitrates.first_prefill(PREEMPTED.iloc[:0]).rate)


def test_recompute_share_is_readmission_prefill_over_all_prefill():
    # prefilled = queried - hit: 100, 168, 14 (readmission), 204
    assert hitrates.recompute_share(PREEMPTED) == pytest.approx(14 / (100 + 168 + 14 + 204))
    assert hitrates.recompute_share(PREEMPTED[PREEMPTED["kind"] == "first"]) == 0.0


def test_exported_rate_must_equal_first_prefill():
    counters = {"exported": {"vllm:prefix_cache_hits": 128, "vllm:prefix_cache_queries": 600}}
    assert hitrates.check_exported_is_first_prefill(PREEMPTED, counters).hits == 128
    counters["exported"]["vllm:prefix_cache_hits"] = 224  # the pre-#25787 all-prefill count
    with pytest.raises(AssertionError, match="differs from first-prefill"):
        hitrates.check_exported_is_first_prefill(PREEMPTED, counters)


def test_cumulative_gives_seed_002_sequence_for_identical_prompts():
    length, block = 81, 16
    hit = (length - 1) // block * block  # 80: every block but the one holding the last token
    rows = [(f"r{i}", f"r{i}", 0, "first", length, 0 if i == 0 else hit, i + 1) for i in range(6)]
    rates = hitrates.cumulative(admissions(rows))["cumulative_rate"].to_numpy()
    expected = [(k - 1) * hit / (k * length) for k in range(1, 7)]
    np.testing.assert_allclose(rates, expected)
    # close to seed 002's 0, 1/2, 2/3, 3/4, 4/5, 5/6 when the hit is nearly the whole prompt
    np.testing.assert_allclose(rates, [0, 1 / 2, 2 / 3, 3 / 4, 4 / 5, 5 / 6], atol=0.011)


def test_windowed_matches_caching_metrics_rules():
    # three steps of first admissions: (requests, queries, hits)
    rows = []
    for step, count, hit in ((1, 600, 0), (2, 300, 50), (3, 300, 100)):
        rows += [(f"s{step}r{i}", "c", 0, "first", 100, hit, step) for i in range(count)]
    window = hitrates.windowed(admissions(rows), window=1000)
    # after step 3: 1200 requests > 1000, so step 1's entry is dropped
    assert window["window_rate"].tolist()[:2] == [0.0, pytest.approx(50 * 300 / 90_000)]
    assert window["window_rate"].iloc[-1] == pytest.approx((300 * 50 + 300 * 100) / 60_000)


def test_per_turn_and_per_conversation_use_first_admissions():
    turns = hitrates.per_turn(PREEMPTED).set_index("turn_index")
    assert turns.loc[0, "hits"] == 32 and turns.loc[0, "queries"] == 300
    assert turns.loc[1, "rate"] == pytest.approx(96 / 300)
    conversations = hitrates.per_conversation(PREEMPTED).set_index("conversation_id")
    assert conversations.loc["a", "queries"] == 400


def test_block_reuse_counts_hits_and_gaps():
    events = pd.DataFrame(
        {
            "step": [1, 1, 2, 4, 4, 9, 10],
            "time_s": [0.1, 0.1, 0.2, 0.4, 0.4, 0.9, 1.0],
            "event": ["stored", "stored", "hit", "hit", "hit", "evicted", "hit"],
            "block_hash": ["aa", "bb", "aa", "aa", "bb", "bb", "aa"],
        }
    )
    stats = hitrates.block_reuse(events)
    assert stats["blocks_hit"] == 2
    assert stats["total_hits"] == 4
    assert stats["hits_per_block_max"] == 3
    assert stats["hits_per_block_mean"] == pytest.approx(2.0)
    assert stats["repeat_hits"] == 2
    steps, seconds = hitrates.reuse_gaps(events)
    assert sorted(steps.tolist()) == [1, 2, 3, 6]  # aa: 1->2->4->10; bb: 1->4
    assert sorted(np.round(seconds, 6).tolist()) == [0.1, 0.2, 0.3, 0.6]
    assert stats["reuse_gap_steps"]["min"] == 1 and stats["reuse_gap_steps"]["max"] == 6


@pytest.mark.engine
def test_windowed_equals_vllm_caching_metrics():
    from vllm.v1.metrics.stats import CachingMetrics, PrefixCacheStats

    rng = np.random.default_rng(0)
    rows = []
    metrics = CachingMetrics()
    for step in range(1, 400):
        stats = PrefixCacheStats()
        for i in range(int(rng.integers(0, 9))):
            queried = int(rng.integers(10, 500))
            hit = int(rng.integers(0, queried))
            stats.record(num_tokens=queried, num_hits=hit, preempted=False)
            rows.append((f"{step}/{i}", "c", 0, "first", queried, hit, step))
        metrics.observe(stats)
    window = hitrates.windowed(admissions(rows))
    assert window["window_rate"].iloc[-1] == pytest.approx(metrics.hit_rate)


def test_legacy_block_metric_counts_whole_blocks_of_every_admission():
    """Pre-PR-#18003 V1: queries = full blocks (the last one dropped when the prompt fills it
    exactly), hits = cached blocks, re-admissions included."""
    table = admissions(
        [
            ("a/0", "a", 0, "first", 40, 0, 1),  # 2 full blocks + 8 tokens: 2 queried
            ("b/0", "b", 0, "first", 48, 32, 2),  # 3 full blocks, last one popped: 2 queried
            ("a/0", "a", 0, "readmission", 50, 48, 3),  # 3 queried, 3 hit
        ]
    )
    counted = hitrates.legacy_block_counts(table, 16)
    assert counted["blocks_queried"].tolist() == [2, 2, 3]
    assert counted["blocks_hit"].tolist() == [0, 2, 3]
    assert hitrates.legacy_block_rate(table, 16) == hitrates.Rate(5, 7)
    with pytest.raises(ValueError, match="block_size"):
        hitrates.legacy_block_counts(table, 0)


def test_legacy_metric_gives_seed_002_exactly_where_tokens_do_not():
    """Seven identical 40-token prompts at block size 16 (seed 002: about 40 prompt tokens per
    request): blocks give 0, 1/2, 2/3, ..., 6/7; tokens give 0, 32/80, 64/120, ..."""
    rows = [(f"r{i}/0", f"r{i}", 0, "first", 40, 0 if i == 0 else 32, i + 1) for i in range(7)]
    table = admissions(rows)
    legacy = hitrates.legacy_cumulative(table, 16)["cumulative_rate"].to_numpy()
    assert np.allclose(legacy, [k / (k + 1) for k in range(7)])
    tokens = hitrates.cumulative(table)["cumulative_rate"].to_numpy()
    assert np.allclose(tokens, [k * 32 / ((k + 1) * 40) for k in range(7)])
    assert not np.allclose(tokens, legacy)


def test_prompts_hitting_counts_first_admissions_from_the_prompt_start():
    assert hitrates.prompts_hitting(PREEMPTED, 1) == 2  # b/0 and a/1; the re-admission is not
    assert hitrates.prompts_hitting(PREEMPTED, 32) == 2
    assert hitrates.prompts_hitting(PREEMPTED, 33) == 1


def test_first_step_sharing_counts_hits_among_the_first_admissions():
    assert hitrates.first_step_sharing(PREEMPTED) == (2, 1)  # step 1: a/0 misses, b/0 hits


def test_same_step_hits_are_reuse_gaps_of_zero():
    events = pd.DataFrame(
        {
            "step": [1, 1, 1, 3],
            "time_s": [0.1, 0.1, 0.1, 0.3],
            "event": ["stored", "hit", "hit", "hit"],
            "block_hash": ["aa", "aa", "aa", "aa"],
        }
    )
    stats = hitrates.block_reuse(events)
    assert stats["same_step_hits"] == 2
    assert stats["reuse_gap_steps"]["min"] == 0
