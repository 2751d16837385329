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

import math
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.platform.errors import BoundsError

POLICIES = ("lru", "opt", "vllm")
DEFAULT_REUSE_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)


# ---------------------------------------------------------------------------------------------
# The trace, indexed once


@dataclass(frozen=True)
class BlockKeys:
    """Every request's stored blocks as collision-free integer keys (flattened, request order).

    Request r stored `keys[offsets[r]:offsets[r + 1]]`, root block first; it may hit at most
    its first `eligible[r]` blocks and holds `allocated[r]` blocks while it runs.
    """

    block_size: int
    keys: np.ndarray
    offsets: np.ndarray
    eligible: np.ndarray
    allocated: np.ndarray
    prompt_tokens: np.ndarray
    num_keys: int

    @property
    def num_requests(self) -> int:
        return int(self.offsets.shape[0] - 1)

    def request_keys(self, request: int) -> np.ndarray:
        return self.keys[self.offsets[request] : self.offsets[request + 1]]


@dataclass
class TraceIndex:
    """What every bound needs from a trace, computed once and shared by all of them.

    `unit` is the number of tokens per element of the stored sequences: 1 for token traces,
    the trace's block size for block-hash traces (whose elements are hash ids).
    """

    kind: str  # "tokens" or "blocks"
    unit: int
    include_outputs: bool
    prompt_tokens: np.ndarray  # int64 per request
    computed_tokens: np.ndarray  # int64 per request: tokens whose KV the request computes
    turn_index: np.ndarray | None  # int64 per request, when the trace has turns
    stored_units: np.ndarray  # int64 per request: length of its stored sequence, in units
    order: np.ndarray  # requests sorted by stored sequence (lexicographic)
    adjacent_lcp: np.ndarray  # units shared by order[i - 1] and order[i] (0 for i = 0)
    prior_lcp: np.ndarray  # per request: longest prefix (units) shared with an earlier one
    _keys: dict[int, BlockKeys] = field(default_factory=dict, repr=False)
    _lru: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    @property
    def num_requests(self) -> int:
        return int(self.prompt_tokens.shape[0])

    @property
    def total_prompt_tokens(self) -> int:
        return int(self.prompt_tokens.sum())

    def check_block_size(self, block_size: int) -> int:
        """Block size in units; block-hash traces only give multiples of their block size."""
        if block_size < 1:
            raise BoundsError(f"block size must be >= 1, got {block_size}")
        if block_size % self.unit:
            raise BoundsError(
                f"block size {block_size} is not a multiple of this block-hash trace's block "
                f"size {self.unit}: use {self.unit} or a multiple of it"
            )
        return block_size // self.unit

    def block_keys(self, block_size: int) -> BlockKeys:
        if block_size not in self._keys:
            self._keys[block_size] = _derive_block_keys(self, block_size)
        return self._keys[block_size]

    def lru_distances(self, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Per stored access: (LRU stack distance before the request, requests since last use).

        The distance is -1 for a block never stored before (a cold miss) and -2 for a block the
        request may not hit (past its eligible prefix).
        """
        if block_size not in self._lru:
            keys = self.block_keys(block_size)
            kernel = _compiled(_lru_distance_kernel)
            self._lru[block_size] = kernel(
                keys.keys, keys.offsets, keys.eligible, np.int64(keys.num_keys)
            )
        return self._lru[block_size]


def index_trace(
    trace: pd.DataFrame | Sequence[Sequence[int]],
    *,
    include_outputs: bool = False,
    trace_block_size: int | None = None,
) -> TraceIndex:
    """Index a token trace (schemas.md), a block-hash frame (`analysis.data.blockhash`) or a list of
    prompts (token id sequences). `trace_block_size` is a block-hash trace's block size (taken
    from the frame's `attrs["block_size"]` when not given)."""
    if isinstance(trace, pd.DataFrame):
        if "hash_ids" in trace.columns and "prompt_ids" not in trace.columns:
            return _index_blockhash(trace, include_outputs, trace_block_size)
        if "prompt_ids" not in trace.columns:
            raise BoundsError(
                "the trace has neither prompt_ids (a token trace) nor hash_ids (a block-hash trace)"
            )
        prompts = list(trace["prompt_ids"])
        responses = list(trace["response_ids"]) if "response_ids" in trace.columns else None
        turns = trace["turn_index"].to_numpy(np.int64) if "turn_index" in trace.columns else None
        ids = list(trace["request_id"]) if "request_id" in trace.columns else None
    else:
        prompts, responses, turns, ids = list(trace), None, None, None
    if include_outputs and responses is None:
        raise BoundsError("include_outputs needs a response_ids column")
    return _index_tokens(prompts, responses, turns, ids, include_outputs)


def _index_tokens(
    prompts: list[Any],
    responses: list[Any] | None,
    turns: np.ndarray | None,
    ids: list[Any] | None,
    include_outputs: bool,
) -> TraceIndex:
    pieces: list[np.ndarray] = []
    prompt_tokens = np.empty(len(prompts), np.int64)
    computed = np.empty(len(prompts), np.int64)
    for r, prompt in enumerate(prompts):
        tokens = _as_token_array(prompt)
        n = tokens.shape[0]
        if n == 0:
            name = ids[r] if ids is not None else r
            raise BoundsError(f"request {name} has an empty prompt: rebuild the trace")
        prompt_tokens[r] = n
        pieces.append(tokens)
        extra = 0
        if include_outputs:
            reply = _as_token_array(responses[r]) if responses is not None else pieces[-1][:0]
            extra = max(reply.shape[0], 1) - 1
            if extra:
                pieces.append(reply[:extra])
        computed[r] = n + extra
    values = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    offsets = np.zeros(len(prompts) + 1, np.int64)
    np.cumsum(computed, out=offsets[1:])
    order, adjacent, prior = _prefix_structure(values, offsets)
    return TraceIndex(
        kind="tokens",
        unit=1,
        include_outputs=include_outputs,
        prompt_tokens=prompt_tokens,
        computed_tokens=computed,
        turn_index=turns,
        stored_units=computed.copy(),
        order=order,
        adjacent_lcp=adjacent,
        prior_lcp=prior,
    )


def _as_token_array(tokens: Any) -> np.ndarray:
    array = np.asarray(tokens)
    if array.ndim != 1:
        raise BoundsError("token ids must be one flat sequence per request")
    if array.size and (array.min() < 0 or array.max() > np.iinfo(np.int32).max):
        raise BoundsError("token ids must be non-negative 32-bit integers")
    return array.astype(np.int32, copy=False)


def _index_blockhash(
    frame: pd.DataFrame, include_outputs: bool, trace_block_size: int | None
) -> TraceIndex:
    unit = trace_block_size or frame.attrs.get("block_size")
    if not unit:
        raise BoundsError("a block-hash trace needs its block size (trace_block_size=...)")
    unit = int(unit)
    n = frame["input_length"].to_numpy(np.int64)
    m = frame["output_length"].to_numpy(np.int64)
    if (n < 1).any():
        raise BoundsError("a block-hash trace has a request with input_length < 1")
    computed = n + np.maximum(m, 1) - 1 if include_outputs else n.copy()
    stored_units = computed // unit
    hash_lists = list(frame["hash_ids"])
    top = max((int(np.max(h)) for h in hash_lists if len(h)), default=-1)
    fresh = top + 1  # ids of blocks that no other request can share (replies, missing ids)
    pieces: list[np.ndarray] = []
    for r, hashes in enumerate(hash_lists):
        hashes = np.asarray(hashes, dtype=np.int64)
        known = min(hashes.shape[0], int(n[r] // unit), int(stored_units[r]))
        pieces.append(hashes[:known])
        missing = int(stored_units[r]) - known
        if missing:
            pieces.append(np.arange(fresh, fresh + missing, dtype=np.int64))
            fresh += missing
    values = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    offsets = np.zeros(len(hash_lists) + 1, np.int64)
    np.cumsum(stored_units, out=offsets[1:])
    order, adjacent, prior = _prefix_structure(values, offsets)
    turns = frame["turn_index"].to_numpy(np.int64) if "turn_index" in frame.columns else None
    return TraceIndex(
        kind="blocks",
        unit=unit,
        include_outputs=include_outputs,
        prompt_tokens=n,
        computed_tokens=computed,
        turn_index=turns,
        stored_units=stored_units,
        order=order,
        adjacent_lcp=adjacent,
        prior_lcp=prior,
    )


def _prefix_structure(
    values: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort the sequences, the common prefix of sorted neighbours, and each request's longest
    common prefix with any earlier request.

    In lexicographic order the sequences sharing a prefix are contiguous and the longest common
    prefix of two of them is the minimum over the neighbours between them. Removing requests
    from the sorted list latest first leaves, at each request's turn, exactly its earlier
    requests, of which the two nearest in the order share the most with it.
    """
    count = offsets.shape[0] - 1
    blobs = [values[offsets[r] : offsets[r + 1]].tobytes() for r in range(count)]
    order = np.array(sorted(range(count), key=blobs.__getitem__), dtype=np.int64)
    del blobs
    adjacent = np.zeros(count, np.int64)
    for i in range(1, count):
        adjacent[i] = _common_prefix(values, offsets, order[i - 1], order[i])
    rank = np.empty(count, np.int64)
    rank[order] = np.arange(count)
    # Linked list over sorted positions; share_next[i] = common prefix with the next alive one.
    prev = list(range(-1, count - 1))
    nxt = list(range(1, count + 1))
    share_next = adjacent[1:].tolist() + [0]
    prior = np.zeros(count, np.int64)
    for r in range(count - 1, -1, -1):
        i = int(rank[r])
        p, q = prev[i], nxt[i]
        left = share_next[p] if p >= 0 else 0
        right = share_next[i] if q < count else 0
        prior[r] = max(left, right)
        if p >= 0:
            nxt[p] = q
            share_next[p] = min(left, right) if q < count else 0
        if q < count:
            prev[q] = p
    return order, adjacent, prior


def _common_prefix(values: np.ndarray, offsets: np.ndarray, a: int, b: int) -> int:
    x = values[offsets[a] : offsets[a + 1]]
    y = values[offsets[b] : offsets[b + 1]]
    length = min(x.shape[0], y.shape[0])
    differ = np.flatnonzero(x[:length] != y[:length])
    return int(differ[0]) if differ.size else length


def _derive_block_keys(index: TraceIndex, block_size: int) -> BlockKeys:
    """Keys from the sorted order: block j of a request is its sorted predecessor's block j when
    they share (j + 1) blocks, else a new key (no earlier sequence in the order can share it)."""
    per_block = index.check_block_size(block_size)
    stored = index.stored_units // per_block
    offsets = np.zeros(index.num_requests + 1, np.int64)
    np.cumsum(stored, out=offsets[1:])
    keys = np.empty(int(offsets[-1]), np.int64)
    previous = np.zeros(0, np.int64)
    next_key = 0
    for position, request in enumerate(index.order.tolist()):
        count = int(stored[request])
        shared = min(int(index.adjacent_lcp[position]) // per_block, count, previous.shape[0])
        current = np.empty(count, np.int64)
        current[:shared] = previous[:shared]
        current[shared:] = np.arange(next_key, next_key + count - shared)
        next_key += count - shared
        keys[offsets[request] : offsets[request + 1]] = current
        previous = current
    prompt = index.prompt_tokens
    return BlockKeys(
        block_size=block_size,
        keys=keys,
        offsets=offsets,
        eligible=(prompt - 1) // block_size,
        allocated=-(-index.computed_tokens // block_size),
        prompt_tokens=prompt,
        num_keys=next_key,
    )


def _as_index(
    trace: pd.DataFrame | TraceIndex | Sequence[Sequence[int]], include_outputs: bool | None
) -> TraceIndex:
    if isinstance(trace, TraceIndex):
        if include_outputs is not None and include_outputs != trace.include_outputs:
            raise BoundsError(
                f"this index was built with include_outputs={trace.include_outputs}: "
                "index the trace again"
            )
        return trace
    return index_trace(trace, include_outputs=bool(include_outputs))


def block_keys(
    trace: pd.DataFrame | TraceIndex | Sequence[Sequence[int]],
    block_size: int,
    *,
    include_outputs: bool | None = None,
) -> BlockKeys:
    """Collision-free chained block keys of every request's stored blocks."""
    return _as_index(trace, include_outputs).block_keys(block_size)


# ---------------------------------------------------------------------------------------------
# Ideal (infinite cache) and token-level reuse


@dataclass(frozen=True)
class IdealBound:
    """The infinite-cache hit rate of a trace at one block size."""

    block_size: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float  # hit tokens / prompt tokens
    requests_with_hit: int
    multi_turn_hit_share: float | None  # share of hit tokens in turns after the first

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ideal_hit_blocks(index: TraceIndex, block_size: int) -> np.ndarray:
    """Blocks each request hits in an infinite cache."""
    index.check_block_size(block_size)
    prompt = index.prompt_tokens
    shared = np.minimum(prompt, index.prior_lcp * index.unit)
    return np.minimum(shared // block_size, (prompt - 1) // block_size)


def ideal_bound(
    trace: pd.DataFrame | TraceIndex | Sequence[Sequence[int]],
    block_size: int,
    *,
    include_outputs: bool | None = None,
) -> IdealBound:
    index = _as_index(trace, include_outputs)
    hits = ideal_hit_blocks(index, block_size) * block_size
    total_hits = int(hits.sum())
    share = None
    if index.turn_index is not None:
        share = float(hits[index.turn_index > 0].sum() / total_hits) if total_hits else 0.0
    prompt_total = index.total_prompt_tokens
    return IdealBound(
        block_size=block_size,
        requests=index.num_requests,
        prompt_tokens=prompt_total,
        hit_tokens=total_hits,
        hit_rate=total_hits / prompt_total if prompt_total else math.nan,
        requests_with_hit=int((hits > 0).sum()),
        multi_turn_hit_share=share,
    )


def ideal_hit_rate(
    trace: pd.DataFrame | TraceIndex | Sequence[Sequence[int]],
    block_size: int,
    *,
    include_outputs: bool | None = None,
) -> float:
    """Token-weighted hit rate with an infinite cache (vLLM semantics, see the module doc).

    NaN when the trace has no prompt tokens, as `analysis.metrics.hitrates.Rate.rate` for no
    admissions: a rate over nothing is undefined, and 0.0 would read as "no reuse".
    """
    return ideal_bound(trace, block_size, include_outputs=include_outputs).hit_rate


def token_vs_block_reuse(
    trace: pd.DataFrame | TraceIndex | Sequence[Sequence[int]],
    block_sizes: Iterable[int] = DEFAULT_REUSE_BLOCK_SIZES,
    *,
    include_outputs: bool | None = None,
) -> pd.DataFrame:
    """Infinite-cache reuse at token level (a radix tree: longest common prefix with an earlier
    sequence, capped at prompt_tokens - 1) against whole blocks, one row per granularity.

    `share_of_token_level` is what block granularity keeps of the token-level reuse. A
    block-hash trace has no token level: its rows start at its own block size.
    """
    index = _as_index(trace, include_outputs)
    prompt = index.prompt_tokens
    total = index.total_prompt_tokens
    rows: list[dict[str, Any]] = []
    token_hits = None
    if index.kind == "tokens":
        token_hits = int(np.minimum(index.prior_lcp, prompt - 1).sum())
        rows.append({"level": "token", "block_size": 1, "hit_tokens": token_hits})
    for size in block_sizes:
        hits = int((ideal_hit_blocks(index, int(size)) * int(size)).sum())
        rows.append({"level": "block", "block_size": int(size), "hit_tokens": hits})
    frame = pd.DataFrame(rows)
    frame["prompt_tokens"] = total
    frame["hit_rate"] = frame["hit_tokens"] / total if total else math.nan
    frame["share_of_token_level"] = frame["hit_tokens"] / token_hits if token_hits else float("nan")
    return frame


def reuse_distances(
    trace: pd.DataFrame | TraceIndex | Sequence[Sequence[int]],
    block_size: int,
    *,
    include_outputs: bool | None = None,
) -> pd.DataFrame:
    """One row per block hit in an infinite cache: how long ago it was last stored, in requests
    and in distinct blocks (its LRU stack distance: an LRU cache holds it iff capacity > it)."""
    index = _as_index(trace, include_outputs)
    keys = index.block_keys(block_size)
    distance, gap = index.lru_distances(block_size)
    warm = np.flatnonzero(distance >= 0)
    request = np.searchsorted(keys.offsets, warm, side="right") - 1
    return pd.DataFrame(
        {
            "request": request.astype(np.int64),
            "block": (warm - keys.offsets[request]).astype(np.int64),
            "requests_since": gap[warm],
            "distinct_blocks_since": distance[warm],
        }
    )


# ---------------------------------------------------------------------------------------------
# Capacity curves


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


# ---------------------------------------------------------------------------------------------
# vLLM's block pool, one request at a time


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
    `allocated` blocks. Straightforward Python: seconds per capacity on the whole trace."""
    need = int(keys.allocated.max(initial=0))
    if num_blocks - 1 < need:
        raise BoundsError(
            f"num_blocks={num_blocks} cannot hold the largest request ({need} blocks plus the "
            f"null block): use num_blocks >= {need + 1}"
        )
    free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))  # 0 is null
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


# ---------------------------------------------------------------------------------------------
# Kernels: plain Python that numba compiles when it is installed (it comes with vLLM)

_COMPILED: dict[str, Callable[..., Any]] = {}


def _compiled(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` compiled by numba (cached on disk), or `func` itself without numba."""
    name = func.__name__
    if name not in _COMPILED:
        try:
            import numba
        except ImportError:
            _COMPILED[name] = func
        else:
            _COMPILED[name] = numba.njit(cache=True, nogil=True)(func)
    return _COMPILED[name]


def _lru_distance_kernel(keys, offsets, eligible, num_keys):  # noqa: ANN001, ANN202
    """Mattson's stack distances with a Fenwick tree over access times.

    A request accesses its blocks tail first. The distance of block j counts the distinct
    blocks accessed since its last access; the blocks this request accessed just before it are
    its own descendants, never accessed in between (their uses always come with block j, just
    before it), so subtracting their number gives the distance before the request started.
    """
    requests = offsets.shape[0] - 1
    total = keys.shape[0]
    tree = np.zeros(total + 1, np.int64)
    last_time = np.zeros(num_keys, np.int64)
    last_request = np.zeros(num_keys, np.int64)
    distance = np.full(total, -2, np.int64)
    gap = np.full(total, -1, np.int64)
    markers = 0
    now = 0
    for r in range(requests):
        start = offsets[r]
        count = offsets[r + 1] - start
        limit = eligible[r]
        for done in range(count):
            j = count - 1 - done
            key = keys[start + j]
            now += 1
            before = last_time[key]
            if before > 0:
                seen = 0
                i = before
                while i > 0:
                    seen += tree[i]
                    i -= i & (-i)
                if j < limit:
                    distance[start + j] = markers - seen - done
                    gap[start + j] = r - last_request[key]
                i = before
                while i <= total:
                    tree[i] -= 1
                    i += i & (-i)
                markers -= 1
            elif j < limit:
                distance[start + j] = -1
            i = now
            while i <= total:
                tree[i] += 1
                i += i & (-i)
            markers += 1
            last_time[key] = now
            last_request[key] = r
    return distance, gap


def _opt_kernel(keys, offsets, eligible, next_use, depth, num_keys, capacity):  # noqa: ANN001, ANN202
    """Belady's MIN with bypass. Priority = next hit-eligible use, then depth: the block used
    furthest ahead (the deepest among equals) is evicted, so a parent never leaves before its
    children. Lazy max-heap: an entry is live while its key is cached with that priority."""
    requests = offsets.shape[0] - 1
    total = keys.shape[0]
    cached = np.zeros(num_keys, np.bool_)
    priority = np.zeros(num_keys, np.int64)
    heap_priority = np.empty(total + 1, np.int64)
    heap_key = np.empty(total + 1, np.int64)
    size = 0
    used = 0
    hits = np.zeros(requests, np.int64)
    for r in range(requests):
        start = offsets[r]
        count = offsets[r + 1] - start
        h = 0
        while h < eligible[r] and cached[keys[start + h]]:
            h += 1
        hits[r] = h
        if capacity == 0:
            continue
        for phase in range(2):  # 0: re-prioritise cached blocks, 1: admit the others
            for j in range(count):
                key = keys[start + j]
                if phase == 0 and not cached[key]:
                    continue
                if phase == 1 and cached[key]:
                    continue
                nxt = next_use[start + j]
                p = nxt * depth + j
                if phase == 1:
                    if nxt >= requests:
                        continue
                    if used >= capacity:
                        while True:  # drop stale entries until the top is live
                            top = heap_key[0]
                            if cached[top] and priority[top] == heap_priority[0]:
                                break
                            size -= 1
                            last_p = heap_priority[size]
                            last_k = heap_key[size]
                            i = 0
                            while True:
                                c = 2 * i + 1
                                if c >= size:
                                    break
                                if c + 1 < size and heap_priority[c + 1] > heap_priority[c]:
                                    c += 1
                                if heap_priority[c] <= last_p:
                                    break
                                heap_priority[i] = heap_priority[c]
                                heap_key[i] = heap_key[c]
                                i = c
                            heap_priority[i] = last_p
                            heap_key[i] = last_k
                        if p >= heap_priority[0]:
                            continue  # bypass: used later than everything cached
                        cached[heap_key[0]] = False
                        used -= 1
                    cached[key] = True
                    used += 1
                priority[key] = p
                i = size  # push (p, key)
                size += 1
                while i > 0:
                    parent = (i - 1) // 2
                    if heap_priority[parent] >= p:
                        break
                    heap_priority[i] = heap_priority[parent]
                    heap_key[i] = heap_key[parent]
                    i = parent
                heap_priority[i] = p
                heap_key[i] = key
        if size > 4 * (used + 1) + 1024:  # rebuild: keep only live entries
            live = 0
            for i in range(size):
                k = heap_key[i]
                if cached[k] and priority[k] == heap_priority[i]:
                    heap_key[live] = k
                    heap_priority[live] = heap_priority[i]
                    live += 1
            size = live
            for start_i in range(size // 2 - 1, -1, -1):
                i = start_i
                p0 = heap_priority[i]
                k0 = heap_key[i]
                while True:
                    c = 2 * i + 1
                    if c >= size:
                        break
                    if c + 1 < size and heap_priority[c + 1] > heap_priority[c]:
                        c += 1
                    if heap_priority[c] <= p0:
                        break
                    heap_priority[i] = heap_priority[c]
                    heap_key[i] = heap_key[c]
                    i = c
                heap_priority[i] = p0
                heap_key[i] = k0
    return hits


def total_ideal_hits_from_keys(keys: BlockKeys) -> np.ndarray:
    """Blocks each request hits in an infinite cache, from the keys alone (a cross-check of the
    common-prefix computation): block j hits iff its key was stored by an earlier request."""
    first = np.full(keys.num_keys, keys.num_requests, np.int64)
    counts = np.diff(keys.offsets)
    request = np.repeat(np.arange(keys.num_requests, dtype=np.int64), counts)
    np.minimum.at(first, keys.keys, request)
    position = np.arange(keys.keys.shape[0]) - np.repeat(keys.offsets[:-1], counts)
    hit = (first[keys.keys] < request) & (position < np.repeat(keys.eligible, counts))
    return np.bincount(request[hit], minlength=keys.num_requests).astype(np.int64)
