"""Engines: replay vs the real CPU engine on one sample, and the whole multi-turn trace replayed.

1. One sample of the multi-turn trace (first conversations, replies capped), the same
   configuration on both engines: requests/s and tokens/s (prompt + generated tokens over the
   step loop, start-up excluded and reported apart), and their ratio.
2. The WHOLE multi-turn trace (recorded replies decoded) through `replay` at one
   configuration: wall and CPU seconds, requests/s, tokens/s; the same run with the replay
   engine as it was at BASELINE_REV (read from git), twice each in the order before, now, now,
   before after a warm-up, their ratio, and that every count is the same; the size of its
   result folder, and what its block events would add in full.

Uses data/traces/multi_turn.parquet; without it, a synthetic trace of the same size and shape
(said so in the output).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SAMPLE_CONVERSATIONS = 24
SAMPLE_MAX_OUTPUT_TOKENS = 32
# Whole-trace configuration: vLLM's GPU default block size, batch arrival, a cache large
# enough for every running request (no preemption), vLLM's default 256 sequences.
WHOLE_BLOCK_SIZE = 16
WHOLE_NUM_BLOCKS = 65_536
# The replay engine before the latest hot-path work: what "faster" is measured against.
BASELINE_REV = "4dabc35"


def _trace():
    from analysis.platform.paths import traces_dir

    path = traces_dir() / "multi_turn.parquet"
    if path.is_file():
        from analysis.data.traces import load_trace

        return load_trace(path), str(path)
    from analysis.engines.synthetic import synthetic_trace

    frame = synthetic_trace(
        17_400, turns=(1, 6), user_tokens=(10, 160), reply_tokens=(50, 510), seed=0
    )
    return frame, "synthetic stand-in (data/traces/multi_turn.parquet not built)"


def _throughput(result) -> tuple[float, float, float]:
    """(loop seconds, requests/s, tokens/s) over the engine's step loop."""
    seconds = result.manifest["engine"]["loop_seconds"]
    requests = result.summary["requests_finished"]
    tokens = result.summary["prompt_tokens"] + result.summary["output_tokens"]
    return seconds, requests / seconds, tokens / seconds


def compare_on_sample(frame) -> dict[str, float]:
    from analysis.engines import RunConfig
    from analysis.runs import run

    config = RunConfig(
        trace="multi_turn",
        engine="vllm",
        block_size=32,
        num_blocks=2048,
        max_model_len=4096,
        mode="batch",
        limit=SAMPLE_CONVERSATIONS,
        max_output_tokens=SAMPLE_MAX_OUTPUT_TOKENS,
    )
    started = time.perf_counter()
    real = run(frame, config, progress=False)
    real_total = time.perf_counter() - started
    started = time.perf_counter()
    replayed = run(frame, replace(config, engine="replay"), progress=False)
    replay_total = time.perf_counter() - started
    same = (
        real.summary["first_prefill"] == replayed.summary["first_prefill"]
        and real.summary["all_prefill"] == replayed.summary["all_prefill"]
        and real.summary["preemptions"] == replayed.summary["preemptions"]
    )
    print(
        f"sample: first {SAMPLE_CONVERSATIONS} conversations, "
        f"{real.summary['requests_finished']} requests, replies capped at "
        f"{SAMPLE_MAX_OUTPUT_TOKENS} tokens, block 32, batch; identical counts: {same}"
    )
    rows = []
    for name, result, total in (
        ("vllm (CPU)", real, real_total),
        ("replay", replayed, replay_total),
    ):
        seconds, rps, tps = _throughput(result)
        rows.append((rps, tps))
        print(
            f"  {name:11s} loop {seconds:7.2f} s  {rps:9.1f} requests/s  {tps:11.0f} tokens/s"
            f"  (with start-up: {total:6.1f} s)"
        )
    print(
        f"  replay / vllm: {rows[1][0] / rows[0][0]:.1f}x requests/s, "
        f"{rows[1][1] / rows[0][1]:.1f}x tokens/s"
    )
    return {"replay / vllm requests/s (sample)": rows[1][0] / rows[0][0]}


def baseline_replay():
    """`analysis.engines.replay` as it was at BASELINE_REV, read from git (None without git or
    that commit): the "before" of the hot-path ratio, run in this same process."""
    import subprocess
    import sys
    import types

    root = Path(__file__).resolve().parents[1]
    try:
        source = subprocess.run(
            ["git", "show", f"{BASELINE_REV}:src/analysis/engines/replay.py"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = types.ModuleType("replay_at_baseline")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        exec(
            compile(source, f"{BASELINE_REV}:src/analysis/engines/replay.py", "exec"), vars(module)
        )
    except ImportError as exc:  # written against the package layout of its time
        print(f"  (replay at {BASELINE_REV} does not import against this package: {exc})")
        return None
    return module


def _whole_trace_run(frame, engine=None):
    """One whole-trace replay (with `engine`'s `run_replay` when given): (result, wall, CPU s)."""
    from analysis.engines import RunConfig
    from analysis.engines import replay as replay_module
    from analysis.runs import run

    config = RunConfig(
        trace="multi_turn",
        engine="replay",
        block_size=WHOLE_BLOCK_SIZE,
        num_blocks=WHOLE_NUM_BLOCKS,
        mode="batch",
    )
    current = replay_module.run_replay
    replay_module.run_replay = engine.run_replay if engine else current
    try:
        wall = time.perf_counter()
        cpu = time.process_time()
        result = run(frame, config, progress=False)
        return result, time.perf_counter() - wall, time.process_time() - cpu
    finally:
        replay_module.run_replay = current


def _counts(result) -> dict:
    """Every count of a run (wall-clock seconds left out)."""
    summary = dict(result.summary)
    summary["blocks"] = {k: v for k, v in summary["blocks"].items() if k != "reuse_gap_seconds"}
    return summary


def _folder_sizes(result) -> tuple[int, int]:
    """Bytes of the result folder as written (aggregates), and of its block events in full."""
    import tempfile
    from pathlib import Path

    from analysis.platform.manifest import write_parquet

    with tempfile.TemporaryDirectory() as tmp:
        folder = result.write(Path(tmp) / "result")
        written = sum(p.stat().st_size for p in folder.iterdir())
        events = Path(tmp) / "block_events.parquet"
        write_parquet(events, result.block_events)
        return written, events.stat().st_size


def whole_trace(frame, source: str) -> dict[str, float]:
    baseline = baseline_replay()
    # A short warm-up pays the imports and first calls, which would otherwise fall on the first
    # timed run; the timed runs go before, now, now, before, so that a slow drift of the
    # machine's speed weighs on both alike. Each one's time is the mean of its two runs.
    _whole_trace_run(frame.head(2000))
    order = (baseline, None, None, baseline) if baseline else (None,)
    timed: dict[bool, list] = {False: [], True: []}
    for engine in order:
        timed[engine is None].append(_whole_trace_run(frame, engine))
    result = timed[True][0][0]
    wall, cpu = (sum(run[i] for run in timed[True]) / len(timed[True]) for i in (1, 2))
    s = result.summary
    engine = result.manifest["engine"]
    tokens = s["prompt_tokens"] + s["output_tokens"]
    print(
        f"whole multi-turn trace ({source}): {s['requests_finished']} requests, "
        f"{s['prompt_tokens'] / 1e6:.1f} M prompt + {s['output_tokens'] / 1e6:.1f} M decoded tokens"
    )
    print(
        f"  replay, block {WHOLE_BLOCK_SIZE}, {WHOLE_NUM_BLOCKS} blocks, batch, "
        f"max_num_seqs 256: {wall:.1f} s wall ({cpu:.1f} s CPU), of which step loop "
        f"{engine['loop_seconds']:.1f} s; {s['requests_finished'] / wall:.0f} requests/s, "
        f"{tokens / wall / 1e6:.2f} M tokens/s"
    )
    print(
        f"  first-prefill {s['first_prefill']['rate']:.2%}, all-prefill "
        f"{s['all_prefill']['rate']:.2%}, preemptions {s['preemptions']}, "
        f"{engine['steps']} steps ({engine['scheduler_calls']} schedule() calls)"
    )
    ratios = {}
    if baseline:
        old_wall, old_cpu = (sum(run[i] for run in timed[False]) / 2 for i in (1, 2))
        spread = {now: [round(run[1], 1) for run in runs] for now, runs in timed.items()}
        same = all(_counts(run[0]) == _counts(result) for runs in timed.values() for run in runs)
        print(
            f"  replay at {BASELINE_REV} -> now: {old_wall:.1f} s -> {wall:.1f} s wall (mean of 2 "
            f"runs each: {spread[False]} s, {spread[True]} s; CPU {old_cpu:.1f} s -> {cpu:.1f} s), "
            f"{old_wall / wall:.2f}x faster wall, {old_cpu / cpu:.2f}x CPU; identical counts: "
            f"{same}"
        )
        ratios[f"replay {BASELINE_REV} / now, whole trace, wall"] = old_wall / wall
    else:
        print(f"  (no runnable replay at {BASELINE_REV} here: no before/after ratio measured)")
    written, events = _folder_sizes(result)
    print(
        f"  result folder: {written / 1e6:.1f} MB with block events as aggregates "
        f"({len(result.block_events):,} events would add {events / 1e6:.0f} MB in full)"
    )
    return ratios


def main() -> dict[str, float]:
    frame, source = _trace()
    return compare_on_sample(frame) | whole_trace(frame, source)


if __name__ == "__main__":
    main()
