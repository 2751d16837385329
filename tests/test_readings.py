"""Prose rendered from results: each reading says the numbers it is given, and the words that
compare them follow the numbers (a reading whose words were fixed would pass on any data)."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.data.experiments import SEED_001_RESULTS
from analysis.metrics import seed_verdicts
from analysis.serving import gpu_reference
from analysis.sweeps.few_blocks_reading import curves_reading, fewest_blocks_row
from analysis.sweeps.turns_reading import multi_vs_single_reading


def capacity_points(single_all: float, multi_all: float) -> pd.DataFrame:
    rows = []
    for trace, all_rate, first, ideal in (
        ("single_turn", single_all, 0.076, 0.089),
        ("multi_turn", multi_all, 0.027, 0.841),
    ):
        rows.append(
            dict(
                trace=trace,
                block_size=16,
                num_blocks=513,
                concurrency=32,
                all_prefill_rate=all_rate,
                first_prefill_rate=first,
                ideal_rate=ideal,
            )
        )
        rows.append(
            dict(
                trace=trace,
                block_size=16,
                num_blocks=9000,
                concurrency=32,
                all_prefill_rate=ideal,
                first_prefill_rate=ideal,
                ideal_rate=ideal,
            )
        )
    return pd.DataFrame(rows)


def test_the_curves_reading_quotes_the_fewest_blocks_points():
    text = curves_reading(capacity_points(0.314, 0.218), 16)
    assert "all-prefill is 31.4%, above the traffic's ideal of 8.9%" in text
    assert "all-prefill is 21.8%, below its ideal of 84.1%" in text
    assert "513 blocks of 16 tokens" in text and "32 conversations in flight" in text


def test_the_curves_reading_turns_when_the_numbers_do():
    text = curves_reading(capacity_points(0.05, 0.9), 16)
    assert "5.0%, below the traffic's ideal" in text
    assert "90.0%, above its ideal" in text


def test_a_missing_block_size_is_a_clear_error():
    with pytest.raises(ValueError, match="block size 32"):
        fewest_blocks_row(capacity_points(0.3, 0.2), "single_turn", 32)


def test_the_turns_reading_computes_its_ratio():
    text = multi_vs_single_reading(0.0892, 0.2058, 0.8751, "first 500 conversations")
    assert "8.9% on the sample (first 500 conversations), 20.6% ideal" in text
    assert "87.5% for multi-turn, 4.3x" in text


@pytest.mark.parametrize(
    ("seed", "ours", "expected"),
    [
        ("0.97%", 0.0, "reproduced"),
        ("0.97%", 0.0200, "explained-different"),
        ("23.44%", 0.4032, "explained-different"),
    ],
)
def test_the_verdict_rule_is_one_percentage_point(seed, ours, expected):
    assert seed_verdicts.verdict(seed, ours) == expected


def regime(preemptions: int = 0, inflated: bool = False) -> pd.DataFrame:
    rows = []
    for template, single, multi in (("llama3.2", 0.2516, 0.4436), ("llama3", 0.0, 0.4032)):
        for trace, rate in (("single-turn", single), ("multi-turn", multi)):
            rows.append(
                {
                    "template": template,
                    "trace": trace,
                    "requests": 77,
                    "finished": 77,
                    seed_verdicts.CORRECT: rate,
                    seed_verdicts.FIRST: rate,
                    seed_verdicts.ALL: rate + (0.1 if inflated else 0.0),
                    "preemptions": preemptions,
                }
            )
    return pd.DataFrame(rows)


def test_the_seed001_verdicts_quote_the_seed_and_render_ours():
    text = seed_verdicts.seed001_verdicts(regime(), shared_blocks=3, block_size=8)
    assert (
        f'"{SEED_001_RESULTS["single-turn"]["correct hit rate (first prefill)"]}" → 0.00%' in text
    )
    assert "(reproduced), 25.16% with Llama 3.2's (explained-different)" in text
    assert "40.32% (Llama 3.0, explained-different)" in text
    assert "3 whole shared blocks of 8" in text
    assert "all-prefill = first-prefill in every run, 0 preemptions" in text
    changed = seed_verdicts.seed001_verdicts(regime(5, inflated=True), 3, 8)
    assert "all-prefill differs from first-prefill, 20 preemptions" in changed


def test_the_seed000_verdict_reads_its_table():
    rows = [
        {
            "template": "llama3",
            "blocks": blocks,
            "requests": 77,
            "preemptions": pre,
            seed_verdicts.ALL_PREFILL: a,
            seed_verdicts.FIRST_PREFILL: f,
            seed_verdicts.ALL_BLOCKS: b,
        }
        for blocks, pre, a, f, b in (
            (16, 60, 0.232, 0.0, 0.263),
            (128, 40, 0.081, 0.003, 0.093),
            (1024, 0, 0.003, 0.003, 0.004),
        )
    ]
    text = seed_verdicts.seed000_verdict(pd.DataFrame(rows))
    assert "At 16 blocks requests are preempted (60 times)" in text
    assert "23.2% against 0.0%, 26.3% counted in blocks" in text
    assert "(8.1% against 0.3%)" in text and "the 77 requests" in text
    assert "the two rates are equal" in text
    rows[-1]["preemptions"] = 4
    assert "4 preemptions remain" in seed_verdicts.seed000_verdict(pd.DataFrame(rows))


def test_the_gpu_quote_computes_its_speedups_from_the_committed_times(tmp_path):
    table = gpu_reference.load_reference()
    text = gpu_reference.gpu_quote(table)
    assert text.startswith("> ")
    assert "18.7 vs 56.2 ms for one request (3.0x)" in text
    assert "30.6 vs 400 ms for 8 at once (13.1x)" in text
    slower = tmp_path / "slower.csv"
    table.drop(columns="speedup").assign(off_ms=table["off_ms"] * 2).to_csv(slower, index=False)
    assert "18.7 vs 112.4 ms for one request (6.0x)" in gpu_reference.gpu_quote(
        gpu_reference.load_reference(slower)
    )
