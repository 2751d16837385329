"""The dtype choice: a bf16 and a float32 matmul timed in the same run, and what was chosen.

The local random models run in bf16 only where the CPU computes bf16 natively
(analysis.platform.hardware); this shows why: on an AVX2-only CPU the bf16 matmul is ~150x slower.
Shape 512x768 @ 768x2048: prefill-llama's MLP up-projection over 512 tokens (small enough
that the slow bf16 case takes seconds, not minutes).
"""

from __future__ import annotations

import time

SHAPE = (512, 768, 2048)
# Stop repeating after this long (a bf16 matmul on an AVX2-only CPU takes seconds).
BUDGET_S = 2.0


def gflops(dtype_name: str) -> float:
    """GFLOP/s of the matmul in `dtype_name`, repeated until BUDGET_S; a first call slower
    than that is the measurement itself."""
    import torch

    m, k, n = SHAPE
    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    flop = 2 * m * k * n
    started = time.perf_counter()
    a @ b  # warm-up: the first call picks kernels
    first = time.perf_counter() - started
    if first > BUDGET_S:
        return flop / first / 1e9
    runs, started = 0, time.perf_counter()
    while runs < 2 or time.perf_counter() - started < BUDGET_S:
        a @ b
        runs += 1
    return flop * runs / (time.perf_counter() - started) / 1e9


def main() -> dict[str, float]:
    from analysis.platform.hardware import choose_dtype, machine

    facts = machine()
    print(
        f"torch dispatches {facts.cpu_capability}; bf16 flags "
        f"{'+'.join(facts.cpu_flags) or 'none'}; ONEDNN_MAX_CPU_ISA "
        f"{facts.onednn_max_cpu_isa or 'unset'}"
    )
    speed = {name: gflops(name) for name in ("float32", "bfloat16")}
    for name, value in speed.items():
        print(f"  {name:9s} {value:9.1f} GFLOP/s  ({'x'.join(map(str, SHAPE))})")
    choice = choose_dtype(None, facts)
    print(f"local models: {choice.dtype}: {choice.reason}")
    return {"bf16 / float32 matmul speed": speed["bfloat16"] / speed["float32"]}


if __name__ == "__main__":
    main()
