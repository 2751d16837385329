"""A measured value with its interval (the serving tables' two-level bootstrap over the repeats;
`stats.interval_label` names its coverage), and the one rule that says whether two such values
differ: every table, claim row and sentence of the serving study asks `compare`, so two places
cannot call the same pair of cells "higher beyond noise" and "not distinguishable".

A module of its own, below the statistics and the write-up that both use it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["lower", "higher", "not distinguishable"]

# How the verdicts read in prose (for a latency, "lower" is the better direction).
VERDICT_TEXT: dict[str, str] = {
    "lower": "lower beyond noise",
    "higher": "higher beyond noise",
    "not distinguishable": "not distinguishable",
}


@dataclass(frozen=True)
class Interval:
    """A statistic and its interval (NaN bounds: no interval, e.g. one value)."""

    value: float
    low: float = math.nan
    high: float = math.nan

    @property
    def has_bounds(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def text(self, unit: str = "s", digits: int = 3) -> str:
        """`0.123 s [0.110-0.140]`, or `n/a` when nothing was measured."""
        if not math.isfinite(self.value):
            return "n/a"
        value = f"{self.value:.{digits}f} {unit}".strip()
        if not self.has_bounds:
            return value
        return f"{value} [{self.low:.{digits}f}-{self.high:.{digits}f}]"

    def below(self, other: Interval) -> bool:
        """Lower beyond noise: this interval lies entirely under the other."""
        return compare(self, other) == "lower"


def compare(a: Interval, b: Interval) -> Verdict:
    """`a` against `b`: "lower" or "higher" only when their intervals do not overlap;
    values without intervals are never told apart."""
    if not (a.has_bounds and b.has_bounds):
        return "not distinguishable"
    if a.high < b.low:
        return "lower"
    if b.high < a.low:
        return "higher"
    return "not distinguishable"


def verdict_text(a: Interval, b: Interval) -> str:
    """`compare` as prose: "lower beyond noise", "higher beyond noise", "not distinguishable"."""
    return VERDICT_TEXT[compare(a, b)]


def ratio_verdict(ratio: Interval, *, above: str, below: str) -> str:
    """A ratio (e.g. on/off) with its interval, read against 1 and with its sign: `above` says
    what a ratio above 1 beyond noise means, `below` what one under 1 means."""
    verdict = compare(ratio, Interval(1.0, 1.0, 1.0))
    if verdict == "not distinguishable":
        return "no difference beyond noise"
    return above if verdict == "higher" else below


def drift_band(same_work_rates: Sequence[float]) -> tuple[float, float]:
    """How far runs doing the same work drift apart: the interquartile range of their rates
    as ratios to their median (a quarter of the runs may lie outside it on each side, so one
    odd run cannot widen it). (nan, nan) with fewer than 4 rates, too few for quartiles."""
    rates = sorted(float(r) for r in same_work_rates if math.isfinite(float(r)))
    if len(rates) < 4:
        return math.nan, math.nan
    q1, middle, q3 = statistics.quantiles(rates, n=4, method="inclusive")
    return q1 / middle, q3 / middle


def overhead_verdict(ratio: Interval, same_work_rates: Sequence[float]) -> str:
    """Requests/s on / off at a 0 % hit rate, read with its sign and against the drift between
    runs. The interval resamples the batches of one run per mode, so it misses how far two runs
    of one setting drift apart; caching off does the same work at every shared fraction, and the
    interquartile band of its rates (`drift_band`) measures that drift. A ratio beyond noise but
    inside that band is unresolved: the run cannot tell an overhead (or a gain) from drift. Only
    an interval that holds 1 says that no difference shows."""
    reading = ratio_verdict(
        ratio,
        above="caching on faster beyond noise: no overhead shows (an overhead would put the "
        "ratio below 1)",
        below="caching on slower: an overhead beyond noise",
    )
    if reading.startswith("no "):
        return "the interval includes 1: " + reading
    low, high = drift_band(same_work_rates)
    if math.isfinite(ratio.value) and low <= ratio.value <= high:
        direction = "slower" if ratio.value < 1 else "faster"
        return (
            f"unresolved: caching on ran {direction} beyond the batches' noise, but caching off "
            f"alone, the same work at every shared fraction, drifted as much (the middle half "
            f"of its runs at {low:.2f}-{high:.2f}x their median); re-run to tell an overhead "
            "from drift"
        )
    return reading
