"""`python -m analysis report`: execute the committed notebooks in order, then the HTML report.

Each notebook and the HTML export are timed into reports/timings.json, after the stages
`make report` ran before (analysis.timings); the table of all stages is printed at the end.
`--plan` prints the estimate for the whole of `make report` and starts a new timings run.
"""

from __future__ import annotations

import argparse
import time


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "notebooks",
        nargs="*",
        help="notebook names or prefixes to run (default: all, in order), e.g. 04 05",
    )
    parser.add_argument("--no-html", action="store_true", help="skip the HTML export")
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the estimated time of `make report` per stage, start a new timings run, "
        "and run nothing",
    )


def main(args: argparse.Namespace) -> int:
    from analysis import timings
    from analysis.cli import CommandError
    from analysis.progress import interactive
    from analysis.report import execute, report_notebooks, to_html

    notebooks = report_notebooks()
    if args.notebooks:
        notebooks = [p for p in notebooks if any(p.name.startswith(s) for s in args.notebooks)]
        if not notebooks:
            raise CommandError(f"no notebook matches {' '.join(args.notebooks)} in notebooks/")
    stages = [nb.stem for nb in notebooks] + ([] if args.no_html else [timings.HTML_STAGE])
    if args.plan:
        previous = timings.start_run()
        print(timings.machine_line(), flush=True)
        names = list(timings.PIPELINE_STAGES) + stages
        print(timings.format_estimate(timings.estimate(names, previous)), flush=True)
        return 0
    timings.ensure_run()
    previous = timings.load().get("previous", {})
    print(timings.format_estimate(timings.estimate(stages, previous)), flush=True)
    for notebook in notebooks:
        print(f"executing {notebook.name} ...", flush=True)
        done = execute(notebook, progress=interactive())
        timings.record(timings.Stage(notebook.stem, round(done.seconds, 1)))
        print(f"  {notebook.name}: {done.seconds:.0f} s", flush=True)
    if not args.no_html:
        started = time.perf_counter()
        index = to_html(report_notebooks())
        timings.record(timings.Stage(timings.HTML_STAGE, round(time.perf_counter() - started, 1)))
        print(f"report: {index}")
    print(f"time per stage (also in {timings.timings_path()}):")
    print(timings.format_table(timings.finish()))
    return 0
