"""`python -m analysis coverage`: the line coverage `make coverage` measured, as a table.

Reads coverage's JSON report (`reports/coverage/coverage.json`), prints the package's total and
its least covered files, and writes every file's row to `reports/coverage.csv`.
"""

from __future__ import annotations

import argparse

LEAST_COVERED = 10


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", default=None, help="coverage's JSON report (reports/coverage/coverage.json)"
    )


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from analysis.platform.errors import UsageError
    from analysis.platform.paths import reports_dir
    from analysis.report import coverage

    report = Path(args.json) if args.json else reports_dir() / coverage.COVERAGE_JSON
    if not report.is_file():
        raise UsageError(f"no coverage report at {report}: run `make coverage` first")
    rows = coverage.coverage_rows(report)
    path = coverage.write_csv(rows, reports_dir() / coverage.COVERAGE_CSV)
    total, files = rows[0], rows[1:]
    print(
        f"line coverage of src/analysis: {total['percent_covered']:.2f} % of "
        f"{total['statements']:,} statements ({total['missing']:,} not run)"
    )
    least = sorted(files, key=lambda r: (r["percent_covered"], -r["statements"]))
    for row in least[:LEAST_COVERED]:
        not_run = f"{row['missing']:4} of {row['statements']:4} not run"
        print(f"  {row['percent_covered']:6.2f} %  {not_run}  {row['file']}")
    print(f"(every file in {path})")
    return 0
