"""`make bench`: time the heavy paths, each benchmark printing ratios measured in the same run.

Run one with `python bench/run.py traces` (names: dtype, traces, engines, replay, clock,
decode_sharing, bounds, plan, serving, sweep; `replay` is the whole-trace replay against its
baseline revision and the fleet, without the real-engine sample of `engines`). A benchmark's
entry point may return {ratio name: value}; every ratio is printed again in one table at the
end, under the machine it was measured on. Speed is only ever compared within one run: no
test asserts on it.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

BENCHMARKS = (
    "dtype",
    "traces",
    "engines",
    "replay",
    "clock",
    "decode_sharing",
    "bounds",
    "plan",
    "serving",
    "sweep",
)
# A benchmark that is one entry point of another's file: name -> (file, function).
ENTRY_POINTS = {"replay": ("engines", "replay_main")}


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
    print(machine_line(), flush=True)
    seconds: dict[str, float] = {}
    ratios: list[tuple[str, str, float]] = []
    for name in chosen:
        print(f"\n=== bench: {name} ===", flush=True)
        started = time.perf_counter()
        file, function = ENTRY_POINTS.get(name, (name, "main"))
        measured = getattr(load(file), function)()
        seconds[name] = time.perf_counter() - started
        ratios += [(name, ratio, value) for ratio, value in (measured or {}).items()]
        print(f"=== {name}: {seconds[name]:.1f} s ===", flush=True)
    print_summary(seconds, ratios)
    return 0


def machine_line() -> str:
    """Cores, torch's CPU ISA and the local models' dtype: what the ratios depend on most."""
    from analysis.platform.hardware import choose_dtype, machine

    facts, choice = machine(), choose_dtype()
    return (
        f"machine: {facts.cpu_name or 'CPU'}, {facts.cores} cores, torch dispatches "
        f"{facts.cpu_capability}; local models in {choice.dtype}: {choice.reason}"
    )


def print_summary(seconds: dict[str, float], ratios: list[tuple[str, str, float]]) -> None:
    """One table: each benchmark's wall time, then every ratio measured in this run."""
    print("\n=== summary (this run, this machine) ===")
    for name, value in seconds.items():
        print(f"  {name:10s} {value:8.1f} s")
    if ratios:
        width = max(len(ratio) for _, ratio, _ in ratios)
        print(f"  {'benchmark':10s} {'ratio':{width}s} {'value':>9s}")
        for name, ratio, value in ratios:
            print(f"  {name:10s} {ratio:{width}s} {value:9.3g}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
