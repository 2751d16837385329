"""`python -m analysis coverage`: coverage's JSON report read into the table `make coverage`
prints and keeps, and the README line quoted from a kept table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis import cli
from analysis.report import coverage, readme_sections

# The shape coverage's `json` report has (coverage 7): totals, and a summary per file.
REPORT = {
    "meta": {"format": 3},
    "files": {
        "src/analysis/b.py": {
            "summary": {"num_statements": 40, "missing_lines": 30, "percent_covered": 25.0}
        },
        "src/analysis/a.py": {
            "summary": {"num_statements": 60, "missing_lines": 0, "percent_covered": 100.0}
        },
    },
    "totals": {"num_statements": 100, "missing_lines": 30, "percent_covered": 70.0},
}


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    return tmp_path


def test_the_table_puts_the_total_first_then_each_file(tmp_path):
    report = tmp_path / "coverage.json"
    report.write_text(json.dumps(REPORT))
    rows = coverage.coverage_rows(report)
    assert [r["file"] for r in rows] == [coverage.TOTAL, "src/analysis/a.py", "src/analysis/b.py"]
    assert rows[0] == {
        "file": coverage.TOTAL,
        "statements": 100,
        "missing": 30,
        "percent_covered": 70.0,
    }
    path = coverage.write_csv(rows, tmp_path / "out" / "coverage.csv")
    assert coverage.read_total(path) == {
        "file": coverage.TOTAL,
        "statements": "100",
        "missing": "30",
        "percent_covered": "70.0",
    }


def test_the_command_prints_the_total_and_the_least_covered_and_writes_the_csv(root, capsys):
    report = root / "reports" / coverage.COVERAGE_JSON
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps(REPORT))
    assert cli.main(["coverage"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "line coverage of src/analysis: 70.00 % of 100 statements (30 not run)"
    assert "src/analysis/b.py" in out[1] and "25.00 %" in out[1]  # the least covered first
    assert coverage.read_total(root / "reports" / coverage.COVERAGE_CSV)["statements"] == "100"


def test_without_a_report_the_command_says_to_run_make_coverage(root, capsys):
    assert cli.main(["coverage"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: no coverage report at") and "make coverage" in error
    assert "\n" not in error


def test_the_readme_quotes_a_kept_table_and_its_commit(root):
    kept = root / readme_sections.COVERAGE
    coverage.write_csv(coverage.coverage_rows(_report(root)), kept)
    line = readme_sections.test_coverage(root)
    commit = Path(readme_sections.COVERAGE).parent.name.rsplit("-", 1)[-1]
    assert line.startswith(f"`make coverage` at commit {commit} ran 70.00 % of the 100 ")
    assert "(30 never ran;" in line
    kept.write_text("file,statements,missing,percent_covered\nsrc/analysis/a.py,1,0,100\n")
    with pytest.raises(ValueError, match="no row"):
        readme_sections.test_coverage(root)


def _report(root: Path) -> Path:
    path = root / "coverage.json"
    path.write_text(json.dumps(REPORT))
    return path
