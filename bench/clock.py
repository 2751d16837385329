"""Replay on a clock against count-only replay, on the same multi-turn conversations.

Both run the decode fast path (the clock charges its parked decodes and skipped steps as
`schedule()` would have logged them): `clock / count-only` is what time costs (the goal:
at most 1.5), and `clock / clock without fast path` what the fast path saves a timed run.
The profile is the committed H100 one, used for its shape (no check needs this machine to be
an H100: replay's speed does not depend on the profile's machine).
Each is timed twice, interleaved after a warm-up run, and the faster time kept (best of 2).
`BENCH_CLOCK_CONVERSATIONS` sets how many conversations (default 2000; 0: the whole trace).
"""

from __future__ import annotations

import os
import time

PROFILE = "data/external/h100/2026-11-26/calibration-2/profile.json"


def main() -> dict[str, float]:
    from analysis.data.traces import ensure_traces
    from analysis.platform.paths import repo_root
    from analysis.runs import run
    from analysis.timing.calibration import BASE

    ensure_traces(progress=False)
    conversations = int(os.environ.get("BENCH_CLOCK_CONVERSATIONS", "2000")) or None
    base = BASE["cuda"].with_(
        engine="replay",
        device="cpu",
        trace="multi_turn",
        limit=conversations,
        concurrency=64,
        warmup=False,
    )
    clocked = base.with_(clock=str(repo_root() / PROFILE))
    runs = {
        "count-only": base,
        "on the clock": clocked,
        "on the clock, no fast path": clocked.with_(fast_path=False),
    }
    run(None, base.with_(limit=20), progress=False)  # warm: imports, the trace, vLLM's setup
    seconds: dict[str, float] = {}
    for repeat in (1, 2):  # interleaved, the faster of two kept: the least disturbed
        for name, config in runs.items():
            started = time.perf_counter()
            result = run(None, config, progress=False)
            elapsed = time.perf_counter() - started
            seconds[name] = min(elapsed, seconds.get(name, elapsed))
            print(
                f"{name:26s} run {repeat}: {elapsed:6.1f} s, "
                f"{result.summary['requests_finished']} requests, "
                f"{result.manifest['engine']['steps']} steps, "
                f"{result.manifest['engine']['scheduler_calls']} schedule() calls"
            )
    return {
        "clock / count-only": seconds["on the clock"] / seconds["count-only"],
        "clock / clock without fast path": (
            seconds["on the clock"] / seconds["on the clock, no fast path"]
        ),
    }
