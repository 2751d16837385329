"""Line coverage of `src/analysis`, as `make coverage` measured it: coverage's JSON report
read into a small table (the whole package first, then each file), written as CSV beside the
time tables, so that a run's coverage can be kept and quoted like its times."""

from __future__ import annotations

import csv
import json
from pathlib import Path

COVERAGE_JSON = Path("coverage") / "coverage.json"
COVERAGE_CSV = "coverage.csv"
FIELDS = ("file", "statements", "missing", "percent_covered")
TOTAL = "src/analysis (total)"


def coverage_rows(report: Path) -> list[dict[str, object]]:
    """The package's total, then one row per measured file, from coverage's `json` report."""
    data = json.loads(Path(report).read_text())

    def row(name: str, summary: dict) -> dict[str, object]:
        return {
            "file": name,
            "statements": int(summary["num_statements"]),
            "missing": int(summary["missing_lines"]),
            "percent_covered": round(float(summary["percent_covered"]), 2),
        }

    files = sorted(data["files"].items())
    return [row(TOTAL, data["totals"]), *(row(name, f["summary"]) for name, f in files)]


def write_csv(rows: list[dict[str, object]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_total(path: Path) -> dict[str, str]:
    """The total row of a coverage CSV written by `write_csv`."""
    with Path(path).open(newline="", encoding="utf-8") as handle:
        return total_row(list(csv.DictReader(handle)), path)


def total_row(rows: list[dict[str, str]], source: Path | str) -> dict[str, str]:
    """The total row among a coverage CSV's rows, or a one-line error naming `source`."""
    total = next((r for r in rows if r["file"] == TOTAL), None)
    if total is None:
        raise ValueError(f"{source} has no row {TOTAL!r}: not a table `make coverage` wrote")
    return total
