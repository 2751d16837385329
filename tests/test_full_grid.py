"""The `full` grid: whole traces for the capacity, concurrency, block-size and outputs series,
replay engine, block sizes 16 and 32; and the sample helpers its notebooks use."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import sweeps
from analysis.platform.errors import GridError


def test_full_grid_runs_whole_traces_on_replay():
    points = sweeps.grid_points("full", block_budget=lambda config: 100_000)
    whole = [p for p in points if p.series != "engine-check"]
    assert {p.series for p in whole} == {"capacity", "concurrency", "block-size", "outputs"}
    assert all(p.config.limit is None and p.config.engine == "replay" for p in whole)
    capacity = [p for p in whole if p.series == "capacity"]
    assert {p.config.block_size for p in capacity} == {16, 32}
    assert {p.config.trace for p in capacity} == {"single_turn", "multi_turn"}
    assert all(p.config.block_events == "aggregate" for p in points)
    assert len({p.point_id for p in points}) == len(points)


def test_sample_limit_and_words():
    whole = pd.DataFrame({"limit": [None, None]})
    first = pd.DataFrame({"limit": [500.0, 500.0]})  # a column with NaN elsewhere is float
    assert sweeps.sample_limit(whole) is None and sweeps.sample_words(whole) == "all conversations"
    assert sweeps.sample_limit(first) == 500
    assert sweeps.sample_words(first) == "first 500 conversations"
    with pytest.raises(GridError, match="rows mix samples"):
        sweeps.sample_limit(pd.DataFrame({"limit": [500, None]}))
