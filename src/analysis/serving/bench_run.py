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
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.serving import loadgen
from analysis.serving.bench_config import RunKey, ServingBenchConfig
from analysis.serving.server import VllmServer
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


def synthetic_specs(config: ServingBenchConfig, key: RunKey) -> list[loadgen.RequestSpec]:
    return loadgen.synthetic_prefix_workload(
        int(key.regime),
        config.requests,
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
    return "; ".join(notes)


def sharegpt_specs(config: ServingBenchConfig) -> loadgen.ShareGPTWorkload:
    return loadgen.sharegpt_workload(
        Path(config.trace_path) if config.trace_path else None,
        conversations=config.requests,
        max_turns=config.max_turns,
        output_tokens=config.output_tokens,
        max_model_len=config.max_model_len,
    )


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
            loadgen.run_closed_loop(
                server.base_url,
                server.model_name,
                workload.conversations,
                key.concurrency,
                **common,
                desc=desc,
            )
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
        **loadgen.summarize_requests(frame, timing.wall_s),
        **loadgen.counter_summary(loadgen.counter_deltas(middle, end)),
        **loadgen.counter_summary(loadgen.counter_deltas(start, middle), "warmup_"),
        **_predicted(config, groups),
        "cache_reset": cache_reset,
        "repeat": repeat,
    }
    if isinstance(workload, loadgen.ShareGPTWorkload):
        ok = frame[frame["status"] == "ok"]
        summary["mean_ttft_first_turn_s"] = float(ok.loc[ok.turn_index == 0, "ttft_s"].mean())
        summary["mean_ttft_later_turns_s"] = float(ok.loc[ok.turn_index > 0, "ttft_s"].mean())
        summary["skipped_turns"] = dict(workload.skipped_turns)
    summary["notes"] = _notes(summary, cache_reset)
    return frame, summary


def combine_repeats(summaries: Sequence[dict[str, Any]], frame: pd.DataFrame) -> dict[str, Any]:
    """One cell's summary from its repeats: counts and counter deltas summed, hit rate over
    the sum, latencies pooled with medians and bootstrap 95 % intervals (serving_stats)."""
    from analysis.serving import stats as serving_stats

    first = dict(summaries[0])
    summed = [
        k
        for k, v in first.items()
        if k.startswith(("n_", "prefix_cache_", "prompt_tokens", "generation_tokens"))
        or k in ("num_preemptions", "request_success", "output_tokens", "wall_s")
        if isinstance(v, int | float) and not isinstance(v, bool)
    ]
    for name in summed:
        first[name] = float(sum(s.get(name, 0.0) or 0.0 for s in summaries))
        if name.startswith("n_"):
            first[name] = int(first[name])
    for prefix in ("", "warmup_"):
        queries = first.get(f"{prefix}prefix_cache_queries", 0.0)
        hits = first.get(f"{prefix}prefix_cache_hits", 0.0)
        first[f"{prefix}hit_rate"] = hits / queries if queries else math.nan
    walls = {int(s["repeat"]): float(s["wall_s"]) for s in summaries}
    first.update(serving_stats.cell_statistics(frame, walls))
    first["tok_s"] = float(pd.Series([s["tok_s"] for s in summaries]).median())
    first["cache_reset"] = all(s.get("cache_reset", False) for s in summaries)
    first["repeat_req_s"] = [float(s["req_s"]) for s in summaries]
    first.pop("repeat", None)
    first["notes"] = _notes(first, first["cache_reset"])
    return first
