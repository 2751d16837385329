"""`python -m analysis sweep`: the points of a grid, and running them.

    python -m analysis sweep --grid default --list        # one point id per line
    python -m analysis sweep --grid default --point ID    # one point, through notebook 03
    python -m analysis sweep --grid default               # every missing point, inline

`make sweep` runs one make target per point (so `make -j` runs points in parallel): notebook 03
executed with the point's parameters, into reports/runs/<grid>/<point>.ipynb. A point whose
result is complete is not computed again unless --force; its notebook only shows it.
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grid", default="default", help="configs/<name>.toml or a path")
    parser.add_argument("--list", action="store_true", help="print the point ids and stop")
    parser.add_argument("--pending", action="store_true", help="with --list: unfinished only")
    parser.add_argument("--point", help="run this point through notebooks/03-run-config.ipynb")
    parser.add_argument("--force", action="store_true", help="run again even if finished")


def main(args: argparse.Namespace) -> int:
    from analysis.cli import CommandError
    from analysis.engines import ConfigError
    from analysis.sweep import (
        GridError,
        find_point,
        grid_points,
        is_done,
        result_folder,
        run_point,
        run_point_notebook,
    )

    try:
        points = grid_points(args.grid)
        if args.list:
            for point in points:
                if not (args.pending and is_done(point)):
                    print(point.point_id)
            return 0
        if args.point:  # the notebook computes the result unless it is complete (or --force)
            point = find_point(points, args.point)
            output = run_point_notebook(point, args.grid, force=args.force)
            print(f"{point.point_id}: {result_folder(point).name} (notebook: {output})")
            return 0
        pending = sum(args.force or not is_done(p) for p in points)
        print(f"{args.grid}: {pending} of {len(points)} points to compute", flush=True)
        for number, point in enumerate(points, 1):
            if is_done(point) and not args.force:
                continue
            folder = run_point(point, force=args.force, progress=None)
            print(f"[{number}/{len(points)}] {point.point_id}: {folder.name}", flush=True)
    except (GridError, ConfigError) as exc:
        raise CommandError(str(exc)) from None
    return 0
