"""`python -m analysis report`: execute the committed notebooks in order, then the HTML report.

Each notebook and the HTML export are timed; at the end the per-stage table (with the stages
`make report` ran before, see `analysis.report.timings`) is printed and kept in
`reports/timings.json` and `reports/report-times.csv` (`analysis.report.durations`).
`--begin [--setup-seconds S]`, `--stage NAME --run CMD` and `--estimate` are the steps the
Makefile uses to time and announce its own stages.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analysis.report import schedule

# The serving study: synthetic prefixes, real conversations, seed 004, the decision write-up.
STUDY_NOTEBOOKS = ("08", "10", "11", "12")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "notebooks",
        nargs="*",
        help="notebook names or prefixes to run (default: all, in order), e.g. 04 05",
    )
    parser.add_argument("--no-html", action="store_true", help="skip the HTML export")
    parser.add_argument(
        "--begin", action="store_true", help="start a new reports/timings.json and stop"
    )
    parser.add_argument(
        "--setup-seconds",
        type=float,
        default=None,
        help="with --begin: the environment set-up time measured before it, recorded as a stage",
    )
    parser.add_argument(
        "--estimate", action="store_true", help="print what the report should take and stop"
    )
    parser.add_argument(
        "--grid", nargs="+", default=["default"], help="sweep grids counted by --estimate"
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="run the serving study's notebooks (08, 10, 11, 12) with this parameter set "
        "(cpu-study, gpu) into figures/<profile>/, figures included; the committed notebooks "
        "are left as they are",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the runs the notebooks execute in (alone or side by side), one per line",
    )
    parser.add_argument("--stage", default=None, help="with --run: the stage's name")
    parser.add_argument("--run", default=None, help="with --stage: a shell command to time")


def main(args: argparse.Namespace) -> int:
    from analysis.platform.errors import UsageError
    from analysis.platform.paths import reports_dir
    from analysis.platform.progress import interactive
    from analysis.report import durations, schedule, timings
    from analysis.report.notebooks import execute, report_notebooks, to_html
    from analysis.report.server_keeper import ServerKeeper

    if args.begin:
        timings.begin(args.setup_seconds or 0.0)
        if args.setup_seconds is not None:
            timings.record("environment set-up", args.setup_seconds)
        return 0
    if (args.stage is None) != (args.run is None):
        raise UsageError("--stage and --run go together: --stage NAME --run 'COMMAND'")
    if args.stage is not None:
        return timings.run_stage(args.stage, args.run)
    notebooks = report_notebooks()
    if args.profile is not None:
        return run_study(args.profile, args.notebooks or list(STUDY_NOTEBOOKS))
    if args.plan:
        from analysis.platform.paths import repo_root

        lines = schedule.plan_lines(notebooks, repo_root(), schedule.sweep_complete(notebooks))
        print("\n".join(lines), flush=True)
        return 0
    if args.estimate:
        print(timings.estimate(notebooks, timings.pending_points(*args.grid)), flush=True)
        return 0
    if args.notebooks:
        notebooks = [p for p in notebooks if any(p.name.startswith(s) for s in args.notebooks)]
        if not notebooks:
            raise UsageError(f"no notebook matches {' '.join(args.notebooks)} in notebooks/")
    with ServerKeeper(notebooks) as keeper:
        keeper.launch()
        for run in schedule.runs(notebooks, schedule.sweep_complete(notebooks)):
            if run.side_by_side:
                execute_side_by_side(run, keeper.starting())
                continue
            for notebook in run.notebooks:
                print(f"executing {notebook.name} ...", flush=True)
                starting = keeper.starting()
                keeper.before(notebook)
                done = execute(notebook, progress=interactive())
                keeper.after(notebook)
                timings.record(f"notebook {notebook.stem}", done.seconds)
                say_done(notebook, done.seconds, starting)
    if not args.no_html:
        started = time.perf_counter()
        index = to_html(report_notebooks())
        timings.record("HTML export", time.perf_counter() - started)
        print(f"report: {index}")
    finished = timings.finish()
    csv = durations.write_csv(
        durations.report_rows(finished), reports_dir() / durations.REPORT_CSV, finished["finished"]
    )
    print("\nTime per stage:\n" + timings.table(finished))
    print(f"(also in {timings.timings_path()} and {csv})")
    return 0


def execute_side_by_side(run: schedule.Run, servers_starting: bool = False) -> None:
    """Execute a run's notebooks a few at a time (`schedule`), each from its own thread (a
    kernel of its own does the work). The run's wall time is its stage; each notebook's own
    time is recorded inside it, so that the total counts the run once. A Ctrl-C stops every
    notebook of the run, not only the thread that waits for them."""
    import threading
    from concurrent.futures import ThreadPoolExecutor, wait

    from analysis.report import schedule, timings
    from analysis.report.notebooks import (
        INTERRUPT_GRACE_S,
        end_interrupted,
        execute,
        stop_kernels,
    )

    workers = schedule.side_by_side_workers()
    names = ", ".join(p.name for p in run.notebooks)
    print(f"executing {names}, {workers} at a time ...", flush=True)
    started = time.perf_counter()
    stopped = threading.Event()

    def one(notebook):
        done = execute(notebook, progress=False, stopped=stopped)
        say_done(notebook, done.seconds, servers_starting)
        return notebook, done.seconds

    pool = ThreadPoolExecutor(workers)
    runs = [pool.submit(one, notebook) for notebook in run.notebooks]
    try:
        finished = [future.result() for future in runs]
    except KeyboardInterrupt:
        # The Ctrl-C lands in this thread only (the kernels have sessions of their own): the
        # notebooks not started are dropped, the kernels running are killed until every
        # thread has ended (one may be starting its kernel just now).
        stopped.set()
        pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        stop_kernels()
        while wait(runs, timeout=1.0).not_done:
            if time.monotonic() > deadline:
                end_interrupted(INTERRUPT_GRACE_S)
            stop_kernels()
        raise
    finally:
        pool.shutdown()  # after a notebook's error the others still finish, as they did
    stage = f"{run.name}, {workers} at a time"
    timings.record(stage, time.perf_counter() - started)
    for notebook, seconds in finished:
        timings.record(f"notebook {notebook.stem}", seconds, within=stage)


def say_done(notebook: Path, seconds: float, servers_starting: bool = False) -> None:
    """A notebook's time, with a note when it took clearly longer than its first cell says
    (and why, when the serving study's servers were starting beside it)."""
    from analysis.report import timings
    from analysis.report.notebooks import progress_noise

    note = timings.overrun(seconds, timings.stated_seconds(notebook))
    if note and servers_starting:
        note += ", the serving study's servers starting beside it"
    print(
        f"  {notebook.name}: {timings.format_seconds(seconds)}" + (f" ({note})" if note else ""),
        flush=True,
    )
    for noise in progress_noise(notebook):
        print(f"  progress-bar noise in its stderr: {noise!r}", flush=True)


def run_study(profile: str, prefixes: list[str]) -> int:
    """Execute the chosen serving notebooks with `profile` into figures/<profile>/: the
    executed notebooks, their figures and captions; the per-request rows are cached under
    data/results/serving/ as for any run, so a second call re-plots without measuring."""
    from analysis.platform.errors import UsageError
    from analysis.platform.paths import figures_dir
    from analysis.platform.progress import interactive
    from analysis.report.notebooks import execute, report_notebooks
    from analysis.report.server_keeper import ServerKeeper
    from analysis.serving import study as serving_study

    try:
        serving_study.params(profile)
    except ValueError as error:
        raise UsageError(str(error)) from None
    chosen = [p for p in report_notebooks() if any(p.name.startswith(s) for s in prefixes)]
    if not chosen:
        raise UsageError(f"no notebook matches {' '.join(prefixes)} in notebooks/")
    os.environ["PREFIX_CACHE_LAB_FIGURES"] = f"figures/{profile}"  # the kernels inherit it
    folder = figures_dir()
    with ServerKeeper(chosen, profile) as keeper:
        for notebook in chosen:
            print(f"executing {notebook.name} with profile={profile!r} ...", flush=True)
            keeper.before(notebook)
            done = execute(notebook, folder / notebook.name, {"profile": profile}, interactive())
            keeper.after(notebook)
            print(f"  {done.output}: {done.seconds / 60:.1f} min", flush=True)
    return 0
