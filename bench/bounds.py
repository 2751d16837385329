"""Bench: bounds (ideal, LRU and MIN curves, token vs block reuse) over the whole multi-turn trace.

Target: 10 capacities over the whole multi-turn ShareGPT trace in under 60 s on 2 cores.
Run alone with `python bench/run.py bounds`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

BLOCK_SIZE = 16
NUM_CAPACITIES = 10
SLICE_REQUESTS = 2000  # requests the plain-Python kernels are timed on


def main() -> dict[str, float]:
    from analysis.platform.paths import traces_dir

    return run(traces_dir())


def run(folder: Path) -> dict[str, float]:
    """Bench the traces in `folder` (multi_turn.parquet, and single_turn.parquet if there)."""
    from analysis.data.traces import load_trace
    from analysis.metrics import bounds

    path = Path(folder) / "multi_turn.parquet"
    if not path.is_file():
        print(f"skipped: {path} is missing (build it with `make traces`)")
        return {}
    clock = Clock()
    trace = load_trace(path)
    clock.lap("read trace")
    warm_up_kernels()
    clock.lap("compile kernels (numba, cached on disk after the first run)")
    started = time.perf_counter()
    index = bounds.index_trace(trace)
    clock.lap("index: sort + common prefixes")
    ideal = bounds.ideal_bound(index, BLOCK_SIZE)
    keys = index.block_keys(BLOCK_SIZE)
    clock.lap(f"ideal + block keys at block {BLOCK_SIZE}")
    capacities = bounds.default_capacities(index, BLOCK_SIZE, NUM_CAPACITIES)
    lru = bounds.capacity_curves(index, BLOCK_SIZE, capacities, ["lru"])
    lru_s = clock.lap(f"LRU, {len(capacities)} capacities (one stack-distance pass)")
    opt = bounds.capacity_curves(index, BLOCK_SIZE, capacities, ["opt"], progress=False)
    opt_s = clock.lap(f"MIN, {len(capacities)} capacities (one pass each)")
    reuse = bounds.token_vs_block_reuse(index)
    clock.lap("token vs block reuse, 6 block sizes")
    bounds_s = time.perf_counter() - started
    vllm = bounds.simulate_vllm(keys, int(capacities[len(capacities) // 2]))
    vllm_s = clock.lap("vllm block pool, 1 capacity (plain Python)")

    print(
        f"trace: {ideal.requests} requests, {ideal.prompt_tokens:,} prompt tokens, "
        f"{keys.keys.shape[0]:,} stored blocks, {keys.num_keys:,} distinct (block {BLOCK_SIZE})"
    )
    print(
        f"ideal hit rate {ideal.hit_rate:.2%}; multi-turn share of hits "
        f"{ideal.multi_turn_hit_share:.1%}"
    )
    single = Path(folder) / "single_turn.parquet"
    if single.is_file():
        rate = bounds.ideal_hit_rate(load_trace(single), BLOCK_SIZE)
        print(f"single-turn ideal hit rate {rate:.2%} (block {BLOCK_SIZE})")
    for (_, a), (_, b) in zip(lru.iterrows(), opt.iterrows(), strict=True):
        print(f"  capacity {a.capacity:>9,}: LRU {a.hit_rate:.2%}  MIN {b.hit_rate:.2%}")
    print(
        "  reuse: "
        + ", ".join(
            f"{r.level}{'' if r.level == 'token' else r.block_size} {r.hit_rate:.2%}"
            for r in reuse.itertuples()
        )
    )
    print(
        f"  vllm pool at {vllm.num_blocks:,} blocks: "
        f"{vllm.hit_blocks.sum() * BLOCK_SIZE / ideal.prompt_tokens:.2%}"
    )
    clock.report()
    print(
        f"bounds for {len(capacities)} capacities (index to reuse, read excluded): "
        f"{bounds_s:.1f} s (target < 60 s)"
    )
    print(f"ratio MIN per capacity / LRU for all capacities: {opt_s / len(capacities) / lru_s:.1f}")
    print(
        f"ratio vllm pool per capacity / MIN per capacity: {vllm_s / (opt_s / len(capacities)):.1f}"
    )
    plain = time_plain_python(trace.head(SLICE_REQUESTS))
    return {
        "MIN per capacity / LRU all": opt_s / len(capacities) / lru_s,
        "vllm pool / MIN per capacity": vllm_s / (opt_s / len(capacities)),
        "plain Python / compiled LRU": plain,
    }


class Clock:
    def __init__(self) -> None:
        self.laps: list[tuple[str, float]] = []
        self.last = time.perf_counter()

    def lap(self, name: str) -> float:
        now = time.perf_counter()
        seconds = now - self.last
        self.laps.append((name, seconds))
        self.last = now
        return seconds

    def report(self) -> None:
        for name, seconds in self.laps:
            print(f"  {seconds:7.2f} s  {name}")


def warm_up_kernels() -> None:
    from analysis.metrics import bounds

    index = bounds.index_trace([[1, 2, 3, 4], [1, 2, 3, 5]])
    bounds.capacity_curves(index, 2, [1], ["lru", "opt"], progress=False)


def time_plain_python(head) -> float:
    """The same kernels, compiled and as plain Python, on the first requests of the trace."""
    from analysis.metrics import bounds
    from analysis.metrics.bounds.kernels import _compiled, _lru_distance_kernel

    index = bounds.index_trace(head)
    keys = index.block_keys(BLOCK_SIZE)
    args = (keys.keys, keys.offsets, keys.eligible, np.int64(keys.num_keys))
    timings = {}
    for name, kernel in (
        ("compiled", _compiled(_lru_distance_kernel)),
        ("plain Python", _lru_distance_kernel),
    ):
        started = time.perf_counter()
        kernel(*args)
        timings[name] = time.perf_counter() - started
    print(
        f"LRU pass on the first {len(head)} requests ({keys.keys.shape[0]:,} blocks): compiled "
        f"{timings['compiled'] * 1e3:.1f} ms, plain Python {timings['plain Python'] * 1e3:.0f} "
        f"ms, ratio {timings['plain Python'] / timings['compiled']:.0f}"
    )
    return timings["plain Python"] / timings["compiled"]


if __name__ == "__main__":
    main()
