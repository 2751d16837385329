"""`python -m analysis gpu-check` (`make gpu-check`): prove a GPU machine.

On CUDA: the engine-check points through the real engine and `replay` (SAME/DIFFERENT per
point, exit status 1 on any difference), then the TTFT table and seed 004's sweep on the 8B
shape. Without CUDA: says so, runs the replay half, exits 0. Results: data/results/gpu-check/.

`--served`: notebook 08's served calibration instead, on the study's `gpu` parameter set
(the `cpu` set where no GPU is visible): the real caching-on and caching-off servers measure
a grid of shared prefixes and clients, the engine's step costs are measured as the servers run
it, and replay on that clock predicts every cell; the one-client cells fit the server's terms,
every other cell is held out. Results: data/results/gpu-check/served/, with the profile
and the server's runs beside it (calibration/, serving/): notebook 17 replays such a folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--results-dir", type=Path, default=None, help="default data/results/gpu-check"
    )
    parser.add_argument("--no-timing", action="store_true", help="only the engine points")
    parser.add_argument(
        "--points", nargs="+", default=None, help="only these engine points (default: all six)"
    )
    served = parser.add_argument_group("the served calibration (--served)")
    served.add_argument(
        "--served",
        action="store_true",
        help="only the served calibration: real servers, replay on their clock, held-out errors",
    )
    served.add_argument("--prefixes", type=int, nargs="+", default=None, metavar="TOKENS")
    served.add_argument("--clients", type=int, nargs="+", default=None, metavar="N")
    served.add_argument("--repeats", type=int, default=None)
    served.add_argument("--budget-s", type=float, default=None)


def main(args: argparse.Namespace) -> int:
    from analysis.serving.gpu_check import check, cuda_visible, results_root

    if not args.served:
        return check(args.results_dir, timing=not args.no_timing, only=args.points)
    root = (args.results_dir or results_root()) / "served"
    profile = "gpu" if cuda_visible() else "cpu"
    overrides = dict(
        prefixes=args.prefixes,
        concurrency=args.clients,
        repeats=args.repeats,
        budget_s=args.budget_s,
    )
    return served_check(root, profile, "cuda" if profile == "gpu" else "cpu", overrides)


def keep_beside(root: Path, calibration: Path, run_ids: list[str]) -> None:
    """The profile, the server terms and the server's runs beside the tables (`calibration/`,
    `serving/` next to `root`), so that the folder above replays anywhere
    (`replayable.recorded_cells`, notebook 17's `gpu_served`)."""
    import shutil

    from analysis.serving.storage import serving_root

    shutil.copytree(calibration, root.parent / "calibration", dirs_exist_ok=True)
    for run_id in run_ids:
        shutil.copytree(
            serving_root() / run_id, root.parent / "serving" / run_id, dirs_exist_ok=True
        )


def served_check(root: Path, profile: str, device: str, overrides: dict) -> int:
    """Notebook 08's grid and its held-out comparison (its cells 2, 19 and 21) as one command,
    for a machine without the notebooks' kernel; every table lands in `root`."""
    import pandas as pd

    from analysis.platform.manifest import write_json
    from analysis.serving import ServerPair, replayable, study
    from analysis.serving.gpu_check import machine
    from analysis.timing import served

    params = study.params(profile, **overrides)
    with ServerPair() as pair:
        table, chosen = study.synthetic_section(pair, params)
    study.say(chosen.describe("synthetic grid"))
    config = study.synthetic_config(params, chosen)
    settings = replayable.engine_settings(config)
    threads = replayable.server_torch_threads()
    cells = replayable.cell_requests(config, table)
    calibration = served.calibration_folder(settings, threads)
    against = served.compare_with_server(cells, settings, calibration, threads, study.say, device)
    root.mkdir(parents=True, exist_ok=True)
    checks = against.checks.table()
    tables = {
        "cells": table,
        "terms": against.terms.table(),
        "errors": against.table,
        "per_repeat": against.repeats,
        "ttft_breakdown": against.breakdown,
        "tpot_breakdown": against.tpot,
        "checks": checks,
    }
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        for name, frame in tables.items():
            frame.to_csv(root / f"{name}.csv", index=False)
        errors = against.table.pivot_table(
            index=["mode", "prefix_regime", "concurrency", "family"],
            columns="statistic",
            values="error",
        )
        print(errors.round(3).to_string())
        print(checks.to_string(index=False))
    write_json(
        root / "manifest.json",
        {
            "machine": machine(),
            "profile": profile,
            "device": device,
            "overrides": {k: v for k, v in overrides.items() if v is not None},
            "engine_settings": settings,
            "calibration": str(calibration),
            "plan": chosen.describe("synthetic grid"),
        },
    )
    keep_beside(root, calibration, table["run_id"].tolist())
    print(f"results: {root.parent} (served/, calibration/, serving/)")
    return 0 if checks["holds"].all() else 1
