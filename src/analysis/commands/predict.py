"""`python -m analysis predict`: TTFT, TPOT, throughput and goodput from replay on a clock.

    python -m analysis predict --trace multi_turn --profile data/results/calibration \\
        --clients 8 --limit 100 --json
    python -m analysis predict --profile P --rate 2 --think-time 5 --no-prefix-caching
    python -m analysis predict --profile P --timestamps --clock-anyway --block-size 512 \\
        --trace data/external/mooncake/conversation_trace.jsonl.gz --trace-block-size 512

vLLM's own scheduler decides every step (`replay`); the step-cost profile that
`python -m analysis calibrate` measured gives each step its time. Arrivals: closed-loop clients
(`--clients`), a Poisson rate of conversations (`--rate`), or the trace's own times
(`--timestamps`; a block-hash trace's, Mooncake's among them, in seconds). The model, block
size and token budget default to the profile's, so that the profile applies; the per-request
table is the run's `requests.parquet`, whose path the summary names.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        default="multi_turn",
        help="a trace name, a .parquet path, or a block-hash trace (Mooncake's JSONL, .gz too)",
    )
    parser.add_argument(
        "--trace-block-size",
        type=int,
        default=None,
        help="a block-hash trace's own block size (512 for Mooncake, 16 for Alibaba/Qwen)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        required=True,
        help="a step-cost profile.json, or the calibration folder that holds one",
    )
    arrivals = parser.add_mutually_exclusive_group(required=True)
    arrivals.add_argument("--clients", type=int, help="closed-loop clients")
    arrivals.add_argument("--rate", type=float, help="Poisson: conversations started per second")
    arrivals.add_argument("--timestamps", action="store_true", help="the trace's own arrival times")
    parser.add_argument(
        "--think-time", type=float, default=0.0, help="seconds between a reply and the next turn"
    )
    parser.add_argument(
        "--start-stagger",
        type=float,
        default=0.0,
        help=(
            "seconds between requests that reach the engine together: the --clients' first, "
            "and those released by replies of one step (a server's front end)"
        ),
    )
    parser.add_argument(
        "--no-prefix-caching", action="store_true", help="vLLM's prefix caching off"
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="engines behind a router, each on its own clock (num-blocks is per replica)",
    )
    parser.add_argument(
        "--router", default=None, help="with --replicas: round-robin, least-loaded, affinity, ..."
    )
    parser.add_argument("--num-blocks", type=int, default=None, help="KV blocks (default 1024)")
    parser.add_argument("--block-size", type=int, default=None, help="default: the profile's")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="default: the profile's"
    )
    parser.add_argument("--model", default=None, help="default: the profile's model shape")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--limit", type=int, default=None, help="first N conversations")
    parser.add_argument("--seed", type=int, default=0, help="Poisson arrivals' seed")
    parser.add_argument("--slo-ttft", type=float, default=None, help="goodput: TTFT target, s")
    parser.add_argument("--slo-tpot", type=float, default=None, help="goodput: TPOT target, s")
    parser.add_argument(
        "--clock-anyway",
        action="store_true",
        help="use a profile measured for another model, vLLM or settings (recorded)",
    )
    parser.add_argument("--json", action="store_true", help="the summary as JSON on stdout")
    parser.add_argument("--force", action="store_true", help="predict again even if finished")
    parser.add_argument("--results-dir", type=Path, default=None, help="default data/results")


def profile_path(given: Path) -> Path:
    """The profile file itself, where a calibration folder is given."""
    return given / "profile.json" if given.is_dir() else given


def config_from_args(args: argparse.Namespace, profile: Any):
    """Replay on the profile's clock, with the profile's model and engine settings unless the
    command line says otherwise."""
    from analysis.engines.config import RunConfig

    settings = profile.identity.get("engine_settings", {})
    model = args.model or profile.identity.get("model", {}).get("name")
    if args.clients is not None:
        arrivals: dict[str, Any] = {"mode": "closed-loop", "concurrency": args.clients}
    elif args.rate is not None:
        arrivals = {"mode": "poisson", "arrival_rate": args.rate}
    else:
        arrivals = {"mode": "timestamps"}
    chosen = {
        "trace": token_trace(args.trace, args.trace_block_size),
        "engine": "fleet" if args.replicas != 1 or args.router else "replay",
        "replicas": args.replicas,
        "router": args.router,
        "model": None if model in (None, "tiny-llama") else model,
        "block_size": args.block_size or settings.get("block_size"),
        "num_blocks": args.num_blocks,
        "max_model_len": args.max_model_len,
        "max_num_batched_tokens": args.max_num_batched_tokens
        or settings.get("max_num_batched_tokens"),
        "limit": args.limit,
        "seed": args.seed,
        "think_time_s": args.think_time,
        "start_stagger_s": args.start_stagger,
        "clock": str(profile_path(args.profile)),
        "clock_anyway": args.clock_anyway,
        "prefix_caching": not args.no_prefix_caching,
        **arrivals,
    }
    return RunConfig(**{k: v for k, v in chosen.items() if v is not None})


def token_trace(trace: str, block_size: int | None) -> str:
    """The trace as replay reads it: a block-hash trace (its `timestamp`s kept, in seconds)
    becomes a token trace file beside it."""
    from analysis.data.blockhash import is_blockhash_path, load_blockhash_trace, token_trace_file
    from analysis.platform.errors import ConfigError

    if not is_blockhash_path(trace):
        return trace
    if block_size is None or block_size < 1:
        raise ConfigError(
            f"{trace} is a block-hash trace: give --trace-block-size, its own block size (512 "
            "for Mooncake, 16 for the Alibaba/Qwen traces)"
        )
    frame, report = load_blockhash_trace(trace, block_size)
    if report.malformed:
        print(report.summary(), file=sys.stderr)
    return str(token_trace_file(trace, frame))


def check_slo(args: argparse.Namespace) -> None:
    from analysis.platform.errors import ConfigError

    for name in ("slo_ttft", "slo_tpot"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            flag = name.replace("_", "-")
            raise ConfigError(f"--{flag} must be a positive number of seconds (got {value})")


def main(args: argparse.Namespace) -> int:
    from analysis.engines.clock import load_profile
    from analysis.engines.result import RunResult
    from analysis.runs import run_and_write
    from analysis.timing.prediction import summarise

    check_slo(args)
    profile = load_profile(profile_path(args.profile))
    config = config_from_args(args, profile)
    folder, result = run_and_write(config, args.results_dir, force=args.force, progress=False)
    if result is None:
        result = RunResult.read(folder)
    summary = {
        "config_id": folder.name,
        "profile": str(profile_path(args.profile)),
        "prefix_caching": config.prefix_caching,
        **({"replicas": config.replicas, "router": config.router} if config.replicas > 1 else {}),
        "first_prefill_hit_rate": result.summary["first_prefill"]["rate"],
        "preemptions": result.summary["preemptions"],
        **summarise(result.requests, slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot),
        "requests_parquet": str(folder / "requests.parquet"),
    }
    if args.json:
        print(json.dumps(summary, indent=1, default=_plain))
    else:
        print(_readable(summary))
    return 0


def _plain(value: Any) -> Any:
    return None if value != value else float(value)  # NaN (no hit rate with caching off): null


def _readable(summary: dict[str, Any]) -> str:
    ttft, tpot = summary["ttft_s"], summary["tpot_s"]
    lines = [
        f"{summary['requests']} requests over {summary['span_s']:.2f} s (predicted): "
        f"{summary['throughput_req_s']:.2f} requests/s",
        f"TTFT mean {ttft['mean'] * 1e3:.1f} ms, p50 {ttft['p50'] * 1e3:.1f} ms, "
        f"p90 {ttft['p90'] * 1e3:.1f} ms",
    ]
    if tpot["mean"] is not None:
        lines.append(f"TPOT mean {tpot['mean'] * 1e3:.2f} ms, p90 {tpot['p90'] * 1e3:.2f} ms")
    if "goodput_req_s" in summary:
        lines.append(
            f"SLO met by {summary['slo_attained']:.1%}: goodput "
            f"{summary['goodput_req_s']:.2f} requests/s"
        )
    lines.append(f"per request: {summary['requests_parquet']}")
    return "\n".join(lines)
