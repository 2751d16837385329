"""The trace indexed once, and the collision-free block keys derived from it.

Indexing (one lexicographic sort of the stored sequences) is the costly step every bound
shares: the ideal bound, the capacity curves and the vLLM simulation all read this index and
its block keys, so it lives apart from any one bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.metrics.bounds.kernels import _compiled, _lru_distance_kernel
from analysis.metrics.bounds.memory import BYTES_PER_STORED_BLOCK, require_memory
from analysis.platform.errors import BoundsError


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
        name = ids[r] if ids is not None else r
        tokens = _as_token_array(prompt, name)
        n = tokens.shape[0]
        if n == 0:
            raise BoundsError(f"request {name} has an empty prompt: rebuild the trace")
        prompt_tokens[r] = n
        pieces.append(tokens)
        extra = 0
        if include_outputs:
            reply = _as_token_array(responses[r], name) if responses is not None else tokens[:0]
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


def _as_token_array(tokens: Any, name: Any) -> np.ndarray:
    array = None if tokens is None else np.asarray(tokens)
    if array is None or (array.dtype.kind in "fO" and pd.isna(array).any()):
        raise BoundsError(f"request {name} has a null token id: rebuild the trace")
    if array.ndim != 1:
        raise BoundsError(f"request {name}: token ids must be one flat sequence per request")
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
    _require_index_memory(frame, stored_units)
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


def _require_index_memory(frame: pd.DataFrame, stored_units: np.ndarray) -> None:
    """Refuse a block-hash trace whose lengths (numbers, not data) need more memory than the
    machine has, before the index allocates one entry per block."""
    if not stored_units.shape[0]:
        return
    total = sum(stored_units.tolist())  # Python ints: no int64 overflow
    longest = int(np.argmax(stored_units))
    where = f"line {frame['line'].iloc[longest]}" if "line" in frame.columns else f"row {longest}"
    require_memory(
        total * BYTES_PER_STORED_BLOCK,
        f"the block-hash trace's {total:,} blocks (the longest at {where}: input_length "
        f"{int(frame['input_length'].iloc[longest]):,})",
        "check that line's input_length and output_length, or use a machine with more memory",
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
