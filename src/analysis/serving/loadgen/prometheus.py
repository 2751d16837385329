"""The server's Prometheus counters: parsing a scrape, deltas over a run, a flat summary.

What the server says about a run (prefix-cache queries and hits, preemptions), as opposed to
what the client measured, so it is read and summarised on its own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from analysis.metrics.server_clocks import RECORDED_CLOCK_COLUMNS

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
# Counters that explain a run; Prometheus names without the `_total` suffix.
SERVER_COUNTERS = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:prompt_tokens_cached",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:num_preemptions",
    "vllm:request_success",
    # the server's own clocks: histograms, whose sums and counts are counters too
    *(f"vllm:{column}" for column in RECORDED_CLOCK_COLUMNS),
)
# Gauges sampled during a run: KV-cache use (0-1, cached-but-idle blocks count as free) and
# the scheduler's queues.
SERVER_GAUGES = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)


def parse_prometheus(text: str, names: Sequence[str] = SERVER_COUNTERS) -> dict[str, float]:
    """Sum each counter over its label sets (engines, finish reasons). `_total` is dropped;
    `_created` timestamps are ignored. Counters absent from the text are absent here."""
    wanted = set(names)
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name = match.group(1).removesuffix("_total")
        if name not in wanted or match.group(1).endswith("_created"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        totals[name] = totals.get(name, 0.0) + value
    return totals


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before for every counter in `after` (a counter new in `after` starts at 0).

    A negative delta means the server restarted between the scrapes: refuse it loudly."""
    deltas = {}
    for name, value in after.items():
        delta = value - before.get(name, 0.0)
        if delta < 0:
            raise ValueError(f"counter {name} went down ({before[name]} -> {value}): server reset?")
        deltas[name] = delta
    return deltas


def counter_summary(deltas: dict[str, float], prefix: str = "") -> dict[str, float]:
    """Flat columns from counter deltas: queries, hits, hit rate, preemptions, ..."""
    out = {f"{prefix}{k.removeprefix('vllm:')}": v for k, v in sorted(deltas.items())}
    queries = deltas.get("vllm:prefix_cache_queries", 0.0)
    hits = deltas.get("vllm:prefix_cache_hits", 0.0)
    out[f"{prefix}hit_rate"] = hits / queries if queries else math.nan
    return out
