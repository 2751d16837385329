"""Which notebooks run side by side (`analysis.report.schedule`), and `python -m analysis report`
executing a run of them at once: the ones that time a real server alone, the others sharing the
cores, the total counting a shared run once. nbval follows the same plan (`--plan`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from analysis.report import schedule, timings
from analysis.report.notebooks import report_notebooks


def names(run: schedule.Run) -> list[str]:
    return [p.name[:2] for p in run.notebooks]


def test_the_committed_notebooks_fall_into_four_runs_once_the_sweep_is_done() -> None:
    runs = schedule.runs(report_notebooks(), sweep_complete=True)
    shared = ["02", "03", "04", "05", "06", "07", "09", "13", "14", "15", "17"]
    assert [(sorted(names(r)), r.side_by_side) for r in runs] == [
        (["00", "01"], False),
        (shared, True),
        (["08", "10", "11"], False),
        (["12", "16"], True),
    ]
    assert [r.name for r in runs] == [
        "notebooks 00-01",
        "notebooks 02-07, 09, 13-15, 17",
        "notebooks 08, 10-11",
        "notebooks 12, 16",
    ]
    # the longest first, by what each notebook's first cell states: the fleet grid (13)
    stated = [timings.stated_seconds(p) or 0.0 for p in runs[1].notebooks]
    assert stated == sorted(stated, reverse=True)
    assert names(runs[1])[0] == "13"


def test_notebook_04_runs_the_missing_sweep_alone_before_the_notebooks_that_read_it() -> None:
    runs = schedule.runs(report_notebooks(), sweep_complete=False)
    assert [(names(r), r.side_by_side) for r in runs[:3]] == [
        (["00", "01"], False),
        (["04"], False),
        (names(runs[2]), True),
    ]
    assert "04" not in names(runs[2]) and {"05", "06"} <= set(names(runs[2]))


def test_a_lone_shareable_notebook_runs_alone() -> None:
    given = [Path(f"{n}-x.ipynb") for n in ("03", "08", "16")]  # stated times unknown
    runs = schedule.runs(given)
    assert [(names(r), r.side_by_side) for r in runs] == [
        (["03"], False),
        (["08"], False),
        (["16"], False),
    ]


def test_shareable_notebooks_in_the_study_run_before_it_and_its_readers_after() -> None:
    given = [Path(f"{n}-x.ipynb") for n in ("07", "08", "09", "10", "13", "16", "17")]
    runs = schedule.runs(given)
    assert [(names(r), r.side_by_side) for r in runs] == [
        (["07", "09", "13", "17"], True),  # reading order among notebooks that state no time
        (["08", "10"], False),
        (["16"], False),
    ]


def test_the_sweep_counts_as_complete_when_04_is_not_run() -> None:
    assert schedule.sweep_complete([Path("09-x.ipynb")], grid="no-such-grid")


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 2), (3, 3), (16, 4)])
def test_one_notebook_per_core_at_most_four(cores: int, workers: int, monkeypatch) -> None:
    monkeypatch.delenv(schedule.WORKERS_ENV, raising=False)
    assert schedule.side_by_side_workers(cores) == workers


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_worker_count_is_one_line(value: str, monkeypatch) -> None:
    from analysis.platform.errors import UsageError

    monkeypatch.setenv(schedule.WORKERS_ENV, value)
    with pytest.raises(UsageError, match=schedule.WORKERS_ENV):
        schedule.side_by_side_workers()


def test_the_plan_lines_name_paths_from_the_root(tmp_path: Path) -> None:
    given = [tmp_path / "notebooks" / f"{n}-x.ipynb" for n in ("01", "02", "03")]
    assert schedule.plan_lines(given, tmp_path, sweep_complete=True) == [
        "alone notebooks/01-x.ipynb",
        "shared notebooks/02-x.ipynb notebooks/03-x.ipynb",
    ]


# Each stand-in notebook says it started, then waits (at most a minute) until the other one
# has too: run one after another, the first would wait in vain and fail.
MEET = """import pathlib, time
here, other = pathlib.Path("{me}.started"), pathlib.Path("{other}.started")
here.touch()
deadline = time.monotonic() + 60
while not other.exists():
    assert time.monotonic() < deadline, "the other notebook never ran beside this one"
    time.sleep(0.05)
print("met")"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for me, other in (("97", "98"), ("98", "97")):
        cell = nbformat.v4.new_code_cell(MEET.format(me=me, other=other))
        notebook = nbformat.v4.new_notebook(cells=[cell])
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
        nbformat.write(notebook, notebooks / f"{me}-meet.ipynb")
    return tmp_path


def test_report_runs_shareable_notebooks_side_by_side_and_counts_them_once(root: Path) -> None:
    env = dict(os.environ, PREFIX_CACHE_LAB_ROOT=str(root), **{schedule.WORKERS_ENV: "2"})
    done = subprocess.run(
        [sys.executable, "-m", "analysis", "report", "--no-html"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "executing 97-meet.ipynb, 98-meet.ipynb, 2 at a time" in done.stdout
    for name in ("97-meet.ipynb", "98-meet.ipynb"):
        executed = nbformat.read(root / "notebooks" / name, as_version=4)
        assert executed.cells[0].outputs[0]["text"] == "met\n"
    record = json.loads((root / "reports" / "timings.json").read_text())
    # what no stage timed (process starts between stages) is a row of its own, when there is any
    stages = [s for s in record["stages"] if s["stage"] != timings.OUTSIDE]
    outside = sum(s["seconds"] for s in record["stages"] if s["stage"] == timings.OUTSIDE)
    assert stages[0]["stage"] == "notebooks 97-98, 2 at a time"
    assert [s.get("within") for s in stages[1:]] == [stages[0]["stage"]] * 2
    assert record["total_s"] == pytest.approx(stages[0]["seconds"] + outside, abs=0.11)
    assert stages[0]["seconds"] < stages[1]["seconds"] + stages[2]["seconds"]


def test_the_test_files_said_slowest_exist_and_run_first() -> None:
    """A renamed test file would silently drop out of the order that balances the workers."""
    import importlib.util

    here = Path(__file__).parent
    spec = importlib.util.spec_from_file_location("order", here / "conftest.py")
    order = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(order)
    assert all((here / f"{name}.py").is_file() for name in order.SLOWEST_FIRST)
    items = [
        SimpleNamespace(path=here / f"{name}.py")
        for name in ("test_a", "test_serving", "test_b", "test_fleet")
    ]
    order.pytest_collection_modifyitems(items)
    assert [item.path.stem for item in items] == ["test_serving", "test_fleet", "test_a", "test_b"]
