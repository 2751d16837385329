"""Bounds on prefix caching from a trace alone, without an engine.

What a request can hit follows vLLM V1: only full blocks are cached, keys chain through the
parent block (equal key = equal prefix), a request hits the longest run of cached blocks from
its start and stops at the first miss, and its last prompt token is always recomputed, so it
hits at most floor((prompt_tokens - 1) / block_size) blocks. Hit rates are token-weighted:
hit tokens / prompt tokens.

What a request leaves in the cache ("stored" blocks): the full blocks of the tokens whose KV it
computed. With `include_outputs=False` that is the prompt alone (as if every request generated
one token, which is never computed): in the multi-turn trace turn k's reply is then reused only
from turn k+2 on, turn k+1 storing it first as part of its prompt. With `include_outputs=True` a
request also stores its reply, as vLLM does when it decodes the recorded reply (teacher-forced
replay): prompt + reply[:max(m, 1) - 1] tokens, an engine never computing the last sampled token.

Bounds, from the loosest:
- ideal: an infinite cache (every stored block stays).
- `lru`: a cache of C blocks between requests, least recently used evicted first. A request
  touches its stored blocks tail first, like vLLM freeing a finished request's blocks in reverse
  order, so a parent block is always more recent than its children and the cached set stays
  closed under prefixes. All capacities come from one Mattson stack-distance pass.
- `opt`: Belady's MIN for the same capacities (evict the block whose next use as a hit is the
  furthest; a block with no use ahead is not kept). Ties go to the deeper block, which keeps
  the cached set prefix-closed. One pass per capacity.
- `vllm`: an exact mirror of vLLM's block pool when requests run one at a time: the capacity
  is `num_blocks` including the reserved null block, a running request holds all its blocks,
  a finished one frees them tail first (cached blocks to the back of the free queue, its
  partial last block to the front), and a recomputed block that is already cached becomes a
  second copy without refreshing the first. When no copy arises it equals `lru` whose capacity
  before each request is num_blocks - 1, minus 1 more if the previous request's last block was
  partial (tests/test_bounds.py, and tests/test_bounds_vs_replay.py against vLLM itself).

Token-level reuse (what a radix tree gives: the longest common prefix with any earlier stored
sequence, capped at prompt_tokens - 1) comes from one lexicographic sort of the stored
sequences. The same sort also gives collision-free block keys for any block size, so no hash is
ever needed.
"""

from __future__ import annotations

from analysis.metrics.bounds.capacity import (
    capacity_curves,
    default_capacities,
    lru_capacity_for,
    lru_hit_blocks,
    lru_request_hits,
    opt_request_hits,
)
from analysis.metrics.bounds.ideal import (
    DEFAULT_REUSE_BLOCK_SIZES,
    ideal_bound,
    ideal_hit_blocks,
    ideal_hit_rate,
    ideal_hits_by_position,
    ideal_hits_by_turn,
    reuse_distances,
    token_vs_block_reuse,
    total_ideal_hits_from_keys,
)
from analysis.metrics.bounds.keys import BlockKeys, TraceIndex, block_keys, index_trace
from analysis.metrics.bounds.order import admission_order, in_engine_order
from analysis.metrics.bounds.simulation import simulate_vllm
from analysis.metrics.bounds.tiers import tier_bounds, tier_request_hits
from analysis.platform.errors import BoundsError

__all__ = [
    "DEFAULT_REUSE_BLOCK_SIZES",
    "BlockKeys",
    "BoundsError",
    "TraceIndex",
    "admission_order",
    "block_keys",
    "capacity_curves",
    "default_capacities",
    "ideal_bound",
    "ideal_hit_blocks",
    "ideal_hit_rate",
    "in_engine_order",
    "ideal_hits_by_position",
    "ideal_hits_by_turn",
    "index_trace",
    "lru_capacity_for",
    "lru_hit_blocks",
    "lru_request_hits",
    "opt_request_hits",
    "reuse_distances",
    "simulate_vllm",
    "tier_bounds",
    "tier_request_hits",
    "token_vs_block_reuse",
    "total_ideal_hits_from_keys",
]
