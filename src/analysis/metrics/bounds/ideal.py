"""The ideal bound: hits in an infinite cache, and token-level against block-level reuse.

The loosest bound needs only each request's longest common prefix with earlier ones, no cache
model, so it stands apart from the capacity-limited policies.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.metrics.bounds.keys import BlockKeys, TraceIndex, _as_index
from analysis.platform.errors import BoundsError

DEFAULT_REUSE_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)


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


def ideal_hits_by_turn(index: TraceIndex, block_size: int, last_turn: int = 8) -> pd.DataFrame:
    """The infinite-cache hit rate per turn (0 = a conversation's first), later turns pooled
    from `last_turn` on: where a trace's reuse comes from. Needs a trace with turns (a token
    trace, or a block-hash trace whose `parent_chat_id` links them)."""
    if index.turn_index is None:
        raise BoundsError("the trace has no turns (no turn_index, no parent_chat_id links)")
    hits = ideal_hit_blocks(index, block_size) * block_size
    frame = pd.DataFrame(
        {
            "turn": np.minimum(index.turn_index, last_turn),
            "prompt_tokens": index.prompt_tokens,
            "hit_tokens": hits,
        }
    )
    table = frame.groupby("turn").agg(
        requests=("hit_tokens", "size"),
        prompt_tokens=("prompt_tokens", "sum"),
        hit_tokens=("hit_tokens", "sum"),
    )
    table["hit_rate"] = table["hit_tokens"] / table["prompt_tokens"]
    table = table.reset_index()
    table["turn"] = table["turn"].map(lambda t: f"{t}+" if t == last_turn else str(t))
    return table


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


def ideal_hits_by_position(
    trace: pd.DataFrame | TraceIndex | Sequence[Sequence[int]],
    block_size: int,
    *,
    include_outputs: bool | None = None,
    first_positions: int = 2,
) -> pd.DataFrame:
    """Infinite-cache hits split by where the hit block sits in its prompt: one row for each
    of the first `first_positions` blocks (1 = the prompt's first block), one for the rest.

    Per row: hits, distinct blocks hit, hits per block (mean, max), hit tokens and their share
    of all hit tokens. Seed 001's "Task 2" statistics (hits per block) are dominated by a
    prompt's first blocks wherever a chat template makes every prompt open the same way; this
    table separates them. Distinct blocks never repeat across rows (a key is a whole prefix).
    """
    index = _as_index(trace, include_outputs)
    keys = index.block_keys(block_size)
    hits = ideal_hit_blocks(index, block_size)
    starts = np.repeat(keys.offsets[:-1], hits)
    within = np.arange(int(hits.sum())) - np.repeat(np.cumsum(hits) - hits, hits)
    hit_keys = keys.keys[starts + within]
    group = np.minimum(within, first_positions)
    total = int(hits.sum()) * block_size
    rows = []
    for position in range(first_positions + 1):
        chosen = hit_keys[group == position]
        counts = np.unique(chosen, return_counts=True)[1]
        label = str(position + 1) if position < first_positions else f"{first_positions + 1}+"
        rows.append(
            {
                "block_position": label,
                "hits": int(chosen.size),
                "blocks_hit": int(counts.size),
                "hits_per_block_mean": chosen.size / counts.size if counts.size else 0.0,
                "hits_per_block_max": int(counts.max()) if counts.size else 0,
                "hit_tokens": int(chosen.size) * block_size,
                "share_of_hit_tokens": int(chosen.size) * block_size / total if total else 0.0,
            }
        )
    return pd.DataFrame(rows)
