"""`make bench`: time the heavy paths, each benchmark printing ratios measured in the same run.

Run one with `python bench/run.py traces` (names: traces, engines, bounds, serving).
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

BENCHMARKS = ("traces", "engines", "bounds", "serving")


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    chosen = argv or list(BENCHMARKS)
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
        return 2
    for name in chosen:
        print(f"\n=== bench: {name} ===", flush=True)
        started = time.perf_counter()
        importlib.import_module(name).main()
        print(f"=== {name}: {time.perf_counter() - started:.1f} s ===", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
