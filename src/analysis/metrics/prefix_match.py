"""Two ways to find the cached prefix of a prompt, to time them on the same prompts (seed 004).

- `RadixTree`: token-level matching (SGLang's RadixAttention, the seed's "YOCO" trie): the
  longest cached prefix to the token, edges compressed into token runs.
- `BlockHashIndex`: vLLM's scheme: the prompt is cut into full blocks, each block's key is a
  hash of (parent key, its tokens); the cached prefix is the leading run of keys found.
  `hash_fn` is any bytes-returning hash of a tuple; `vllm_hash_fn()` returns vLLM's own
  (`vllm.utils.hashing.get_hash_fn_by_name`, sha256 of the pickled tuple), so that the timed
  cost is the installed vLLM's.

Both only match and insert prompts: neither allocates or evicts KV blocks, so the timing is
the lookup cost alone (`bench/serving.py`). Importing this module imports neither vllm nor
torch.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any


class _Node:
    __slots__ = ("children", "edge")

    def __init__(self, edge: tuple[int, ...] = ()) -> None:
        self.edge = edge
        self.children: dict[int, _Node] = {}


class RadixTree:
    """A compressed trie of token sequences; `match` returns the longest stored prefix."""

    def __init__(self) -> None:
        self.root = _Node()
        self.nodes = 1

    def match(self, tokens: Sequence[int]) -> int:
        """Tokens of `tokens` that a stored sequence shares, from the start."""
        node, matched = self.root, 0
        while matched < len(tokens):
            child = node.children.get(tokens[matched])
            if child is None:
                return matched
            edge = child.edge
            common = _common_length(edge, tokens, matched)
            matched += common
            if common < len(edge):
                return matched
            node = child
        return matched

    def insert(self, tokens: Sequence[int]) -> int:
        """Store `tokens`; returns how many were already stored (the match)."""
        tokens = tuple(tokens)
        node, position = self.root, 0
        while position < len(tokens):
            child = node.children.get(tokens[position])
            if child is None:
                node.children[tokens[position]] = _Node(tokens[position:])
                self.nodes += 1
                return position
            common = _common_length(child.edge, tokens, position)
            if common < len(child.edge):  # split the edge where the sequences part
                middle = _Node(child.edge[:common])
                child.edge = child.edge[common:]
                middle.children[child.edge[0]] = child
                node.children[tokens[position]] = middle
                self.nodes += 1
                child = middle
            position += common
            node = child
        return position


def _common_length(edge: tuple[int, ...], tokens: Sequence[int], start: int) -> int:
    limit = min(len(edge), len(tokens) - start)
    index = 0
    while index < limit and edge[index] == tokens[start + index]:
        index += 1
    return index


def default_hash_fn(value: Any) -> bytes:
    """sha256 of the pickled value: what vLLM's `sha256` hash does (without importing it)."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def vllm_hash_fn(name: str = "sha256") -> Callable[[Any], bytes]:
    """The installed vLLM's block hash function (imports vllm)."""
    from vllm.utils.hashing import get_hash_fn_by_name

    return get_hash_fn_by_name(name)


class BlockHashIndex:
    """vLLM-style prefix lookup: chained hashes of full blocks in a dict."""

    def __init__(self, block_size: int, hash_fn: Callable[[Any], bytes] = default_hash_fn) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.hash_fn = hash_fn
        self.blocks: set[bytes] = set()

    def block_keys(self, tokens: Sequence[int]) -> list[bytes]:
        """One key per full block; each covers its parent's key and its own tokens."""
        keys, parent = [], b"none"
        size = self.block_size
        for start in range(0, len(tokens) - size + 1, size):
            parent = self.hash_fn((parent, tuple(tokens[start : start + size]), None))
            keys.append(parent)
        return keys

    def match(self, tokens: Sequence[int]) -> int:
        """Tokens covered by the leading run of stored block keys (vLLM never counts the
        last prompt token; the caller applies that rule where it matters)."""
        matched = 0
        for key in self.block_keys(tokens):
            if key not in self.blocks:
                break
            matched += self.block_size
        return matched

    def insert(self, tokens: Sequence[int]) -> int:
        """Store every full block of `tokens`; returns the match before storing."""
        keys = self.block_keys(tokens)
        matched = 0
        for key in keys:
            if key not in self.blocks:
                break
            matched += self.block_size
        self.blocks.update(keys)
        return matched


def time_lookups(
    prompts: Sequence[Sequence[int]],
    block_size: int,
    kind: str,
    hash_fn: Callable[[Any], bytes] | None = None,
) -> dict[str, Any]:
    """Each prompt in turn looks up its cached prefix and then is stored (what a cache does
    for every arriving request), timed over all prompts. `kind`: "radix" (token level) or
    "blockhash" (vLLM's scheme; `hash_fn` defaults to the installed vLLM's sha256, or to an
    equivalent when vLLM is not installed)."""
    import time

    if kind == "radix":
        index: RadixTree | BlockHashIndex = RadixTree()
        name = "token trie"
    elif kind == "blockhash":
        if hash_fn is None:
            try:
                hash_fn, name = vllm_hash_fn(), "vLLM sha256"
            except ImportError:
                hash_fn, name = default_hash_fn, "sha256 of pickle"
        else:
            name = getattr(hash_fn, "__name__", "custom")
        index = BlockHashIndex(block_size, hash_fn)
    else:
        raise ValueError(f"kind must be 'radix' or 'blockhash', got {kind!r}")
    tokens = sum(len(p) for p in prompts)
    started = time.perf_counter()
    matched = sum(index.insert(p) for p in prompts)
    elapsed = time.perf_counter() - started
    return {
        "kind": kind,
        "method": name,
        "requests": len(prompts),
        "prompt_tokens": tokens,
        "matched_tokens": matched,
        "us_per_request": elapsed / max(len(prompts), 1) * 1e6,
        "ns_per_token": elapsed / max(tokens, 1) * 1e9,
    }


def compare_lookup_costs(
    prompts: Sequence[Sequence[int]],
    block_size: int,
    repeats: int = 7,
    hash_fn: Callable[[Any], bytes] | None = None,
) -> list[dict[str, Any]]:
    """`time_lookups` for both kinds, `repeats` times each, alternating the kinds so that a
    change in the machine's speed falls on both: one row per kind with the median, lowest and
    highest microseconds per request over the repeats, and the trie's time over block
    hashing's in each repeat (`trie_over_hash_min` / `_max`)."""
    runs: dict[str, list[dict[str, Any]]] = {"radix": [], "blockhash": []}
    for _ in range(repeats):
        for kind in runs:
            runs[kind].append(time_lookups(prompts, block_size, kind, hash_fn))
    ratios = [
        radix["us_per_request"] / block["us_per_request"]
        for radix, block in zip(runs["radix"], runs["blockhash"], strict=True)
    ]
    rows = []
    for timed in runs.values():
        us = sorted(t["us_per_request"] for t in timed)
        rows.append(
            {
                **{k: timed[0][k] for k in ("kind", "method", "requests", "matched_tokens")},
                "repeats": repeats,
                "us_per_request_median": us[len(us) // 2],
                "us_per_request_min": us[0],
                "us_per_request_max": us[-1],
                "trie_over_hash_min": min(ratios),
                "trie_over_hash_max": max(ratios),
            }
        )
    return rows


def lookup_cost_reading(rows: Sequence[dict[str, Any]]) -> str:
    """What one run of `compare_lookup_costs` says, and what it cannot: which lookup was faster
    in this run's repeats, and that a run's direction does not settle the question (it has
    changed from one committed run to another on the same code and prompts: the timing is of
    pure-Python stand-ins, sensitive to the machine and the interpreter)."""
    by_kind = {row["kind"]: row for row in rows}
    radix, block = by_kind["radix"], by_kind["blockhash"]
    low, high = radix["trie_over_hash_min"], radix["trie_over_hash_max"]
    if high < 1:
        here = "the trie was faster in every repeat of this run"
    elif low > 1:
        here = "the trie was slower in every repeat of this run"
    else:
        here = "the repeats of this run disagree on which is faster"
    return (
        f"Measured in this run: token trie {radix['us_per_request_median']:.1f} us per request, "
        f"{block['method']} block hashing {block['us_per_request_median']:.1f} us (medians of "
        f"{radix['repeats']} repeats; trie / hashing {low:.2f}-{high:.2f} across them): {here}. "
        "Which lookup is faster has changed between committed runs of this notebook on the same "
        "code and prompts, so this timing leaves seed 004's cost claim (a trie costs more) "
        "unresolved: it shows what each lookup costs here, not which one is larger."
    )
