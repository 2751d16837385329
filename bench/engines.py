"""Engines: replay vs the real CPU engine on one sample, and the whole multi-turn trace replayed.

1. `engines` (`main`): one sample of the multi-turn trace (first conversations, replies
   capped), the same configuration on both engines: requests/s and tokens/s (prompt +
   generated tokens over the step loop, start-up excluded and reported apart), and their ratio.
2. `replay` (`replay_main`): the WHOLE multi-turn trace (recorded replies decoded) through
   `replay` at one configuration: wall and CPU seconds, requests/s, tokens/s; the same run
   with the replay engine as it was at BASELINE_REV (its `src/` from `git archive`, run in a
   child process: its package layout is not today's), twice each in the order before, now,
   now, before after a warm-up, their ratio, and that every count is the same; the size of
   its result folder, and what its block events would add in full. Then the whole trace
   through a fleet of 8 replay engines behind session affinity, with its wall time.

Uses data/traces/multi_turn.parquet; without it, a synthetic trace of the same size and shape
(said so in the output).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
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
# The replay engine at the start of issue 21 (its speed target): what "faster" is measured
# against.
BASELINE_REV = "94f5565"
# The whole trace through a fleet: session affinity over 8 replicas, and the time it should
# take at most on 2 cores (issue 21).
FLEET = {"replicas": 8, "router": "affinity"}
FLEET_TARGET_SECONDS = 300


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


BASELINE_CHILD = """
import json, os, sys, time
from analysis.engines import RunConfig, run
from analysis.traces import load_trace

frame = load_trace(sys.argv[1])
config = RunConfig(trace="multi_turn", engine="replay", block_size=int(sys.argv[2]),
                   num_blocks=int(sys.argv[3]), mode="batch")
run(frame.head(int(sys.argv[4])), config, progress=False)  # warm-up, as the parent's
wall, cpu = time.perf_counter(), time.process_time()
result = run(frame, config, progress=False)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"wall": wall, "cpu": cpu, "summary": result.summary}, default=str))
"""
WARM_UP_ROWS = 2000


@contextmanager
def baseline_source():
    """The `src/` folder of BASELINE_REV, extracted from git into a temporary folder (None
    without git or that commit). Its package layout differs from today's, so the baseline runs
    from its own tree in a child process, never mixed with today's modules."""
    root = Path(__file__).resolve().parents[1]
    try:
        archive = subprocess.run(
            ["git", "archive", BASELINE_REV, "src"], cwd=root, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp) / "src"


def _baseline_run(source: Path, trace_path: Path) -> tuple[dict, float, float]:
    """One whole-trace replay by the engine at BASELINE_REV: (summary, wall s, CPU s), timed
    inside the child after the same warm-up as today's runs (imports and start-up excluded)."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(source), "PREFIX_CACHE_LAB_ROOT": str(root)}
    args = [str(trace_path), str(WHOLE_BLOCK_SIZE), str(WHOLE_NUM_BLOCKS), str(WARM_UP_ROWS)]
    done = subprocess.run(
        [sys.executable, "-c", BASELINE_CHILD, *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    return measured["summary"], measured["wall"], measured["cpu"]


def _whole_trace_run(frame, **changes):
    """One whole-trace run at today's HEAD (replay unless `changes` say otherwise):
    (result, wall s, CPU s)."""
    from analysis.engines import RunConfig
    from analysis.runs import run

    settings = {"engine": "replay", "block_size": WHOLE_BLOCK_SIZE, "mode": "batch"}
    config = RunConfig(trace="multi_turn", num_blocks=WHOLE_NUM_BLOCKS, **{**settings, **changes})
    wall = time.perf_counter()
    cpu = time.process_time()
    result = run(frame, config, progress=False)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _counts(summary: dict) -> dict:
    """Every count of a run's summary (wall-clock seconds left out)."""
    counts = json.loads(json.dumps(summary, default=str))  # as the baseline's child sends it
    counts["blocks"] = {k: v for k, v in counts["blocks"].items() if k != "reuse_gap_seconds"}
    return counts


def _same_counts(old: dict, new: dict) -> bool:
    """Equal counts on every field both revisions report (today's summary has a few more)."""
    old, new = _counts(old), _counts(new)
    fields = old.keys() & new.keys()
    blocks = old["blocks"].keys() & new["blocks"].keys()
    return all(old[k] == new[k] for k in fields - {"blocks"}) and all(
        old["blocks"][k] == new["blocks"][k] for k in blocks
    )


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
    """Today's replay against BASELINE_REV's on the whole trace, timed in one run."""
    # A short warm-up pays the imports and first calls, which would otherwise fall on the first
    # timed run; the timed runs go before, now, now, before, so that a slow drift of the
    # machine's speed weighs on both alike. Each one's time is the mean of its two runs.
    _whole_trace_run(frame.head(WARM_UP_ROWS))
    with baseline_source() as baseline, tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(source) if Path(source).is_file() else Path(tmp) / "trace.parquet"
        if not trace_path.is_file():
            frame.to_parquet(trace_path)
        timed: dict[bool, list] = {False: [], True: []}
        for now in (False, True, True, False) if baseline else (True,):
            if now:
                result, wall, cpu = _whole_trace_run(frame)
                timed[True].append((result.summary, wall, cpu))
            else:
                timed[False].append(_baseline_run(baseline, trace_path))
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
    if timed[False]:
        old_wall, old_cpu = (sum(run[i] for run in timed[False]) / 2 for i in (1, 2))
        spread = {now: [round(run[1], 1) for run in runs] for now, runs in timed.items()}
        same = all(_same_counts(run[0], s) for runs in timed.values() for run in runs)
        print(
            f"  replay at {BASELINE_REV} -> now: {old_wall:.1f} s -> {wall:.1f} s wall (mean of 2 "
            f"runs each: {spread[False]} s, {spread[True]} s; CPU {old_cpu:.1f} s -> {cpu:.1f} s), "
            f"{old_wall / wall:.2f}x faster wall, {old_cpu / cpu:.2f}x CPU; identical counts: "
            f"{same}"
        )
        ratios[f"replay {BASELINE_REV} / now, whole trace, wall"] = old_wall / wall
        ratios[f"replay {BASELINE_REV} / now, whole trace, CPU"] = old_cpu / cpu
    else:
        print(f"  (no git or no commit {BASELINE_REV} here: no before/after ratio measured)")
    written, events = _folder_sizes(result)
    print(
        f"  result folder: {written / 1e6:.1f} MB with block events as aggregates "
        f"({len(result.block_events):,} events would add {events / 1e6:.0f} MB in full)"
    )
    return ratios


def whole_trace_fleet(frame) -> dict[str, float]:
    """The whole trace through the FLEET of replay engines (session affinity), timed."""
    result, wall, cpu = _whole_trace_run(frame, engine="fleet", **FLEET)
    s = result.summary
    verdict = "within" if wall <= FLEET_TARGET_SECONDS else "over"
    print(
        f"  fleet of {FLEET['replicas']} ({FLEET['router']}), {WHOLE_NUM_BLOCKS} blocks each: "
        f"{wall:.1f} s wall ({cpu:.1f} s CPU), {verdict} the {FLEET_TARGET_SECONDS} s target; "
        f"{s['requests_finished']} requests, first-prefill {s['first_prefill']['rate']:.2%}"
    )
    return {f"fleet x{FLEET['replicas']}, whole trace, wall s": wall}


def main() -> dict[str, float]:
    """`engines`: replay against the real CPU engine on one sample."""
    frame, _ = _trace()
    return compare_on_sample(frame)


def replay_main() -> dict[str, float]:
    """`replay`: the whole trace, today's replay against BASELINE_REV's, and a fleet."""
    frame, source = _trace()
    return whole_trace(frame, source) | whole_trace_fleet(frame)


if __name__ == "__main__":
    main()
