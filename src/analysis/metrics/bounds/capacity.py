"""Hit rate against cache capacity: LRU and Belady's MIN (and vLLM's pool) per capacity.

The bounds for a cache of a given size, as opposed to the ideal one: they need a cache policy
and one pass per capacity (one for all capacities under LRU), and they make the curves.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.metrics.bounds.kernels import _compiled, _opt_kernel
from analysis.metrics.bounds.keys import BlockKeys, TraceIndex, _as_index
from analysis.metrics.bounds.simulation import simulate_vllm
from analysis.platform.errors import BoundsError

POLICIES = ("lru", "opt", "vllm")


def default_capacities(
    index: TraceIndex, block_size: int, count: int = 10, low: int | None = None
) -> list[int]:
    """`count` capacities, geometric, up to the number of distinct blocks (where LRU = ideal).

    `low` (default 1/1000 of the distinct blocks) is the smallest; in trace order the curves
    rise where a cache holds about one request, tens of blocks, whatever the trace's length.
    """
    distinct = max(index.block_keys(block_size).num_keys, 1)
    low = max(1, distinct // 1000) if low is None else min(max(1, int(low)), distinct)
    points = np.unique(np.round(np.geomspace(low, distinct, count)).astype(np.int64))
    return [int(p) for p in points]


def capacity_curves(
    trace: pd.DataFrame | TraceIndex | Sequence[Sequence[int]],
    block_size: int,
    capacities: Iterable[int],
    policies: Iterable[str] = ("lru", "opt"),
    *,
    include_outputs: bool | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Hit rate against cache capacity (in blocks), one row per (policy, capacity).

    For `lru` and `opt` the capacity is the number of cached blocks kept between requests; for
    `vllm` it is vLLM's `num_blocks` (null block included), requests running one at a time.
    """
    index = _as_index(trace, include_outputs)
    capacities = [int(c) for c in capacities]
    policies = list(policies)
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown:
        raise BoundsError(f"unknown policy {', '.join(unknown)}: choose from {', '.join(POLICIES)}")
    if any(c < 0 for c in capacities):
        raise BoundsError("capacities must be >= 0 blocks")
    keys = index.block_keys(block_size)
    total = index.total_prompt_tokens
    rows: list[dict[str, Any]] = []
    if "lru" in policies:
        for capacity, hits in zip(
            capacities, lru_hit_blocks(index, block_size, capacities), strict=True
        ):
            rows.append({"policy": "lru", "capacity": capacity, "hit_blocks": int(hits)})
    slow = [(p, c) for p in policies if p != "lru" for c in capacities]
    next_use = _next_eligible_use(keys) if "opt" in policies else None
    for policy, capacity in _progress(slow, progress, "capacities"):
        if policy == "opt":
            hits = int(_opt_hits(keys, capacity, next_use).sum())
        else:
            hits = int(simulate_vllm(keys, capacity).hit_blocks.sum())
        rows.append({"policy": policy, "capacity": capacity, "hit_blocks": hits})
    frame = pd.DataFrame(rows, columns=["policy", "capacity", "hit_blocks"])
    frame["hit_tokens"] = frame["hit_blocks"] * block_size
    frame["hit_rate"] = frame["hit_tokens"] / total if total else math.nan
    frame["block_size"] = block_size
    frame["policy"] = pd.Categorical(frame["policy"], categories=policies)
    return frame.sort_values(["policy", "capacity"], kind="stable").reset_index(drop=True)


def lru_hit_blocks(index: TraceIndex, block_size: int, capacities: Sequence[int]) -> np.ndarray:
    """Total blocks hit under LRU at each capacity, from one stack-distance pass."""
    distance, _ = index.lru_distances(block_size)
    warm = np.sort(distance[distance >= 0])
    return np.searchsorted(warm, np.asarray(capacities, np.int64), side="left")


def lru_capacity_for(index: TraceIndex, block_size: int, hit_blocks: int) -> int | None:
    """The smallest LRU capacity (blocks) that hits `hit_blocks` blocks; None beyond the ideal.

    A block is hit under LRU with C blocks iff its stack distance is below C, so the capacity
    that keeps k hits is the k-th smallest distance plus one: exact, from the one pass.
    """
    distance, _ = index.lru_distances(block_size)
    warm = np.sort(distance[distance >= 0])
    if hit_blocks <= 0:
        return 0
    if hit_blocks > warm.shape[0]:
        return None
    return int(warm[hit_blocks - 1]) + 1


def lru_request_hits(index: TraceIndex, block_size: int, capacity: int) -> np.ndarray:
    """Blocks each request hits under LRU with `capacity` blocks."""
    keys = index.block_keys(block_size)
    distance, _ = index.lru_distances(block_size)
    hit = (distance >= 0) & (distance < capacity)
    request = np.repeat(np.arange(keys.num_requests), np.diff(keys.offsets))
    return np.bincount(request[hit], minlength=keys.num_requests).astype(np.int64)


def opt_request_hits(index: TraceIndex, block_size: int, capacity: int) -> np.ndarray:
    """Blocks each request hits under Belady's MIN with `capacity` blocks."""
    keys = index.block_keys(block_size)
    return _opt_hits(keys, capacity, _next_eligible_use(keys))


def _progress(items: list[Any], enabled: bool | None, unit: str) -> Iterable[Any]:
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled or len(items) < 2:
        return items
    from analysis.platform.progress import bar as tqdm

    return tqdm(items, unit=unit, file=sys.stderr)


def _next_eligible_use(keys: BlockKeys) -> np.ndarray:
    """Per stored access: the next request that may hit the same block (num_requests if none)."""
    requests = keys.num_requests
    counts = np.diff(keys.offsets)
    request = np.repeat(np.arange(requests, dtype=np.int64), counts)
    position = np.arange(keys.keys.shape[0], dtype=np.int64) - np.repeat(keys.offsets[:-1], counts)
    eligible = position < np.repeat(keys.eligible, counts)
    stride = np.int64(requests + 1)
    uses = np.sort(keys.keys[eligible] * stride + request[eligible])
    query = keys.keys * stride + request
    found = np.searchsorted(uses, query, side="right")
    result = np.full(query.shape[0], requests, np.int64)
    inside = found < uses.shape[0]
    candidate = uses[found[inside]]
    same = candidate // stride == keys.keys[inside]
    target = np.flatnonzero(inside)[same]
    result[target] = candidate[same] % stride
    return result


def _opt_hits(keys: BlockKeys, capacity: int, next_use: np.ndarray) -> np.ndarray:
    depth = int(np.diff(keys.offsets).max(initial=0)) + 1
    kernel = _compiled(_opt_kernel)
    return kernel(
        keys.keys,
        keys.offsets,
        keys.eligible,
        next_use,
        np.int64(depth),
        np.int64(keys.num_keys),
        np.int64(capacity),
    )
