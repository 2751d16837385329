"""Wall time per stage of `make report`: an estimate before, a table after, reports/timings.json.

`make report` runs its stages as separate processes (traces, the inline sweep, the per-point
notebooks under `make -j`, each notebook, the HTML export). Each stage appends its time to
`reports/timings.json`; `python -m analysis report --plan` starts a new run there (keeping the
previous run's times as the estimate for the next) and `python -m analysis report` prints the
table when it is done. Times are wall seconds on this machine; they go to the terminal and
this file, never into a notebook or a test.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from analysis.paths import reports_dir

TIMINGS_FILE = "timings.json"
# The stages of `make report`, in order; each notebook is a stage of its own, after these.
PIPELINE_STAGES = ("traces", "sweep-inline", "sweep-notebooks")
HTML_STAGE = "html"
# Seconds per stage when this machine has no previous run, rounded up from runs on a shared
# 2-core x86 CPU (AVX-512, and the same with torch and oneDNN capped at AVX2, float32 models).
# Update them from a fresh `make report` on the reference machine (README, "Time budgets").
REFERENCE_SECONDS: dict[str, float] = {
    "traces": 70,
    "sweep-inline": 720,
    "sweep-notebooks": 240,
    "00-download-sharegpt": 10,
    "01-build-traces": 10,
    "02-identical-requests": 45,
    "03-run-config": 10,
    "04-why-few-blocks-inflate-hit-rate": 15,
    "05-multi-vs-single-turn": 20,
    "06-block-size": 15,
    "07-bounds-and-production-traces": 25,
    HTML_STAGE: 10,
}
# A notebook without a reference time (notebook 08 states about 5 minutes).
DEFAULT_NOTEBOOK_SECONDS = 300.0


@dataclass(frozen=True)
class Stage:
    name: str
    seconds: float
    ok: bool = True


def timings_path() -> Path:
    return reports_dir() / TIMINGS_FILE


def load(path: Path | None = None) -> dict[str, Any]:
    """The timings file, or an empty finished run when there is none (or it is unreadable)."""
    path = path or timings_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"stages": [], "finished": True}
    data.setdefault("stages", [])
    return data


def save(data: dict[str, Any], path: Path | None = None) -> None:
    path = path or timings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".json.partial")
    staging.write_text(json.dumps(data, indent=2) + "\n")
    staging.replace(path)


def start_run(path: Path | None = None) -> dict[str, float]:
    """Begin a new run in the timings file; return the previous run's seconds per stage."""
    from analysis.hardware import machine_facts

    previous = load(path)
    seconds = {s["name"]: float(s["seconds"]) for s in previous["stages"] if s.get("ok", True)}
    save(
        {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "finished": False,
            "machine": machine_facts().to_dict(),
            "previous": seconds,
            "stages": [],
        },
        path,
    )
    return seconds


def ensure_run(path: Path | None = None) -> None:
    """Keep appending to a run that --plan started; otherwise start a new one."""
    if load(path).get("finished", True):
        start_run(path)


def record(stage: Stage, path: Path | None = None) -> None:
    data = load(path)
    data["stages"] = [s for s in data["stages"] if s["name"] != stage.name] + [asdict(stage)]
    save(data, path)


def finish(path: Path | None = None) -> list[Stage]:
    """Mark the run finished and return its stages."""
    data = load(path)
    data["finished"] = True
    data["total_seconds"] = round(sum(s["seconds"] for s in data["stages"]), 1)
    save(data, path)
    return [Stage(**s) for s in data["stages"]]


def estimate(names: list[str], previous: dict[str, float]) -> list[tuple[str, float, str]]:
    """(stage, seconds, source) per stage: this machine's previous run, else the reference."""
    rows = []
    for name in names:
        if name in previous:
            rows.append((name, previous[name], "previous run here"))
        elif name in REFERENCE_SECONDS:
            rows.append((name, REFERENCE_SECONDS[name], "reference"))
        else:
            rows.append((name, DEFAULT_NOTEBOOK_SECONDS, "reference"))
    return rows


def machine_line() -> str:
    """Cores, torch's CPU ISA and the models' dtype: what the estimate depends on most."""
    from analysis.hardware import default_dtype, machine_facts

    facts, choice = machine_facts(), default_dtype()
    return (
        f"machine: {facts.cpu_cores} cores, torch dispatches {facts.cpu_capability}; "
        f"local models in {choice.dtype}: {choice.reason}"
    )


def format_estimate(rows: list[tuple[str, float, str]]) -> str:
    total = sum(seconds for _, seconds, _ in rows)
    lines = [f"estimated time: about {_minutes(total)} (per stage, in order):"]
    width = max(len(name) for name, _, _ in rows)
    lines += [f"  {name:<{width}}  {_minutes(sec):>8}  ({source})" for name, sec, source in rows]
    return "\n".join(lines)


def format_table(stages: list[Stage]) -> str:
    """A plain table of stage, seconds and share of the total."""
    total = sum(s.seconds for s in stages) or 1.0
    width = max([len(s.name) for s in stages] + [len("total")])
    lines = [f"  {'stage':<{width}}  {'seconds':>8}  {'share':>6}"]
    for s in stages:
        flag = "" if s.ok else "  FAILED"
        lines.append(f"  {s.name:<{width}}  {s.seconds:8.1f}  {s.seconds / total:6.1%}{flag}")
    lines.append(
        f"  {'total':<{width}}  {sum(s.seconds for s in stages):8.1f}  "
        f"({_minutes(sum(s.seconds for s in stages))})"
    )
    return "\n".join(lines)


def _minutes(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"
