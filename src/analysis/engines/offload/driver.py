"""vLLM's native CPU offloading, replayed without a model: hits per tier, stores and loads.

The scheduler is `replay`'s (vLLM's own `Scheduler`) built with vLLM's `OffloadingConnector`,
so every decision is vLLM's: its scheduler half (`offloading/scheduler.py`) looks up the CPU
after the GPU's prefix hit, plans loads and write-through stores, and its `CPUOffloadingManager`
allocates and evicts CPU blocks (LRU or ARC). The worker half is vLLM's own
`OffloadingConnectorWorker` too, over a worker that moves no bytes (`transfers`). In steps, it
reports every transfer finished at its next poll: a load submitted in a step is reported in that
step's output, a store in the next step's (vLLM defers store submission by one step,
`prepare_store_kv`). That is the worker's timing when transfers are fast against a step, the
best case for offloading. On a clock (`RunConfig.clock`, a GPU's step-cost profile), each step
costs what the profile charges, and each transfer its bytes over the GPU's host link, so that a
request whose prefix comes back from the CPU waits for it.

Steps follow the GPU model runner's connector calls (`gpu_model_runner.execute_model`,
`kv_connector_model_runner_mixin._get_kv_connector_output`): `handle_preemptions`,
`bind_connector_metadata`, `start_load_kv`, (forward), `wait_for_save`, `get_finished`,
`build_connector_worker_meta`. The loop keeps stepping while the connector has transfers in
flight, as vLLM's engine does (`Scheduler.has_requests`).

The real CPU engine cannot run this: vLLM 0.32's CPU worker refuses the connector when it
registers its KV caches (`CPUOffloadingSpec.get_worker`, `vllm/v1/kv_offload/cpu/spec.py:200`:
"CPU Offloading is currently only supported on CUDA-alike and XPU GPUs").
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from analysis.engines.config import RunConfig
from analysis.engines.offload.transfers import PCIE5_X16_BYTES_PER_S, HostLink, worker_half
from analysis.engines.recorder import Recorder
from analysis.engines.replay import (
    ReplayEngine,
    build_replay_engine,
    charge_scheduled,
    last_turn_indices,
    new_request,
)
from analysis.engines.replay_fast_path import PrefixHashes
from analysis.engines.workload import Arrivals, Workload
from analysis.models.resolved import ResolvedModel
from analysis.platform.errors import ConfigError

EVICTION_POLICIES = ("lru", "arc")


@dataclass
class OffloadCounts:
    """What one offloading replay did, in tokens (hits) and blocks (transfers).

    Hit tokens are over first admissions, as vLLM exports them: `gpu_hit_tokens` from the GPU
    prefix cache, `cpu_hit_tokens` loaded from the CPU (the connector's hits).
    """

    cpu_blocks: int
    eviction_policy: str
    prompt_tokens: int = 0  # first admissions' queries (prompt tokens)
    gpu_hit_tokens: int = 0
    cpu_hit_tokens: int = 0
    computed_prompt_tokens: int = 0  # first admissions: neither tier had them
    recomputed_tokens: int = 0  # re-prefills after preemption that neither tier gave back
    preemptions: int = 0
    load_jobs: int = 0
    loaded_blocks: int = 0  # CPU -> GPU
    store_jobs: int = 0
    stored_blocks: int = 0  # GPU -> CPU
    evicted_blocks: int = 0  # dropped from the CPU to make room
    stored_never_loaded: int = 0  # stored blocks evicted (or left at the end) unread
    store_refusals: int = 0  # stores the CPU could not take (everything pinned)
    steps: int = 0

    @property
    def gpu_hit_rate(self) -> float:
        return self.gpu_hit_tokens / self.prompt_tokens if self.prompt_tokens else math.nan

    @property
    def cpu_hit_rate(self) -> float:
        return self.cpu_hit_tokens / self.prompt_tokens if self.prompt_tokens else math.nan

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"gpu_hit_rate": self.gpu_hit_rate, "cpu_hit_rate": self.cpu_hit_rate}


@dataclass
class _Ledger:
    """Counts the CPU manager's loads, stores and evictions per block (wraps its methods)."""

    counts: OffloadCounts
    unread: set[Any] = field(default_factory=set)  # stored blocks not loaded since

    def attach(self, manager: Any) -> None:
        load, store = manager.prepare_load, manager.prepare_store

        def prepare_load(keys: Any, req_context: Any) -> Any:
            self.counts.loaded_blocks += len(keys)
            self.unread.difference_update(keys)
            return load(keys, req_context)

        def prepare_store(keys: Any, req_context: Any) -> Any:
            output = store(keys, req_context)
            if output is None:
                self.counts.store_refusals += 1
                return output
            for key in output.evicted_keys:
                self.counts.stored_never_loaded += key in self.unread
                self.unread.discard(key)
            self.counts.evicted_blocks += len(output.evicted_keys)
            self.counts.stored_blocks += len(output.keys_to_store)
            self.unread.update(output.keys_to_store)
            return output

        manager.prepare_load, manager.prepare_store = prepare_load, prepare_store

    def close(self) -> None:
        self.counts.stored_never_loaded += len(self.unread)
        self.unread.clear()


def offload_kv_transfer_config(
    cpu_bytes: int, eviction_policy: str, prompt_only: bool = True
) -> Any:
    """The `kv_transfer_config` that `kv_offloading_size` makes (`VllmConfig.
    _post_init_kv_transfer_config`), with the CPU size in bytes rather than GiB.
    `prompt_only=False` also stores reply blocks (the connector's `offload_prompt_only`,
    True by default)."""
    from vllm.config import KVTransferConfig

    return KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "cpu_bytes_to_use": cpu_bytes,
            "eviction_policy": eviction_policy,
            "offload_prompt_only": prompt_only,
        },
    )


def cpu_block_bytes(config: RunConfig, model: ResolvedModel) -> int:
    """Bytes of one CPU block as vLLM sizes it: one block of every layer, page-aligned
    (`CPUOffloadingSpec.__init__`), for the layer shape `build_replay_engine` uses."""
    import torch
    from vllm.utils.math_utils import round_up
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    layers, kv_heads, head_size = (
        (model.num_layers, model.num_kv_heads, model.head_size) if model.shape_known else (2, 4, 64)
    )
    spec = FullAttentionSpec(
        block_size=config.block_size,
        num_kv_heads=kv_heads,
        head_size=head_size,
        dtype=getattr(torch, model.kv_dtype),
    )
    return round_up(spec.page_size_bytes * layers, mmap.PAGESIZE)


def build_offload_scheduler(
    config: RunConfig,
    model: ResolvedModel,
    cpu_blocks: int,
    eviction_policy: str = "lru",
    prompt_only: bool = True,
) -> ReplayEngine:
    """`replay`'s engine (`build_replay_engine`) with the OffloadingConnector's scheduler half
    and `cpu_blocks` CPU blocks: the same construction, plus the `kv_transfer_config`."""
    if eviction_policy not in EVICTION_POLICIES:
        raise ConfigError(
            f"eviction_policy={eviction_policy!r}: vLLM's CPU offloading has "
            f"{', '.join(EVICTION_POLICIES)}"
        )
    if cpu_blocks < 1:
        raise ConfigError(f"cpu_blocks={cpu_blocks}: give at least 1 CPU block")
    transfer = offload_kv_transfer_config(
        cpu_blocks * cpu_block_bytes(config, model), eviction_policy, prompt_only
    )
    return build_replay_engine(config, model, extra_kwargs={"kv_transfer_config": transfer})


def worker_step(worker: Any, scheduler_output: Any, forward: Callable[[], None]) -> Any:
    """The worker half's calls for one step, in the model runner's order, around the step's
    `forward` pass (on a clock, its cost); its report."""
    from vllm.v1.outputs import KVConnectorOutput

    metadata = scheduler_output.kv_connector_metadata
    worker.handle_preemptions(metadata)
    worker.bind_connector_metadata(metadata)
    worker.start_load_kv(None)
    forward()
    worker.wait_for_save()
    sending, recving = worker.get_finished(scheduler_output.finished_req_ids)
    report = worker.build_connector_worker_meta()
    worker.clear_connector_metadata()
    return KVConnectorOutput(
        finished_sending=sending or None,
        finished_recving=recving or None,
        kv_connector_worker_meta=report,
    )


@dataclass
class OffloadRun:
    """One offloading replay: its counts and vLLM's admissions, as the project's `Recorder`
    saw them (one row per admission, in the order vLLM admitted them; `kind` is "first" or
    "readmission", `tokens_hit` the GPU prefix hit vLLM recorded, without the CPU's). On a
    clock, also each request's times (`requests`), each step's (`steps`) and the seconds the
    host link carried loads and stores (`link_seconds`)."""

    counts: OffloadCounts
    admissions: pd.DataFrame
    recorder: Recorder
    requests: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    link_seconds: dict[str, float] | None = None

    @property
    def first_prefill_gpu_hit_tokens(self) -> int:
        """GPU hit tokens over first admissions, summed from the recorder's rows."""
        first = self.admissions[self.admissions["kind"] == "first"]
        return int(first["tokens_hit"].sum())


def run_offload(
    workload: Workload,
    config: RunConfig,
    model: ResolvedModel,
    cpu_blocks: int,
    eviction_policy: str = "lru",
    prompt_only: bool = True,
    host_link_bytes_per_s: float = PCIE5_X16_BYTES_PER_S,
) -> OffloadRun:
    """Replay `workload` through vLLM's scheduler with `cpu_blocks` blocks of CPU offloading.

    `cpu_blocks=0` runs the same loop on `replay`'s scheduler without the connector (no CPU
    tier at all), the baseline the CPU is compared with. With a clock (`config.clock`, a
    step-cost profile), arrivals come in seconds, each step costs what the profile charges
    for it, and each transfer its bytes at `host_link_bytes_per_s`.
    """
    if cpu_blocks < 0:
        raise ConfigError(f"cpu_blocks={cpu_blocks}: give 0 (no offloading) or more CPU blocks")
    if config.timed and config.clock is None:
        raise ConfigError(
            "CPU offloading in seconds needs a clock: give a step-cost profile (clock=...), "
            "or drop the think time and arrivals in seconds (mode batch or closed-loop)"
        )
    counts = OffloadCounts(cpu_blocks=cpu_blocks, eviction_policy=eviction_policy)
    if cpu_blocks:
        engine = build_offload_scheduler(config, model, cpu_blocks, eviction_policy, prompt_only)
    else:
        engine = build_replay_engine(config, model)
    scheduler = engine.scheduler
    prefix_hashes = PrefixHashes(engine.hash_block_size, engine.block_hasher)
    recorder = Recorder(len(workload.specs), config.block_size)
    recorder.attach(scheduler)
    clocked = _Clocked.for_run(workload, config, model, scheduler) if config.clock else None
    ledger: _Ledger | None = None
    worker = None
    link: HostLink | None = None
    if cpu_blocks:
        manager = scheduler.connector.scheduler.manager
        if manager._num_chunks != cpu_blocks:
            raise RuntimeError(f"vLLM made {manager._num_chunks} CPU blocks, not {cpu_blocks}")
        ledger = _Ledger(counts)
        ledger.attach(manager)
        if clocked is not None:
            link = HostLink(
                host_link_bytes_per_s,
                cpu_block_bytes(config, model),
                clocked.clock.now,
                clocked.clock.wait_until,
            )
        worker = worker_half(engine.vllm_config, engine.kv_cache_config, link)
    last_turns = last_turn_indices(workload)
    live: dict[str, Any] = {}

    def submit(indices: list[int]) -> None:
        step = scheduler.current_step
        for index in indices:
            request = new_request(workload, index, prefix_hashes, last_turns)
            recorder.ids[request.request_id] = index
            live[request.request_id] = (index, request)
            recorder.submitted(index, step)
            scheduler.add_request(request)

    recorder.start_clock()
    limit = _step_limit(workload)

    def step_once(forward: Callable[[], None]) -> list[int]:
        if counts.steps > limit:
            raise RuntimeError(
                f"offloading replay ran {counts.steps} steps without finishing: a transfer "
                "that is never reported finished keeps its request waiting"
            )
        return _step(scheduler, worker, live, counts, recorder, forward)

    if clocked is None:
        arrivals = Arrivals(workload, config.mode, config.concurrency)
        submit(arrivals.initial())
        while live or scheduler.has_requests():
            recorder.mark_step(scheduler.current_step + 1, recorder.now())
            finished = step_once(_no_cost)
            if finished:
                submit(arrivals.after_finished(finished))
    else:
        clocked.drive(scheduler, live, recorder, submit, step_once)
    if ledger is not None:
        ledger.close()
    counts.computed_prompt_tokens = (
        counts.prompt_tokens - counts.gpu_hit_tokens - counts.cpu_hit_tokens
    )
    recorder.check_against_engine_stats()
    admissions = recorder.admissions_frame()
    admissions.insert(1, "kind", np.where(admissions["readmission"], "readmission", "first"))
    run = OffloadRun(counts=counts, admissions=admissions, recorder=recorder)
    if clocked is not None:
        run.requests = timed_requests(workload, recorder)
        run.steps = clocked.steps.frame()
        run.link_seconds = dict(link.seconds) if link else {"load": 0.0, "store": 0.0}
    return run


def _no_cost() -> None:
    """A step's forward pass in steps, not seconds: it costs nothing."""


@dataclass
class _Clocked:
    """What an offloading run on a clock keeps: the clock, the profile, its step table and the
    arrivals in seconds."""

    clock: Any
    profile: Any
    steps: Any
    arrivals: Any

    @classmethod
    def for_run(cls, workload: Workload, config: RunConfig, model: ResolvedModel, scheduler: Any):
        from analysis.engines.clock import VirtualClock, check_applies, load_profile, run_identity
        from analysis.engines.steps import StepLog
        from analysis.engines.timed_arrivals import TimedArrivals

        profile = load_profile(config.clock)
        check_applies(profile, run_identity(config, model), anyway=config.clock_anyway)
        steps = StepLog()
        steps.attach(scheduler)
        return cls(VirtualClock(), profile, steps, TimedArrivals.for_config(workload, config))

    def drive(self, scheduler, live, recorder, submit, step_once) -> None:
        """`replay`'s step loop on a clock (`analysis.engines.replay._drive_on_clock`, without
        its decode fast path): submit what has arrived (each charged `admit_s`), idle until the
        next arrival when nothing runs, charge each step its modelled cost during its forward
        pass (so that loads it starts end behind it and stores start after it), then `loop_s`.
        With no request in the engine, the clock idles to the next arrival, as in `replay`
        (stores still in flight then are reported at the next step)."""
        clock, profile, arrivals = self.clock, self.profile, self.arrivals
        recorder.clock = clock.now
        while live or arrivals.pending():
            due = arrivals.due(clock.now())
            if due:
                recorder.arrival_seconds[due] = arrivals.arrival_s[due]
                submit(due)
                clock.advance(profile.admit_s * len(due))
            if not live:
                clock.wait_until(arrivals.next_time())
                continue
            recorder.mark_step(scheduler.current_step + 1, clock.now())
            finished = step_once(partial(charge_scheduled, self.steps, profile, clock, len(due)))
            if finished:
                arrivals.after_finished(finished, clock.now())
            clock.advance(profile.loop_s)


def timed_requests(workload: Workload, recorder: Recorder) -> pd.DataFrame:
    """Each request's times on the clock: arrival, first token, finish; TTFT and end to end."""
    finished = recorder.finish_step >= 0
    arrival = recorder.arrival_times()
    return pd.DataFrame(
        {
            "request_index": np.arange(len(workload.specs)),
            "status": np.where(finished, "finished", "unfinished"),
            "prompt_tokens": [spec.prompt_tokens for spec in workload.specs],
            "output_tokens": recorder.output_tokens,
            "arrival_s": arrival,
            "first_token_s": recorder.first_token_seconds,
            "finish_s": recorder.finish_seconds,
            "ttft_s": recorder.first_token_seconds - arrival,
            "e2e_s": recorder.finish_seconds - arrival,
        }
    )


def _step_limit(workload: Workload) -> int:
    """More steps than any run can need (one token per step at worst, many times over)."""
    tokens = sum(spec.prompt_tokens + spec.outputs.shape[0] for spec in workload.specs)
    return 10 * tokens + 1000


def _step(
    scheduler: Any,
    worker: Any,
    live: dict[str, Any],
    counts: OffloadCounts,
    recorder: Recorder,
    forward: Callable[[], None],
) -> list[int]:
    """One engine step: schedule, the forward pass (`forward`) with the worker's calls around
    it (none without a connector), the workload's next tokens, update; returns the workload
    indices that finished."""
    from vllm.v1.outputs import ModelRunnerOutput

    scheduler_output = scheduler.schedule()
    counts.steps += 1
    metadata = scheduler_output.kv_connector_metadata
    if metadata is not None:
        counts.load_jobs += len(metadata.load_jobs)
        counts.store_jobs += len(metadata.store_jobs)
    req_ids = list(scheduler_output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for rid in req_ids:
        request = live[rid][1]
        done = request.is_prefill_chunk
        sampled.append([] if done else [request._replay_outputs[len(request._output_token_ids)]])
    if worker is None:
        forward()
        connector_output = None
    else:
        connector_output = worker_step(worker, scheduler_output, forward)
    output = ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=sampled,
        kv_connector_output=connector_output,
    )
    finished: list[int] = []
    step = scheduler.current_step
    for outputs in scheduler.update_from_output(scheduler_output, output).values():
        _add_stats(counts, outputs.scheduler_stats)
        for item in outputs.outputs:
            index = live[item.request_id][0]
            if item.new_token_ids:
                recorder.first_token(index, step)
            if item.finish_reason is not None:
                index, request = live.pop(item.request_id)
                counts.preemptions += request.num_preemptions
                recorder.finished(
                    index, step, str(item.finish_reason).lower(), request.num_output_tokens
                )
                finished.append(index)
    return finished


def _add_stats(counts: OffloadCounts, stats: Any) -> None:
    """Sum one step's prefix cache stats: the GPU's and the connector's (CPU)."""
    if stats is None:
        return
    gpu = stats.prefix_cache_stats
    counts.prompt_tokens += gpu.queries
    counts.gpu_hit_tokens += gpu.hits
    recomputed = gpu.preempted_queries - gpu.preempted_hits
    cpu = stats.connector_prefix_cache_stats
    if cpu is not None:
        counts.cpu_hit_tokens += cpu.hits
        recomputed -= cpu.preempted_hits
    counts.recomputed_tokens += recomputed
