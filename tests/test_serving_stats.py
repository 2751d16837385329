"""Statistics of serving runs and the prefix matchers: fast, no server."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.metrics import prefix_match
from analysis.serving import stats as serving_stats


def _requests(ttfts_by_repeat, cached=None, prompt=1000):
    rows = []
    for repeat, ttfts in enumerate(ttfts_by_repeat):
        for i, ttft in enumerate(ttfts):
            rows.append(
                {
                    "repeat": repeat,
                    "warmup": False,
                    "status": "ok",
                    "ttft_s": ttft,
                    "e2e_s": ttft + 0.3,
                    "tpot_s": 0.1,
                    "sent_prompt_tokens": prompt,
                    "cached_tokens": None if cached is None else cached[repeat][i],
                }
            )
    rows.append({**rows[0], "warmup": True, "ttft_s": 100.0})  # never counted
    return pd.DataFrame(rows)


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_more_data():
    rng = np.random.default_rng(1)
    small = [rng.normal(1.0, 0.2, 10)]
    large = [rng.normal(1.0, 0.2, 1000)]
    low, high = serving_stats.bootstrap_interval(small)
    assert low < small[0].mean() < high
    low_l, high_l = serving_stats.bootstrap_interval(large)
    assert high_l - low_l < high - low
    assert low_l < 1.0 < high_l
    assert all(np.isnan(serving_stats.bootstrap_interval([np.array([1.0])])))
    # constant data: the interval is that value
    assert serving_stats.bootstrap_interval([np.full(5, 2.0)], "p95") == (2.0, 2.0)


def test_cell_statistics_pool_repeats_and_skip_warmup():
    frame = _requests([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    stats = serving_stats.cell_statistics(frame, {0: 1.0, 1: 2.0, 2: 4.0})
    assert stats["repeats"] == 3 and stats["n_measured"] == 6
    assert stats["mean_ttft_s"] == pytest.approx(2.0)
    assert stats["mean_ttft_median_s"] == pytest.approx(2.0)
    assert 1.0 < stats["mean_ttft_lo_s"] <= 2.0 <= stats["mean_ttft_hi_s"] < 3.0
    assert stats["req_s"] == pytest.approx(1.0)  # median of 2, 1, 0.5 requests/s
    assert 0.5 <= stats["req_s_lo"] <= stats["req_s_hi"] <= 2.0
    assert stats["mean_tpot_s"] == pytest.approx(0.1)


def test_dilution_test_predicts_the_mixture_from_the_measured_hit_share():
    mixed = _requests([[0.1, 1.0, 0.1, 1.0]], cached=[[960, 0, 960, 0]])
    all_hit = _requests([[0.1, 0.1]])
    off = _requests([[1.0, 1.0]])
    result = serving_stats.dilution_test(mixed, all_hit, off, eligible_share=0.5, block_size=32)
    assert result["hit_share"] == 0.5
    assert result["predicted_ttft_s"] == pytest.approx(0.55)
    assert result["measured_ttft_s"] == pytest.approx(0.55)
    assert result["predicted_saving"] == pytest.approx(0.45)
    assert result["prediction_in_interval"]
    # a mixed run that got no hits is far from the prediction for h = 0.5
    missed = _requests([[1.0, 1.0, 1.0, 1.0]], cached=[[0, 0, 0, 0]])
    assert (
        serving_stats.dilution_test(missed, all_hit, off, eligible_share=0.5, block_size=32)[
            "hit_share"
        ]
        == 0.0
    )


def test_token_mixture_uses_the_prefill_line_of_the_caching_off_run():
    off = pd.concat([_requests([[0.1 + 0.001 * n]], prompt=n) for n in (100, 500, 900)])
    on = _requests([[0.1 + 0.001 * 100]], cached=[[800]], prompt=900)
    result = serving_stats.token_mixture_test(on, off)
    assert result["fixed_cost_s"] == pytest.approx(0.1)
    assert result["prefill_s_per_1k_tokens"] == pytest.approx(1.0)
    assert result["predicted_ttft_s"] == pytest.approx(0.2)
    assert result["token_hit_rate"] == pytest.approx(800 / 900)


def _random_prompts(count, seed=0):
    rng = np.random.default_rng(seed)
    shared = list(rng.integers(0, 50, 70))
    return [shared[: rng.integers(0, 70)] + list(rng.integers(0, 50, 20)) for _ in range(count)]


def _brute_match(stored, tokens):
    best = 0
    for other in stored:
        n = 0
        while n < min(len(other), len(tokens)) and other[n] == tokens[n]:
            n += 1
        best = max(best, n)
    return best


def test_radix_tree_matches_the_longest_stored_prefix_to_the_token():
    tree, stored = prefix_match.RadixTree(), []
    for prompt in _random_prompts(60):
        assert tree.match(prompt) == _brute_match(stored, prompt)
        assert tree.insert(prompt) == _brute_match(stored, prompt)
        stored.append(prompt)
    assert all(tree.match(p) == len(p) for p in stored)


def test_block_hash_index_matches_whole_blocks_only():
    index, tree = prefix_match.BlockHashIndex(16), prefix_match.RadixTree()
    for prompt in _random_prompts(60, seed=1):
        token_level = tree.insert(prompt)
        assert index.insert(prompt) == token_level // 16 * 16
    with pytest.raises(ValueError, match="block_size"):
        prefix_match.BlockHashIndex(0)


def test_a_sweep_whose_0_percent_ratio_is_far_from_1_is_flagged_as_disturbed():
    from analysis.serving import writeup as serving_writeup
    from analysis.serving.study import StudyParams

    quiet = serving_writeup.Facts(StudyParams(), overhead_at_zero=(0.97, 0.9, 1.05))
    loaded = serving_writeup.Facts(StudyParams(), overhead_at_zero=(8.3, 5.0, 11.6))
    assert not serving_writeup.sweep_disturbed(quiet)
    assert serving_writeup.sweep_disturbed(loaded)
    assert serving_writeup.Interval(0.1, 0.05, 0.2).below(serving_writeup.Interval(0.5, 0.3, 0.6))
    assert not serving_writeup.Interval(0.1, 0.05, 0.4).below(
        serving_writeup.Interval(0.5, 0.3, 0.6)
    )
