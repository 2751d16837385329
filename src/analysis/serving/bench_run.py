"""One benchmark run on a running server: its requests (synthetic shared prefixes or ShareGPT
conversations), sent from an emptied prefix cache while the server's gauges are sampled, and
its summary; and several repeats of a run combined into one.

A module of its own: what happens inside one run (load generation, counter scraping, the
predicted saving) is apart from which runs a benchmark schedules on which servers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.engines.timed_arrivals import poisson_starts
from analysis.metrics.server_clocks import RECORDED_CLOCK_COLUMNS
from analysis.serving import loadgen
from analysis.serving.bench_config import RunKey, ServingBenchConfig, arrival_seed
from analysis.serving.server import VllmServer
from analysis.serving.stats import odd_repeats_text
from analysis.serving.storage import _digest


def run_coroutine(coroutine: Any) -> Any:
    """`asyncio.run`, also from inside a running event loop (a Jupyter kernel has one): the
    coroutine then runs to completion on a fresh loop in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def warm_server(server: VllmServer, config: ServingBenchConfig) -> None:
    """Two requests (256 and up to 1024 unrelated ids), so that first-call costs (allocations, lazy
    initialisation) do not land on the first measured run; then an empty cache."""
    specs = [
        loadgen.RequestSpec(
            request_id=f"server-warmup/{i}",
            prompt_ids=tuple([loadgen.BOS_ID, *loadgen.ordinary_ids(length - 1, "warm", i)]),
            max_tokens=4,
        )
        for i, length in enumerate((256, min(1024, config.max_model_len // 2)))
    ]
    run_coroutine(
        loadgen.run_burst(
            server.base_url, server.model_name, specs, 2, timeout_s=300.0, progress=False
        )
    )
    server.reset_prefix_cache()


# A cell whose machine speed (prefill tokens/s of one request alone) changed by more than this
# share between its start and its end ran on a machine whose load changed: it is flagged.
SPEED_CHANGE_BOUND = 0.3


# How many times the speed probe sends each of its two prompt sizes.
PROBE_REPEATS = 2


def prefill_speed(server: VllmServer, probe_tokens: int = 1024) -> float:
    """Prefill tokens/s of one uncached request alone, now: the TTFT of a `probe_tokens`
    prompt less that of a 32-token one, from an emptied cache. Measured before and after
    each cell (one cell's after is the next one's before, see `benchmark`), so that load from
    anything else on the machine shows in the cell's record.

    A warm-up request goes first and each size is sent `PROBE_REPEATS` times, its fastest TTFT
    counting: a lone first request pays one-off costs (a fresh connection, the first request
    after a cache reset), which had moved a single-shot probe from 1,530 to 9,222 tok/s between
    cells of one quiet run."""
    tag = f"{time.perf_counter_ns()}"
    sizes = [32] + [32, probe_tokens] * PROBE_REPEATS
    specs = [
        loadgen.RequestSpec(
            request_id=f"speed/{tag}/{i}",
            prompt_ids=tuple([loadgen.BOS_ID, *loadgen.ordinary_ids(n - 1, "speed", f"{tag}/{i}")]),
            max_tokens=1,
            warmup=i == 0,
        )
        for i, n in enumerate(sizes)
    ]
    server.reset_prefix_cache()
    before = server.counters()
    results, _ = run_coroutine(
        loadgen.run_burst(
            server.base_url, server.model_name, specs, 1, timeout_s=600.0, progress=False
        )
    )
    # its requests counted as finished before it returns: a later count tells what ran since
    server.counters_after(before, sum(r.status == "ok" for r in results))
    server.reset_prefix_cache()
    if any(r.status != "ok" for r in results):
        return math.nan
    return probe_rate(sizes[1:], [r.ttft_s for r in results[1:]], probe_tokens)


def probe_rate(sizes: Sequence[int], ttfts: Sequence[float], probe_tokens: int) -> float:
    """Prefill tokens/s from the probe's requests: the fastest TTFT of each size counts."""
    fastest = {n: min(t for m, t in zip(sizes, ttfts, strict=True) if m == n) for n in set(sizes)}
    return prefill_rate(fastest[32], fastest[probe_tokens], probe_tokens)


def prefill_rate(short_ttft: float, long_ttft: float, probe_tokens: int) -> float:
    """Prefill tokens/s from the TTFTs of a 32-token and a `probe_tokens` prompt. Noise on a
    busy machine can make the gap tiny or negative: at least a quarter of the long request's
    TTFT counts as its prefill (a conservative, slower estimate)."""
    return (probe_tokens - 32) / max(long_ttft - short_ttft, 0.25 * long_ttft)


def speed_note(before: float, after: float) -> str:
    """A note when the prefill-speed probe moved beyond `SPEED_CHANGE_BOUND` during a cell. It
    names no cause: one probe of two requests cannot tell load from other jobs from its own
    noise."""
    if not (math.isfinite(before) and math.isfinite(after)) or before <= 0:
        return ""
    if abs(after / before - 1.0) <= SPEED_CHANGE_BOUND:
        return ""
    return (
        f"speed probe moved during the cell: prefill {before:,.0f} -> {after:,.0f} tok/s "
        "(one probe before and one after: other load, or the probe's own noise; re-run the "
        "cell before quoting it)"
    )


def synthetic_specs(config: ServingBenchConfig, key: RunKey) -> list[loadgen.RequestSpec]:
    return loadgen.synthetic_prefix_workload(
        int(key.regime),
        config.requests_at(key.concurrency),
        suffix_tokens=config.suffix_tokens,
        output_tokens=config.output_tokens,
        warmup_requests=config.warmup_requests,
        seed=config.seed,
        salt=f"c{key.concurrency}{config.salt}",  # cold start even without a cache reset
        eligible_share=config.eligible_share,
        distinct_prefixes=config.distinct_prefixes,
        churn_every=config.churn_every,
    )


def _predicted(config: ServingBenchConfig, specs: Sequence[Sequence[loadgen.RequestSpec]]) -> dict:
    """Hit rate an ideal cache would give the measured requests, and the P/(P+S) saving."""
    if config.workload == "synthetic":
        prefix = int(specs[0][0].group)
        saving = loadgen.predicted_ttft_saving(prefix, config.suffix_tokens, config.block_size)
        return {"predicted_saving": saving, "predicted_hit_rate": saving * config.eligible_share}
    hits = prompt = 0
    for conversation in specs:
        previous = 0
        for spec in conversation:
            n = len(spec.prompt_ids)
            hits += loadgen.cacheable_tokens(n, previous, config.block_size)
            prompt += n
            previous = n
    rate = hits / prompt if prompt else math.nan
    return {"predicted_saving": rate, "predicted_hit_rate": rate}


def _notes(summary: dict, cache_reset: bool) -> str:
    notes = [
        f"{summary[f'n_{s}']} {s}" for s in ("timeout", "error", "not_sent") if summary[f"n_{s}"]
    ]
    if summary.get("num_preemptions"):
        notes.append(f"{summary['num_preemptions']:g} preemptions")
    if not cache_reset:
        notes.append("cache not reset before the run")
    if summary.get("burst"):
        notes.append(
            f"one burst: {summary['requests_per_repeat']} requests per repeat for "
            f"{summary['concurrency']} clients, at most {summary['inflight_peak']} in flight"
        )
    odd = summary.get("outlier_repeats") or []
    if odd:
        values = summary.get("mean_ttft_repeats", [])
        shown = ", ".join(f"{v:.3f}" for v in values)
        what = odd_repeats_text(odd, len(values))
        notes.append(f"{what} (mean TTFT per repeat {shown} s)")
    return "; ".join(notes)


def completeness(frame: pd.DataFrame, planned: int) -> tuple[bool, str]:
    """Whether a cell's requests all succeeded as planned (`planned` requests, warm-ups
    included), and if not, the note that says so: such a cell is not reused."""
    succeeded = int((frame["status"] == "ok").sum())
    if succeeded == planned:
        return True, ""
    return False, (
        f"incomplete: {succeeded} of {planned} requests succeeded, so the cell runs again next "
        "time (a longer --request-timeout if they timed out)"
    )


def planned_requests(workload: list[loadgen.RequestSpec] | loadgen.ShareGPTWorkload) -> int:
    """Requests one repeat of a run sends (warm-ups included)."""
    if isinstance(workload, loadgen.ShareGPTWorkload):
        return workload.num_requests
    return len(workload)


def sharegpt_specs(config: ServingBenchConfig) -> loadgen.ShareGPTWorkload:
    return loadgen.sharegpt_workload(
        Path(config.trace_path) if config.trace_path else None,
        conversations=config.requests,
        max_turns=config.max_turns,
        output_tokens=config.output_tokens,
        max_model_len=config.max_model_len,
    )


def conversations_run(
    server: VllmServer,
    config: ServingBenchConfig,
    key: RunKey,
    workload: loadgen.ShareGPTWorkload,
    common: dict[str, Any],
    repeat: int,
) -> Any:
    """The client of a ShareGPT run: `key.concurrency` clients in a closed loop, or with an
    arrival rate, conversations started open loop on replay's own Poisson schedule (the
    repeat's seed)."""
    args = (server.base_url, server.model_name, workload.conversations)
    if config.arrival_rate is None:
        return loadgen.run_closed_loop(*args, key.concurrency, **common)
    seed = arrival_seed(config, repeat)
    starts = poisson_starts(len(workload.conversations), config.arrival_rate, seed)
    return loadgen.run_open_loop(*args, starts.tolist(), key.concurrency, **common)


def workload_digest(workload: Any) -> str:
    """A stable hash of a ShareGPT workload's prompts, so that a rebuilt trace gets new runs."""
    if isinstance(workload, loadgen.ShareGPTWorkload):
        specs = [s for c in workload.conversations for s in c]
    else:
        specs = list(workload)
    return _digest([[s.request_id, s.max_tokens, list(s.prompt_ids)] for s in specs], 16)


class GaugeSampler:
    """Samples the server's gauges (KV-cache use, queue lengths) in a thread during a run."""

    def __init__(self, server: VllmServer, interval_s: float, repeat: int = 0) -> None:
        self.server = server
        self.interval_s = interval_s
        self.repeat = repeat
        self.rows: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()

    def _loop(self) -> None:
        while not self._stop.is_set():
            values = self.server.gauges()
            if values:
                row = {"repeat": self.repeat, "t_s": time.perf_counter() - self._t0}
                row.update({k.removeprefix("vllm:"): v for k, v in values.items()})
                self.rows.append(row)
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        if self.interval_s > 0:
            self._t0 = time.perf_counter()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15.0)


def execute_run(
    server: VllmServer,
    config: ServingBenchConfig,
    key: RunKey,
    workload: list[loadgen.RequestSpec] | loadgen.ShareGPTWorkload | None = None,
    *,
    progress: bool = True,
    repeat: int = 0,
    gauges: list[dict[str, float]] | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Send one run's requests to a running server, from an emptied prefix cache; return the
    per-request table (column `repeat`) and the run's summary (nothing is written).
    `workload` defaults to the config's: synthetic requests for `key`'s prefix, or the
    ShareGPT conversations. `gauges`: a list that receives the KV-cache use sampled from
    `/metrics` during the run (every `config.gauge_interval_s`)."""
    if workload is None:
        workload = sharegpt_specs(config) if config.workload == "sharegpt" else None
        workload = workload or synthetic_specs(config, key)
    cache_reset = server.reset_prefix_cache()
    load_before = os.getloadavg()[0]
    common = dict(
        timeout_s=config.request_timeout_s, deadline_s=config.run_deadline_s, progress=progress
    )
    desc = f"{key.mode} {key.regime} c={key.concurrency}"
    sampler = GaugeSampler(server, config.gauge_interval_s, repeat)
    start = server.counters()
    sampler.start()
    if not isinstance(workload, loadgen.ShareGPTWorkload):
        warm = [s for s in workload if s.warmup]
        measured = [s for s in workload if not s.warmup]
        common["t0"] = time.perf_counter()  # one clock for both phases
        warm_results, _ = run_coroutine(
            loadgen.run_burst(server.base_url, server.model_name, warm, 1, **common, desc=desc)
        )
        middle = server.counters_after(start, sum(r.status == "ok" for r in warm_results))
        results, timing = run_coroutine(
            loadgen.run_burst(
                server.base_url, server.model_name, measured, key.concurrency, **common, desc=desc
            )
        )
        results = warm_results + results
        groups = [workload]
    else:
        middle = start
        results, timing = run_coroutine(
            conversations_run(server, config, key, workload, {**common, "desc": desc}, repeat)
        )
        groups = workload.conversations
    finished = sum(r.status == "ok" for r in results if not r.warmup)
    end = server.counters_after(middle, finished)
    sampler.stop()
    if gauges is not None:
        gauges.extend(sampler.rows)
    frame = loadgen.results_frame(results)
    frame.insert(0, "repeat", repeat)
    summary: dict[str, Any] = {
        "workload": config.workload,
        "mode": key.mode,
        "prefix_regime": key.regime,
        "concurrency": key.concurrency,
        # an open loop's rate (a closed loop's summary has none, as before open loops)
        **({"arrival_rate": config.arrival_rate} if config.arrival_rate is not None else {}),
        **loadgen.summarize_requests(frame, timing.wall_s),
        **loadgen.counter_summary(loadgen.counter_deltas(middle, end)),
        **loadgen.counter_summary(loadgen.counter_deltas(start, middle), "warmup_"),
        **_predicted(config, groups),
        "cache_reset": cache_reset,
        "repeat": repeat,
        # the machine's 1-minute load average before and after (our server and client count)
        "load_1m": [load_before, os.getloadavg()[0]],
    }
    if isinstance(workload, loadgen.ShareGPTWorkload):
        summary["skipped_turns"] = dict(workload.skipped_turns)
    summary["notes"] = _notes(summary, cache_reset)
    return frame, summary


# What a run's summary holds, by how repeats combine: fixed by the configuration (equal in
# every repeat), counted (summed), or measured per repeat (summarised across repeats by
# `serving_stats.cell_statistics` or, for the rest, the median with the values kept).
CONFIGURED = (
    "workload",
    "mode",
    "prefix_regime",
    "concurrency",
    "arrival_rate",
    "predicted_saving",
    "predicted_hit_rate",
    "skipped_turns",
)
COUNTED_PREFIXES = ("n_", "prefix_cache_", "prompt_tokens", "generation_tokens", "warmup_")
COUNTED = (
    "num_preemptions",
    "request_success",
    "output_tokens",
    "wall_s",
    # the server's own clocks: sums and counts over the measured requests of every repeat
    *RECORDED_CLOCK_COLUMNS,
)
PER_REPEAT_MEDIAN = ("tok_s", "warmup_ttft_s", "mean_ttft_incl_warmup_s", "p50_ttft_s")


def _counted(name: str) -> bool:
    return (name.startswith(COUNTED_PREFIXES) and name != "warmup_ttft_s") or name in COUNTED


def _same_in_every_repeat(summaries: Sequence[dict[str, Any]], name: str) -> Any:
    first = summaries[0].get(name)
    for summary in summaries[1:]:
        value = summary.get(name)
        both_nan = isinstance(value, float) and isinstance(first, float) and value != value
        if value != first and not (both_nan and first != first):
            raise ValueError(f"repeats of one cell differ in {name!r}: {first!r} and {value!r}")
    return first


def combine_repeats(summaries: Sequence[dict[str, Any]], frame: pd.DataFrame) -> dict[str, Any]:
    """One cell's summary from all of its repeats: the configuration (checked equal), counts
    and counter deltas summed (hit rates over the sums), and every measured statistic per
    repeat, then across repeats (`serving_stats.cell_statistics`: medians of repeats with
    two-level bootstrap intervals, per-turn columns included). Nothing is taken from one
    repeat alone."""
    from analysis.serving import stats as serving_stats

    if not summaries:
        raise ValueError("a cell needs at least one repeat")
    repeats = sorted(int(s["repeat"]) for s in summaries)
    if sorted(frame["repeat"].unique().tolist()) != repeats:
        raise ValueError(
            f"the requests' repeats {sorted(frame['repeat'].unique())} are not "
            f"the summaries' {repeats}"
        )
    cell: dict[str, Any] = {
        name: _same_in_every_repeat(summaries, name) for name in CONFIGURED if name in summaries[0]
    }
    numbers = [
        k for k, v in summaries[0].items() if isinstance(v, int | float) and not isinstance(v, bool)
    ]
    for name in filter(_counted, numbers):
        total = sum(float(s.get(name, 0.0) or 0.0) for s in summaries)
        cell[name] = int(total) if name.startswith("n_") else total
    for prefix in ("", "warmup_"):
        queries = cell.get(f"{prefix}prefix_cache_queries", 0.0)
        hits = cell.get(f"{prefix}prefix_cache_hits", 0.0)
        cell[f"{prefix}hit_rate"] = hits / queries if queries else math.nan
    walls = {int(s["repeat"]): float(s["wall_s"]) for s in summaries}
    cell.update(
        serving_stats.cell_statistics(
            frame,
            walls,
            concurrency=int(cell.get("concurrency", 1)),
            turn_columns="turn_index" in frame and cell.get("workload") == "sharegpt",
        )
    )
    if cell.get("arrival_rate") is not None:
        cell["burst"] = False  # an open loop sends on its schedule, not in rounds of clients
    by_repeat = sorted(summaries, key=lambda s: int(s["repeat"]))
    for name in (n for n in PER_REPEAT_MEDIAN if n in summaries[0]):
        values = [float(s[name]) for s in by_repeat]
        cell[f"{name}_repeats"] = values
        cell[name] = float(np.nanmedian(values)) if np.isfinite(values).any() else math.nan
    loads = [s.get("load_1m", [math.nan, math.nan]) for s in by_repeat]
    cell["load_1m_repeats"] = loads
    cell["load_1m_max"] = float(np.nanmax(loads)) if np.isfinite(loads).any() else math.nan
    cell["cache_reset"] = all(s.get("cache_reset", False) for s in summaries)
    cell["notes"] = _notes(cell, cell["cache_reset"])
    return cell
