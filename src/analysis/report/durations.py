"""Where `make test` and `make report` spent their time: a small table, and the same rows as CSV.

`make test` runs pytest and nbval with `--junitxml` into `reports/junit/`; from those files
come each phase's wall time (a test suite's own `time`), pytest's slowest tests (setup, call
and teardown together, as pytest's junit report counts them) and each notebook's time under
nbval (its cells summed, the kernel's start in its first cell's setup). `make report` records
its stages in `reports/timings.json` (`analysis.report.timings`). Both are written as CSV under
`reports/` (`section,name,seconds,recorded,cores`), so that a line about them can be rendered
from a recorded run, never typed by hand.
"""

from __future__ import annotations

import csv
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.platform.paths import reports_dir

JUNIT_DIR = "junit"
PYTEST_XML = "pytest.xml"
# nbval runs once per run of notebooks (`analysis.report.schedule`): nbval-1.xml, nbval-2.xml...
NBVAL_GLOB = "nbval-*.xml"
TEST_CSV = "test-times.csv"
REPORT_CSV = "report-times.csv"
SLOWEST = 15
FIELDS = ("section", "name", "seconds", "recorded", "cores", "machine")
# `.ci/run` sets this to the epoch second it started, so that a fresh run's set-up (the
# environment, ruff) and its whole time are rows too.
STARTED_ENV = "PREFIX_CACHE_LAB_TEST_STARTED"


@dataclass(frozen=True)
class Row:
    section: str  # phase, test, notebook (make test); stage, side by side, total (make report)
    name: str
    seconds: float


@dataclass(frozen=True)
class Suite:
    seconds: float  # the run's wall time
    timestamp: str
    cases: list[tuple[str, float]]  # (pytest node id, seconds)


def junit_dir() -> Path:
    return reports_dir() / JUNIT_DIR


def read_junit(path: Path) -> Suite:
    """A pytest junit file: its wall time, when it started, each test case's time."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    cases = []
    for suite in suites:
        for case in suite.iter("testcase"):
            cases.append((_node_id(case), float(case.get("time") or 0.0)))
    seconds = sum(float(s.get("time") or 0.0) for s in suites)
    timestamp = next((s.get("timestamp") for s in suites if s.get("timestamp")), "")
    return Suite(seconds, timestamp, cases)


def merged(suites: list[Suite]) -> Suite | None:
    """Suites run one after another as one: their wall times summed, the first one's start."""
    if not suites:
        return None
    timestamp = next((s.timestamp for s in suites if s.timestamp), "")
    cases = [case for s in suites for case in s.cases]
    return Suite(sum(s.seconds for s in suites), timestamp, cases)


def _node_id(case: ET.Element) -> str:
    """A test case's name as pytest's junit report gives it: its classname (the file's path,
    dotted, without the tests folder: `test_x`, `test_x.TestClass`) and its name."""
    classname = case.get("classname", "").removeprefix("tests.")
    return f"{classname}::{case.get('name', '')}"


def notebook_of(node_id: str) -> str:
    """The notebook a nbval cell belongs to ("notebooks.04-x.ipynb::Cell 3" -> "04-x.ipynb")."""
    classname = node_id.split("::", 1)[0]
    head = classname.removesuffix(".ipynb")
    return head.rsplit(".", 1)[-1] + ".ipynb" if classname.endswith(".ipynb") else classname


def junit_rows(pytest: Suite | None, nbval: Suite | None, slowest: int = SLOWEST) -> list[Row]:
    """The phases' wall times, pytest's `slowest` tests, every notebook's time (slowest first)."""
    rows = []
    if pytest is not None:
        rows.append(Row("phase", "pytest", pytest.seconds))
    if nbval is not None:
        rows.append(Row("phase", "nbval", nbval.seconds))
    if pytest is not None:
        ranked = sorted(pytest.cases, key=lambda c: -c[1])[:slowest]
        rows += [Row("test", name, seconds) for name, seconds in ranked]
    if nbval is not None:
        per_notebook: dict[str, float] = {}
        for name, seconds in nbval.cases:
            notebook = notebook_of(name)
            per_notebook[notebook] = per_notebook.get(notebook, 0.0) + seconds
        ranked = sorted(per_notebook.items(), key=lambda item: -item[1])
        rows += [Row("notebook", name, seconds) for name, seconds in ranked]
    return rows


def report_rows(timings: dict[str, Any]) -> list[Row]:
    """`make report`'s stages in the order they ran (a notebook executed side by side with
    others is a row of section "side by side", after its run's stage), and their total."""
    from analysis.report.timings import counted

    stages = timings.get("stages", [])
    rows = [
        Row(
            "side by side" if s.get("within") else "stage",
            s["stage"] + ("" if s.get("ok", True) else " (failed)"),
            s["seconds"],
        )
        for s in stages
    ]
    rows.append(Row("total", "total", sum(s["seconds"] for s in counted(stages))))
    return rows


def table(rows: list[Row]) -> str:
    """The rows as a small text table, one block per section."""
    width = max([len(r.name) for r in rows] + [len("name")])
    lines: list[str] = []
    section = None
    for row in rows:
        if row.section != section:
            section = row.section
            lines.append(f"{section:<{width}}  {'time':>8}")
        lines.append(f"  {row.name:<{width - 2}}  {_seconds(row.seconds):>8}")
    return "\n".join(lines)


def _seconds(seconds: float) -> str:
    from analysis.report.timings import format_seconds

    return f"{seconds:.1f} s" if seconds < 10 else format_seconds(seconds)


def write_csv(rows: list[Row], path: Path, recorded: str) -> Path:
    """The rows as CSV (written whole, then renamed into place), with the machine they ran on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".csv.partial")
    with staging.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(FIELDS)
        cores, machine = os.cpu_count() or "", machine_line()
        for row in rows:
            line = [row.section, row.name, f"{row.seconds:.2f}", recorded, cores, machine]
            writer.writerow(line)
    staging.replace(path)
    return path


def machine_line() -> str:
    """The CPU and what torch dispatches on it ("AMD EPYC, AVX2"): what the times depend on."""
    from analysis.platform.hardware import machine

    facts = machine()
    line = ", ".join(part for part in (facts.cpu_name.strip(), facts.cpu_capability) if part)
    told = os.environ.get("ATEN_CPU_CAPABILITY")  # the capability torch was told to dispatch as
    return f"{line} (ATEN_CPU_CAPABILITY={told})" if told else line


def _run_order(path: Path) -> tuple[int, str]:
    """nbval-2.xml before nbval-10.xml."""
    digits = "".join(c for c in path.stem if c.isdigit())
    return (int(digits) if digits else 0, path.name)


def fresh_run_rows(pytest: Suite | None, started: float, ended: float) -> list[Row]:
    """A run timed from its start (`STARTED_ENV`): the set-up before pytest, and the total."""
    from datetime import datetime

    rows = []
    if pytest is not None and pytest.timestamp:
        began = datetime.fromisoformat(pytest.timestamp).timestamp()
        rows.append(Row("phase", "set-up and ruff", max(0.0, began - started)))
    rows.append(Row("total", "make test", max(0.0, ended - started)))
    return rows


def read_csv(path: Path) -> list[Row]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [Row(r["section"], r["name"], float(r["seconds"])) for r in csv.DictReader(handle)]


def from_junit_dir(
    folder: Path | None = None, started: float | None = None
) -> tuple[list[Row], str] | None:
    """`make test`'s rows from the junit files in `folder` (None when there are none yet);
    with the epoch second the run `started`, its set-up and total as well."""
    folder = folder or junit_dir()
    suites = {
        name: merged([read_junit(path) for path in sorted(folder.glob(name), key=_run_order)])
        for name in (PYTEST_XML, NBVAL_GLOB)
    }
    if not any(suites.values()):
        return None
    recorded = next((s.timestamp for s in suites.values() if s is not None and s.timestamp), "")
    rows = junit_rows(suites[PYTEST_XML], suites[NBVAL_GLOB])
    if started is not None:
        import time

        extra = fresh_run_rows(suites[PYTEST_XML], started, time.time())
        rows = extra[:-1] + rows + extra[-1:]
    return rows, recorded
