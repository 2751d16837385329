"""The fleet's step loop: N replay engines in lockstep, requests routed as they arrive (on a
clock, `clocked` runs them instead, each at its own pace).

Each fleet step runs one vLLM step on every replica that has work, in replica order, with
`replay`'s own step (`run_step`) and decode fast path; a replica with only parked decodes does
nothing that step, as in `replay`. When no replica schedules anything, the clock jumps to the
first step at which one has work (as `replay` does), so a fleet of one runs exactly the steps
of `replay`. Requests that finished release the next turns of their conversations (closed
loop), which the router places one by one, each seeing the replicas as the previous one left
them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from analysis.engines.config import RunConfig
from analysis.engines.fleet.kv_index import KvEventIndex
from analysis.engines.fleet.routers import Arrival, make_router
from analysis.engines.recorder import Recorder
from analysis.engines.replay import (
    ReplayEngine,
    build_replay_engine,
    clock_facts,
    last_turn_indices,
    new_request,
    resolved_settings,
    run_step,
)
from analysis.engines.replay_fast_path import DecodeFastPath, PrefixHashes
from analysis.engines.workload import Arrivals, Workload
from analysis.models.resolved import ResolvedModel
from analysis.platform.manifest import gc_paused


@dataclass
class Replica:
    """One replay engine of the fleet, and what the router may read of it."""

    index: int
    engine: ReplayEngine
    fast: DecodeFastPath
    kv_index: KvEventIndex | None = None
    routed: int = 0
    scheduled_steps: int = 0

    @property
    def scheduler(self) -> Any:
        return self.engine.scheduler

    def load(self) -> int:
        running, waiting = self.scheduler.get_request_counts()
        return running + waiting

    def kv_usage(self) -> float:
        return float(self.scheduler.kv_cache_manager.usage)

    def cached_prefix_blocks(self, block_hashes: Any) -> int:
        if self.kv_index is None:
            raise RuntimeError("this router did not ask for KV events")
        return self.kv_index.leading_blocks(block_hashes)


@dataclass
class LoadBalance:
    """Running requests per replica over the run, weighted by steps: max over mean."""

    replicas: int
    weighted_ratio: float = 0.0
    steps: int = 0
    worst: float = 0.0
    running_steps: list[int] = field(default_factory=list)  # per replica: running x steps

    def __post_init__(self) -> None:
        self.running_steps = [0] * self.replicas

    def observe(self, running: list[int], steps: int) -> None:
        total = sum(running)
        if not total or steps <= 0:
            return
        ratio = max(running) * self.replicas / total
        self.weighted_ratio += ratio * steps
        self.steps += steps
        self.worst = max(self.worst, ratio)
        for k, count in enumerate(running):
            self.running_steps[k] += count * steps

    def facts(self) -> dict[str, Any]:
        mean = round(self.weighted_ratio / self.steps, 6) if self.steps else None
        return {
            "load_imbalance_mean": mean,
            "load_imbalance_max": round(self.worst, 6),
            "mean_running_per_replica": [
                round(value / self.steps, 6) if self.steps else 0.0 for value in self.running_steps
            ],
        }


def run_fleet(
    workload: Workload,
    config: RunConfig,
    recorder: Recorder,
    model: ResolvedModel,
    progress: Any = None,
) -> dict[str, Any]:
    """Replay the workload through `config.replicas` schedulers behind `config.router`."""
    router = make_router(config.router, config.replicas, config.num_blocks)
    replicas = [
        _replica(k, config, model, recorder, router.reads_kv_events) for k in range(config.replicas)
    ]
    first = replicas[0].engine
    prefix_hashes = PrefixHashes(first.hash_block_size, first.block_hasher)
    last_turns = last_turn_indices(workload)
    live: dict[str, Any] = {}
    ids = recorder.ids
    balance = LoadBalance(config.replicas)

    def route(index: int, step: int) -> Replica:
        request = new_request(workload, index, prefix_hashes, last_turns)
        arrival = Arrival(workload.specs[index].conversation_id, request.block_hashes)
        replica = replicas[router.choose(arrival, replicas)]
        replica.routed += 1
        ids[request.request_id] = index
        live[request.request_id] = request
        recorder.submitted(index, step)
        recorder.replica_of[index] = replica.index
        replica.scheduler.add_request(request)
        return replica

    def submit(indices: list[int], step: int) -> None:
        for index in indices:
            route(index, step)

    recorder.start_clock()
    started = time.perf_counter()
    cpu_started = time.process_time()
    timed: dict[str, Any] = {}
    with gc_paused():
        if config.clock is None:
            arrivals = Arrivals(workload, config.mode, config.concurrency)
            clock, skipped = _drive(
                replicas, arrivals, live, ids, recorder, submit, balance, progress
            )
        else:
            timed = _run_on_clock(
                workload, config, model, replicas, live, recorder, route, balance, progress
            )
            clock, skipped = timed.pop("steps"), sum(r.fast.skipped_steps for r in replicas)
    elapsed = time.perf_counter() - started
    return {
        **timed,
        "steps": clock,
        "fleet_skipped_steps": skipped,
        "loop_seconds": round(elapsed, 3),
        "loop_cpu_seconds": round(time.process_time() - cpu_started, 3),
        "replicas": config.replicas,
        "router": config.router,
        "fast_path": replicas[0].fast.enabled,
        "routed_per_replica": [r.routed for r in replicas],
        "scheduled_steps_per_replica": [r.scheduled_steps for r in replicas],
        "reused_block_hashes": prefix_hashes.reused_blocks,
        **balance.facts(),
        "resolved": resolved_settings(first.vllm_config, first.scheduler),
    }


def _run_on_clock(workload, config, model, replicas, live, recorder, route, balance, progress):
    """The fleet with each replica on its own clock (`clocked`), arrivals in seconds."""
    from analysis.engines.clock import check_applies, load_profile, run_identity
    from analysis.engines.fleet.clocked import drive_on_clock
    from analysis.engines.timed_arrivals import TimedArrivals

    profile = load_profile(config.clock)
    differences = check_applies(profile, run_identity(config, model), anyway=config.clock_anyway)

    def observe() -> None:
        balance.observe([len(replica.scheduler.running) for replica in replicas], 1)

    timed = drive_on_clock(
        replicas,
        TimedArrivals.for_config(workload, config),
        live,
        recorder,
        route,
        profile,
        observe,
        progress,
    )
    timed["clock"] = clock_facts(config, profile, differences, timed.pop("seconds"))
    return timed


def _replica(
    index: int, config: RunConfig, model: ResolvedModel, recorder: Recorder, kv_events: bool
) -> Replica:
    engine = build_replay_engine(config, model, kv_events=kv_events)
    recorder.fleet = True
    recorder.attach(engine.scheduler, index)
    fast = DecodeFastPath(engine.scheduler, engine.hash_block_size)
    fast.enabled = fast.enabled and config.fast_path
    kv_index = None
    if kv_events:
        kv_index = KvEventIndex()
        engine.scheduler.kv_event_publisher = kv_index
    return Replica(index, engine, fast, kv_index)


def _drive(replicas, arrivals, live, ids, recorder, submit, balance, progress) -> tuple[int, int]:
    """Lockstep steps until every request finished; returns (last step, steps jumped over)."""
    clock = 0
    skipped = 0
    submit(arrivals.initial(), clock)
    while live:
        step = clock + 1
        recorder.mark_step(step, recorder.now())
        finished: list[int] = []
        scheduled = False
        parked: list[Replica] = []  # replicas with only parked decodes this step
        for replica in replicas:
            scheduler = replica.scheduler
            if scheduler.get_request_counts() == (0, 0):
                scheduler.current_step = step  # idle: its clock follows the fleet's
                continue
            fast = replica.fast
            if fast.prepare(step) and fast.nothing_to_schedule():
                fast.restore()  # vLLM would change nothing shared
                scheduler.current_step = step
                parked.append(replica)
            else:
                finished += run_step(scheduler, fast, live, ids, recorder, step)
                replica.scheduled_steps += 1
                scheduled = True
            if replica.kv_index is not None:
                replica.kv_index.publish_pending(scheduler.kv_cache_manager)
        clock = step
        span = 1
        if not scheduled:
            # Nothing scheduled anywhere: jump to the first step a replica has work (as replay).
            wake = min(replica.fast.next_wake(step) for replica in parked)
            span = wake - step
            skipped += span
            clock = wake - 1
            for replica in replicas:
                replica.scheduler.current_step = clock
        balance.observe([len(replica.scheduler.running) for replica in replicas], span)
        if finished:
            if progress is not None:
                progress.update(len(finished))
            submit(arrivals.after_finished(finished), clock)
    return clock, skipped
