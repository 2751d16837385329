"""Sweep rate: points of the `full` grid's capacity series through the Ray executor with 1 and
then 2 workers (a local Ray instance each), in one run; points/hour, requests/s and their ratio;
then the time the whole `full` grid takes.

The whole capacity series (32 whole-trace points of a minute or more each) would take far
longer than a benchmark should, so a spread of its points is timed (BENCH_SWEEP_POINTS, default
4, evenly over the series: both traces, both block sizes, small to large caches) and the whole
grid's time is ESTIMATED from their mean time per point, and said so. Points whose results
are already in data/results (`python -m analysis sweep --grid full`) add their measured
run time.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

GRID = "full"
SERIES = "capacity"


def _sample(points: list, count: int) -> list:
    """`count` points spread over the series (its ends included): small and large caches."""
    if count >= len(points):
        return points
    step = (len(points) - 1) / max(count - 1, 1)
    return [points[round(i * step)] for i in range(count)]


def _requests(points: list, results: Path) -> int:
    from analysis.platform.manifest import read_json
    from analysis.sweeps import result_folder

    return sum(
        read_json(result_folder(p, results) / "summary.json")["requests_finished"] for p in points
    )


def _timed(points: list, workers: int) -> tuple[float, int]:
    """Seconds to run the points on a fresh local Ray instance of `workers` CPUs, requests."""
    from analysis.sweeps.executors import run_points

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        run_points(points, "ray", workers=workers, results=Path(tmp), progress=False)
        seconds = time.perf_counter() - started
        return seconds, _requests(points, Path(tmp))


def _grid_seconds_measured(points: list) -> tuple[int, float]:
    """(finished points, sum of their run times) from the results already in data/results."""
    from analysis.platform.manifest import read_json
    from analysis.sweeps import is_done, result_folder

    done = [result_folder(p) for p in points if is_done(p)]
    return len(done), sum(read_json(f / "manifest.json")["timings"]["total_s"] for f in done)


def main() -> None:
    from analysis.sweeps import grid_points, result_folder
    from analysis.sweeps.executors import import_ray

    import_ray()
    points = grid_points(GRID)
    distinct = {result_folder(p).name: p for p in points}  # series share some points
    series = [p for p in points if p.series == SERIES]
    sample = _sample(series, int(os.environ.get("BENCH_SWEEP_POINTS", "4")))
    print(
        f"grid {GRID}: {len(points)} points ({len(distinct)} distinct); timing {len(sample)} of "
        f"the {len(series)} {SERIES} points: {', '.join(p.point_id for p in sample)}"
    )
    rates = {}
    for workers in (1, 2):
        seconds, requests = _timed(sample, workers)
        rates[workers] = seconds
        print(
            f"  ray, {workers} worker(s): {seconds:7.1f} s, "
            f"{len(sample) / seconds * 3600:6.1f} points/hour, {requests / seconds:8.0f} requests/s"
            " (worker start-up included)"
        )
    print(f"  2 workers / 1 worker: {rates[1] / rates[2]:.2f}x points/hour")
    per_point = rates[1] / len(sample)
    whole = [p for p in distinct.values() if p.config.limit is None]
    print(
        f"  whole {GRID} grid, ESTIMATED from these {len(sample)} points' mean "
        f"{per_point:.0f} s/point over its {len(whole)} whole-trace points (its "
        f"{len(distinct) - len(whole)} small-sample points left out): "
        f"{len(whole) * per_point / 60:.0f} min with 1 worker, "
        f"{len(whole) * per_point / 60 / (rates[1] / rates[2]):.0f} min with 2"
    )
    finished, seconds = _grid_seconds_measured(list(distinct.values()))
    if finished:
        print(
            f"  measured in data/results: {finished} of {len(distinct)} distinct points "
            f"finished, {seconds / 60:.0f} min of run time (sum over points)"
        )


if __name__ == "__main__":
    main()
