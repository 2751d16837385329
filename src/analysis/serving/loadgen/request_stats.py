"""Statistics of a run's per-request table: percentiles, latencies, throughput.

Computed from the results table alone, after the run, so they need neither the client nor a
server.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from analysis.serving.loadgen.records import STATUSES


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (linear interpolation) of the finite values; NaN if there are none."""
    array = np.asarray([v for v in values if v is not None], dtype=float)
    array = array[np.isfinite(array)]
    return float(np.percentile(array, q)) if array.size else math.nan


def _mean(values: Iterable[float]) -> float:
    array = np.asarray(list(values), dtype=float)
    array = array[np.isfinite(array)]
    return float(array.mean()) if array.size else math.nan


def latency_stats(frame: pd.DataFrame, prefix: str = "") -> dict[str, float]:
    """mean / p50 / p95 of TTFT, end-to-end latency and TPOT over the `ok` rows of `frame`."""
    ok = frame[frame["status"] == "ok"]
    stats = {}
    for column in ("ttft", "e2e", "tpot"):
        if f"{column}_s" not in ok.columns:
            continue
        values = ok[f"{column}_s"].to_numpy(dtype=float)
        stats[f"mean_{column}{prefix}_s"] = _mean(values)
        stats[f"p50_{column}{prefix}_s"] = percentile(values, 50)
        stats[f"p95_{column}{prefix}_s"] = percentile(values, 95)
    return stats


def requests_in_flight(frame: pd.DataFrame) -> tuple[int, float]:
    """The most requests in flight at once and the time-weighted mean number in flight over
    the span from the first start to the last end, from each request's start and end-to-end
    time (requests without both are left out): what a run's concurrency really was."""
    start = frame["start_s"].to_numpy(dtype=float)
    end = start + frame["e2e_s"].to_numpy(dtype=float)
    keep = np.isfinite(start) & np.isfinite(end)
    start, end = start[keep], end[keep]
    if not start.size:
        return 0, 0.0
    times = np.concatenate([start, end])
    steps = np.concatenate([np.ones_like(start), -np.ones_like(end)])
    order = np.lexsort((steps, times))  # at a tie an end comes before a start
    times, in_flight = times[order], np.cumsum(steps[order])
    span = times[-1] - times[0]
    mean = float(np.sum(in_flight[:-1] * np.diff(times)) / span) if span > 0 else float(len(start))
    return int(in_flight.max()), mean


def summarize_requests(frame: pd.DataFrame, wall_s: float) -> dict[str, Any]:
    """Per-run statistics. Latencies exclude warm-up rows; `*_incl_warmup_s` include them.

    Throughput is over the measured phase: measured `ok` requests (and their output tokens)
    per second of its wall-clock time.
    """
    measured = frame[~frame["warmup"].astype(bool)]
    counts = {f"n_{s}": int((measured["status"] == s).sum()) for s in STATUSES}
    ok = measured[measured["status"] == "ok"]
    summary: dict[str, Any] = {
        "n_requests": len(measured),
        **counts,
        "n_warmup": int(frame["warmup"].astype(bool).sum()),
        **latency_stats(measured),
        **{
            k: v
            for k, v in latency_stats(frame, "_incl_warmup").items()
            if k.startswith(("mean", "p95"))
        },
        "wall_s": float(wall_s),
        "req_s": len(ok) / wall_s if wall_s > 0 else math.nan,
        "tok_s": float(ok["output_tokens"].sum()) / wall_s if wall_s > 0 else math.nan,
        "prompt_tokens": int(ok["sent_prompt_tokens"].sum()),
        "output_tokens": int(ok["output_tokens"].sum()),
    }
    warm = frame[frame["warmup"].astype(bool) & (frame["status"] == "ok")]
    summary["warmup_ttft_s"] = _mean(warm["ttft_s"]) if len(warm) else math.nan
    return summary
