"""Where `make test` and `make report` spent their time (`analysis.report.durations`): read
from pytest's junit files and reports/timings.json, printed as a table, written as CSV."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from analysis import cli
from analysis.report import durations, timings

# As pytest (xdist or not) writes them: one suite in a <testsuites>, a node id per classname.
PYTEST_XML = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" tests="3" time="95.5" timestamp="2026-01-02T03:04:05+00:00">
<testcase classname="tests.test_a" name="test_slow" time="61.0" />
<testcase classname="tests.test_b.TestGroup" name="test_fast[1]" time="0.25" />
<testcase classname="tests.test_a" name="test_middle" time="12.0" />
</testsuite></testsuites>"""
NBVAL_XML = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" tests="4" time="40.0" timestamp="2026-01-02T03:06:00+00:00">
<testcase classname="notebooks.00-download-sharegpt.ipynb" name="Cell 0" time="3.0" />
<testcase classname="notebooks.00-download-sharegpt.ipynb" name="Cell 1" time="2.5" />
<testcase classname="notebooks.04-why-few-blocks.ipynb" name="Cell 0" time="20.0" />
<testcase classname="notebooks.04-why-few-blocks.ipynb" name="Cell 3" time="10.0" />
</testsuite></testsuites>"""


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    monkeypatch.delenv(durations.STARTED_ENV, raising=False)  # `.ci/run` sets it for make test
    return tmp_path


def test_junit_files_give_phases_slowest_tests_and_each_notebook(root: Path) -> None:
    folder = durations.junit_dir()
    folder.mkdir(parents=True)
    (folder / durations.PYTEST_XML).write_text(PYTEST_XML)
    (folder / "nbval-1.xml").write_text(NBVAL_XML)
    rows, recorded = durations.from_junit_dir()
    assert recorded == "2026-01-02T03:04:05+00:00"
    by_section = {}
    for row in rows:
        by_section.setdefault(row.section, []).append((row.name, row.seconds))
    assert by_section["phase"] == [("pytest", 95.5), ("nbval", 40.0)]
    assert by_section["test"] == [
        ("test_a::test_slow", 61.0),
        ("test_a::test_middle", 12.0),
        ("test_b.TestGroup::test_fast[1]", 0.25),
    ]
    assert by_section["notebook"] == [
        ("04-why-few-blocks.ipynb", 30.0),
        ("00-download-sharegpt.ipynb", 5.5),
    ]
    assert durations.junit_rows(durations.read_junit(folder / "pytest.xml"), None, slowest=1)[
        1:
    ] == [durations.Row("test", "test_a::test_slow", 61.0)]


def test_the_command_prints_the_table_and_writes_the_csv(root: Path, capsys) -> None:
    folder = durations.junit_dir()
    folder.mkdir(parents=True)
    (folder / "nbval-1.xml").write_text(NBVAL_XML)  # `make nbval` alone: no pytest file
    assert cli.main(["durations"]) == 0
    out = capsys.readouterr().out
    assert "04-why-few-blocks.ipynb" in out and "30 s" in out and "  pytest " not in out
    path = root / "reports" / durations.TEST_CSV
    with path.open(newline="") as handle:
        written = list(csv.DictReader(handle))
    assert list(written[0]) == list(durations.FIELDS)
    assert [(r["section"], r["name"], r["seconds"]) for r in written] == [
        ("phase", "nbval", "40.00"),
        ("notebook", "04-why-few-blocks.ipynb", "30.00"),
        ("notebook", "00-download-sharegpt.ipynb", "5.50"),
    ]
    assert {r["recorded"] for r in written} == {"2026-01-02T03:06:00+00:00"}
    assert durations.read_csv(path)[0] == durations.Row("phase", "nbval", 40.0)


def test_nbval_runs_count_as_one_phase_in_order(root: Path) -> None:
    """nbval runs once per run of notebooks (alone or side by side): one phase, their wall
    times summed, every notebook's cells, the first run's start."""
    folder = durations.junit_dir()
    folder.mkdir(parents=True)
    later = NBVAL_XML.replace("2026-01-02T03:06:00", "2026-01-02T03:07:00").replace(
        "00-download-sharegpt", "13-fleet"
    )
    (folder / "nbval-10.xml").write_text(later.replace("04-why-few-blocks", "17-time"))
    (folder / "nbval-2.xml").write_text(NBVAL_XML)
    rows, recorded = durations.from_junit_dir()
    assert recorded == "2026-01-02T03:06:00+00:00"
    assert rows[0] == durations.Row("phase", "nbval", 80.0)
    assert {r.name for r in rows if r.section == "notebook"} == {
        "00-download-sharegpt.ipynb",
        "04-why-few-blocks.ipynb",
        "13-fleet.ipynb",
        "17-time.ipynb",
    }


def test_no_junit_file_is_said_not_raised(root: Path, capsys) -> None:
    assert cli.main(["durations", "test"]) == 0
    assert "no junit files" in capsys.readouterr().out


def test_report_stages_are_tabled_and_written(root: Path, capsys) -> None:
    timings.begin()
    timings.record("traces", 12.0)
    timings.record("notebook 00-download-sharegpt", 5.0, ok=False)
    timings.finish()
    assert cli.main(["durations", "report"]) == 0
    out = capsys.readouterr().out
    assert "notebook 00-download-sharegpt (failed)" in out and "17 s" in out
    rows = durations.read_csv(root / "reports" / durations.REPORT_CSV)
    assert rows == [
        durations.Row("stage", "traces", 12.0),
        durations.Row("stage", "notebook 00-download-sharegpt (failed)", 5.0),
        durations.Row("total", "total", 17.0),
    ]


def test_notebooks_side_by_side_count_once_in_the_total(root: Path, capsys) -> None:
    timings.begin()
    timings.record("traces", 12.0)
    timings.record("notebooks 02-07, 2 at a time", 50.0)
    timings.record("notebook 02-identical-requests", 30.0, within="notebooks 02-07, 2 at a time")
    timings.record("notebook 04-why-few-blocks", 40.0, within="notebooks 02-07, 2 at a time")
    finished = timings.finish()
    assert finished["total_s"] == 62.0
    assert "\n  notebook 04-why-few-blocks  " in timings.table(finished)
    assert timings.table(finished).splitlines()[-1].split() == ["total", "1m02s"]
    assert durations.report_rows(finished) == [
        durations.Row("stage", "traces", 12.0),
        durations.Row("stage", "notebooks 02-07, 2 at a time", 50.0),
        durations.Row("side by side", "notebook 02-identical-requests", 30.0),
        durations.Row("side by side", "notebook 04-why-few-blocks", 40.0),
        durations.Row("total", "total", 62.0),
    ]


def test_a_fresh_run_from_its_start_adds_its_set_up_and_total(root: Path, monkeypatch) -> None:
    """`.ci/run` gives the epoch second it started: set-up is what passed before pytest began,
    the total what passed until the table; the machine is recorded beside every row."""
    from datetime import datetime

    folder = durations.junit_dir()
    folder.mkdir(parents=True)
    (folder / durations.PYTEST_XML).write_text(PYTEST_XML)
    (folder / "nbval-1.xml").write_text(NBVAL_XML)
    began = datetime.fromisoformat("2026-01-02T03:04:05+00:00").timestamp()
    monkeypatch.setenv(durations.STARTED_ENV, str(began - 150.0))
    monkeypatch.setattr(durations, "machine_line", lambda: "Some CPU, AVX2")
    assert cli.main(["durations"]) == 0
    with (root / "reports" / durations.TEST_CSV).open(newline="") as handle:
        written = list(csv.DictReader(handle))
    assert (written[0]["section"], written[0]["name"]) == ("phase", "set-up and ruff")
    assert float(written[0]["seconds"]) == 150.0
    assert (written[-1]["section"], written[-1]["name"]) == ("total", "make test")
    assert float(written[-1]["seconds"]) > 150.0 + 95.5  # began long ago: now is later still
    assert {r["machine"] for r in written} == {"Some CPU, AVX2"}


def test_the_readme_counts_a_side_by_side_run_once(tmp_path: Path) -> None:
    """The README's line on a recorded `make report`: the notebooks' wall time counts a run of
    them side by side once, and its notebooks still rank among the slowest."""
    from analysis.report import readme_sections

    path = tmp_path / readme_sections.REPORT_TIMES
    path.parent.mkdir(parents=True)
    rows = [
        durations.Row("stage", "environment set-up", 50.0),
        durations.Row("stage", "traces", 20.0),
        durations.Row("stage", "sweep", 100.0),
        durations.Row("stage", "notebook 08-ttft", 300.0),
        durations.Row("stage", "notebooks 09, 13-14, 2 at a time", 120.0),
        durations.Row("side by side", "notebook 13-fleet", 110.0),
        durations.Row("side by side", "notebook 14-capacity", 40.0),
        durations.Row("side by side", "notebook 09-seeds", 30.0),
        durations.Row("total", "total", 590.0),
    ]
    durations.write_csv(rows, path, "2026-01-02T03:04:05+00:00")
    line = readme_sections.report_times(tmp_path)
    assert "took 9m50s" in line
    assert "4 notebooks 7m00s (one run of them side by side: 09, 13-14)" in line
    assert "slowest notebooks: 08 5m00s, 13 1m50s, 14 40 s" in line
    assert "outside the stages" not in line  # recorded before that row was

    rows[-1:] = [
        durations.Row("stage", timings.OUTSIDE, 25.0),
        durations.Row("total", "total", 615.0),
    ]
    durations.write_csv(rows, path, "2026-01-02T03:04:05+00:00")
    line = readme_sections.report_times(tmp_path)
    assert "took 10m15s" in line and "outside the stages 25 s." in line


def test_the_machine_line_says_what_torch_was_told_to_dispatch_as(monkeypatch) -> None:
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    plain = durations.machine_line()
    assert "ATEN_CPU_CAPABILITY" not in plain
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert durations.machine_line() == f"{plain} (ATEN_CPU_CAPABILITY=avx2)"
