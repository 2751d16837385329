"""How long each stage of `make report` takes: an estimate first, a table at the end.

The stages (set-up, traces, sweep, each notebook, HTML export) append
their wall time to `reports/timings.json` as they finish. A new run starts a new file and keeps
the last finished one under "previous": that is what the next estimate reads, together with
the run times the notebooks state in their first cells and the sweep points still to run.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from analysis.platform.paths import reports_dir

TIMINGS_FILE = "timings.json"
# "About 5 min", "About 20-40 s", "Under a minute", "Seconds to a minute": the upper bound.
_STATED = re.compile(r"(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?\s*(s\b|sec|min)", re.IGNORECASE)


def timings_path() -> Path:
    return reports_dir() / TIMINGS_FILE


def load() -> dict[str, Any]:
    path = timings_path()
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:  # a run killed while writing: start again
        return {}


def save(timings: dict[str, Any]) -> None:
    path = timings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".json.partial")
    staging.write_text(json.dumps(timings, indent=2) + "\n")
    staging.replace(path)


# The row that holds what no stage timed (processes starting between stages, the wait for the
# serving study's servers before notebook 08), so that the total is the run's wall time.
OUTSIDE = "outside the stages"


def begin(setup_s: float = 0.0) -> dict[str, Any]:
    """A new run's record; the last finished run moves under "previous" for the estimate.
    `setup_s`: the seconds the run spent before this call (setting up the environment)."""
    old = load()
    previous = old if old.get("finished") else old.get("previous")
    if previous:
        previous = {k: v for k, v in previous.items() if k != "previous"}
    timings = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "started_at_s": time.time() - setup_s,
        "finished": None,
        "machine": _machine(),
        "stages": [],
        "previous": previous,
    }
    save(timings)
    return timings


def current() -> dict[str, Any]:
    """The run in progress, or a new one when the last was finished (a standalone command)."""
    timings = load()
    if not timings or timings.get("finished"):
        timings = begin()
    return timings


def record(stage: str, seconds: float, ok: bool = True, within: str | None = None) -> None:
    """A stage's wall time; `within`: the stage it ran inside (a notebook executed side by side
    with others, inside their run), which the total does not count again."""
    timings = current()
    entry = {"stage": stage, "seconds": round(seconds, 1), "ok": ok}
    if within is not None:
        entry["within"] = within
    timings["stages"].append(entry)
    save(timings)


def counted(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stages that make up the total: not the ones that ran inside another."""
    return [s for s in stages if not s.get("within")]


def finish() -> dict[str, Any]:
    """The run's end: what no stage timed becomes a stage of its own (`OUTSIDE`), so that the
    total is the wall time from the start of the set-up to now."""
    timings = current()
    timings["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    timed = sum(s["seconds"] for s in counted(timings["stages"]))
    if "started_at_s" in timings:
        outside = time.time() - timings["started_at_s"] - timed
        if outside >= 0.05:
            timings["stages"].append({"stage": OUTSIDE, "seconds": round(outside, 1), "ok": True})
    timings["total_s"] = round(sum(s["seconds"] for s in counted(timings["stages"])), 1)
    save(timings)
    return timings


def run_stage(stage: str, command: str) -> int:
    """Run a shell command as one timed stage; its exit status is returned (and recorded)."""
    import subprocess

    started = time.perf_counter()
    print(f"== {stage}: {command}", flush=True)
    rc = subprocess.call(command, shell=True, executable="/bin/bash")
    seconds = time.perf_counter() - started
    record(stage, seconds, ok=rc == 0)
    print(f"== {stage}: {format_seconds(seconds)}" + ("" if rc == 0 else f" (exit {rc})"))
    return rc


def table(timings: dict[str, Any]) -> str:
    """The per-stage time table, printed at the end of `make report`: a run of notebooks
    executed side by side, then each of them indented under it (their times overlap)."""
    stages = timings.get("stages", [])
    width = max([len(s["stage"]) + (2 if s.get("within") else 0) for s in stages] + [5])
    lines = [f"{'stage':<{width}}  {'time':>8}"]
    for s in stages:
        flag = "" if s.get("ok", True) else "  (failed)"
        name = f"  {s['stage']}" if s.get("within") else s["stage"]
        lines.append(f"{name:<{width}}  {format_seconds(s['seconds']):>8}{flag}")
    total = sum(s["seconds"] for s in counted(stages))
    lines.append(f"{'total':<{width}}  {format_seconds(total):>8}")
    return "\n".join(lines)


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}m{rest:02d}s"


def stated_seconds(notebook: Path) -> float | None:
    """The run time a notebook's first markdown cell states (its upper bound), if it does."""
    cells = json.loads(Path(notebook).read_text()).get("cells", [])
    first = next((c for c in cells if c.get("cell_type") == "markdown"), None)
    if first is None:
        return None
    text = "".join(first.get("source", []))
    line = next((ln for ln in text.splitlines() if "run time" in ln.lower()), "")
    line = line.split("**", 2)[-1]  # the text after "**Run time on a 2-core CPU.**"
    match = _STATED.search(line)
    if match:
        value = float(match.group(2) or match.group(1))
        return value * 60 if match.group(3).lower() == "min" else value
    if "a minute" in line.lower():
        return 60.0
    return None


def overrun(seconds: float, stated: float | None) -> str | None:
    """A note when a notebook took clearly longer than its first cell says (None otherwise)."""
    if stated is None or seconds <= 1.5 * stated + 10:
        return None
    return f"longer than the {format_seconds(stated)} its first cell states"


def estimate(notebooks: list[Path], pending_points: dict[str, int] | None) -> str:
    """What the next run should take: the last finished run here, the notebooks' own
    statements, and how many sweep points are still to run."""
    timings = load()
    previous = timings.get("previous") if not timings.get("finished") else timings
    lines = ["Estimate for `make report`:"]
    machine = _machine()
    lines.append(
        f"  machine: {machine.get('cpu_capability')} ({machine.get('cores')} cores), "
        f"local models in {machine.get('dtype')}"
    )
    if previous and previous.get("stages"):
        same = previous.get("machine") == machine
        note = "" if same else " (machine or dtype differed)"
        total = sum(s["seconds"] for s in counted(previous["stages"]))
        lines.append(f"  the last finished run here took {format_seconds(total)}{note}; per stage:")
        lines += ["    " + row for row in table(previous).splitlines()]
    stated = {p.name: stated_seconds(p) for p in notebooks}
    known = [v for v in stated.values() if v is not None]
    unknown = [k for k, v in stated.items() if v is None]
    lines.append(
        f"  the notebooks state about {format_seconds(sum(known))} together"
        + (f" (no stated time: {', '.join(unknown)})" if unknown else "")
    )
    if pending_points is None:
        lines.append("  sweep points: counted once the traces are built")
    else:
        left = ", ".join(f"{n} {engine}" for engine, n in sorted(pending_points.items()))
        lines.append(f"  sweep points still to run: {left or 'none'}")
    return "\n".join(lines)


def pending_points(*grids: str) -> dict[str, int] | None:
    """The grids' points without a complete result (one count per distinct result), per
    engine; None while a grid's traces are not built (its "log:N" and "max" points are sized
    from them). An unknown or broken grid is its one-line GridError, as `sweep` gives it: an
    estimate must not hide it."""
    from analysis.sweeps.grid import grid_points, is_done, load_grid, missing_traces, result_folder

    if any(missing_traces(load_grid(grid)) for grid in grids):
        return None
    pending = {
        result_folder(point): point.config.engine
        for grid in grids
        for point in grid_points(grid)
        if not is_done(point)
    }
    return dict(Counter(pending.values()))


def _machine() -> dict[str, Any]:
    """What makes timings comparable between runs: CPU capability, cores, the models' dtype."""
    from analysis.platform.hardware import choose_dtype, machine

    facts = machine()
    return {
        "cpu_capability": facts.cpu_capability,
        "cpu_name": facts.cpu_name,
        "cores": facts.cores,
        "cuda": facts.cuda,
        "dtype": choose_dtype().dtype,
    }
