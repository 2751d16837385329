"""`python -m analysis sweep`: the points of a grid, and running them.

    python -m analysis sweep --grid default --list        # one point id per line
    python -m analysis sweep --grid default --point ID    # one point, through notebook 03
    python -m analysis sweep --grid default               # every missing point, inline
    python -m analysis sweep --grid full --executor ray   # one Ray task per missing point
    python -m analysis sweep --grid default fleet --workers 2  # several grids, one pool

`make report` runs the grids of its notebooks in one pool of workers this way: each worker
imports vLLM once (about 10 s of a core), instead of once for the sweep and again for each
notebook that runs a grid of its own.

`make sweep` runs one make target per point (so `make -j` runs points in parallel): notebook 03
executed with the point's parameters, into reports/runs/<grid>/<point>.ipynb. A point whose
result is complete is not computed again unless --force; its notebook only shows it.

Executors (`analysis.sweeps.executors`): `local` runs the points here, one after the other (with
--workers N, in N processes of this machine, e.g. `--workers $(nproc)`); `ray`
runs one task per point on the Ray cluster at RAY_ADDRESS, or on a Ray instance started
here with --workers CPUs. Either way an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--grid",
        nargs="+",
        default=["default"],
        help="configs/<name>.toml or a path; several grids run in one pool (not with --list, "
        "--point)",
    )
    parser.add_argument("--list", action="store_true", help="print the point ids and stop")
    parser.add_argument("--pending", action="store_true", help="with --list: unfinished only")
    parser.add_argument("--point", help="run this point through notebooks/03-run-config.ipynb")
    parser.add_argument("--force", action="store_true", help="run again even if finished")
    parser.add_argument(
        "--executor",
        default="local",
        choices=("local", "ray"),
        help="local: here, point by point; ray: one Ray task per point (RAY_ADDRESS or local)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="local: processes (default 1); ray without RAY_ADDRESS: CPUs of the instance",
    )


def main(args: argparse.Namespace) -> int:
    from analysis.engines import is_complete
    from analysis.platform.writable import ensure_writable
    from analysis.report.notebooks import run_point_notebook
    from analysis.sweeps.executors import run_points
    from analysis.sweeps.grid import find_point, grid_points, is_done, result_folder

    if (args.list or args.point) and len(args.grid) > 1:
        print(f"--list and --point take one grid, got {len(args.grid)}", file=sys.stderr)
        return 2
    # GridError, ConfigError: printed as one line by the CLI
    points = [point for grid in args.grid for point in grid_points(grid)]
    if args.list:
        for point in points:
            if not (args.pending and is_done(point)):
                print(point.point_id)
        return 0
    if args.point:  # the notebook computes the result unless it is complete (or --force)
        point = find_point(points, args.point)
        output = run_point_notebook(point, args.grid[0], force=args.force)
        print(f"{point.point_id}: {result_folder(point).name} (notebook: {output})")
        return 0
    folders = {result_folder(point) for point in points}  # series may share a point
    pending = {f for f in folders if args.force or not is_complete(f)}
    for parent in {folder.parent for folder in pending}:  # checked before computing
        ensure_writable(parent)
    total = len(folders)
    written = iter(range(1, total + 1))

    def say_done(point) -> None:  # one line per point written, as it happens
        print(f"[{next(written)}/{total}] {point.point_id}: {result_folder(point).name}")
        sys.stdout.flush()

    done = run_points(
        points, args.executor, force=args.force, workers=args.workers, on_done=say_done
    )
    print(
        f"{len(done.ran)} point(s) run, {len(done.skipped)} already complete, of "
        f"{len(done.ran) + len(done.skipped)} distinct in grid {', '.join(args.grid)} "
        f"({args.executor}, {done.seconds:.0f} s)"
    )
    return 0
