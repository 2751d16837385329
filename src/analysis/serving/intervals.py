"""A measured value with its 95 % interval, and the one rule that says whether two such values
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
    """A statistic and its 95 % interval (NaN bounds: no interval, e.g. one value)."""

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
    """`a` against `b`: "lower" or "higher" only when their 95 % intervals do not overlap;
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
    """How far runs doing the same work drift apart: their lowest and highest rate as ratios
    to their median."""
    rates = sorted(float(r) for r in same_work_rates if math.isfinite(float(r)))
    if not rates:
        return math.nan, math.nan
    middle = statistics.median(rates)
    return rates[0] / middle, rates[-1] / middle


def overhead_verdict(ratio: Interval, same_work_rates: Sequence[float]) -> str:
    """Requests/s on / off at a 0 % hit rate, read with its sign and against the drift between
    runs. The interval resamples the batches of one run per mode, so it misses how far two runs
    of one setting drift apart; caching off does the same work at every shared fraction, and its
    spread across them (`same_work_rates`) measures that drift. A ratio inside it is no
    overhead and no gain."""
    reading = ratio_verdict(
        ratio,
        above="caching on faster: no overhead shows (an overhead would put the ratio below 1)",
        below="caching on slower: an overhead beyond noise",
    )
    if reading.startswith("no "):
        return "the interval includes 1: " + reading
    low, high = drift_band(same_work_rates)
    if math.isfinite(ratio.value) and low <= ratio.value <= high:
        return (
            f"within the drift between runs: caching off alone, the same work at every shared "
            f"fraction, ran at {low:.2f}-{high:.2f}x its median, so no overhead shows"
        )
    return reading
