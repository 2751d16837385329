"""`python -m analysis stage NAME -- COMMAND ...`: run a command, record its wall time.

`make report` wraps its long steps in this, so that reports/timings.json and the table printed
at the end hold every stage (analysis.timings). The command's exit status is passed on.
"""

from __future__ import annotations

import argparse
import subprocess
import time


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="stage name in reports/timings.json, e.g. traces")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command to run")


def main(args: argparse.Namespace) -> int:
    from analysis.cli import CommandError
    from analysis.timings import Stage, ensure_run, record

    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise CommandError(f"stage {args.name}: no command given (write `-- COMMAND ...`)")
    ensure_run()
    print(f"== {args.name}: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    status = subprocess.call(command)
    seconds = time.perf_counter() - started
    record(Stage(args.name, round(seconds, 1), ok=status == 0))
    print(f"== {args.name}: {seconds:.0f} s" + ("" if status == 0 else f" (exit {status})"))
    return status
