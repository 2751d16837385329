"""Workloads as token ids: synthetic shared-prefix requests and ShareGPT conversations.

Building the requests is deterministic and needs no server, so it is apart from the client
that sends them; a shared prefix is shared token for token.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.platform.errors import WorkloadError
from analysis.platform.paths import traces_dir
from analysis.serving.loadgen.records import RequestSpec

BOS_ID = 128000
# Ids below the Llama 3 special tokens (128000+) are ordinary BPE tokens of the vocabulary.
ORDINARY_ID_RANGE = (1_000, 128_000)


def _rng(*key: object) -> np.random.Generator:
    """A generator seeded by a stable hash of `key`, so workloads are the same on every run."""
    digest = hashlib.sha256(json.dumps(key, default=str).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def ordinary_ids(count: int, *key: object) -> list[int]:
    """`count` pseudo-random ordinary token ids, fixed by `key`."""
    low, high = ORDINARY_ID_RANGE
    return _rng(*key).integers(low, high, size=count).tolist()


def shared_prefix(prefix_tokens: int, *key: object) -> list[int]:
    """A prefix of exactly `prefix_tokens` ids, BOS first; empty for 0."""
    if prefix_tokens < 0:
        raise WorkloadError(f"prefix length must be >= 0, got {prefix_tokens}")
    if prefix_tokens == 0:
        return []
    return [BOS_ID, *ordinary_ids(prefix_tokens - 1, "prefix", *key)]


def unique_suffix(index: int, suffix_tokens: int, *key: object) -> list[int]:
    """A suffix whose first id differs for every `index`, so that no two suffixes share a block."""
    low, high = ORDINARY_ID_RANGE
    first = low + (index * 7919) % (high - low)  # distinct for index < high - low
    return [first, *ordinary_ids(suffix_tokens - 1, "suffix", index, *key)]


def _evenly_chosen(index: int, share: float) -> bool:
    """Whether the `index`-th request belongs to a share `share` spread evenly over the run."""
    return math.floor((index + 1) * share + 1e-9) > math.floor(index * share + 1e-9)


def synthetic_prefix_workload(
    prefix_tokens: int,
    num_requests: int,
    *,
    suffix_tokens: int = 24,
    output_tokens: int = 16,
    warmup_requests: int = 1,
    seed: int = 0,
    salt: str = "",
    eligible_share: float = 1.0,
    distinct_prefixes: int = 1,
    churn_every: int = 0,
) -> list[RequestSpec]:
    """Requests that share a prefix of `prefix_tokens` ids token for token, then a unique suffix.

    Every prompt is exactly `prefix_tokens + suffix_tokens` long (BOS opens the prefix, or the
    suffix when there is no prefix). The first `warmup_requests` are marked warm-up: they
    populate the cache before the measured ones. `salt` changes the prefix, so that runs on
    one server (another concurrency, say) start cold instead of hitting the last run's prefix.

    Variants of seed 003's traffic patterns (all prompts keep the same length):
    - `eligible_share` f: only that share of the measured requests (spread evenly) uses a
      shared prefix; the others get a prefix of their own (mixed traffic, the f·h dilution);
    - `distinct_prefixes` K: eligible requests cycle over K different prefixes (many
      distinct prefixes; they thrash once K prefixes no longer fit the KV cache);
    - `churn_every` N: the prefix changes to a new version every N measured requests
      (an edited system prompt invalidates reuse).
    """
    if suffix_tokens < 1:
        raise WorkloadError(f"suffix length must be >= 1, got {suffix_tokens}")
    if num_requests < 1 or warmup_requests < 0 or output_tokens < 1:
        raise WorkloadError(
            f"need num_requests >= 1, warmup_requests >= 0, output_tokens >= 1; got "
            f"{num_requests}, {warmup_requests}, {output_tokens}"
        )
    if not 0.0 <= eligible_share <= 1.0 or distinct_prefixes < 1 or churn_every < 0:
        raise WorkloadError(
            f"need 0 <= eligible_share <= 1, distinct_prefixes >= 1, churn_every >= 0; got "
            f"{eligible_share}, {distinct_prefixes}, {churn_every}"
        )
    key = (seed, prefix_tokens, salt)
    specs = []
    for index in range(warmup_requests + num_requests):
        warmup = index < warmup_requests
        measured = index - warmup_requests
        if warmup:
            prefix_key: tuple = (*key,)
        elif not _evenly_chosen(measured, eligible_share):
            prefix_key = (*key, "unique", measured)
        else:
            version = measured // churn_every if churn_every else 0
            variant = measured % distinct_prefixes
            prefix_key = (*key,) if (version, variant) == (0, 0) else (*key, version, variant)
        prefix = shared_prefix(prefix_tokens, *prefix_key)
        suffix = unique_suffix(index, suffix_tokens, *key)
        if not prefix:
            suffix = [BOS_ID, *suffix[:-1]]
        specs.append(
            RequestSpec(
                request_id=f"p{prefix_tokens}/{'w' if warmup else 'r'}{index}",
                prompt_ids=tuple(prefix + suffix),
                max_tokens=output_tokens,
                group=str(prefix_tokens),
                turn_index=0,
                warmup=warmup,
            )
        )
    return specs


def new_prefixes(num_requests: int, distinct_prefixes: int = 1, churn_every: int = 0) -> int:
    """How many prefixes of `synthetic_prefix_workload`'s measured requests the warm-up did not
    send first: each misses once, on its first request (in a cache that evicts nothing)."""
    keys = {
        (m // churn_every if churn_every else 0, m % distinct_prefixes) for m in range(num_requests)
    }
    return len(keys - {(0, 0)})


def cacheable_tokens(prompt_tokens: int, shared_tokens: int, block_size: int) -> int:
    """Tokens of a prompt that vLLM can serve from cache: full shared blocks, never the last
    prompt token (`max_cache_hit_length = num_tokens - 1`)."""
    usable = min(shared_tokens, prompt_tokens - 1)
    return max(0, usable // block_size * block_size)


def predicted_ttft_saving(prefix_tokens: int, suffix_tokens: int, block_size: int) -> float:
    """First-order TTFT saving on a cache hit, P / (P + S), with P the cacheable prefix."""
    total = prefix_tokens + suffix_tokens
    return cacheable_tokens(total, prefix_tokens, block_size) / total if total else 0.0


def prefix_sweep_prompts(
    fraction: float, num_prompts: int, input_len: int = 1000, *, seed: int = 0
) -> list[list[int]]:
    """Seed 004's workload: `num_prompts` prompts of `input_len` ids whose first
    round(fraction * input_len) ids are shared by all; the rest is unique per prompt."""
    if not 0.0 <= fraction <= 1.0:
        raise WorkloadError(f"shared fraction must lie in [0, 1], got {fraction}")
    if input_len < 2 or num_prompts < 1:
        raise WorkloadError(
            f"need input_len >= 2 and num_prompts >= 1, got {input_len}, {num_prompts}"
        )
    shared = round(fraction * input_len)
    key = ("sweep", seed, fraction, input_len)
    prefix = shared_prefix(shared, *key)
    prompts = []
    for index in range(num_prompts):
        rest = input_len - shared
        if rest == 0:
            prompts.append(list(prefix))
            continue
        suffix = unique_suffix(index, rest, *key)
        prompts.append(prefix + suffix if prefix else [BOS_ID, *suffix[:-1]])
    return prompts


@dataclass
class ShareGPTWorkload:
    """Closed-loop conversations: each inner list is one conversation's turns, in order."""

    conversations: list[list[RequestSpec]]
    skipped_turns: dict[str, int] = field(default_factory=dict)  # reason -> count

    @property
    def num_requests(self) -> int:
        return sum(len(c) for c in self.conversations)


def load_trace_frame(path: Path) -> pd.DataFrame:
    """The multi-turn trace (shared schema), or a one-line error saying how to build it."""
    from analysis.data.traces import load_trace

    return load_trace(path)


def sharegpt_workload(
    trace: pd.DataFrame | Path | None = None,
    *,
    conversations: int = 8,
    max_turns: int = 4,
    min_turns: int = 2,
    output_tokens: int = 16,
    max_model_len: int = 4096,
) -> ShareGPTWorkload:
    """The first `conversations` conversations of the trace with at least `min_turns` usable
    turns, cut to `max_turns` turns. A turn is usable if its prompt plus its output fits
    `max_model_len`; a conversation stops at its first turn that does not fit (later turns
    are longer still). Output length: the recorded reply's length, capped at `output_tokens`.
    """
    if isinstance(trace, pd.DataFrame):
        frame = trace
    else:
        frame = load_trace_frame(Path(trace) if trace else traces_dir() / "multi_turn.parquet")
    skipped: dict[str, int] = {}
    chosen: list[list[RequestSpec]] = []
    for conversation_id, turns in frame.groupby("conversation_id", sort=False):
        if len(chosen) >= conversations:
            break
        specs: list[RequestSpec] = []
        for row in turns.sort_values("turn_index").itertuples(index=False):
            if len(specs) >= max_turns:
                skipped["beyond_max_turns"] = skipped.get("beyond_max_turns", 0) + 1
                continue
            max_tokens = int(min(max(row.response_tokens, 1), output_tokens))
            if int(row.prompt_tokens) + max_tokens > max_model_len:
                skipped["too_long"] = skipped.get("too_long", 0) + len(turns) - len(specs)
                break
            specs.append(
                RequestSpec(
                    request_id=str(row.request_id),
                    prompt_ids=tuple(int(t) for t in row.prompt_ids),
                    max_tokens=max_tokens,
                    group=str(conversation_id),
                    turn_index=int(row.turn_index),
                )
            )
        if len(specs) >= min_turns:
            chosen.append(specs)
        else:
            skipped["short_conversation"] = skipped.get("short_conversation", 0) + len(specs)
    if not chosen:
        raise WorkloadError(
            f"no conversation of the trace has {min_turns}+ turns within {max_model_len} tokens"
        )
    return ShareGPTWorkload(chosen, skipped)
