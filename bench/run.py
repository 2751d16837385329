"""`make bench`: time the heavy paths, each benchmark printing ratios measured in the same run.

Run one with `python bench/run.py traces` (names: traces, engines, bounds, serving, sweep).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

BENCHMARKS = ("traces", "engines", "bounds", "serving", "sweep")


def load(name: str):
    """The benchmark module bench/<name>.py, loaded from its file."""
    path = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    chosen = argv or list(BENCHMARKS)
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
        return 2
    for name in chosen:
        print(f"\n=== bench: {name} ===", flush=True)
        started = time.perf_counter()
        load(name).main()
        print(f"=== {name}: {time.perf_counter() - started:.1f} s ===", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
