"""A mirror of vLLM's block pool, replayed one request at a time.

Not a bound from a formula but an exact simulation in plain Python (free queue, hash map,
touch, free), checked against vLLM itself; the capacity curves run it as their `vllm` policy.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from analysis.metrics.bounds.keys import BlockKeys
from analysis.platform.errors import BoundsError


@dataclass(frozen=True)
class VllmSimulation:
    """Per-request hits of vLLM's block pool replayed one request at a time."""

    num_blocks: int
    hit_blocks: np.ndarray
    evictions: int  # cached blocks reused for new content
    duplicates: int  # recomputed blocks cached as a second copy of a cached key


def simulate_vllm(keys: BlockKeys, num_blocks: int) -> VllmSimulation:
    """Mirror of vLLM 0.32's `BlockPool` (free queue, hash map, touch, free) for requests that
    run one after another, each prefilling its prompt and decoding until it holds
    `allocated` blocks. Straightforward Python: seconds per capacity on the whole trace.

    A pool larger than every block the trace allocates never evicts (new blocks come from the
    never-used ones ahead of the cached ones), so it is simulated at that size: a capacity of
    10^12 costs what the trace does, not 10^12 queue entries."""
    need = int(keys.allocated.max(initial=0))
    if num_blocks - 1 < need:
        raise BoundsError(
            f"num_blocks={num_blocks} cannot hold the largest request ({need} blocks plus the "
            f"null block): use num_blocks >= {need + 1}"
        )
    pool = min(num_blocks, int(keys.allocated.sum()) + 1)  # the same result, bounded memory
    free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, pool))  # 0 is null
    block_key: dict[int, int] = {}
    key_blocks: dict[int, dict[int, None]] = {}  # key -> its cached copies, oldest first
    hits = np.zeros(keys.num_requests, np.int64)
    evictions = duplicates = 0
    all_keys = keys.keys.tolist()
    offsets = keys.offsets.tolist()
    eligible = keys.eligible.tolist()
    allocated = keys.allocated.tolist()
    for r in range(keys.num_requests):
        stored = all_keys[offsets[r] : offsets[r + 1]]
        held: list[int] = []
        for key in stored[: eligible[r]]:  # find_longest_cache_hit, then touch
            copies = key_blocks.get(key)
            if not copies:
                break
            block = next(iter(copies))
            del free[block]
            held.append(block)
        hits[r] = len(held)
        for _ in range(allocated[r] - len(held)):  # get_new_blocks: evict from the front
            block, _ = free.popitem(last=False)
            old = block_key.pop(block, None)
            if old is not None:
                copies = key_blocks[old]
                del copies[block]
                if not copies:
                    del key_blocks[old]
                evictions += 1
            held.append(block)
        for j in range(int(hits[r]), len(stored)):  # cache_full_blocks (no de-duplication)
            copies = key_blocks.setdefault(stored[j], {})
            duplicates += bool(copies)
            copies[held[j]] = None
            block_key[held[j]] = stored[j]
        for block in reversed(held):  # free: tail first; uncached blocks to the front
            free[block] = None
            if block not in block_key:
                free.move_to_end(block, last=False)
    return VllmSimulation(num_blocks, hits, evictions, duplicates)
