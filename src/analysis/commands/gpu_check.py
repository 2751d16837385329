"""`python -m analysis gpu-check` (`make gpu-check`): prove a GPU machine.

On CUDA: the engine-check points through the real engine and `replay` (SAME/DIFFERENT per
point, exit status 1 on any difference), then the TTFT table and seed 004's sweep on the 8B
shape. Without CUDA: says so, runs the replay half, exits 0. Results: data/results/gpu-check/.
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


def main(args: argparse.Namespace) -> int:
    from analysis.serving.gpu_check import check

    return check(args.results_dir, timing=not args.no_timing, only=args.points)
