"""What a timed run says about latency and throughput, as one plain summary.

A timed run (replay on a step-cost clock, or the real engine on the wall clock) has, per
request, its arrival, first token and finish. From them: TTFT, TPOT (decode time per token after
the first), end-to-end time, throughput over the run's span, and goodput under an SLO (requests
per second that met both latency targets). `python -m analysis predict` prints this as JSON.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis.timing.calibration import latencies

QUANTILES = {"mean": None, "p50": 0.5, "p90": 0.9, "p99": 0.99}


def _spread(values: pd.Series) -> dict[str, float | None]:
    """Mean and quantiles of one latency, in seconds (None where no request has it)."""
    if values.empty:
        return dict.fromkeys(QUANTILES)
    return {
        name: float(values.mean() if q is None else values.quantile(q))
        for name, q in QUANTILES.items()
    }


def summarise(
    requests: pd.DataFrame,
    *,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> dict[str, Any]:
    """Latency spreads, throughput and (with an SLO) goodput of the finished, timed requests."""
    done = requests[(requests["status"] == "finished") & requests["ttft_s"].notna()]
    times = latencies(done)
    span = float(done["finish_s"].max() - done["arrival_s"].min()) if len(done) else 0.0
    decoding = done["output_tokens"] > 1
    summary: dict[str, Any] = {
        "requests": int(len(done)),
        "span_s": span,
        "ttft_s": _spread(times["ttft_s"]),
        "tpot_s": _spread(times["tpot_s"][decoding]),
        "e2e_s": _spread(times["e2e_s"]),
        "throughput_req_s": len(done) / span if span > 0 else None,
        "throughput_output_tok_s": float(done["output_tokens"].sum()) / span if span > 0 else None,
    }
    if slo_ttft_s is not None or slo_tpot_s is not None:
        met = pd.Series(True, index=done.index)
        if slo_ttft_s is not None:
            met &= times["ttft_s"] <= slo_ttft_s
        if slo_tpot_s is not None:
            met &= ~decoding | (times["tpot_s"] <= slo_tpot_s)
        summary["slo"] = {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s}
        summary["slo_attained"] = float(met.mean()) if len(done) else None
        summary["goodput_req_s"] = float(met.sum()) / span if span > 0 else None
    return summary
