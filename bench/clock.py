"""Replay on a clock against count-only replay, on the same multi-turn conversations.

The clock charges every step, so it runs without the decode fast path: the ratios say what
time costs against replay as it is (fast path on) and against replay doing the same steps
(fast path off). The profile is the committed H100 one, used for its shape (no check needs
this machine to be an H100: replay's speed does not depend on the profile's machine).
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
    runs = {
        "count-only": base,
        "count-only, no fast path": base.with_(fast_path=False),
        "on the clock": base.with_(clock=str(repo_root() / PROFILE)),
    }
    seconds = {}
    for name, config in runs.items():
        started = time.perf_counter()
        result = run(None, config, progress=False)
        seconds[name] = time.perf_counter() - started
        print(
            f"{name:26s} {seconds[name]:7.1f} s, {result.summary['requests_finished']} requests, "
            f"{result.manifest['engine']['steps']} steps"
        )
    return {
        "clock / count-only": seconds["on the clock"] / seconds["count-only"],
        "clock / no fast path": seconds["on the clock"] / seconds["count-only, no fast path"],
    }
