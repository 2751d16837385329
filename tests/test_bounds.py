"""Bounds: hand-computed traces, reference simulations, and the optimum found by brute force."""

from __future__ import annotations

import argparse
import itertools
import json
from collections import OrderedDict

import numpy as np
import pandas as pd
import pytest

from analysis.metrics import bounds
from analysis.metrics.bounds import BoundsError, index_trace
from analysis.metrics.bounds.capacity import _next_eligible_use
from analysis.metrics.bounds.kernels import _compiled, _lru_distance_kernel, _opt_kernel


def token_trace(prompts, responses=None, turns=None) -> pd.DataFrame:
    """A trace frame with the schema's columns from lists of token ids."""
    responses = responses or [[] for _ in prompts]
    turns = turns or [0] * len(prompts)
    return pd.DataFrame(
        {
            "request_id": [f"c{i}/{t}" for i, t in enumerate(turns)],
            "conversation_id": [f"c{i}" for i in range(len(prompts))],
            "turn_index": np.array(turns, np.int32),
            "prompt_ids": [np.array(p, np.int32) for p in prompts],
            "response_ids": [np.array(r, np.int32) for r in responses],
            "prompt_tokens": np.array([len(p) for p in prompts], np.int32),
            "response_tokens": np.array([len(r) for r in responses], np.int32),
            "timestamp": np.arange(len(prompts), dtype=np.float64),
        }
    )


def random_prompts(rng: np.random.Generator, count: int, vocab: int = 3, longest: int = 20):
    """Prompts that often extend a cut of an earlier one, over a tiny vocabulary."""
    prompts: list[list[int]] = []
    for _ in range(count):
        if prompts and rng.random() < 0.6:
            base = prompts[int(rng.integers(len(prompts)))]
            head = base[: int(rng.integers(0, len(base) + 1))]
            prompt = head + rng.integers(0, vocab, int(rng.integers(1, 8))).tolist()
        else:
            prompt = rng.integers(0, vocab, int(rng.integers(1, longest))).tolist()
        prompts.append(prompt[: 2 * longest])
    return prompts


def random_trace(rng: np.random.Generator, count: int) -> pd.DataFrame:
    prompts = random_prompts(rng, count)
    responses = [rng.integers(0, 3, int(rng.integers(0, 9))).tolist() for _ in prompts]
    return token_trace(prompts, responses)


def reference_lru(keys: bounds.BlockKeys, capacity: int) -> np.ndarray:
    """Plain LRU over block keys: hit the longest cached prefix, then touch blocks tail first."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = []
    for r in range(keys.num_requests):
        stored = keys.request_keys(r).tolist()
        h = 0
        while h < keys.eligible[r] and stored[h] in cache:
            h += 1
        hits.append(h)
        for key in reversed(stored):
            cache[key] = None
            cache.move_to_end(key)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return np.array(hits)


def brute_force_optimum(keys: bounds.BlockKeys, capacity: int) -> int:
    """Most blocks any policy can hit: every cache content (any subset, not only prefixes)
    reachable after each request, keeping the best total so far."""
    states = {frozenset(): 0}
    for r in range(keys.num_requests):
        stored = keys.request_keys(r).tolist()
        reached: dict[frozenset, int] = {}
        for cached, total in states.items():
            h = 0
            while h < keys.eligible[r] and stored[h] in cached:
                h += 1
            pool = sorted(cached | set(stored))
            for size in range(min(capacity, len(pool)) + 1):
                for kept in itertools.combinations(pool, size):
                    state = frozenset(kept)
                    reached[state] = max(reached.get(state, -1), total + h)
        states = reached
    return max(states.values())


# --- ideal and token-level reuse, by hand ----------------------------------------------------

HAND_PROMPTS = [
    list(range(1, 11)),  # 10 tokens: 2 full blocks of 4 stored
    list(range(1, 9)) + [99],  # 9 tokens: shares 8 with the first -> 2 blocks hit
    list(range(1, 9)),  # 8 tokens: shares 8, but its last token is recomputed -> 1 block
    [1, 2, 3, 5, 6],  # shares 3 tokens: no whole block
]


def test_ideal_hit_rate_by_hand():
    trace = token_trace(HAND_PROMPTS)
    assert bounds.ideal_hit_blocks(index_trace(trace), 4).tolist() == [0, 2, 1, 0]
    assert bounds.ideal_hit_rate(trace, 4) == pytest.approx(12 / 32)
    assert bounds.ideal_hit_rate(trace, 8) == pytest.approx(8 / 32)  # 9 tokens: 1 block of 8


def test_token_vs_block_reuse_by_hand():
    reuse = bounds.token_vs_block_reuse(token_trace(HAND_PROMPTS), [1, 4, 8])
    assert reuse["level"].tolist() == ["token", "block", "block", "block"]
    # token level: min(common prefix, n - 1) = 0 + 8 + 7 + 3
    assert reuse["hit_tokens"].tolist() == [18, 18, 12, 8]
    assert reuse["hit_rate"].tolist() == pytest.approx([18 / 32, 18 / 32, 12 / 32, 8 / 32])
    assert reuse["share_of_token_level"].iloc[2] == pytest.approx(12 / 18)


def test_ideal_with_outputs_counts_the_reply_of_the_previous_turn():
    first = [1, 2, 3, 4, 5]
    reply = [6, 7, 8, 9]  # the engine computes 5 + 4 - 1 = 8 tokens: 2 blocks of 4
    second = first + reply + [10, 11]
    trace = token_trace([first, second], [reply, [12]], turns=[0, 1])
    assert bounds.ideal_bound(trace, 4).hit_tokens == 4  # prompts only: block (1..4)
    with_outputs = bounds.ideal_bound(trace, 4, include_outputs=True)
    assert with_outputs.hit_tokens == 8
    assert with_outputs.multi_turn_hit_share == 1.0


def test_ideal_from_common_prefixes_equals_ideal_from_keys():
    rng = np.random.default_rng(7)
    for _ in range(30):
        index = index_trace(random_trace(rng, 25), include_outputs=bool(rng.integers(2)))
        for size in (1, 2, 3, 5):
            keys = index.block_keys(size)
            expected = bounds.total_ideal_hits_from_keys(keys)
            assert bounds.ideal_hit_blocks(index, size).tolist() == expected.tolist()


def test_block_keys_are_equal_exactly_for_equal_prefixes():
    rng = np.random.default_rng(3)
    for _ in range(30):
        prompts = random_prompts(rng, 30)
        size = int(rng.integers(1, 5))
        keys = bounds.block_keys(prompts, size)
        prefixes = [tuple(p[: (j + 1) * size]) for p in prompts for j in range(len(p) // size)]
        assert len(prefixes) == keys.keys.shape[0]
        pairs = set(zip(keys.keys.tolist(), prefixes, strict=True))
        assert len({k for k, _ in pairs}) == len(pairs) == len(set(prefixes))
        assert keys.num_keys == len(set(prefixes))


# --- LRU and OPT -----------------------------------------------------------------------------


def test_lru_and_opt_by_hand():
    # One eligible block per request (3 tokens at block 2): keys A, B, C, A.
    trace = token_trace([[1, 1, 9], [2, 2, 9], [3, 3, 9], [1, 1, 8]])
    curves = bounds.capacity_curves(trace, 2, [1, 2, 3], ["lru", "opt"])
    hits = curves.set_index(["policy", "capacity"])["hit_tokens"].to_dict()
    assert hits[("lru", 2)] == 0  # B and C push A out
    assert hits[("opt", 1)] == 2  # MIN keeps A (used again) and never admits B or C
    assert hits[("opt", 2)] == hits[("lru", 3)] == hits[("opt", 3)] == 2
    assert curves["hit_rate"].max() == pytest.approx(2 / 12) == bounds.ideal_hit_rate(trace, 2)


def test_lru_stack_distances_match_a_plain_lru_simulation():
    rng = np.random.default_rng(11)
    for trial in range(40):
        index = index_trace(random_trace(rng, 30), include_outputs=trial % 2 == 1)
        size = int(rng.integers(1, 4))
        keys = index.block_keys(size)
        for capacity in range(keys.num_keys + 2):
            expected = reference_lru(keys, capacity)
            assert bounds.lru_request_hits(index, size, capacity).tolist() == expected.tolist()


def test_opt_is_the_optimum_on_tiny_traces():
    rng = np.random.default_rng(1)
    checked = beats_lru = 0
    for _ in range(300):
        prompts = random_prompts(rng, int(rng.integers(2, 9)), vocab=2, longest=7)
        index = index_trace(prompts)
        size = int(rng.integers(1, 3))
        keys = index.block_keys(size)
        if keys.num_keys > 9:
            continue
        for capacity in range(4):
            best = brute_force_optimum(keys, capacity)
            assert bounds.opt_request_hits(index, size, capacity).sum() == best
            beats_lru += best > bounds.lru_request_hits(index, size, capacity).sum()
            checked += 1
    assert checked > 300 and beats_lru > 30  # the check is not vacuous


def plain_belady(keys: bounds.BlockKeys, capacity: int) -> np.ndarray:
    """MIN written the slow way: evict the cached block used furthest ahead (deepest first)."""
    next_use = _next_eligible_use(keys)
    cached: dict[int, tuple[int, int]] = {}  # key -> (next use, depth)
    hits = []
    for r in range(keys.num_requests):
        start, stored = keys.offsets[r], keys.request_keys(r).tolist()
        h = 0
        while h < keys.eligible[r] and stored[h] in cached:
            h += 1
        hits.append(h)
        for j, key in enumerate(stored):
            if key in cached:
                cached[key] = (int(next_use[start + j]), j)
        for j, key in enumerate(stored):
            use = (int(next_use[start + j]), j)
            if key in cached or use[0] >= keys.num_requests or capacity == 0:
                continue
            if len(cached) >= capacity:
                victim = max(cached, key=cached.__getitem__)
                if use >= cached[victim]:
                    continue
                del cached[victim]
            cached[key] = use
    return np.array(hits)


def test_opt_matches_a_plain_belady_on_a_longer_trace():
    rng = np.random.default_rng(8)
    hot = [rng.integers(0, 50, 40).tolist() for _ in range(6)]
    prompts = []
    for _ in range(3000):  # many re-uses of few blocks: the heap fills with stale entries
        base = hot[int(rng.integers(len(hot)))]
        prompts.append(base[: int(rng.integers(2, 41))] + rng.integers(0, 50, 3).tolist())
    index = index_trace(prompts)
    keys = index.block_keys(4)
    for capacity in (1, 5, 40):
        expected = plain_belady(keys, capacity)
        assert bounds.opt_request_hits(index, 4, capacity).tolist() == expected.tolist()
        assert expected.sum() >= bounds.lru_request_hits(index, 4, capacity).sum()


def test_opt_at_least_lru_and_both_reach_the_ideal():
    rng = np.random.default_rng(5)
    for trial in range(20):
        index = index_trace(random_trace(rng, 40), include_outputs=trial % 2 == 0)
        size = int(rng.integers(1, 4))
        keys = index.block_keys(size)
        capacities = sorted(set(range(0, keys.num_keys + 3, 3)) | {keys.num_keys})
        curves = bounds.capacity_curves(index, size, capacities)
        lru = curves[curves["policy"] == "lru"].set_index("capacity")["hit_tokens"]
        opt = curves[curves["policy"] == "opt"].set_index("capacity")["hit_tokens"]
        assert (opt >= lru).all()
        assert lru.is_monotonic_increasing and opt.is_monotonic_increasing
        ideal = bounds.ideal_bound(index, size).hit_tokens
        assert lru[keys.num_keys] == opt[keys.num_keys] == ideal
        assert opt.max() <= ideal


def test_numba_kernels_equal_their_python_source():
    rng = np.random.default_rng(2)
    index = index_trace(random_trace(rng, 60), include_outputs=True)
    keys = index.block_keys(2)
    fast = _compiled(_lru_distance_kernel)
    args = (keys.keys, keys.offsets, keys.eligible, np.int64(keys.num_keys))
    for a, b in zip(fast(*args), _lru_distance_kernel(*args), strict=True):
        assert a.tolist() == b.tolist()
    next_use = _next_eligible_use(keys)
    depth = np.int64(np.diff(keys.offsets).max() + 1)
    for capacity in (0, 3, 10):
        opt_args = (*args[:3], next_use, depth, np.int64(keys.num_keys), np.int64(capacity))
        fast_hits = _compiled(_opt_kernel)(*opt_args)
        assert fast_hits.tolist() == _opt_kernel(*opt_args).tolist()


def test_reuse_distances_by_hand():
    # Block size 2, one stored block each: A, B, A, C, B.
    trace = token_trace([[1, 1, 0], [2, 2, 0], [1, 1, 0], [3, 3, 0], [2, 2, 0]])
    frame = bounds.reuse_distances(trace, 2)
    assert frame["request"].tolist() == [2, 4]
    assert frame["requests_since"].tolist() == [2, 3]
    assert frame["distinct_blocks_since"].tolist() == [1, 2]  # B; then A and C
    index = index_trace(trace)
    for capacity in range(4):
        hits = bounds.lru_request_hits(index, 2, capacity)
        assert hits.sum() == (frame["distinct_blocks_since"] < capacity).sum()


def test_capacity_curves_frame_and_errors():
    trace = token_trace(HAND_PROMPTS)
    curves = bounds.capacity_curves(trace, 4, [4, 1], ["opt", "lru"])
    assert curves["policy"].astype(str).tolist() == ["opt", "opt", "lru", "lru"]
    assert curves["capacity"].tolist() == [1, 4, 1, 4]
    assert set(curves.columns) >= {"policy", "capacity", "hit_tokens", "hit_rate", "block_size"}
    with pytest.raises(BoundsError, match="unknown policy"):
        bounds.capacity_curves(trace, 4, [4], ["fifo"])
    with pytest.raises(BoundsError, match="empty prompt"):
        index_trace(token_trace([[1, 2], []]))
    with pytest.raises(BoundsError, match="include_outputs"):
        bounds.ideal_bound(index_trace(trace), 4, include_outputs=True)
    assert bounds.default_capacities(index_trace(trace), 1)[-1] == 13  # distinct blocks


# --- vLLM's block pool, one request at a time ------------------------------------------------


def test_vllm_pool_reserves_the_null_block_and_evicts_tail_blocks_first():
    # Block size 2, prompts only (each request computes its prompt; one token is generated).
    trace = token_trace([[1, 2, 3, 4, 5], [7, 8, 9], [1, 2, 3, 4, 5]])
    keys = bounds.block_keys(trace, 2)
    assert keys.allocated.tolist() == [3, 2, 3]
    # 4 blocks = null + 3. After the first request the free queue is [its partial block,
    # (1,2,3,4), (1,2)]: the second request takes the partial block, then evicts the tail
    # block (1,2,3,4), not its parent, so the third request still hits (1,2).
    assert bounds.simulate_vllm(keys, 4).hit_blocks.tolist() == [0, 0, 1]
    assert bounds.simulate_vllm(keys, 5).hit_blocks.tolist() == [0, 0, 2]
    with pytest.raises(BoundsError, match="num_blocks >= 4"):
        bounds.simulate_vllm(keys, 3)


def test_vllm_pool_keeps_a_second_copy_of_a_recomputed_block():
    # 4 tokens at block 2: the second block is full but not eligible (last token recomputed),
    # so the repeat computes it again into a new block: vLLM caches a second copy.
    trace = token_trace([[1, 2, 3, 4], [1, 2, 3, 4]])
    sim = bounds.simulate_vllm(bounds.block_keys(trace, 2), 10)
    assert sim.hit_blocks.tolist() == [0, 1]
    assert sim.duplicates == 1


def test_vllm_pool_is_lru_with_the_capacity_left_between_requests():
    """Without second copies, vLLM one request at a time is LRU whose capacity after request R
    is num_blocks - 1 (null block) - 1 if R's last block is partial (it stays uncached in front
    of the free queue)."""
    rng = np.random.default_rng(9)
    compared = 0
    for trial in range(60):
        index = index_trace(random_trace(rng, 30), include_outputs=trial % 2 == 0)
        size = int(rng.integers(2, 4))
        keys = index.block_keys(size)
        distance, _ = index.lru_distances(size)
        partial = (index.computed_tokens % size != 0).astype(np.int64)
        for num_blocks in range(int(keys.allocated.max()) + 1, keys.num_keys + 6, 2):
            sim = bounds.simulate_vllm(keys, num_blocks)
            if sim.duplicates:
                continue
            left = num_blocks - 1 - np.concatenate([[0], partial[:-1]])
            request = np.repeat(np.arange(keys.num_requests), np.diff(keys.offsets))
            hit = (distance >= 0) & (distance < left[request])
            expected = np.bincount(request[hit], minlength=keys.num_requests)
            assert sim.hit_blocks.tolist() == expected.tolist()
            compared += 1
    assert compared > 50


# --- the command -----------------------------------------------------------------------------


def run_command(argv: list[str], capsys) -> tuple[int, str]:
    from analysis.commands import bounds as command
    from analysis.platform.errors import AnalysisError

    parser = argparse.ArgumentParser()
    command.configure(parser)
    try:
        code = command.main(parser.parse_args(argv))
    except AnalysisError as exc:
        return 2, str(exc)
    return code, capsys.readouterr().out


def test_command_on_a_parquet_trace(tmp_path, capsys):
    path = tmp_path / "trace.parquet"
    token_trace(HAND_PROMPTS).to_parquet(path)
    code, out = run_command(["--trace", str(path), "--block-size", "4", "--json"], capsys)
    assert code == 0
    result = json.loads(out)
    assert result["ideal_hit_rate"] == pytest.approx(12 / 32)
    assert result["requests"] == 4 and result["tokens"] == 32
    assert {row["policy"] for row in result["curves"]} == {"lru", "opt"}
    assert result["token_vs_block"][0] == {
        "level": "token",
        "block_size": 1,
        "hit_rate": pytest.approx(18 / 32),
        "hit_tokens": 18,
    }
    code, out = run_command(
        ["--trace", str(path), "--block-size", "4", "--policies", "vllm", "--capacities", "2", "9"],
        capsys,
    )
    assert code == 0 and "vllm at 2 blocks: below 4" in out and "ideal hit rate 37.50%" in out


def test_command_errors_are_one_line(tmp_path, capsys):
    code, message = run_command(["--trace", str(tmp_path / "none.parquet")], capsys)
    assert code == 2 and "no trace at" in message
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0}\n')
    code, message = run_command(["--trace", str(tmp_path / "t.jsonl")], capsys)
    assert code == 2 and "needs --block-size" in message


def test_importing_the_modules_stays_light():
    import subprocess
    import sys

    code = (
        "import sys, analysis.metrics.bounds, analysis.data.blockhash, analysis.commands.bounds; "
        "print(sorted({'vllm', 'torch', 'numba'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ideal_hits_by_position_by_hand():
    # block size 2; B shares 4 tokens with A (2 blocks), C shares 2 (1 block), D shares 3 with A
    # but only its first block is whole; every later hit repeats block 1 or 2 of A's chain
    prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6, 7], [1, 2, 9, 9, 9], [1, 2, 3, 8, 8]]
    table = bounds.ideal_hits_by_position(token_trace(prompts), 2, first_positions=1)
    table = table.set_index("block_position")
    assert table.index.tolist() == ["1", "2+"]
    assert table.loc["1", ["hits", "blocks_hit", "hits_per_block_max"]].tolist() == [3, 1, 3]
    assert table.loc["2+", ["hits", "blocks_hit", "hits_per_block_mean"]].tolist() == [1, 1, 1.0]
    assert table["hit_tokens"].sum() == bounds.ideal_bound(token_trace(prompts), 2).hit_tokens
    assert table["share_of_hit_tokens"].tolist() == pytest.approx([0.75, 0.25])
