"""`python -m analysis calibrate`: measure the real engine's step costs, fit a profile, and
check it against the real engine on held-out workloads.

Writes data/results/calibration/<device>-<model>/ (profile.json, steps.parquet,
validation.csv, requests.parquet, manifest.json). `run --engine replay --clock
.../profile.json` then runs replay on that clock.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--model", default=None, help="a registered shape or folder (default: the device's)"
    )
    parser.add_argument("--block-size", type=int, default=None)
    # A server's limits, so that its profile holds for it (a CPU server's defaults differ from
    # the offline engine's: 2048 tokens and 128 requests per step against 4096 and 256).
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument(
        "--no-validate", action="store_true", help="fit only; skip the held-out workloads"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="real-engine runs of each held-out workload (2 or more: its own spread is shown)",
    )
    parser.add_argument("--out", type=Path, default=None, help="the folder to write")


def main(args: argparse.Namespace) -> int:
    import pandas as pd

    from analysis.platform.paths import results_dir
    from analysis.platform.writable import ensure_writable
    from analysis.timing import calibrate, write
    from analysis.timing.calibration import base_config

    settings = {
        name: getattr(args, name)
        for name in ("max_model_len", "max_num_batched_tokens", "max_num_seqs")
        if getattr(args, name) is not None
    }
    base = base_config(args.device, args.model, args.block_size, settings)
    name = f"{args.device}-{base.model or 'tiny-llama'}-b{base.block_size}"
    folder = args.out or results_dir() / "calibration" / name
    ensure_writable(folder.parent)
    if args.repeats < 1:
        from analysis.platform.errors import UsageError

        raise UsageError(f"--repeats must be 1 or more (got {args.repeats})")
    result = calibrate(
        args.device,
        model=args.model,
        block_size=args.block_size,
        settings=settings,
        validate=not args.no_validate,
        repeats=args.repeats,
    )
    write(result, folder)
    if result.validation is not None:
        with pd.option_context("display.width", 200, "display.max_columns", 40):
            print(result.validation.round(4).set_index(["workload", "against"]).T.to_string())
    print(f"profile: {folder / 'profile.json'}")
    return 0
