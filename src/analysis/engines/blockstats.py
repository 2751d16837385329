"""Block events, aggregated: what the figures read, in kilobytes instead of hundreds of MB.

A whole-trace run records tens of millions of block events (stored / hit / evicted, one row
each). The figures and tables only use three aggregates of them, kept exactly:

- events per kind (stored, hit, evicted);
- hits per block: for each number of hits h, how many distinct block hashes were hit h times;
- reuse gaps in steps: for each gap g, how many hits came g steps after the previous store or
  hit of the same hash (`reuse_gaps` below).

Stored as one small table (`block_stats.parquet`: kind, value, count). Every statistic
`hitrates.block_reuse` gives from the events, it gives from these counts with the same
numbers (the mean and numpy's linear quantiles are computed on the counts, not approximated);
only the reuse gaps in *seconds* need the full events, which a run keeps when asked for
(`RunConfig.block_events = "full"`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

EVENTS, HITS_PER_BLOCK, REUSE_GAP_STEPS = "events", "hits_per_block", "reuse_gap_steps"
EVENT_NAMES = ("stored", "hit", "evicted")
QUANTILES = (0.1, 0.5, 0.9, 0.99)


@dataclass(eq=False)
class BlockStats:
    """Exact aggregates of one run's block events (see the module doc)."""

    events: dict[str, int]  # kind -> number of events
    hits_per_block: pd.Series  # index: hits of a block (>= 1), value: number of blocks
    reuse_gap_steps: pd.Series  # index: gap in steps, value: number of hits

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BlockStats)
            and self.events == other.events
            and _same_counts(self.hits_per_block, other.hits_per_block)
            and _same_counts(self.reuse_gap_steps, other.reuse_gap_steps)
        )

    @classmethod
    def from_events(cls, block_events: pd.DataFrame) -> BlockStats:
        event = block_events["event"]
        hit = (event == "hit").to_numpy()
        codes = hash_codes(block_events)[hit]
        per_block = np.bincount(codes) if codes.size else np.zeros(0, dtype=np.int64)
        gaps = reuse_gaps(block_events)[0].astype(np.int64)
        return cls(
            events={name: int((event == name).sum()) for name in EVENT_NAMES},
            hits_per_block=_value_counts(per_block[per_block > 0]),
            reuse_gap_steps=_value_counts(gaps),
        )

    def to_frame(self) -> pd.DataFrame:
        parts = [
            (EVENTS, [EVENT_NAMES.index(k) for k in self.events], list(self.events.values())),
            (HITS_PER_BLOCK, self.hits_per_block.index, self.hits_per_block.to_numpy()),
            (REUSE_GAP_STEPS, self.reuse_gap_steps.index, self.reuse_gap_steps.to_numpy()),
        ]
        return pd.DataFrame(
            {
                "kind": np.concatenate([[kind] * len(values) for kind, values, _ in parts]),
                "value": np.concatenate([np.asarray(v, dtype=np.int64) for _, v, _ in parts]),
                "count": np.concatenate([np.asarray(c, dtype=np.int64) for _, _, c in parts]),
            }
        )

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> BlockStats:
        def part(kind: str) -> pd.Series:
            rows = frame[frame["kind"] == kind]
            return pd.Series(
                rows["count"].to_numpy(dtype=np.int64),
                index=pd.Index(rows["value"].to_numpy(dtype=np.int64), name="value"),
                name="count",
            )

        events = part(EVENTS)
        return cls(
            events={EVENT_NAMES[int(k)]: int(v) for k, v in events.items()},
            hits_per_block=part(HITS_PER_BLOCK),
            reuse_gap_steps=part(REUSE_GAP_STEPS),
        )

    def reuse_gaps(self) -> np.ndarray:
        """Every hit's reuse gap in steps, sorted (the array `reuse_gaps` gives,
        in order), for an ECDF."""
        return np.repeat(
            self.reuse_gap_steps.index.to_numpy(dtype=np.float64),
            self.reuse_gap_steps.to_numpy(),
        )


def _same_counts(a: pd.Series, b: pd.Series) -> bool:
    return np.array_equal(a.index, b.index) and np.array_equal(a.to_numpy(), b.to_numpy())


def _value_counts(values: np.ndarray) -> pd.Series:
    distinct, counts = np.unique(values, return_counts=True)
    return pd.Series(
        counts.astype(np.int64), index=pd.Index(distinct.astype(np.int64), name="value")
    )


def describe_counts(counts: pd.Series) -> dict[str, float]:
    """`hitrates._describe` of the values `counts` stands for (value -> multiplicity),
    with the same floats: numpy's mean and linear-interpolation quantiles, done on counts."""
    counts = counts[counts > 0].sort_index()
    n = int(counts.sum())
    if n == 0:
        return {"count": 0}
    values = counts.index.to_numpy(dtype=np.float64)
    ends = np.cumsum(counts.to_numpy())  # sorted position i holds values[searchsorted(ends, i)]
    quantiles = [_quantile(values, ends, n, q) for q in QUANTILES]
    return {
        "count": n,
        "min": float(values[0]),
        "mean": float(np.dot(values, counts.to_numpy(dtype=np.float64)) / n),
        "max": float(values[-1]),
        "p10": quantiles[0],
        "p50": quantiles[1],
        "p90": quantiles[2],
        "p99": quantiles[3],
    }


def _quantile(values: np.ndarray, ends: np.ndarray, n: int, q: float) -> float:
    """numpy's default (linear) quantile of the sorted multiset, with numpy's arithmetic."""
    q = np.float64(q)
    virtual = (n - 1) * q  # numpy's virtual index for its default method
    below = int(np.floor(virtual))
    gamma = virtual - below
    below = min(max(below, 0), n - 1)
    above = min(below + 1, n - 1)
    a = values[np.searchsorted(ends, below, side="right")]
    b = values[np.searchsorted(ends, above, side="right")]
    diff = b - a
    return float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)


def hash_codes(block_events: pd.DataFrame) -> np.ndarray:
    """An integer code per distinct block: its hash, and in a fleet its replica (one hash held
    by two replicas is two blocks)."""
    hashes = block_events["block_hash"]
    if isinstance(hashes.dtype, pd.CategoricalDtype):
        codes = hashes.cat.codes.to_numpy()
    else:
        codes = pd.factorize(hashes)[0]
    if "replica" not in block_events:
        return codes
    replicas = block_events["replica"].to_numpy().astype(np.int64)
    return pd.factorize(codes.astype(np.int64) * (int(replicas.max(initial=0)) + 1) + replicas)[0]


def reuse_gaps(block_events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Gaps (steps, seconds) between each hit and the previous store/hit of the same hash."""
    codes = hash_codes(block_events)
    event = block_events["event"]
    keep = (event != "evicted").to_numpy()
    if not keep.any():
        return np.zeros(0), np.zeros(0)
    hit = (event == "hit").to_numpy()[keep]
    codes = codes[keep]
    steps = block_events["step"].to_numpy()[keep]
    seconds = block_events["time_s"].to_numpy()[keep]
    order = np.lexsort((steps, codes))  # by hash, then step; stable within a step
    codes, hit, steps, seconds = codes[order], hit[order], steps[order], seconds[order]
    follows = (codes[1:] == codes[:-1]) & hit[1:]
    return np.diff(steps)[follows].astype(np.float64), np.diff(seconds)[follows]
