"""A grid's results: running its missing points, and collecting the finished ones into a table.

A module of its own because it sits above the executors (`ensure_grid` runs points through
them) while `grid` sits below them (the executors read points and result folders from it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.platform.errors import GridError
from analysis.sweeps.executors import run_points
from analysis.sweeps.grid import (
    Point,
    find_point,
    grid_points,
    is_done,
    resolve_trace,
    result_folder,
)


def run_point(point: Point, *, force: bool = False, progress: bool | None = False) -> Path:
    """Run one point inline unless its result is complete; the result folder either way."""
    from analysis.runs import run_and_write

    folder, _ = run_and_write(point.config, force=force, progress=progress)
    return folder


def ensure_grid(name_or_path: str | Path, *more: str | Path, progress: bool = True) -> list[Point]:
    """Run every point of the grid (and of `more` grids) whose result is missing (finished ones
    are kept), in one process per usable core: the grids together, so that the workers start
    once (each imports vLLM, about 14 s of a core)."""
    from analysis.platform.hardware import usable_cores

    points = [point for grid in (name_or_path, *more) for point in grid_points(grid)]
    run_points(points, "local", workers=usable_cores(), progress=progress)
    return points


def collect(name_or_path: str | Path, *, run_missing: bool = False) -> pd.DataFrame:
    """One row per finished point of the grid: its configuration and headline numbers.

    With `run_missing`, points without a result are run first (inline)."""
    from analysis.platform.manifest import read_json

    points = ensure_grid(name_or_path) if run_missing else grid_points(name_or_path)
    rows = []
    for point in points:
        folder = result_folder(point)
        if not is_done(point, folder):
            continue
        summary = read_json(folder / "summary.json")
        rows.append(
            {"point_id": point.point_id, "series": point.series}
            | point.config.to_dict()
            | _headline(summary)
        )
    return pd.DataFrame(rows)


def _headline(summary: dict[str, Any]) -> dict[str, Any]:
    first, every = summary["first_prefill"], summary["all_prefill"]
    return {
        "requests": summary["requests_finished"],
        "requests_skipped": summary["requests_skipped"],
        "first_prefill_hits": first["hits"],
        "first_prefill_queries": first["queries"],
        "first_prefill_rate": first["rate"],
        "all_prefill_hits": every["hits"],
        "all_prefill_queries": every["queries"],
        "all_prefill_rate": every["rate"],
        "exported_rate": summary["exported"]["rate"],
        "preemptions": summary["preemptions"],
        "readmissions": summary["readmissions"],
        "recompute_share": summary["recompute_share"],
        "prompt_tokens": summary["prompt_tokens"],
        "output_tokens": summary["output_tokens"],
    }


def with_ideal(frame: pd.DataFrame) -> pd.DataFrame:
    """Add `ideal_rate`: the infinite-cache hit rate of each row's sample and block size.

    Replies count as cached when they are decoded as recorded (teacher forcing), as in the
    engine; rows whose replies are capped or free-running get the prompts-only ideal (free
    tokens never appear in a later prompt) or NaN (a cap is not modelled by the bound)."""
    from analysis.data.traces import load_trace
    from analysis.engines.workload import limit_trace
    from analysis.metrics import bounds

    frame = frame.copy()
    frame["ideal_rate"] = np.nan
    traces: dict[str, pd.DataFrame] = {}
    keys = ["trace", "limit", "block_size", "outputs", "max_output_tokens"]
    for key, rows in frame.groupby(keys, dropna=False, sort=False):
        trace, limit, block_size, outputs, cap = key
        if pd.notna(cap):
            continue
        if trace not in traces:
            traces[trace] = load_trace(resolve_trace(trace))
        sample = limit_trace(traces[trace], None if pd.isna(limit) else int(limit))
        rate = bounds.ideal_hit_rate(sample, int(block_size), include_outputs=outputs == "recorded")
        frame.loc[rows.index, "ideal_rate"] = rate
    return frame


def sample_limit(rows: pd.DataFrame) -> int | None:
    """The `limit` (first N conversations) shared by these result rows; None: whole traces."""
    limits = rows["limit"].drop_duplicates()
    if len(limits) != 1:
        raise GridError(f"rows mix samples (limit {sorted(map(str, limits))}): select one")
    value = limits.iloc[0]
    return None if value is None or pd.isna(value) else int(value)


def sample_words(rows: pd.DataFrame) -> str:
    """'first 500 conversations' or 'all conversations', for titles and printed tables."""
    limit = sample_limit(rows)
    return "all conversations" if limit is None else f"first {limit} conversations"


def read_result(name_or_path: str | Path, point_id: str):
    """The RunResult of one finished point: admissions, requests, block statistics (and block
    events where the point kept them in full)."""
    from analysis.engines import RunResult

    return RunResult.read(result_folder(find_point(grid_points(name_or_path), point_id)))
