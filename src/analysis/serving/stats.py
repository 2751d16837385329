"""Statistics of serving runs, per repeat first: each statistic (mean or p95 of TTFT, TPOT,
end-to-end latency; requests/s) is computed on every repeat of a cell, and the cell reports the
median of the repeats' values with a 95 % interval from a two-level bootstrap (resample the
repeats, then the requests within each), so a repeat unlike the others widens the interval
instead of vanishing into a pooled mean. A repeat far from the others (its own interval apart
from theirs, and its value at least `ODD_REPEAT_SHARE` away from the median) is named in the
cell (`outlier_repeats`), not averaged away.

The interval is computed at the 95 % level, but with few repeats it cannot have that coverage:
resampling 3 repeats, it spans about their range, and the range of n repeats holds the median
of a repeat's value with probability 1 - 2 * 0.5**n (75 % for 3). So it is named for what it is
(`interval_label`, `interval_note`), a "95 % interval" only from `REPEATS_FOR_95` repeats on.

Column names say which statistic they hold:
- `mean_ttft_s`, `p95_ttft_s`, ...: the median over repeats of each repeat's mean (p95);
- `..._lo_s` / `..._hi_s`: its two-level bootstrap interval (see above for its coverage);
- `..._pooled_s`: the statistic over all repeats' requests pooled;
- `..._repeats`: one value per repeat, in repeat order.

Nothing here imports vllm or torch, and nothing here asserts on time: these are numbers to
show, never to compare in a test.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from analysis.serving.intervals import Interval, compare
from analysis.serving.loadgen.request_stats import requests_in_flight

N_BOOT = 2000
LEVEL = 0.95
METRICS = ("ttft", "tpot", "e2e")
# A cell with fewer measured requests per repeat than this many times its clients never
# reaches a steady state: it is one burst (the first wave is all there is).
STEADY_STATE_WAVES = 3
# A repeat counts as standing apart only this far (relative) from the median of the repeats:
# within-repeat intervals are narrow, so non-overlap alone flags repeats a few per cent apart.
ODD_REPEAT_SHARE = 0.25
# From this many repeats the range of the repeats holds their median with at least 95 %
# probability (1 - 2 * 0.5**6 = 96.9 %); below it the interval is not called a 95 % one.
REPEATS_FOR_95 = 6


def range_coverage(repeats: int) -> float:
    """The probability that the range of `repeats` independent repeats holds the median of a
    repeat's value: 1 - 2 * 0.5**n (0 for fewer than 2)."""
    return 1.0 - 2.0 * 0.5**repeats if repeats >= 2 else 0.0


def interval_label(repeats: int) -> str:
    """How a table names the across-repeat interval: `95 % interval` only where the repeats
    are enough for that coverage, else what it is, `two-level bootstrap interval, 3 repeats`
    (not "the range of the repeats": resampling the requests within each repeat too can widen
    it well past three equal repeat values)."""
    if repeats >= REPEATS_FOR_95:
        return "95 % interval"
    if repeats == 1:
        return "bootstrap interval over its requests, 1 repeat"
    return f"two-level bootstrap interval, {repeats} repeats"


def interval_note(repeats: int) -> str:
    """One sentence that says what the brackets of a serving table are, with their coverage."""
    what = (
        "The brackets are a two-level bootstrap interval of the median of repeats (resample "
        "the repeats, then the requests within each)"
    )
    if repeats >= REPEATS_FOR_95:
        return f"{what}, a 95 % interval."
    if repeats == 1:
        return (
            "With one repeat the brackets resample that repeat's requests only: they say "
            "nothing of how far another run would land."
        )
    return (
        f"{what}. With {repeats} repeats it spans about their range, which holds the median of "
        f"a repeat's value with probability {range_coverage(repeats):.0%} only (1 - 2 x "
        f"0.5^{repeats}): it is not a 95 % interval, and two cells whose brackets do not "
        "overlap differ less surely than that name would say."
    )


def _p95(values: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.percentile(values, 95, axis=axis)


STATISTICS: dict[str, Callable[..., np.ndarray]] = {"mean": np.mean, "p95": _p95}


def _finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    return array[np.isfinite(array)]


def _percentile_bounds(values: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return float(low), float(high)


def bootstrap_interval(
    groups: Sequence[np.ndarray],
    statistic: str = "mean",
    *,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over the pooled values of `groups`,
    resampling within each group (one run's requests: the groups are its sizes, fixed).
    (nan, nan) when there are fewer than 2 values."""
    groups = [g for g in (_finite(g) for g in groups) if g.size]
    if sum(g.size for g in groups) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    draws = [g[rng.integers(0, g.size, size=(n_boot, g.size))] for g in groups]
    values = STATISTICS[statistic](np.concatenate(draws, axis=1), axis=1)
    return _percentile_bounds(values, level)


def across_repeats(
    groups: Sequence[np.ndarray],
    statistic: str = "mean",
    *,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval:
    """The median over repeats of `statistic` (one group of values per repeat) and its 95 %
    interval from a two-level bootstrap: draw as many repeats as there are, with replacement,
    resample each drawn repeat's values, take the statistic per repeat and their median."""
    groups = [g for g in (_finite(g) for g in groups) if g.size]
    if not groups:
        return Interval(math.nan)
    per_repeat = [float(STATISTICS[statistic](g)) for g in groups]
    value = float(np.median(per_repeat))
    if sum(g.size for g in groups) < 2:
        return Interval(value)
    rng = np.random.default_rng(seed)
    slots = len(groups)
    # each repeat's statistic under resampling of its own values, one per (draw, slot)
    within = np.stack(
        [
            STATISTICS[statistic](g[rng.integers(0, g.size, size=(n_boot, slots, g.size))], axis=2)
            for g in groups
        ]
    )  # (repeat, draw, slot)
    chosen = rng.integers(0, slots, size=(n_boot, slots))
    draws = within[chosen, np.arange(n_boot)[:, None], np.arange(slots)[None, :]]
    low, high = _percentile_bounds(np.median(draws, axis=1), level)
    return Interval(value, low, high)


def outlier_repeats(
    groups: Sequence[np.ndarray], statistic: str = "mean", *, share: float = ODD_REPEAT_SHARE
) -> list[int]:
    """Positions of the repeats that stand apart: a repeat whose own 95 % interval does not
    overlap those of more than half of the other repeats (of both others, with 3), by
    `compare`, and whose value is at least `share` (relative) away from the median of all
    the repeats' values (the cell's value); repeats a few per cent apart are not flagged,
    however narrow their intervals. None with fewer than 3 repeats, where either of two could
    be the odd one."""
    if len(groups) < 3:
        return []
    groups = [_finite(g) for g in groups]
    own = [Interval(math.nan, *bootstrap_interval([g], statistic)) for g in groups]
    values = [float(STATISTICS[statistic](g)) if g.size else math.nan for g in groups]
    odd = []
    middle = float(np.nanmedian(values))
    for i, interval in enumerate(own):
        apart = sum(compare(interval, other) != "not distinguishable" for other in own)
        far = math.isfinite(values[i]) and middle > 0 and abs(values[i] / middle - 1) >= share
        if apart > (len(groups) - 1) / 2 and far:
            odd.append(i)
    return odd


def odd_repeats_text(odd: Sequence[int], total: int) -> str:
    """`outlier_repeats` in words: one repeat stands apart, or several, or, when every repeat
    stands apart from the others, the repeats disagree with one another."""
    if not odd:
        return ""
    if len(odd) == total:
        return "the repeats all differ from one another"
    if len(odd) == 1:
        return f"repeat {odd[0]} stands apart"
    return f"repeats {', '.join(map(str, odd[:-1]))} and {odd[-1]} stand apart"


def _stat(values: np.ndarray, statistic: str) -> float:
    values = _finite(values)
    return float(STATISTICS[statistic](values)) if values.size else math.nan


def _latency_columns(ok: pd.DataFrame, repeats: list[int], prefix: str = "") -> dict:
    out: dict[str, object] = {}
    for metric in METRICS:
        groups = [ok.loc[ok["repeat"] == r, f"{metric}_s"].to_numpy(dtype=float) for r in repeats]
        for statistic in STATISTICS:
            name = f"{statistic}_{metric}{prefix}"
            summary = across_repeats(groups, statistic)
            out[f"{name}_s"] = summary.value
            out[f"{name}_lo_s"], out[f"{name}_hi_s"] = summary.low, summary.high
            out[f"{name}_pooled_s"] = _stat(np.concatenate(groups), statistic)
            out[f"{name}_repeats"] = [_stat(g, statistic) for g in groups]
    return out


def cell_statistics(
    requests: pd.DataFrame,
    walls: dict[int, float],
    *,
    concurrency: int = 1,
    turn_columns: bool = False,
) -> dict[str, object]:
    """One cell's statistics from its per-request rows (column `repeat`; warm-up rows are
    ignored) and each repeat's measured wall time: every latency statistic per repeat, then
    the median of repeats with its two-level interval (see the module docstring); requests/s
    likewise; the repeats whose mean TTFT stands apart; the requests in flight that were
    measured, beside the `concurrency` configured; and, with `turn_columns`, the same
    TTFT statistics over first turns and over later turns (from every repeat)."""
    measured = requests[~requests["warmup"].astype(bool)]
    ok = measured[measured["status"] == "ok"]
    repeats = sorted(walls)
    out: dict[str, object] = {"repeats": len(repeats), "n_measured": len(measured)}
    out.update(_latency_columns(ok, repeats))
    if turn_columns:
        for name, rows in (
            ("_first_turn", ok[ok["turn_index"] == 0]),
            ("_later_turns", ok[ok["turn_index"] > 0]),
        ):
            columns = _latency_columns(rows, repeats, name)
            out.update({k: v for k, v in columns.items() if k.startswith(f"mean_ttft{name}")})
    rates = [(ok["repeat"] == r).sum() / walls[r] if walls[r] > 0 else math.nan for r in repeats]
    rate = across_repeats([np.array([r]) for r in rates])
    out["req_s"], out["req_s_lo"], out["req_s_hi"] = rate.value, rate.low, rate.high
    out["req_s_repeats"] = [float(r) for r in rates]
    ttfts = [ok.loc[ok["repeat"] == r, "ttft_s"].to_numpy(dtype=float) for r in repeats]
    out["outlier_repeats"] = [repeats[i] for i in outlier_repeats(ttfts)]
    per_repeat = [measured[measured["repeat"] == r] for r in repeats]
    flights = [requests_in_flight(frame) for frame in per_repeat]
    out["inflight_peak"] = max((peak for peak, _ in flights), default=0)
    out["inflight_mean"] = float(np.median([mean for _, mean in flights])) if flights else 0.0
    sizes = [len(frame) for frame in per_repeat]
    out["requests_per_repeat"] = min(sizes, default=0)
    out["burst"] = bool(sizes) and min(sizes) < STEADY_STATE_WAVES * concurrency
    return out


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


def _measured_ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[~frame["warmup"].astype(bool) & (frame["status"] == "ok")]


def _ttft_by_repeat(frame: pd.DataFrame) -> list[np.ndarray]:
    return [g["ttft_s"].to_numpy(dtype=float) for _, g in frame.groupby("repeat", sort=True)]


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
    compared with f, and the mixed run's mean TTFT with caching on (median of repeats, with
    its two-level interval) with the mixture h·TTFT_hit + (1-h)·TTFT_miss, where TTFT_hit is
    the all-hit run's (caching on, f = 1) and TTFT_miss the caching-off run's, each the
    median of its repeats' means at the same prompt length."""
    mixed = _measured_ok(mixed_on)
    hits = request_hits(mixed, block_size)
    h = float(hits.mean()) if len(mixed) else math.nan
    ttft_hit = across_repeats(_ttft_by_repeat(_measured_ok(all_hit_on))).value
    ttft_miss = across_repeats(_ttft_by_repeat(_measured_ok(miss_off))).value
    predicted = mixture_prediction(h, ttft_hit, ttft_miss)
    measured = across_repeats(_ttft_by_repeat(mixed))
    return {
        "eligible_share": eligible_share,
        "hit_share": h,
        "ttft_hit_s": ttft_hit,
        "ttft_miss_s": ttft_miss,
        "ttft_mixed_hits_s": float(mixed.loc[hits, "ttft_s"].mean()),
        "ttft_mixed_misses_s": float(mixed.loc[~hits, "ttft_s"].mean()),
        "predicted_ttft_s": predicted,
        "measured_ttft_s": measured.value,
        "measured_lo_s": measured.low,
        "measured_hi_s": measured.high,
        "predicted_saving": 1.0 - predicted / ttft_miss if ttft_miss else math.nan,
        "measured_saving": 1.0 - measured.value / ttft_miss if ttft_miss else math.nan,
        "prediction_in_interval": bool(measured.low <= predicted <= measured.high),
    }


def prefill_line(requests_off: pd.DataFrame) -> tuple[float, float]:
    """Least-squares TTFT = a + b·prompt_tokens over the ok, measured requests of a
    caching-off run: the fixed cost a (s) and the prefill cost b (s per token)."""
    ok = _measured_ok(requests_off)
    x = ok["sent_prompt_tokens"].to_numpy(dtype=float)
    y = ok["ttft_s"].to_numpy(dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        return math.nan, math.nan
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def token_mixture_test(requests_on: pd.DataFrame, requests_off: pd.DataFrame) -> dict[str, float]:
    """Real conversations: each request's own hit share h_i = cached_i / prompt_i (server's
    count). With TTFT_miss(i) = a + b·prompt_i fitted on the caching-off run, the model
    predicts TTFT_on(i) = a + b·(1 - h_i)·prompt_i; compare its mean with the measured one
    (median of the repeats' means, two-level interval). `line_r_squared` says how much of the
    caching-off TTFTs the line explains at all."""
    a, b = prefill_line(requests_off)
    off = _measured_ok(requests_off)
    residual = off["ttft_s"] - (a + b * off["sent_prompt_tokens"])
    spread = float(((off["ttft_s"] - off["ttft_s"].mean()) ** 2).sum())
    ok = _measured_ok(requests_on)
    prompt = ok["sent_prompt_tokens"].to_numpy(dtype=float)
    cached = pd.to_numeric(ok["cached_tokens"], errors="coerce").fillna(0).to_numpy(dtype=float)
    predicted = pd.Series(a + b * (prompt - cached), index=ok.index)
    by_repeat = [predicted[g.index].to_numpy() for _, g in ok.groupby("repeat", sort=True)]
    measured = across_repeats(_ttft_by_repeat(ok))
    return {
        "fixed_cost_s": a,
        "prefill_s_per_1k_tokens": b * 1000.0,
        # the share of the caching-off TTFTs' variance that the line explains
        "line_r_squared": 1.0 - float((residual**2).sum()) / spread if spread else math.nan,
        "token_hit_rate": float(cached.sum() / prompt.sum()) if prompt.sum() else math.nan,
        "request_hit_share": float((cached > 0).mean()) if len(cached) else math.nan,
        "predicted_ttft_s": across_repeats(by_repeat).value,
        "measured_ttft_s": measured.value,
        "measured_lo_s": measured.low,
        "measured_hi_s": measured.high,
    }
