"""Statistics of serving runs: per-cell medians and bootstrap intervals over repeats, and the
tests of seed 003's hit-rate model (E[TTFT] = h·TTFT_hit + (1-h)·TTFT_miss, the f·h dilution).

A cell is one (mode, workload regime, concurrency) measured `repeats` times, each repeat from
an emptied prefix cache. Latency statistics pool the measured requests of all repeats; their
95 % interval comes from a bootstrap that resamples requests within each repeat (so every
resample keeps the repeats' sizes). Requests/s has one value per repeat: the interval
resamples those values (with 3 repeats it is coarse, and says so by being wide).

Nothing here imports vllm or torch, and nothing here asserts on time: these are numbers to
show, never to compare in a test.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

N_BOOT = 2000
LEVEL = 0.95
METRICS = ("ttft", "tpot", "e2e")


def _p95(values: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.percentile(values, 95, axis=axis)


STATISTICS: dict[str, Callable[..., np.ndarray]] = {"mean": np.mean, "p95": _p95}


def bootstrap_interval(
    groups: Sequence[np.ndarray],
    statistic: str = "mean",
    *,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over the pooled values of `groups`,
    resampling within each group. (nan, nan) when there are fewer than 2 values."""
    groups = [np.asarray(g, dtype=float) for g in groups]
    groups = [g[np.isfinite(g)] for g in groups]
    groups = [g for g in groups if g.size]
    if sum(g.size for g in groups) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    draws = [g[rng.integers(0, g.size, size=(n_boot, g.size))] for g in groups]
    pooled = np.concatenate(draws, axis=1)
    values = STATISTICS[statistic](pooled, axis=1)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return float(low), float(high)


def _stat(values: np.ndarray, statistic: str) -> float:
    values = values[np.isfinite(values)]
    return float(STATISTICS[statistic](values)) if values.size else math.nan


def cell_statistics(requests: pd.DataFrame, walls: dict[int, float]) -> dict[str, float]:
    """One cell's statistics from its per-request rows (column `repeat`; warm-up rows are
    ignored) and each repeat's measured wall time.

    For each of TTFT, TPOT, e2e and mean/p95: `<stat>_<metric>_s` (pooled over repeats),
    `..._median_s` (median of the repeats' values), `..._lo_s` / `..._hi_s` (bootstrap 95 %).
    For requests/s: `req_s` (median of the repeats), `req_s_lo` / `req_s_hi`."""
    measured = requests[~requests["warmup"].astype(bool)]
    ok = measured[measured["status"] == "ok"]
    repeats = sorted(walls)
    out: dict[str, float] = {"repeats": len(repeats), "n_measured": len(measured)}
    for metric in METRICS:
        column = f"{metric}_s"
        groups = [ok.loc[ok["repeat"] == r, column].to_numpy(dtype=float) for r in repeats]
        pooled = np.concatenate(groups) if groups else np.array([])
        for statistic in STATISTICS:
            name = f"{statistic}_{metric}"
            per_repeat = [_stat(g, statistic) for g in groups]
            out[f"{name}_s"] = _stat(pooled, statistic)
            out[f"{name}_median_s"] = float(np.nanmedian(per_repeat)) if groups else math.nan
            out[f"{name}_lo_s"], out[f"{name}_hi_s"] = bootstrap_interval(groups, statistic)
    rates = np.array(
        [(ok["repeat"] == r).sum() / walls[r] if walls[r] > 0 else math.nan for r in repeats]
    )
    out["req_s"] = float(np.nanmedian(rates)) if rates.size else math.nan
    out["req_s_lo"], out["req_s_hi"] = bootstrap_interval([rates], "mean")
    if rates.size == 1:
        out["req_s_lo"] = out["req_s_hi"] = float(rates[0])
    return out


def interval_text(value: float, low: float, high: float, unit: str = "s", digits: int = 3) -> str:
    """`0.123 s [0.110, 0.140]`: a value with its 95 % interval, for generated prose."""
    return f"{value:.{digits}f} {unit} [{low:.{digits}f}, {high:.{digits}f}]".replace(" ]", "]")


# --------------------------------------------------------------------------------------------
# Seed 003's hit-rate model
# --------------------------------------------------------------------------------------------


def request_hits(requests: pd.DataFrame, block_size: int) -> pd.Series:
    """Whether each request was served (partly) from the prefix cache: at least one block of
    its prompt was cached, by the server's own per-request count (`cached_tokens`)."""
    cached = pd.to_numeric(requests["cached_tokens"], errors="coerce").fillna(0)
    return cached >= block_size


def mixture_prediction(h: float, ttft_hit: float, ttft_miss: float) -> float:
    """Seed 003: E[TTFT] = h·TTFT_hit + (1-h)·TTFT_miss."""
    return h * ttft_hit + (1.0 - h) * ttft_miss


def dilution_test(
    mixed_on: pd.DataFrame,
    all_hit_on: pd.DataFrame,
    miss_off: pd.DataFrame,
    *,
    eligible_share: float,
    block_size: int,
) -> dict[str, float]:
    """Mixed traffic: a share f of requests shares the prefix, the rest have unique prefixes
    of the same length. h (share of measured requests that hit, by the server's counts) is
    compared with f, and the measured mean TTFT of the mixed run with caching on with the
    mixture h·TTFT_hit + (1-h)·TTFT_miss, where TTFT_hit is the all-hit run's mean (caching
    on, f = 1) and TTFT_miss the caching-off run's mean at the same prompt length."""

    def measured_ok(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[~frame["warmup"].astype(bool) & (frame["status"] == "ok")]

    mixed = measured_ok(mixed_on)
    hits = request_hits(mixed, block_size)
    h = float(hits.mean()) if len(mixed) else math.nan
    ttft_hit = float(measured_ok(all_hit_on)["ttft_s"].mean())
    ttft_miss = float(measured_ok(miss_off)["ttft_s"].mean())
    predicted = mixture_prediction(h, ttft_hit, ttft_miss)
    measured = float(mixed["ttft_s"].mean())
    groups = [
        mixed.loc[mixed["repeat"] == r, "ttft_s"].to_numpy() for r in mixed["repeat"].unique()
    ]
    low, high = bootstrap_interval(groups, "mean")
    return {
        "eligible_share": eligible_share,
        "hit_share": h,
        "ttft_hit_s": ttft_hit,
        "ttft_miss_s": ttft_miss,
        "ttft_mixed_hits_s": float(mixed.loc[hits, "ttft_s"].mean()),
        "ttft_mixed_misses_s": float(mixed.loc[~hits, "ttft_s"].mean()),
        "predicted_ttft_s": predicted,
        "measured_ttft_s": measured,
        "measured_lo_s": low,
        "measured_hi_s": high,
        "predicted_saving": 1.0 - predicted / ttft_miss if ttft_miss else math.nan,
        "measured_saving": 1.0 - measured / ttft_miss if ttft_miss else math.nan,
        "prediction_in_interval": bool(low <= predicted <= high),
    }


def prefill_line(requests_off: pd.DataFrame) -> tuple[float, float]:
    """Least-squares TTFT = a + b·prompt_tokens over the ok, measured requests of a
    caching-off run: the fixed cost a (s) and the prefill cost b (s per token)."""
    ok = requests_off[~requests_off["warmup"].astype(bool) & (requests_off["status"] == "ok")]
    x = ok["sent_prompt_tokens"].to_numpy(dtype=float)
    y = ok["ttft_s"].to_numpy(dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        return math.nan, math.nan
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def token_mixture_test(requests_on: pd.DataFrame, requests_off: pd.DataFrame) -> dict[str, float]:
    """Real conversations: each request's own hit share h_i = cached_i / prompt_i (server's
    count). With TTFT_miss(i) = a + b·prompt_i fitted on the caching-off run, the model
    predicts TTFT_on(i) = a + b·(1 - h_i)·prompt_i; compare its mean with the measured one."""
    a, b = prefill_line(requests_off)
    ok = requests_on[~requests_on["warmup"].astype(bool) & (requests_on["status"] == "ok")]
    prompt = ok["sent_prompt_tokens"].to_numpy(dtype=float)
    cached = pd.to_numeric(ok["cached_tokens"], errors="coerce").fillna(0).to_numpy(dtype=float)
    predicted = a + b * (prompt - cached)
    groups = [ok.loc[ok["repeat"] == r, "ttft_s"].to_numpy() for r in ok["repeat"].unique()]
    low, high = bootstrap_interval(groups, "mean")
    return {
        "fixed_cost_s": a,
        "prefill_s_per_1k_tokens": b * 1000.0,
        "token_hit_rate": float(cached.sum() / prompt.sum()) if prompt.sum() else math.nan,
        "request_hit_share": float((cached > 0).mean()) if len(cached) else math.nan,
        "predicted_ttft_s": float(predicted.mean()) if len(predicted) else math.nan,
        "measured_ttft_s": float(ok["ttft_s"].mean()),
        "measured_lo_s": low,
        "measured_hi_s": high,
    }
