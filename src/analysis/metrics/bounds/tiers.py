"""Two-level bounds: hits by tier (GPU blocks, CPU memory) for a GPU of G and a CPU of C blocks.

What vLLM 0.32's native offloading does, and so what these bounds model (the OffloadingConnector,
`vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`, and its
`CPUOffloadingManager`, `vllm/v1/kv_offload/cpu/manager.py`):

- The CPU tier is written through: every full block a request computes is offered to the CPU as
  soon as it is computed (`_build_store_jobs`), not when the GPU evicts it. A block the request
  hit on the GPU is offered too; if the CPU still holds it, it only counts as a reuse.
- The CPU keeps its own LRU order: a block becomes most recent when stored, and at the end of
  each request all its blocks are touched tail first (`LRUCachePolicy.on_request_finished`),
  exactly like the GPU bound's touches (`bounds.lru`).
- A request first hits its longest prefix on the GPU; from the first GPU miss on, the connector
  loads the longest run of blocks the CPU holds (`get_num_new_matched_tokens`); the hit stops at
  the first block neither tier gives. Its last prompt token is always recomputed.

So both tiers see the same stream of accesses, and each holds the most recent blocks of that
stream that fit: the GPU's top G, the CPU's top C, of one LRU stack. That is what "inclusive"
means here: the CPU holds a copy of what the GPU holds (when C >= G), so it adds hits only for
blocks at stack distance G <= d < C, and a CPU smaller than the GPU adds nothing. The textbook
alternative, an exclusive victim cache (the GPU's evictions move to the CPU, a CPU hit moves the
block back), holds the top G + C and hits G <= d < G + C; it is given for comparison
("lru-exclusive"), vLLM does not do that.

Policies (one row per policy and (G, C)):
- `lru`: inclusive, LRU on both tiers (vLLM's design, `eviction_policy="lru"`).
- `lru-exclusive`: exclusive victim cache, LRU on both tiers.
- `opt-lru`: Belady's MIN on the GPU tier (`bounds.opt`, with bypass) over the write-through
  LRU CPU tier. Because the CPU sees every access whatever the GPU keeps, its content is still
  the top C of the LRU stack; the GPU run comes from MIN, the CPU continues from its first miss.
  MIN maximises GPU hits, not hits over both tiers: it is the best GPU policy in this hierarchy,
  not the best hierarchy.

What the bounds leave out of vLLM: running requests pin GPU blocks (capacities are blocks kept
between requests, as in `bounds.lru`); transfers take time (a block being stored is not yet
loadable); the CPU admits by chunks of `blocks_per_chunk` blocks (1 by default); and by default
vLLM offloads prompt blocks only (`offload_prompt_only=True`), so with `include_outputs=True`
the CPU tier here also keeps reply blocks that vLLM would store only with the next turn's prompt.
Bounds meant to sit beside engine points take the trace in engine order (`bounds.in_engine_order`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.metrics.bounds.capacity import _next_eligible_use, _opt_hits
from analysis.metrics.bounds.keys import BlockKeys, TraceIndex, _as_index
from analysis.platform.errors import BoundsError

TIER_POLICIES = ("lru", "lru-exclusive", "opt-lru")


def tier_request_hits(
    index: TraceIndex,
    block_size: int,
    gpu_capacity: int,
    cpu_capacity: int,
    policy: str = "lru",
    *,
    next_use: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Blocks each request hits on the GPU tier and on the CPU tier (two int64 arrays).

    The CPU run starts where the GPU run stops, so a request's hit is one prefix across both
    tiers. `next_use` (from `_next_eligible_use`) saves a pass when `opt-lru` runs repeatedly.
    """
    _check(policy, gpu_capacity, cpu_capacity)
    keys = index.block_keys(block_size)
    distance, _ = index.lru_distances(block_size)
    if policy == "opt-lru":
        next_use = _next_eligible_use(keys) if next_use is None else next_use
        gpu = _opt_hits(keys, gpu_capacity, next_use).astype(np.int64)
    else:
        gpu = _leading_run(keys, _held(distance, gpu_capacity), np.zeros_like(keys.eligible))
    reach = gpu_capacity + cpu_capacity if policy == "lru-exclusive" else cpu_capacity
    cpu = _leading_run(keys, _held(distance, reach), gpu)
    return gpu, cpu


def tier_bounds(
    trace: pd.DataFrame | TraceIndex | Sequence[Sequence[int]],
    block_size: int,
    capacities: Iterable[tuple[int, int]],
    policies: Iterable[str] = ("lru", "opt-lru"),
    *,
    include_outputs: bool | None = None,
) -> pd.DataFrame:
    """Hits by tier for each policy and (GPU, CPU) capacity pair, in blocks and token rates.

    One row per (policy, gpu_capacity, cpu_capacity): `gpu_hit_blocks`, `cpu_hit_blocks`,
    `miss_blocks` (hit-eligible blocks neither tier gave), and token-weighted rates over all
    prompt tokens (`gpu_hit_rate`, `cpu_hit_rate`, `hit_rate`).
    """
    index = _as_index(trace, include_outputs)
    pairs = [(int(g), int(c)) for g, c in capacities]
    policies = list(policies)
    keys = index.block_keys(block_size)
    eligible = int(keys.eligible.sum())
    next_use = _next_eligible_use(keys) if "opt-lru" in policies else None
    rows: list[dict[str, Any]] = []
    for policy in policies:
        for gpu_capacity, cpu_capacity in pairs:
            gpu, cpu = tier_request_hits(
                index, block_size, gpu_capacity, cpu_capacity, policy, next_use=next_use
            )
            rows.append(
                {
                    "policy": policy,
                    "gpu_capacity": gpu_capacity,
                    "cpu_capacity": cpu_capacity,
                    "gpu_hit_blocks": int(gpu.sum()),
                    "cpu_hit_blocks": int(cpu.sum()),
                }
            )
    columns = ["policy", "gpu_capacity", "cpu_capacity", "gpu_hit_blocks", "cpu_hit_blocks"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["miss_blocks"] = eligible - frame["gpu_hit_blocks"] - frame["cpu_hit_blocks"]
    total = index.total_prompt_tokens
    for tier in ("gpu", "cpu"):
        rate = frame[f"{tier}_hit_blocks"] * block_size / total if total else math.nan
        frame[f"{tier}_hit_rate"] = rate
    frame["hit_rate"] = frame["gpu_hit_rate"] + frame["cpu_hit_rate"]
    frame["block_size"] = block_size
    return frame


def _check(policy: str, gpu_capacity: int, cpu_capacity: int) -> None:
    if policy not in TIER_POLICIES:
        raise BoundsError(f"unknown tier policy {policy!r}: choose from {', '.join(TIER_POLICIES)}")
    if gpu_capacity < 0 or cpu_capacity < 0:
        raise BoundsError(
            f"capacities must be >= 0 blocks, got GPU {gpu_capacity} and CPU {cpu_capacity}"
        )


def _held(distance: np.ndarray, capacity: int) -> np.ndarray:
    """Per stored access: whether an LRU tier of `capacity` blocks holds the block before the
    request starts (a warm block at stack distance below the capacity)."""
    return (distance >= 0) & (distance < capacity)


def _leading_run(keys: BlockKeys, held: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Per request: the number of consecutive held blocks from position `start[r]`, within its
    hit-eligible prefix. One backward pass finds, for every access, the next block not held."""
    total = held.shape[0]
    blocked = np.where(held, total, np.arange(total, dtype=np.int64))
    next_blocked = np.append(np.minimum.accumulate(blocked[::-1])[::-1], total)
    first = keys.offsets[:-1]
    begin = first + start  # a GPU run never passes the eligible prefix
    end = first + keys.eligible
    return np.maximum(np.minimum(next_blocked[begin], end) - begin, 0).astype(np.int64)
