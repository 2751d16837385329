"""`python -m analysis serve-bench`: TTFT and throughput with prefix caching on and off.

Workloads: `synthetic` (shared prefixes of --prefixes tokens, a real `vllm serve` per mode),
`sharegpt` (multi-turn conversations from data/traces/multi_turn.parquet as closed-loop
clients, a real server per mode), `prefix-sweep` (seed 004: requests/s against the shared
fraction of 1000-token prompts, in-process engine). Results are cached under
data/results/serving/: a cell whose requests all succeeded is reused unless --force (its key holds
the whole configuration, --request-timeout included); a cell with failed or timed-out requests is
kept with its counts and runs again next time.
"""

from __future__ import annotations

import argparse

WORKLOAD_CHOICES = ("synthetic", "sharegpt", "prefix-sweep")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=WORKLOAD_CHOICES, default="synthetic")
    parser.add_argument(
        "--model",
        default=None,
        help="local model folder, hub name, or a built-in random Llama: prefill-llama "
        "(default, ~155 M parameters) or tiny-llama",
    )
    parser.add_argument("--prefixes", type=int, nargs="+", default=[0, 512, 1024, 2048])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument(
        "--requests",
        type=int,
        default=16,
        help="measured requests per run (sharegpt: conversations per run)",
    )
    parser.add_argument("--modes", nargs="+", choices=("cache", "no_cache"), default=None)
    parser.add_argument("--suffix-tokens", type=int, default=24)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=4, help="sharegpt: turns per conversation")
    parser.add_argument("--trace", default=None, help="sharegpt: trace Parquet file")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--num-prompts", type=int, default=16, help="prefix-sweep: prompts")
    parser.add_argument("--input-len", type=int, default=1000, help="prefix-sweep: prompt length")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="repeats per cell, each from an emptied cache (default 1; prefix-sweep: timed "
        "batches per point, default 2); tables give the median of the repeats with a two-level "
        "bootstrap 95 %% interval",
    )
    parser.add_argument(
        "--load-format",
        default=None,
        help='vLLM load format, e.g. "dummy": a real architecture with random weights',
    )
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument(
        "--kv-cache-gib",
        type=float,
        default=None,
        help="KV cache size in GiB (default 1 for servers, 0.5 for the sweep); 0: let vLLM "
        "size it from --gpu-memory-utilization (GPUs)",
    )
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="eager mode (default; turn off on GPUs to use CUDA graphs)",
    )
    parser.add_argument(
        "--request-timeout", type=float, default=120.0, help="seconds per request (> 0)"
    )
    parser.add_argument(
        "--no-interleave",
        action="store_true",
        help="one server at a time (default: both modes' servers at once, runs alternating, "
        "so background load hits both alike; use this where two servers do not fit)",
    )
    parser.add_argument("--force", action="store_true", help="re-run cached runs")
    parser.add_argument("--no-progress", action="store_true")


def _kv_bytes(args: argparse.Namespace, default: int) -> int | None:
    if args.kv_cache_gib is None:
        return default
    return None if args.kv_cache_gib == 0 else int(args.kv_cache_gib * (1 << 30))


def _print(frame) -> None:
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 40):
        print(frame.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def _run_sweep(args: argparse.Namespace) -> None:
    from analysis import serving

    config = serving.PrefixSweepConfig(
        model=args.model,
        fractions=tuple(args.fractions),
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        repeats=args.repeats or 2,
        load_format=args.load_format,
        modes=tuple(args.modes or serving.MODES),
        block_size=args.block_size,
        max_model_len=args.max_model_len or 2048,
        kv_cache_memory_bytes=_kv_bytes(args, serving.GIB // 2),
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
    )
    sweep = serving.run_prefix_sweep(config, force=args.force, progress=not args.no_progress)
    _print(serving.sweep_table(sweep))


def _run_serving(args: argparse.Namespace) -> None:
    from analysis import serving

    config = serving.ServingBenchConfig(
        model=args.model,
        workload=args.workload,
        prefixes=tuple(args.prefixes),
        concurrency=tuple(args.concurrency),
        requests=args.requests,
        repeats=args.repeats or 1,
        load_format=args.load_format,
        modes=tuple(args.modes or serving.MODES),
        suffix_tokens=args.suffix_tokens,
        output_tokens=args.output_tokens,
        max_turns=args.max_turns,
        trace_path=args.trace,
        request_timeout_s=args.request_timeout,
        block_size=args.block_size,
        max_model_len=args.max_model_len or 4096,
        kv_cache_memory_bytes=_kv_bytes(args, serving.GIB),
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
    )
    table = serving.run_serving_bench(
        config, force=args.force, progress=not args.no_progress, interleave=not args.no_interleave
    )
    _print(serving.readable_table(table))
    print()
    _print(table[["mode", "prefix_regime", "concurrency", "hit_rate", "predicted_saving"]])
    comparison = serving.compare_modes(table)
    if not comparison.empty:
        print()
        _print(comparison)


def main(args: argparse.Namespace) -> int:
    from analysis.platform.errors import UsageError

    try:
        if args.workload == "prefix-sweep":
            _run_sweep(args)
        else:
            _run_serving(args)
    except ValueError as exc:  # a bad argument (the core's own errors reach the CLI as they are)
        raise UsageError(str(exc)) from exc
    return 0
