"""`python -m analysis durations`: where `make test` (or `make report`) spent its time.

`test` (the default) reads the junit files pytest and nbval wrote under `reports/junit/`:
each phase's wall time, the slowest tests, every notebook's time under nbval. `report` reads
`reports/timings.json`, the stages of the last `make report`. Either is printed as a small
table and written as CSV under `reports/` (`test-times.csv`, `report-times.csv`).
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run",
        nargs="?",
        choices=("test", "report"),
        default="test",
        help="whose time: make test's (junit files) or make report's (reports/timings.json)",
    )
    parser.add_argument(
        "--junit-dir", default=None, help="with test: the junit files' folder (reports/junit)"
    )


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from analysis.platform.paths import reports_dir
    from analysis.report import durations, timings

    if args.run == "report":
        recorded = timings.load()
        if not recorded.get("stages"):
            print(f"no report stages recorded in {timings.timings_path()}")
            return 0
        rows = durations.report_rows(recorded)
        path = reports_dir() / durations.REPORT_CSV
        durations.write_csv(rows, path, recorded.get("finished") or recorded.get("started", ""))
    else:
        import os

        started = os.environ.get(durations.STARTED_ENV)
        found = durations.from_junit_dir(
            Path(args.junit_dir) if args.junit_dir else None,
            float(started) if started else None,
        )
        if found is None:
            print(f"no junit files in {args.junit_dir or durations.junit_dir()}")
            return 0
        rows, stamp = found
        path = durations.write_csv(rows, reports_dir() / durations.TEST_CSV, stamp)
    print(f"\nWhere the time went (make {args.run}):\n" + durations.table(rows))
    print(f"(also in {path})")
    return 0
