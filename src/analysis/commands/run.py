"""`python -m analysis run`: one trace through one engine configuration, into data/results/.

Example:
    python -m analysis run --trace multi_turn --engine replay --block-size 16 \\
        --num-blocks 256 --mode closed-loop --concurrency 8

A fleet of 4 replay engines, 600 blocks each, behind session affinity with a load cap:
    python -m analysis run --engine fleet --replicas 4 --router affinity-cap1.25 \\
        --num-blocks 600 --concurrency 32

Replay on a clock measured by `python -m analysis calibrate`, requests arriving as a Poisson
process of 4 conversations a second, 2 s of thinking between a reply and the next turn:
    python -m analysis run --engine replay --clock data/results/calibration/X/profile.json \
        --mode poisson --arrival-rate 4 --think-time 2

The result goes to `data/results/<config id>/`. A configuration already finished there is not
run again unless `--force`. The folder is built under a temporary name and renamed at the end
(manifest.json written last), so an interrupted run leaves nothing that looks complete.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    from analysis.engines.config import (
        BLOCK_EVENTS,
        DEVICES,
        ENGINES,
        HASH_ALGOS,
        LONG_PROMPTS,
        MODES,
        OUTPUTS,
        ROUTERS,
        RunConfig,
    )
    from analysis.platform.hardware import DTYPES

    d = RunConfig()
    parser.add_argument(
        "--trace", default=d.trace, help="trace name under data/traces/ or a .parquet path"
    )
    parser.add_argument("--engine", choices=ENGINES, default=d.engine)
    parser.add_argument(
        "--model",
        default=None,
        help="model for the vllm engine: a registered shape with random weights (llama-3.2-1b, "
        "llama-3.1-8b, qwen2.5-7b), a folder or a hub name (default: local random Llama)",
    )
    parser.add_argument("--block-size", type=int, default=d.block_size)
    parser.add_argument("--num-blocks", type=int, default=d.num_blocks)
    parser.add_argument("--max-model-len", type=int, default=d.max_model_len)
    parser.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="default: vLLM's own"
    )
    parser.add_argument("--no-chunked-prefill", action="store_true", help="disable chunked prefill")
    parser.add_argument("--mode", choices=MODES, default=d.mode)
    parser.add_argument(
        "--concurrency", type=int, default=d.concurrency, help="closed-loop clients"
    )
    parser.add_argument(
        "--outputs",
        choices=OUTPUTS,
        default=d.outputs,
        help="recorded replies (teacher forcing) or free tokens",
    )
    parser.add_argument("--max-output-tokens", type=int, default=None)
    parser.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default=d.device,
        help="the vllm engine's device; replay and fleet run no model (same result, same folder)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="model dtype (default: bfloat16 where the CPU computes it natively, else float32; "
        "or $PREFIX_CACHE_LAB_DTYPE)",
    )
    parser.add_argument("--hash-algo", choices=HASH_ALGOS, default=d.hash_algo)
    parser.add_argument(
        "--long-prompts",
        choices=LONG_PROMPTS,
        default=d.long_prompts,
        help="prompts >= max_model_len: skip them (counted) or stop with an error",
    )
    parser.add_argument(
        "--no-fast-path",
        action="store_true",
        help="replay: let vLLM's schedule() run every decode step (same results, slower)",
    )
    parser.add_argument(
        "--block-events",
        choices=BLOCK_EVENTS,
        default=d.block_events,
        help="write the block events' aggregates (a few kB) or every event (hundreds of MB "
        "for a whole trace)",
    )
    parser.add_argument(
        "--replicas", type=int, default=d.replicas, help="fleet: replay engines (blocks each)"
    )
    routers = ", ".join(n if p is None else f"{n}[-{p}X]" for n, p in ROUTERS.items())
    parser.add_argument("--router", default=d.router, help=f"fleet: one of {routers}")
    parser.add_argument(
        "--arrival-rate", type=float, default=None, help="poisson: conversations started per second"
    )
    parser.add_argument(
        "--think-time",
        type=float,
        default=d.think_time_s,
        help=(
            "seconds between a reply and the next request: the next turn, or in a closed loop "
            "the client's next conversation"
        ),
    )
    parser.add_argument(
        "--start-stagger",
        type=float,
        default=d.start_stagger_s,
        help=(
            "closed-loop, poisson: seconds between requests that reach the engine together: "
            "closed-loop clients' first, and those released by replies of one step (a server's "
            "front end)"
        ),
    )
    parser.add_argument(
        "--clock",
        default=None,
        help="replay: a step-cost profile (python -m analysis calibrate) that gives steps time",
    )
    parser.add_argument(
        "--clock-anyway",
        action="store_true",
        help="use a profile measured for another model, vLLM or settings (recorded)",
    )
    parser.add_argument(
        "--warmup", action="store_true", help="vllm: a few requests before the measured run"
    )
    parser.add_argument(
        "--no-prefix-caching", action="store_true", help="vLLM's prefix caching off"
    )
    parser.add_argument(
        "--timeline",
        type=Path,
        default=None,
        help="write a run that kept time as Chrome trace-event JSON (Perfetto opens it)",
    )
    parser.add_argument("--force", action="store_true", help="run again even if finished")
    parser.add_argument("--results-dir", type=Path, default=None, help="default data/results")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace):
    from analysis.engines.config import RunConfig

    return RunConfig(
        trace=args.trace,
        engine=args.engine,
        model=args.model,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_chunked_prefill=not args.no_chunked_prefill,
        mode=args.mode,
        concurrency=args.concurrency,
        outputs=args.outputs,
        max_output_tokens=args.max_output_tokens,
        limit=args.limit,
        seed=args.seed,
        device=args.device,
        hash_algo=args.hash_algo,
        long_prompts=args.long_prompts,
        fast_path=not args.no_fast_path,
        dtype=args.dtype,
        block_events=args.block_events,
        replicas=args.replicas,
        router=args.router,
        arrival_rate=args.arrival_rate,
        think_time_s=args.think_time,
        start_stagger_s=args.start_stagger,
        clock=args.clock,
        clock_anyway=args.clock_anyway,
        warmup=args.warmup,
        prefix_caching=not args.no_prefix_caching,
    )


def main(args: argparse.Namespace) -> int:
    from analysis.runs import run_and_write

    config = config_from_args(args)
    if args.timeline is not None and not (config.engine == "vllm" or config.clock):
        from analysis.platform.errors import ConfigError

        raise ConfigError("--timeline needs a run that keeps time: --engine vllm, or --clock")
    folder, result = run_and_write(
        config,
        args.results_dir,
        force=args.force,
        progress=False if args.no_progress else None,
    )
    if result is None:
        if args.timeline is not None:
            from analysis.engines.result import RunResult

            result = RunResult.read(folder)
        else:
            print(f"already finished: {folder} (use --force to run again)")
            return 0
    print(summary_line(result.summary, result.manifest))
    timed = latency_line(result.requests)
    if timed:
        print(timed)
    if args.timeline is not None:
        from analysis.timing.timeline import write_chrome_trace

        print(f"timeline: {write_chrome_trace(result, args.timeline)}")
    print(f"written: {folder}")
    return 0


def summary_line(summary: dict, manifest: dict) -> str:
    first, every = summary["first_prefill"], summary["all_prefill"]
    skipped = summary["requests_skipped"]
    parts = [
        f"{summary['requests_finished']} requests",
        f"first-prefill hit rate {first['rate']:.2%} ({first['hits']}/{first['queries']} tokens)",
        f"all-prefill {every['rate']:.2%}",
        f"preemptions {summary['preemptions']}",
        f"{manifest['timings']['total_s']:.1f} s",
    ]
    if skipped:
        parts.append(f"{skipped} skipped (prompt >= max_model_len)")
    return ", ".join(parts)


def latency_line(requests) -> str | None:
    """TTFT, TPOT and throughput of a run that kept time (the real engine, replay on a clock)."""
    from analysis.timing.calibration import latencies

    done = requests[(requests["status"] == "finished") & requests["ttft_s"].notna()]
    if done.empty:
        return None
    times = latencies(done)
    span = float(done["finish_s"].max() - done["arrival_s"].min())
    tpot = times["tpot_s"][done["output_tokens"] > 1]
    return (
        f"TTFT mean {times['ttft_s'].mean() * 1e3:.1f} ms, p50 "
        f"{times['ttft_s'].median() * 1e3:.1f} ms, p90 {times['ttft_s'].quantile(0.9) * 1e3:.1f} "
        f"ms; TPOT mean {tpot.mean() * 1e3:.2f} ms; {len(done) / span:.2f} requests/s over "
        f"{span:.2f} s"
    )
