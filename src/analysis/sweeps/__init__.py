"""Sweeps: the points of a grid (`configs/*.toml`) run through an engine, and their results.

- `grid`: the points of a grid file, where each point's result lives, whether it is done;
- `executors`: how the missing points run (`local` processes, or Ray tasks), written atomically;
- `results`: run what is missing, and collect the finished points into one table.

The names notebooks use are importable from here (`from analysis import sweeps`).
"""

from __future__ import annotations

from analysis.sweeps.fleet import fleet_table
from analysis.sweeps.grid import (
    Point,
    find_point,
    grid_path,
    grid_points,
    is_done,
    load_grid,
    log_spaced_blocks,
    no_pressure_blocks,
    points_frame,
    resolve_trace,
    result_folder,
)
from analysis.sweeps.results import (
    collect,
    ensure_grid,
    read_result,
    run_point,
    sample_limit,
    sample_words,
    with_ideal,
)

__all__ = [
    "Point",
    "collect",
    "ensure_grid",
    "find_point",
    "fleet_table",
    "grid_path",
    "grid_points",
    "is_done",
    "load_grid",
    "log_spaced_blocks",
    "no_pressure_blocks",
    "points_frame",
    "read_result",
    "resolve_trace",
    "result_folder",
    "run_point",
    "sample_limit",
    "sample_words",
    "with_ideal",
]
