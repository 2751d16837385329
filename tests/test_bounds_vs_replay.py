"""The bounds against vLLM's own scheduler (the `replay` engine), one request at a time.

`simulate_vllm` must give exactly vLLM's first-admission hits; LRU over blocks must equal them
whenever vLLM keeps no second copy of a block, with the capacity vLLM leaves between requests
(num_blocks - 1 for the null block, - 1 more after a request whose last block is partial: it is
freed uncached to the front of the free queue). A request's blocks are freed tail first, which
is why LRU touches a request's blocks tail first.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pandas as pd
import pytest

from analysis.metrics import bounds

pytestmark = pytest.mark.engine

BLOCK = 16


def replay_hits(trace: pd.DataFrame, num_blocks: int, max_model_len: int) -> np.ndarray:
    """Hit tokens of every request's first admission, requests run one after another."""
    from analysis.engines import RunConfig
    from analysis.runs import run

    config = RunConfig(
        engine="replay",
        mode="closed-loop",
        concurrency=1,
        block_size=BLOCK,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        outputs="recorded",
    )
    result = run(trace, config, progress=False)
    requests = result.requests
    assert (requests["status"] == "finished").all()
    assert requests["preemptions"].sum() == 0
    return requests["cached_tokens"].to_numpy()


def lru_with_vllm_capacity(index: bounds.TraceIndex, num_blocks: int) -> np.ndarray:
    """LRU hits when the capacity before request r is what vLLM leaves after request r - 1."""
    keys = index.block_keys(BLOCK)
    distance, _ = index.lru_distances(BLOCK)
    partial = (index.computed_tokens % BLOCK != 0).astype(np.int64)
    left = num_blocks - 1 - np.concatenate([[0], partial[:-1]])
    request = np.repeat(np.arange(keys.num_requests), np.diff(keys.offsets))
    hit = (distance >= 0) & (distance < left[request])
    return np.bincount(request[hit], minlength=keys.num_requests)


def stress_trace(seed: int, count: int = 40, copies: bool = True) -> pd.DataFrame:
    """Independent requests that share prefixes, often block-aligned, sometimes repeating an
    earlier request's reply (so vLLM recomputes blocks it already caches). Without `copies`,
    no prompt ends on a block boundary and every reply is new, so vLLM never recomputes a
    cached block."""
    rng = np.random.default_rng(seed)
    seen: list[list[int]] = []
    rows = []
    for i in range(count):
        if seen and rng.random() < 0.7:
            base = seen[int(rng.integers(len(seen)))]
            cut = int(rng.integers(1, len(base) + 1))
            if rng.random() < 0.3:
                cut = max(BLOCK, cut // BLOCK * BLOCK)
            body = base[:cut]
        else:
            body = [128000]
        full = body + rng.integers(0, 128000, int(rng.integers(0, 40))).tolist()
        n = len(full) if rng.random() < 0.5 else int(rng.integers(1, len(full) + 1))
        if copies and rng.random() < 0.3 and n >= BLOCK:
            n = n // BLOCK * BLOCK
        if not copies and n % BLOCK == 0:
            n -= 1 if n > 1 else -1
            full = full + [1]
        rest = full[n:]
        if copies and rest and rng.random() < 0.5:
            reply = rest[: int(rng.integers(0, len(rest) + 1))]
        else:
            reply = rng.integers(0, 128000, int(rng.integers(0, 30))).tolist()
        seen.append(full[:n] + reply)
        rows.append(_row(f"r{i}", full[:n], reply, i))
    return pd.DataFrame(rows)


def _row(name: str, prompt, reply, i: int) -> dict:
    return {
        "request_id": f"{name}/0",
        "conversation_id": name,
        "turn_index": np.int32(0),
        "prompt_ids": np.asarray(prompt, np.int32),
        "response_ids": np.asarray(reply, np.int32),
        "prompt_tokens": np.int32(len(prompt)),
        "response_tokens": np.int32(len(reply)),
        "timestamp": float(i),
    }


def _max_model_len(trace: pd.DataFrame) -> int:
    longest = int((trace["prompt_tokens"] + np.maximum(trace["response_tokens"], 1)).max())
    return (longest // BLOCK + 1) * BLOCK


@pytest.mark.parametrize("copies", [True, False])
def test_simulation_and_lru_agree_with_replay_on_synthetic_traces(copies):
    for seed in range(2):
        trace = stress_trace(seed, copies=copies)
        index = bounds.index_trace(trace, include_outputs=True)
        keys = index.block_keys(BLOCK)
        max_len = _max_model_len(trace)
        smallest = max_len // BLOCK + 1
        for num_blocks in (smallest, smallest + 5, 4 * smallest):
            replayed = replay_hits(trace, num_blocks, max_len)
            simulated = bounds.simulate_vllm(keys, num_blocks)
            assert replayed.tolist() == (simulated.hit_blocks * BLOCK).tolist()
            assert (simulated.duplicates > 0) == copies
            if not copies:
                lru = lru_with_vllm_capacity(index, num_blocks) * BLOCK
                assert replayed.tolist() == lru.tolist()


def test_lru_touches_blocks_tail_first_like_vllm_frees_them():
    """Touching a request's blocks head first (parent least recent) would evict the parent
    first: the next request would then lose its whole hit, where vLLM keeps the prefix."""
    trace = pd.DataFrame(
        [
            _row("a", list(range(1, 34)), [], 0),  # 33 tokens: blocks P (1..16), C (17..32)
            _row("b", list(range(100, 140)), [], 1),  # 40 tokens: 3 blocks, evicts one
            _row("c", list(range(1, 34)), [], 2),
        ]
    )
    # 5 blocks = null + 4; after a, the free queue is [a's partial block, unused, C, P]
    replayed = replay_hits(trace, 5, 64)
    assert replayed.tolist() == [0, 0, 16]  # vLLM evicted the tail block C and kept P
    index = bounds.index_trace(trace, include_outputs=True)
    assert (lru_with_vllm_capacity(index, 5) * BLOCK).tolist() == replayed.tolist()
    keys = index.block_keys(BLOCK)
    assert _head_first_lru(keys, capacity=3)[2] == 0


def _head_first_lru(keys: bounds.BlockKeys, capacity: int) -> list[int]:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = []
    for r in range(keys.num_requests):
        stored = keys.request_keys(r).tolist()
        h = 0
        while h < keys.eligible[r] and stored[h] in cache:
            h += 1
        hits.append(h)
        for key in stored:
            cache[key] = None
            cache.move_to_end(key)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits


def test_on_real_sharegpt_turns_interleaved():
    from analysis.data.sharegpt import load_conversations
    from analysis.data.traces import TraceOptions, build_traces

    conversations, _ = load_conversations(source="package", max_conversations=40, progress=False)
    options = TraceOptions(max_model_len=2048, max_conversations=40)
    multi = build_traces(conversations, options, progress=False).multi
    # Every turn as its own request, turns of different conversations interleaved, so that
    # the cache holds several conversations at once and capacity matters.
    multi = multi.sort_values(["turn_index", "timestamp"], kind="stable").head(60)
    trace = pd.DataFrame(
        [
            _row(f"q{i}", row.prompt_ids, row.response_ids, i)
            for i, row in enumerate(multi.itertuples())
        ]
    )
    index = bounds.index_trace(trace, include_outputs=True)
    keys = index.block_keys(BLOCK)
    _check_keys_against_vllm_hashes(trace, keys)
    max_len = 2048 + BLOCK
    smallest = max_len // BLOCK + 1
    total = index.total_prompt_tokens
    totals = []
    for num_blocks in (smallest, 2 * smallest, 100_000):
        replayed = replay_hits(trace, num_blocks, max_len)
        simulated = bounds.simulate_vllm(keys, num_blocks)
        assert replayed.tolist() == (simulated.hit_blocks * BLOCK).tolist()
        totals.append(int(replayed.sum()))
    assert totals[0] < totals[2]  # the capacity mattered
    # with room for everything, the replay reaches the ideal hit rate
    assert totals[2] / total == pytest.approx(bounds.ideal_hit_rate(index, BLOCK))


def _check_keys_against_vllm_hashes(trace: pd.DataFrame, keys: bounds.BlockKeys) -> None:
    """Our keys partition the stored blocks exactly as vLLM's chained sha256 block hashes do."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    hashes = []
    for r, row in enumerate(trace.itertuples()):
        tokens = np.concatenate([row.prompt_ids, row.response_ids]).tolist()
        parent = None
        for j in range(keys.offsets[r + 1] - keys.offsets[r]):
            block = tokens[j * BLOCK : (j + 1) * BLOCK]
            parent = kv_cache_utils.hash_block_tokens(hash_fn, parent, block)
            hashes.append(bytes(parent))
    pairs = set(zip(keys.keys.tolist(), hashes, strict=True))
    assert len({k for k, _ in pairs}) == len({h for _, h in pairs}) == len(pairs)


def test_replay_runs_a_synthesised_blockhash_trace():
    """Equal hash ids become equal token blocks: vLLM hits exactly what the hash ids predict."""
    from pathlib import Path

    from analysis.data.blockhash import blockhash_to_trace, load_blockhash_trace

    frame, _ = load_blockhash_trace(Path(__file__).parent / "data" / "blockhash_qwen.jsonl", 16)
    trace = blockhash_to_trace(frame, BLOCK)
    keys = bounds.index_trace(frame, include_outputs=True).block_keys(BLOCK)
    max_len = _max_model_len(trace)
    for num_blocks in (max_len // BLOCK + 1, 1000):
        replayed = replay_hits(trace, num_blocks, max_len)
        assert (
            replayed.tolist()
            == (bounds.simulate_vllm(keys, num_blocks).hit_blocks * BLOCK).tolist()
        )
    assert replayed.sum() == 112  # the hand-computed ideal of this file (tests/test_blockhash.py)
