"""Results that scale: block events kept as exact aggregates (`analysis.engines.blockstats`), in
full only when asked for, and the replay hot path's savings changing no count."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.engines import RunConfig, RunResult
from analysis.engines.blockstats import BlockStats, describe_counts
from analysis.engines.synthetic import synthetic_trace
from analysis.metrics import hitrates

SMALL = {"block_size": 16, "max_model_len": 2048}


def run_replay(trace: pd.DataFrame, **changes) -> RunResult:
    from analysis.runs import run

    config = RunConfig(trace="synthetic", engine="replay", **{**SMALL, **changes})
    return run(trace, config, progress=False)


@pytest.mark.parametrize("seed", range(5))
def test_quantiles_from_counts_are_numpys(seed):
    rng = np.random.default_rng(seed)
    values = rng.geometric(0.01, size=rng.integers(1, 3000)).astype(np.int64)
    distinct, counts = np.unique(values, return_counts=True)
    from analysis.metrics.hitrates import _describe

    assert describe_counts(pd.Series(counts, index=distinct)) == _describe(values.astype(float))


def tiny_events() -> pd.DataFrame:
    """Hand-made events: hash a stored at 1, hit at 3 and 7; b stored at 2, hit at 2, evicted."""
    return pd.DataFrame(
        {
            "step": [1, 2, 2, 3, 4, 7],
            "time_s": [0.1, 0.2, 0.2, 0.3, 0.4, 0.7],
            "event": pd.Categorical(
                ["stored", "stored", "hit", "hit", "evicted", "hit"],
                categories=["stored", "hit", "evicted"],
            ),
            "block_hash": ["a", "b", "b", "a", "b", "a"],
        }
    )


def test_aggregates_by_hand():
    stats = BlockStats.from_events(tiny_events())
    assert stats.events == {"stored": 2, "hit": 3, "evicted": 1}
    assert stats.hits_per_block.to_dict() == {1: 1, 2: 1}  # b hit once, a twice
    assert stats.reuse_gap_steps.to_dict() == {0: 1, 2: 1, 4: 1}
    assert stats.reuse_gaps().tolist() == [0.0, 2.0, 4.0]
    assert BlockStats.from_frame(stats.to_frame()) == stats


@pytest.mark.engine
def test_aggregates_give_the_numbers_the_events_give(tmp_path):
    trace = synthetic_trace(30, turns=(1, 4), user_tokens=(50, 300), reply_tokens=(20, 120), seed=6)
    result = run_replay(trace, mode="batch", num_blocks=140)  # preemption and eviction
    events = result.block_events
    assert (events["event"] == "evicted").any() and (events["event"] == "hit").any()
    from_events = hitrates.block_reuse(events)
    from_stats = hitrates.block_reuse(result.block_stats)
    assert from_stats.pop("reuse_gap_seconds") is None
    from_events.pop("reuse_gap_seconds")
    assert from_stats == from_events
    accesses = events[events["event"] != "evicted"]
    np.testing.assert_array_equal(
        result.block_stats.reuse_gaps(), np.sort(hitrates.reuse_gaps(accesses)[0])
    )
    # written without the events, read back with the same aggregates
    folder = result.write(tmp_path / "aggregate")
    assert not (folder / "block_events.parquet").exists()
    again = RunResult.read(folder)
    assert again.block_events is None and again.block_stats == result.block_stats
    assert hitrates.block_reuse(again.block_stats) == hitrates.block_reuse(result.block_stats)


@pytest.mark.engine
def test_full_block_events_when_asked(tmp_path):
    trace = synthetic_trace(6, turns=(1, 3), seed=2)
    result = run_replay(trace, mode="batch", num_blocks=400, block_events="full")
    assert result.config_id != run_replay(trace, mode="batch", num_blocks=400).config_id
    again = RunResult.read(result.write(tmp_path / "full"))
    pd.testing.assert_frame_equal(again.block_events, result.block_events)
    assert again.block_stats == BlockStats.from_events(again.block_events)
