"""Two-level (GPU, CPU) bounds against plain two-tier simulators written the slow way."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pandas as pd
import pytest

from analysis.metrics import bounds
from analysis.metrics.bounds import BoundsError, index_trace
from analysis.metrics.bounds.capacity import _next_eligible_use
from analysis.metrics.bounds.tiers import tier_bounds, tier_request_hits


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


def touch(cache: OrderedDict, key: int) -> None:
    cache[key] = None
    cache.move_to_end(key)


def trim(cache: OrderedDict, capacity: int) -> list[int]:
    dropped = []
    while len(cache) > capacity:
        dropped.append(cache.popitem(last=False)[0])
    return dropped


def walk(stored: list[int], eligible: int, gpu, cpu) -> tuple[int, int]:
    """Hit the GPU's longest cached prefix, then the CPU's run from the first GPU miss."""
    g = 0
    while g < eligible and stored[g] in gpu:
        g += 1
    c = g
    while c < eligible and stored[c] in cpu:
        c += 1
    return g, c - g


def inclusive_lru(keys: bounds.BlockKeys, gpu_cap: int, cpu_cap: int) -> np.ndarray:
    """Write-through: both tiers see every stored block (tail first), each an LRU of its own."""
    gpu: OrderedDict[int, None] = OrderedDict()
    cpu: OrderedDict[int, None] = OrderedDict()
    hits = []
    for r in range(keys.num_requests):
        stored = keys.request_keys(r).tolist()
        hits.append(walk(stored, int(keys.eligible[r]), gpu, cpu))
        for key in reversed(stored):
            touch(gpu, key)
            touch(cpu, key)
        trim(gpu, gpu_cap)
        trim(cpu, cpu_cap)
    return np.array(hits, np.int64).reshape(-1, 2)


def exclusive_lru(keys: bounds.BlockKeys, gpu_cap: int, cpu_cap: int) -> np.ndarray:
    """Victim cache: a used block moves to the GPU; the GPU's evictions move to the CPU."""
    gpu: OrderedDict[int, None] = OrderedDict()
    cpu: OrderedDict[int, None] = OrderedDict()
    hits = []
    for r in range(keys.num_requests):
        stored = keys.request_keys(r).tolist()
        hits.append(walk(stored, int(keys.eligible[r]), gpu, cpu))
        for key in reversed(stored):
            cpu.pop(key, None)
            touch(gpu, key)
        for key in trim(gpu, gpu_cap):  # oldest victim first: the newest ends most recent
            touch(cpu, key)
        trim(cpu, cpu_cap)
    return np.array(hits, np.int64).reshape(-1, 2)


def belady_over_lru(keys: bounds.BlockKeys, gpu_cap: int, cpu_cap: int) -> np.ndarray:
    """MIN on the GPU (furthest next use evicted, deepest first, bypass) over a write-through
    LRU CPU that sees every stored block."""
    next_use = _next_eligible_use(keys)
    gpu: dict[int, tuple[int, int]] = {}
    cpu: OrderedDict[int, None] = OrderedDict()
    hits = []
    for r in range(keys.num_requests):
        start, stored = keys.offsets[r], keys.request_keys(r).tolist()
        hits.append(walk(stored, int(keys.eligible[r]), gpu, cpu))
        for j, key in enumerate(stored):
            if key in gpu:
                gpu[key] = (int(next_use[start + j]), j)
        for j, key in enumerate(stored):
            use = (int(next_use[start + j]), j)
            if key in gpu or use[0] >= keys.num_requests or gpu_cap == 0:
                continue
            if len(gpu) >= gpu_cap:
                victim = max(gpu, key=gpu.__getitem__)
                if use >= gpu[victim]:
                    continue
                del gpu[victim]
            gpu[key] = use
        for key in reversed(stored):
            touch(cpu, key)
        trim(cpu, cpu_cap)
    return np.array(hits, np.int64).reshape(-1, 2)


SIMULATORS = {"lru": inclusive_lru, "lru-exclusive": exclusive_lru, "opt-lru": belady_over_lru}


def fast(index, size: int, gpu_cap: int, cpu_cap: int, policy: str) -> np.ndarray:
    gpu, cpu = tier_request_hits(index, size, gpu_cap, cpu_cap, policy)
    return np.stack([gpu, cpu], axis=1)


def spread(num_keys: int) -> list[int]:
    """Capacities from none to more than every distinct block, small ones densely."""
    return sorted({0, 1, 2, 3, 5, num_keys // 4, num_keys // 2, num_keys, num_keys + 1})


@pytest.mark.parametrize("policy", list(SIMULATORS))
def test_tiers_match_plain_two_tier_simulators(policy):
    rng = np.random.default_rng({"lru": 1, "lru-exclusive": 2, "opt-lru": 3}[policy])
    cpu_hits = 0
    for trial in range(15):
        index = index_trace(random_prompts(rng, 30))
        size = int(rng.integers(1, 4))
        keys = index.block_keys(size)
        for gpu_cap in spread(keys.num_keys):
            for cpu_cap in spread(keys.num_keys):
                expected = SIMULATORS[policy](keys, gpu_cap, cpu_cap)
                got = fast(index, size, gpu_cap, cpu_cap, policy)
                assert got.tolist() == expected.tolist(), (trial, size, gpu_cap, cpu_cap)
                cpu_hits += int(expected[:, 1].sum())
    assert cpu_hits > 100  # the CPU tier is really exercised


def test_without_a_cpu_tier_it_is_plain_lru_and_opt():
    rng = np.random.default_rng(4)
    index = index_trace(random_prompts(rng, 80))
    keys = index.block_keys(2)
    capacities = list(range(0, keys.num_keys + 2, 5))
    frame = tier_bounds(index, 2, [(g, 0) for g in capacities], list(SIMULATORS))
    assert (frame["cpu_hit_blocks"] == 0).all()
    lru = bounds.lru_hit_blocks(index, 2, capacities).tolist()
    for policy in ("lru", "lru-exclusive"):
        assert frame[frame["policy"] == policy]["gpu_hit_blocks"].tolist() == lru
    opt = [int(bounds.opt_request_hits(index, 2, g).sum()) for g in capacities]
    assert frame[frame["policy"] == "opt-lru"]["gpu_hit_blocks"].tolist() == opt


def test_a_large_cpu_reaches_the_ideal_and_an_inclusive_small_one_adds_nothing():
    rng = np.random.default_rng(5)
    index = index_trace(random_prompts(rng, 80))
    keys = index.block_keys(2)
    ideal = bounds.ideal_bound(index, 2).hit_tokens
    big = keys.num_keys
    frame = tier_bounds(index, 2, [(3, big), (0, big), (10, 5)], list(SIMULATORS))
    rows = frame.set_index(["policy", "gpu_capacity", "cpu_capacity"])
    for policy in SIMULATORS:
        for gpu_cap in (3, 0):
            row = rows.loc[(policy, gpu_cap, big)]
            assert (row["gpu_hit_blocks"] + row["cpu_hit_blocks"]) * 2 == ideal
            assert row["hit_rate"] == pytest.approx(ideal / index.total_prompt_tokens)
    # Inclusive: a CPU smaller than the GPU only holds copies of what the GPU holds.
    assert rows.loc[("lru", 10, 5), "cpu_hit_blocks"] == 0
    assert rows.loc[("lru-exclusive", 10, 5), "cpu_hit_blocks"] > 0


def test_tiers_by_hand():
    # Block 2, one eligible block per request: keys A, B, C, A, B.
    trace = [[1, 1, 9], [2, 2, 9], [3, 3, 9], [1, 1, 8], [2, 2, 8]]
    index = index_trace(trace)
    frame = tier_bounds(index, 2, [(1, 3), (1, 2), (2, 1)], ["lru", "lru-exclusive"])
    got = frame.set_index(["policy", "gpu_capacity", "cpu_capacity"])
    # A and B come back at stack distance 2: a CPU of 3 holds them, a GPU of 1 does not.
    assert got.loc[("lru", 1, 3), ["gpu_hit_blocks", "cpu_hit_blocks"]].tolist() == [0, 2]
    assert got.loc[("lru", 1, 2), "cpu_hit_blocks"] == 0  # inclusive: reach is max(G, C) = 2
    assert got.loc[("lru-exclusive", 1, 2), "cpu_hit_blocks"] == 2  # exclusive: G + C = 3
    assert got.loc[("lru-exclusive", 2, 1), ["gpu_hit_blocks", "cpu_hit_blocks"]].tolist() == [
        0,
        2,
    ]
    assert frame["miss_blocks"].tolist() == [3, 5, 5, 3, 3, 3]
    assert list(frame.columns[:5]) == [
        "policy",
        "gpu_capacity",
        "cpu_capacity",
        "gpu_hit_blocks",
        "cpu_hit_blocks",
    ]


def test_engine_order_changes_the_tiers():
    # Two conversations interleaved need a larger stack than one after the other.
    prompts = [[1] * 5, [2] * 5, [1] * 7, [2] * 7]
    ordered = index_trace([prompts[i] for i in (0, 2, 1, 3)])
    interleaved = index_trace(prompts)
    a = tier_bounds(ordered, 2, [(2, 5)], ["lru"]).iloc[0]
    b = tier_bounds(interleaved, 2, [(2, 5)], ["lru"]).iloc[0]
    assert a["gpu_hit_blocks"] == 4 and a["cpu_hit_blocks"] == 0
    assert b["gpu_hit_blocks"] == 0 and b["cpu_hit_blocks"] == 4


def test_bad_inputs_are_named():
    index = index_trace([[1, 2, 3]])
    with pytest.raises(BoundsError, match="unknown tier policy 'mru'"):
        tier_bounds(index, 2, [(1, 1)], ["mru"])
    with pytest.raises(BoundsError, match="capacities must be >= 0 blocks"):
        tier_bounds(index, 2, [(1, -1)])


def test_frame_from_a_trace_frame():
    frame = pd.DataFrame({"prompt_ids": [np.array([1, 2, 3], np.int32)] * 3})
    out = tier_bounds(frame, 2, [(1, 1)])
    assert out["gpu_hit_rate"].tolist() == pytest.approx([4 / 9, 4 / 9])
