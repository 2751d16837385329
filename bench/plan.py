"""Bench: a whole capacity plan (`python -m analysis plan`) over the whole multi-turn trace.

Targets: 8 engine points (replay, vLLM's scheduler) plus the ideal, LRU and Belady curves in
the engine's order; the bounds in engine order no more than 2x slower than in trace order
(the reordering itself is a gather). Results go to a scratch root, so nothing is reused.
Run alone with `python bench/run.py plan`.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

BLOCK_SIZE = 16
CONCURRENCY = 16
POINTS = 8
CURVE_POINTS = 24


def main() -> dict[str, float]:
    from analysis.platform.paths import cache_dir, traces_dir

    path = traces_dir() / "multi_turn.parquet"
    if not path.is_file():
        print(f"skipped: {path} is missing (build it with `make traces`)")
        return {}
    models = cache_dir() / "models"
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as scratch:
        (Path(scratch) / "data" / "cache").mkdir(parents=True)
        if models.is_dir():  # the local model replay names, not rebuilt
            (Path(scratch) / "data" / "cache" / "models").symlink_to(models)
        previous = os.environ.get("PREFIX_CACHE_LAB_ROOT")
        os.environ["PREFIX_CACHE_LAB_ROOT"] = scratch
        try:
            return run(path)
        finally:
            if previous is None:
                os.environ.pop("PREFIX_CACHE_LAB_ROOT", None)
            else:
                os.environ["PREFIX_CACHE_LAB_ROOT"] = previous


def run(path: Path) -> dict[str, float]:
    from analysis.metrics import bounds
    from analysis.sweeps import capacity_plan

    started = time.perf_counter()
    trace = capacity_plan.plan_trace(path, BLOCK_SIZE)
    settings = capacity_plan.PlanSettings(concurrency=CONCURRENCY, points=POINTS, refine=0)
    load_s = time.perf_counter() - started
    mark = time.perf_counter()
    points, spare = capacity_plan.engine_points(trace, settings)
    replay_s = time.perf_counter() - mark
    frame = trace.bounds_frame
    _timed_curves(frame.head(200))  # compile the kernels (numba) before anything is timed
    trace_s, _ = _timed_curves(frame)
    mark = time.perf_counter()
    ordered = bounds.in_engine_order(frame, spare.admissions)
    order_s = time.perf_counter() - mark
    engine_s, engine_curves = _timed_curves(ordered)
    total = time.perf_counter() - started
    blocks = ", ".join(f"{n:,}" for n in points["num_blocks"])
    print(
        f"whole multi-turn trace: {len(frame):,} requests, {CONCURRENCY} clients, block "
        f"{BLOCK_SIZE}; engine points at num_blocks {blocks}"
    )
    print(f"  read + prepare             {load_s:8.1f} s")
    print(f"  replay, {len(points)} points          {replay_s:8.1f} s")
    curves = f"index, LRU and Belady at {CURVE_POINTS} capacities"
    print(f"  bounds in trace order      {trace_s:8.1f} s ({curves})")
    print(f"  reorder to engine order    {order_s:8.1f} s")
    print(f"  bounds in engine order     {engine_s:8.1f} s")
    print(f"  whole plan                 {total:8.1f} s")
    lru = engine_curves[engine_curves["policy"] == "lru"]
    top = lru.loc[lru["capacity"].idxmax()]
    print(f"  LRU in engine order: {top['hit_rate']:.2%} at {int(top['capacity']):,} blocks")
    return {
        "engine-order bounds / trace-order bounds (target <= 2)": (order_s + engine_s) / trace_s,
        "whole plan, 8 replay points + bounds (s)": total,
    }


def _timed_curves(frame):
    """Seconds to index `frame` and draw LRU and Belady at CURVE_POINTS capacities."""
    from analysis.metrics import bounds

    mark = time.perf_counter()
    index = bounds.index_trace(frame, include_outputs=True)
    capacities = bounds.default_capacities(index, BLOCK_SIZE, CURVE_POINTS, low=1)
    curves = bounds.capacity_curves(index, BLOCK_SIZE, capacities, ["lru", "opt"], progress=False)
    return time.perf_counter() - mark, curves
