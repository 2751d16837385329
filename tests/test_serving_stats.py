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
                    "start_s": float(i),
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


def test_cell_statistics_summarise_each_repeat_then_across_repeats_and_skip_warmup():
    frame = _requests([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    stats = serving_stats.cell_statistics(frame, {0: 1.0, 1: 2.0, 2: 4.0})
    assert stats["repeats"] == 3 and stats["n_measured"] == 6
    assert stats["mean_ttft_s"] == pytest.approx(2.0)  # median of the repeats' means
    assert stats["mean_ttft_repeats"] == pytest.approx([1.0, 2.0, 3.0])
    assert stats["mean_ttft_pooled_s"] == pytest.approx(2.0)
    # the interval resamples repeats: it reaches the outer repeats' values
    assert stats["mean_ttft_lo_s"] == pytest.approx(1.0)
    assert stats["mean_ttft_hi_s"] == pytest.approx(3.0)
    assert stats["req_s"] == pytest.approx(1.0)  # median of 2, 1, 0.5 requests/s
    assert stats["req_s_repeats"] == pytest.approx([2.0, 1.0, 0.5])
    assert 0.5 <= stats["req_s_lo"] <= stats["req_s_hi"] <= 2.0
    assert stats["mean_tpot_s"] == pytest.approx(0.1)


def test_the_median_of_repeats_differs_from_the_pooled_mean_when_one_repeat_is_slow():
    rng = np.random.default_rng(3)
    quick = [rng.normal(0.3, 0.02, 40) for _ in range(2)]
    slow = rng.normal(1.5, 0.1, 40)
    frame = _requests([slow, *quick])
    stats = serving_stats.cell_statistics(frame, {0: 60.0, 1: 8.0, 2: 8.0})
    assert stats["mean_ttft_s"] == pytest.approx(np.median([g.mean() for g in (slow, *quick)]))
    assert stats["mean_ttft_pooled_s"] > 0.6 > stats["mean_ttft_s"]
    assert stats["outlier_repeats"] == [0]  # flagged, not averaged away
    assert stats["mean_ttft_hi_s"] > 1.0  # resampling repeats shows the slow one


def test_repeats_that_agree_are_not_flagged_and_give_a_narrow_interval():
    rng = np.random.default_rng(4)
    groups = [rng.normal(0.5, 0.05, 60) for _ in range(3)]
    stats = serving_stats.cell_statistics(_requests(groups), {0: 5.0, 1: 5.0, 2: 5.0})
    assert stats["outlier_repeats"] == []
    assert stats["mean_ttft_hi_s"] - stats["mean_ttft_lo_s"] < 0.1


def test_requests_in_flight_and_the_burst_label_report_what_ran():
    from analysis.serving.loadgen.request_stats import requests_in_flight

    # four requests started together, each 1 s: never more than 4 in flight
    burst = pd.DataFrame({"start_s": [0.0, 0.0, 0.0, 0.0], "e2e_s": [1.0, 1.0, 1.0, 1.0]})
    assert requests_in_flight(burst) == (4, pytest.approx(4.0))
    # back to back: one at a time
    serial = pd.DataFrame({"start_s": [0.0, 1.0, 2.0], "e2e_s": [1.0, 1.0, 1.0]})
    assert requests_in_flight(serial) == (1, pytest.approx(1.0))
    frame = _requests([[0.1] * 4])
    frame["start_s"], frame["e2e_s"] = 0.0, 1.0
    stats = serving_stats.cell_statistics(frame, {0: 1.0}, concurrency=8)
    assert stats["burst"] and stats["inflight_peak"] == 4 and stats["requests_per_repeat"] == 4
    assert not serving_stats.cell_statistics(frame, {0: 1.0}, concurrency=1)["burst"]


def test_the_one_verdict_rule_is_sign_aware():
    from analysis.serving.intervals import Interval, compare, ratio_verdict

    low, high = Interval(0.1, 0.05, 0.2), Interval(0.5, 0.3, 0.6)
    assert compare(low, high) == "lower" and compare(high, low) == "higher"
    assert compare(Interval(0.1, 0.05, 0.4), high) == "not distinguishable"
    assert compare(Interval(0.1), high) == "not distinguishable"  # no interval, no verdict
    faster = Interval(1.025, 1.017, 1.034)  # requests/s on/off above 1: no overhead
    assert ratio_verdict(faster, above="faster", below="slower") == "faster"
    assert ratio_verdict(Interval(0.9, 0.85, 0.95), above="faster", below="slower") == "slower"
    assert ratio_verdict(Interval(1.0, 0.98, 1.01), above="faster", below="slower") == (
        "no difference beyond noise"
    )


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


def test_a_dilution_interval_wider_than_the_model_range_tests_nothing():
    from analysis.serving.writeup import dilution_verdict

    d = {
        "ttft_hit_s": 0.3,
        "ttft_miss_s": 1.6,
        "predicted_ttft_s": 0.95,
        "measured_lo_s": 0.8,
        "measured_hi_s": 1.1,
    }
    assert dilution_verdict(d) == "reproduced"
    assert dilution_verdict({**d, "measured_lo_s": 1.0}) == "prediction outside the interval"
    wide = {**d, "measured_lo_s": 0.467, "measured_hi_s": 2.265}  # 1.8 s wide, range 1.3 s
    assert dilution_verdict(wide).startswith("not tested: the interval (1.798 s wide)")


def test_token_mixture_uses_the_prefill_line_of_the_caching_off_run():
    off = pd.concat([_requests([[0.1 + 0.001 * n]], prompt=n) for n in (100, 500, 900)])
    on = _requests([[0.1 + 0.001 * 100]], cached=[[800]], prompt=900)
    result = serving_stats.token_mixture_test(on, off)
    assert result["fixed_cost_s"] == pytest.approx(0.1)
    assert result["prefill_s_per_1k_tokens"] == pytest.approx(1.0)
    assert result["predicted_ttft_s"] == pytest.approx(0.2)
    assert result["token_hit_rate"] == pytest.approx(800 / 900)
    assert result["line_r_squared"] == pytest.approx(1.0)  # the points lie on the line
    from analysis.serving import writeup as w

    inside = {**result, "measured_lo_s": 0.15, "measured_hi_s": 0.25}  # one request: no interval
    assert w.mixture_title(inside) == "TTFT follows the tokens left to prefill"
    scattered = {**inside, "line_r_squared": 0.1}  # a line that explains little
    assert w.mixture_title(scattered) == "TTFT is not set by the tokens left to prefill alone"


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


def _repeat_summary(repeat, scale):
    """A per-repeat summary as `execute_run` writes it, every measured number scaled."""
    return {
        "workload": "sharegpt",
        "mode": "cache",
        "prefix_regime": "sharegpt",
        "concurrency": 2,
        "predicted_saving": 0.4,
        "predicted_hit_rate": 0.4,
        "skipped_turns": {"short_conversation": 1},
        "repeat": repeat,
        "n_requests": 6,
        "n_ok": 6,
        "n_timeout": 0,
        "n_error": 0,
        "n_not_sent": 0,
        "prefix_cache_queries": 100.0 * scale,
        "prefix_cache_hits": 40.0 * scale,
        "request_prefill_time_seconds_sum": 0.3 * scale,
        "request_prefill_time_seconds_count": 6.0,
        "wall_s": 10.0 * scale,
        "tok_s": 5.0 / scale,
        "req_s": 0.6 / scale,
        "mean_ttft_s": 0.5 * scale,
        "mean_ttft_first_turn_s": 0.4 * scale,
        "mean_ttft_later_turns_s": 0.6 * scale,
        "p50_ttft_s": 0.5 * scale,
        "warmup_ttft_s": 0.1 * scale,
        "mean_ttft_incl_warmup_s": 0.5 * scale,
        "cache_reset": True,
        "load_1m": [0.5 * scale, 0.6 * scale],
    }


def _conversation_requests(scales):
    rows = []
    for repeat, scale in enumerate(scales):
        for i in range(6):
            turn = i % 3
            rows.append(
                {
                    "repeat": repeat,
                    "warmup": False,
                    "status": "ok",
                    "turn_index": turn,
                    "ttft_s": (0.4 if turn == 0 else 0.6) * scale,
                    "e2e_s": scale,
                    "tpot_s": 0.05,
                    "start_s": float(i),
                    "output_tokens": 4,
                    "sent_prompt_tokens": 100,
                    "cached_tokens": 40,
                }
            )
    return pd.DataFrame(rows)


def test_combine_repeats_takes_every_column_from_all_repeats_never_from_repeat_0_alone():
    from analysis.serving.bench_run import combine_repeats

    scales = [5.0, 1.0, 2.0]  # repeat 0 is the slow one: its values are never the median
    summaries = [_repeat_summary(r, s) for r, s in enumerate(scales)]
    cell = combine_repeats(summaries, _conversation_requests(scales))
    first = summaries[0]
    for name, value in cell.items():
        if name in first and isinstance(value, float) and first[name] != summaries[1][name]:
            assert value != pytest.approx(first[name]), f"{name} is repeat 0's value"
    # the per-turn columns: medians over all repeats (0.4 x median scale 2.0), and a
    # partition: first and later turns bracket the whole
    assert cell["mean_ttft_first_turn_s"] == pytest.approx(0.8)
    assert cell["mean_ttft_later_turns_s"] == pytest.approx(1.2)
    assert cell["mean_ttft_first_turn_s"] < cell["mean_ttft_s"] < cell["mean_ttft_later_turns_s"]
    assert cell["n_ok"] == 18 and cell["repeats"] == 3
    assert cell["hit_rate"] == pytest.approx(0.4)
    assert cell["wall_s"] == pytest.approx(80.0)
    assert cell["tok_s_repeats"] == pytest.approx([1.0, 5.0, 2.5])
    assert cell["load_1m_max"] == pytest.approx(3.0)


def test_combine_repeats_counts_every_repeat_and_refuses_a_lost_one():
    from analysis.serving.bench_run import combine_repeats

    scales = [1.0, 1.0, 4.0]
    summaries = [_repeat_summary(r, s) for r, s in enumerate(scales)]
    frame = _conversation_requests(scales)
    cell = combine_repeats(summaries, frame)
    dropped = combine_repeats(summaries[:2], frame[frame["repeat"] < 2])
    for name in ("n_ok", "repeats", "wall_s", "prefix_cache_queries"):
        assert cell[name] != dropped[name], name
    # the server's clocks: summed over every repeat, so that sum / count is their mean
    assert cell["request_prefill_time_seconds_sum"] == pytest.approx(0.3 * 6.0)
    assert cell["request_prefill_time_seconds_count"] == 18
    assert cell["mean_ttft_hi_s"] > dropped["mean_ttft_hi_s"]  # the slow repeat is seen
    with pytest.raises(ValueError, match="repeats"):
        combine_repeats(summaries[:2], frame)  # a repeat's requests without its summary
    changed = [*summaries[:2], {**summaries[2], "concurrency": 4}]
    with pytest.raises(ValueError, match="concurrency"):
        combine_repeats(changed, frame)


def test_odd_repeats_read_as_words():
    assert serving_stats.odd_repeats_text([], 3) == ""
    assert serving_stats.odd_repeats_text([2], 3) == "repeat 2 stands apart"
    assert serving_stats.odd_repeats_text([0, 3], 5) == "repeats 0 and 3 stand apart"
    assert serving_stats.odd_repeats_text([0, 1, 2], 3) == "the repeats all differ from one another"


def test_repeats_a_few_per_cent_apart_are_not_odd_however_narrow_their_intervals():
    # 0.105 / 0.110 / 0.099 s with tight requests: the intervals do not overlap, yet the
    # repeats are 5-10 % apart, which is no news; a repeat 40 % off is flagged
    rng = np.random.default_rng(5)
    close = [rng.normal(m, 0.0005, 96) for m in (0.105, 0.110, 0.099)]
    assert serving_stats.outlier_repeats(close) == []
    assert serving_stats.outlier_repeats(close, share=0.05) != []  # the old rule flagged them
    far = [rng.normal(m, 0.01, 12) for m in (1.754, 1.842, 1.088)]
    assert serving_stats.outlier_repeats(far) == [2]


def test_the_interval_is_called_95_only_with_enough_repeats():
    assert serving_stats.range_coverage(3) == pytest.approx(0.75)
    assert serving_stats.range_coverage(6) > 0.95 > serving_stats.range_coverage(5)
    assert serving_stats.interval_label(3) == "two-level bootstrap interval, 3 repeats"
    assert serving_stats.interval_label(6) == "95 % interval"
    note = serving_stats.interval_note(3)
    assert "75%" in note and "not a 95 % interval" in note
    assert "a 95 % interval" in serving_stats.interval_note(8)
    # one repeat (notebook 08's anti-patterns on a CPU): an interval over its requests only
    assert serving_stats.interval_label(1) == "bootstrap interval over its requests, 1 repeat"
    assert "one repeat" in serving_stats.interval_note(1)
    from analysis.serving.tables import readable_table

    table = pd.DataFrame(
        {
            "mode": ["cache"],
            "prefix_regime": ["0"],
            "concurrency": [1],
            "repeats": [3],
            "mean_ttft_s": [0.1],
            "mean_ttft_lo_s": [0.09],
            "mean_ttft_hi_s": [0.11],
            "notes": [""],
        }
    )
    (name,) = [c for c in readable_table(table, ("mean_ttft",)).columns if "TTFT" in c]
    assert name == "mean TTFT (s), median of 3 repeats [two-level bootstrap interval, 3 repeats]"
    (name,) = [
        c for c in readable_table(table.assign(repeats=1), ("mean_ttft",)).columns if "TTFT" in c
    ]
    assert name == "mean TTFT (s), one repeat [bootstrap interval over its requests, 1 repeat]"


def test_the_lookup_cost_reading_says_what_this_run_measured_and_stays_unresolved():
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9] * 4, [1, 2, 3, 4, 5, 6, 7, 8, 9] * 3 + [0] * 5]
    rows = prefix_match.compare_lookup_costs(prompts, 4, repeats=3)
    assert [r["kind"] for r in rows] == ["radix", "blockhash"]
    assert all(
        r["us_per_request_min"] <= r["us_per_request_median"] <= r["us_per_request_max"]
        for r in rows
    )
    reading = prefix_match.lookup_cost_reading(rows)
    assert reading.startswith("Measured in this run") and "unresolved" in reading

    def fake(low, high):
        row = {"method": "m", "repeats": 3, "us_per_request_median": 1.0}
        return [
            {**row, "kind": "radix", "trie_over_hash_min": low, "trie_over_hash_max": high},
            {**row, "kind": "blockhash", "trie_over_hash_min": low, "trie_over_hash_max": high},
        ]

    assert "trie was faster in every repeat" in prefix_match.lookup_cost_reading(fake(0.7, 0.9))
    assert "trie was slower in every repeat" in prefix_match.lookup_cost_reading(fake(1.1, 1.3))
    assert "disagree" in prefix_match.lookup_cost_reading(fake(0.9, 1.1))
    for low, high in ((0.7, 0.9), (1.1, 1.3)):  # a direction in one run is never the answer
        assert "unresolved" in prefix_match.lookup_cost_reading(fake(low, high))


def test_the_speed_probe_counts_each_sizes_fastest_request_so_a_cold_one_moves_nothing():
    from analysis.serving.bench_run import probe_rate, speed_note

    sizes = [32, 1024, 32, 1024]
    warm = [0.02, 0.40, 0.02, 0.40]
    cold_short = [0.35, 0.40, 0.02, 0.41]  # the first request paid a one-off cost
    assert probe_rate(sizes, warm, 1024) == pytest.approx(992 / 0.38)
    assert probe_rate(sizes, cold_short, 1024) == pytest.approx(992 / 0.38)
    assert speed_note(probe_rate(sizes, warm, 1024), probe_rate(sizes, cold_short, 1024)) == ""
    # a single cold pair is what flagged quiet cells: its short request ate the gap
    assert speed_note(
        probe_rate(sizes[:2], warm[:2], 1024), probe_rate(sizes[:2], cold_short[:2], 1024)
    )
    slower = [0.03, 0.80, 0.03, 0.82]  # the whole machine halved: still flagged
    assert speed_note(probe_rate(sizes, warm, 1024), probe_rate(sizes, slower, 1024))
