"""`python -m analysis bounds`: ideal, LRU and optimal hit rates of a trace, without an engine.

The trace is a Parquet trace from `analysis.data.traces` or a block-hash JSONL file (Mooncake,
Qwen/Bailian). Capacities are in blocks; for the `vllm` policy a capacity is vLLM's num_blocks.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace", required=True, help="a trace (.parquet) or a block-hash trace (.jsonl)"
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per block (default 16 for a Parquet trace; a block-hash trace needs its "
        "own: 512 for Mooncake, 16 for the Qwen traces)",
    )
    parser.add_argument(
        "--capacities",
        type=int,
        nargs="+",
        default=None,
        help="cache capacities in blocks (default: 10, geometric, up to every distinct block)",
    )
    parser.add_argument(
        "--policies",
        nargs="+",
        choices=("lru", "opt", "vllm"),
        default=["lru", "opt"],
        help="eviction policies (vllm: exact block pool, one request at a time; slower)",
    )
    parser.add_argument(
        "--include-outputs",
        action="store_true",
        help="requests also store their replies' blocks, as a teacher-forced replay does",
    )
    parser.add_argument(
        "--reuse-block-sizes",
        type=int,
        nargs="+",
        default=None,
        help="block sizes for token- vs block-level reuse (default 1 8 16 32 64 128; "
        "multiples of the block size for a block-hash trace)",
    )
    parser.add_argument(
        "--timestamp-unit",
        choices=("auto", "s", "ms"),
        default="auto",
        help="block-hash timestamps (auto: integers without chat ids are ms, as in Mooncake)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    from analysis.platform.errors import UsageError

    try:
        result = compute(args)
    except (ValueError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from None
    except MemoryError:  # the estimates before each allocation were not enough
        raise UsageError(
            f"the bounds of {args.trace} ran out of memory: give fewer or smaller --capacities "
            "or --policies, or use a machine with more memory"
        ) from None
    if args.json:
        print(json.dumps(_json_safe(result), indent=2))
    else:
        print(_as_text(result))
    return 0


def compute(args: argparse.Namespace) -> dict[str, Any]:
    """Every number the command prints, as one dictionary."""
    import pandas as pd

    from analysis.metrics import bounds

    started = time.perf_counter()
    if args.block_size is not None and args.block_size < 1:
        raise ValueError(f"--block-size must be a positive integer (got {args.block_size})")
    from analysis.data.blockhash import is_blockhash_path

    path = Path(args.trace)
    blockhash = is_blockhash_path(path)
    result: dict[str, Any] = {"trace": str(path)}
    if blockhash:
        if args.block_size is None:
            raise ValueError(
                "a block-hash trace needs --block-size: its own block size (512 for Mooncake, "
                "16 for the Qwen traces)"
            )
        from analysis.data.blockhash import load_blockhash_trace

        frame, report = load_blockhash_trace(
            path, args.block_size, timestamp_unit=args.timestamp_unit
        )
        result["import"] = report.to_dict()
        index = bounds.index_trace(
            frame, include_outputs=args.include_outputs, trace_block_size=args.block_size
        )
        block_size = args.block_size
        reuse_sizes = args.reuse_block_sizes or [block_size * k for k in (1, 2, 4, 8)]
    else:
        frame = _read_parquet_trace(path)
        index = bounds.index_trace(frame, include_outputs=args.include_outputs)
        block_size = args.block_size or 16
        reuse_sizes = args.reuse_block_sizes or list(bounds.DEFAULT_REUSE_BLOCK_SIZES)
    loaded = time.perf_counter()
    if index.num_requests == 0:
        raise ValueError(f"trace {path} has no requests: rebuild it or give another trace")
    ideal = bounds.ideal_bound(index, block_size)
    keys = index.block_keys(block_size)
    capacities = args.capacities or bounds.default_capacities(index, block_size)
    progress = False if args.no_progress else None
    policies = [p for p in args.policies if p != "vllm"]
    frames = [bounds.capacity_curves(index, block_size, capacities, policies, progress=progress)]
    if "vllm" in args.policies:
        smallest = int(keys.allocated.max(initial=0)) + 1
        runnable = [c for c in capacities if c >= smallest]
        result["skipped"] = [
            f"vllm at {c} blocks: below {smallest} (largest request + the null block)"
            for c in capacities
            if c < smallest
        ]
        frames.append(
            bounds.capacity_curves(index, block_size, runnable, ["vllm"], progress=progress)
        )
    curves = pd.concat(frames, ignore_index=True)
    reuse = bounds.token_vs_block_reuse(index, reuse_sizes)
    result.update(
        kind=index.kind,
        block_size=block_size,
        include_outputs=args.include_outputs,
        requests=ideal.requests,
        tokens=ideal.prompt_tokens,
        stored_blocks=int(keys.keys.shape[0]),
        distinct_blocks=keys.num_keys,
        ideal_hit_rate=ideal.hit_rate,
        ideal_hit_tokens=ideal.hit_tokens,
        requests_with_hit=ideal.requests_with_hit,
        multi_turn_hit_share=ideal.multi_turn_hit_share,
        curves=curves[["policy", "capacity", "hit_rate", "hit_tokens"]]
        .astype({"policy": str})
        .to_dict("records"),
        token_vs_block=reuse[["level", "block_size", "hit_rate", "hit_tokens"]].to_dict("records"),
        seconds={
            "load_and_index": round(loaded - started, 3),
            "bounds": round(time.perf_counter() - loaded, 3),
        },
    )
    return result


def _read_parquet_trace(path: Path) -> Any:
    """The trace through `load_trace`, so that bounds refuse what run refuses."""
    from analysis.data.traces import load_trace

    if not path.is_file():
        raise FileNotFoundError(f"no trace at {path}: build it with `python -m analysis traces`")
    return load_trace(path)


def _json_safe(value: Any) -> Any:
    """Plain JSON: numpy scalars to Python, NaN to null."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _as_text(result: dict[str, Any]) -> str:
    lines = []
    if "import" in result:
        from analysis.data.blockhash import ImportReport

        lines.append(ImportReport(**result["import"]).summary())
    share = result["multi_turn_hit_share"]
    lines += [
        f"trace {result['trace']}: {result['requests']} requests, {result['tokens']} prompt "
        f"tokens, block size {result['block_size']}, "
        f"{'prompts and replies' if result['include_outputs'] else 'prompts'} stored",
        f"distinct blocks {result['distinct_blocks']} of {result['stored_blocks']} stored",
        f"ideal hit rate {result['ideal_hit_rate']:.2%} "
        f"({result['requests_with_hit']} requests hit"
        + (f"; {share:.1%} of hit tokens in later turns)" if share is not None else ")"),
        "",
        f"{'policy':<7}{'capacity':>12}{'hit rate':>10}",
    ]
    for row in result["curves"]:
        lines.append(f"{row['policy']:<7}{row['capacity']:>12}{row['hit_rate']:>10.2%}")
    lines += [f"skipped: {note}" for note in result.get("skipped", [])]
    lines += ["", f"{'reuse':<7}{'block':>12}{'hit rate':>10}"]
    for row in result["token_vs_block"]:
        lines.append(f"{row['level']:<7}{row['block_size']:>12}{row['hit_rate']:>10.2%}")
    return "\n".join(lines)
