"""`python -m analysis plan`: how much KV memory a trace needs for a target hit rate.

Runs vLLM's scheduler (`replay`) at a few `num_blocks`, draws the ideal, LRU and Belady bounds
in the engine's admission order, and answers "x % of the ideal needs N blocks = G GiB = this
share of a GPU" for a model, a KV cache dtype and a GPU (`analysis.sweeps.capacity_plan`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    from analysis.models import memory, shapes

    parser.add_argument(
        "--trace",
        default="multi_turn",
        help="multi_turn, single_turn, a .parquet trace, or a block-hash .jsonl(.gz) "
        "(Mooncake, Alibaba/Qwen) (default multi_turn)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per block (default 16; a block-hash trace needs its own: 16 for the "
        "Alibaba/Qwen traces, 512 for Mooncake)",
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="first N conversations (default: all)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=16, help="closed-loop clients (default 16)"
    )
    parser.add_argument("--max-model-len", type=int, default=8192, help="(default 8192)")
    parser.add_argument(
        "--points", type=int, default=8, help="engine points on the grid (default 8)"
    )
    parser.add_argument(
        "--refine",
        type=int,
        default=4,
        help="extra engine runs that narrow the answer by bisection (default 4)",
    )
    parser.add_argument(
        "--target",
        type=float,
        default=0.9,
        help="the share of the ideal hit rate to reach, in (0, 1] (default 0.9)",
    )
    parser.add_argument(
        "--model",
        default="llama-3.1-8b",
        help=f"a registered shape ({', '.join(shapes.SHAPES)}) or a model folder with "
        "config.json: what turns blocks into bytes (default llama-3.1-8b)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=sorted(memory.KV_CACHE_DTYPES),
        help="vLLM's --kv-cache-dtype (default auto: the model's dtype)",
    )
    parser.add_argument(
        "--gpu", default="h100-80gb", choices=sorted(memory.GPUS), help="(default h100-80gb)"
    )
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.9, help="vLLM's (default 0.9)"
    )
    parser.add_argument(
        "--reserve-gib",
        type=float,
        default=0.0,
        help="GiB per GPU for activations, CUDA graphs and non-torch memory, which vLLM "
        "measures at start and a plan cannot (default 0: an upper bound on the KV budget)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="a folder for the tables (Parquet and CSV): new, empty or an earlier plan's; "
        "replaced whole once the plan is done",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def main(args: argparse.Namespace) -> int:
    from analysis.platform.errors import UsageError
    from analysis.sweeps.capacity_target import check_plan_folder, plan_record, write_plan_tables

    if args.out is not None:  # a full, read-only or mistaken --out: one line, before any work
        check_plan_folder(args.out)
    try:
        plan, answer = compute(args)
    except (ValueError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from None
    if args.out is not None:
        write_plan_tables(plan, answer, args.out)
    if args.json:
        print(json.dumps(plan_record(plan, answer), indent=2))
    else:
        print(as_text(plan, answer))
    return 0


def compute(args: argparse.Namespace) -> tuple[Any, Any]:
    from analysis.platform.errors import ConfigError
    from analysis.sweeps import capacity_plan, capacity_target

    if args.block_size is not None and args.block_size < 1:
        raise ConfigError(f"--block-size must be a positive integer (got {args.block_size})")
    for name in ("concurrency", "points", "max_model_len"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    if args.refine < 0:
        raise ConfigError("--refine must be 0 or more")
    if not 0 < args.target <= 1:
        raise ConfigError(f"--target {args.target} is not a share of the ideal in (0, 1]")
    trace = capacity_plan.plan_trace(args.trace, args.block_size, args.limit)
    settings = capacity_plan.PlanSettings(
        concurrency=args.concurrency,
        max_model_len=args.max_model_len,
        points=args.points,
        refine=args.refine,
    )
    plan = capacity_plan.build_plan(trace, settings)
    answer = capacity_target.answer_target(
        plan,
        args.target,
        model=args.model,
        kv_cache_dtype=args.kv_cache_dtype,
        gpu=args.gpu,
        gpu_memory_utilization=args.gpu_memory_utilization,
        reserve_bytes=int(args.reserve_gib * 2**30),
    )
    return plan, answer


def as_text(plan: Any, answer: Any) -> str:
    from analysis.sweeps.capacity_target import answer_sentence

    size = plan.trace.block_size
    per_block = answer.bytes_per_block
    lines = [*plan.trace.notes]
    lines.append(
        f"{plan.trace.label}: block size {size}, {plan.settings.concurrency} clients"
        + (f", first {plan.trace.limit} conversations" if plan.trace.limit else "")
        + f"; ideal hit rate {plan.ideal['engine']:.2%} in engine order "
        f"({plan.ideal['trace']:.2%} in trace order)"
    )
    lines += ["", f"{'num_blocks':>11}{'GiB':>9}{'first-prefill':>15}{'preempt':>9}  found by"]
    for row in plan.points.sort_values("num_blocks").itertuples():
        lines.append(
            f"{row.num_blocks:>11,}{row.num_blocks * per_block / 2**30:>9.2f}"
            f"{row.first_prefill:>15.2%}{row.preemptions:>9,}  {row.found_by}"
        )
    lines += ["", answer_sentence(answer, size)]
    return "\n".join(lines)
