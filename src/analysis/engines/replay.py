"""`replay`: vLLM's V1 `Scheduler` and `KVCacheManager`, driven step by step without a model.

Everything that decides a cache hit, an eviction or a preemption is vLLM's own code: the
scheduler is built from the same `EngineArgs` as the real engine, requests are vLLM
`Request`s with vLLM's block hasher, and each step is `schedule()` then
`update_from_output()` with a `ModelRunnerOutput` that carries, for every request that
finished its prefill, the next token of its workload outputs (its recorded reply by default).

On a clock (`RunConfig.clock`, a step-cost profile from `python -m analysis calibrate`), each
step is charged the profile's cost of what vLLM scheduled in it, requests arrive in seconds
(`timed_arrivals`), and the run predicts TTFT, TPOT and throughput. The decode fast path runs
there too: its parked decodes are charged with their step and its skipped steps one by one,
so the step table is the same, to the bit, as a run that calls `schedule()` every step.

Two of its savings live in `replay_fast_path` (the decode fast path, hashes a previous turn
computed); two more change no result either: the model-runner payload of `schedule()`
(`_make_cached_request_data`) is not built, as no model reads it, and Python's cyclic GC is
paused during the loop (vLLM frees its objects by reference counting).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from analysis.engines.config import RunConfig
from analysis.engines.recorder import Recorder
from analysis.engines.replay_fast_path import DecodeFastPath, PrefixHashes
from analysis.engines.vllm_args import engine_kwargs
from analysis.engines.workload import Arrivals, Workload
from analysis.models.resolved import ResolvedModel
from analysis.platform.manifest import gc_paused


@dataclass
class ReplayEngine:
    """A model-free vLLM scheduler, its block hasher and the resolved vLLM config."""

    scheduler: Any
    block_hasher: Callable[[Any], list[Any]]
    vllm_config: Any
    hash_block_size: int
    kv_cache_config: Any = None  # the KVCacheConfig the scheduler was built with


def build_replay_engine(
    config: RunConfig,
    model: ResolvedModel,
    *,
    kv_events: bool = False,
    extra_kwargs: dict[str, Any] | None = None,
) -> ReplayEngine:
    """vLLM's scheduler for `config`, without a model; `kv_events` turns on vLLM's KV cache
    events (`BlockStored` / `BlockRemoved`, what a precise router reads).

    `extra_kwargs` are merged last into the `EngineArgs` keyword arguments: settings a
    `RunConfig` does not describe but a driver needs on the same scheduler, such as the
    `kv_transfer_config` of CPU offloading (`engines.offload`), so that one construction
    serves every model-free engine. Nothing is added when it is None."""
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import (
        get_request_block_hasher,
        init_none_hash,
        resolve_kv_cache_block_sizes,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    kwargs = engine_kwargs(config, model)
    if kv_events:
        from vllm.config import KVEventsConfig

        kwargs["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    if extra_kwargs:
        kwargs.update(extra_kwargs)
    vllm_config = EngineArgs(**kwargs).create_engine_config(usage_context=UsageContext.LLM_CLASS)
    # A hub model's shape is unknown without its config; the layer shape changes no count.
    layers, kv_heads, head_size = (
        (model.num_layers, model.num_kv_heads, model.head_size) if model.shape_known else (2, 4, 64)
    )
    layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    spec = FullAttentionSpec(
        block_size=vllm_config.cache_config.block_size,
        num_kv_heads=kv_heads,
        head_size=head_size,
        dtype=getattr(torch, model.kv_dtype),
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layer_names, spec)],
    )
    vllm_config.cache_config.num_gpu_blocks = config.num_blocks
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    if hasattr(kv_cache_config, "hash_block_size"):
        kv_cache_config.hash_block_size = hash_block_size
    scheduler_cls = vllm_config.scheduler_config.get_scheduler_cls()
    scheduler = scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        hash_block_size=hash_block_size,
        log_stats=True,
    )
    if scheduler.connector is None:  # a KV connector's scheduler half reads the payload
        skip_model_runner_payload(scheduler)
    hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return ReplayEngine(
        scheduler=scheduler,
        block_hasher=get_request_block_hasher(hash_block_size, hash_fn),
        vllm_config=vllm_config,
        hash_block_size=hash_block_size,
        kv_cache_config=kv_cache_config,
    )


def skip_model_runner_payload(scheduler: Any) -> None:
    """No model runner reads `scheduled_cached_reqs`: skip building it (a copy of every
    token of each resumed request). `_make_cached_request_data` only builds that payload.
    Not with a KV connector: its scheduler half (the OffloadingConnector's) learns the blocks
    allocated after a request's first step (the next prefill chunk, decode) from it."""
    from vllm.v1.core.sched.output import CachedRequestData

    def empty_cached_request_data(*args: Any, **kwargs: Any) -> Any:
        return CachedRequestData(
            req_ids=[],
            resumed_req_ids=set(),
            new_token_ids=[],
            all_token_ids={},
            new_block_ids=[],
            num_computed_tokens=[],
            num_output_tokens=[],
        )

    scheduler._make_cached_request_data = empty_cached_request_data


def run_replay(
    workload: Workload,
    config: RunConfig,
    recorder: Recorder,
    model: ResolvedModel,
    progress: Any = None,
) -> dict[str, Any]:
    """Replay the workload through vLLM's scheduler; fills `recorder`; returns engine facts."""
    engine = build_replay_engine(config, model)
    scheduler = engine.scheduler
    recorder.attach(scheduler)
    fast = DecodeFastPath(scheduler, engine.hash_block_size)
    fast.enabled = fast.enabled and config.fast_path
    live: dict[str, Any] = {}
    ids = recorder.ids

    prefix_hashes = PrefixHashes(engine.hash_block_size, engine.block_hasher)
    last_turns = last_turn_indices(workload)

    def submit(indices: list[int]) -> None:
        step = scheduler.current_step
        for index in indices:
            request = new_request(workload, index, prefix_hashes, last_turns)
            ids[request.request_id] = index
            live[request.request_id] = request
            recorder.submitted(index, step)
            scheduler.add_request(request)

    recorder.start_clock()
    started = time.perf_counter()
    cpu_started = time.process_time()
    timed: dict[str, Any] = {}
    with gc_paused():
        if config.clock is None:
            arrivals = Arrivals(workload, config.mode, config.concurrency)
            steps_run = _drive(scheduler, fast, arrivals, live, ids, recorder, submit, progress)
        else:
            timed = _run_on_clock(
                workload, config, model, engine, fast, live, recorder, submit, progress
            )
            steps_run = timed["scheduler_calls"]
    elapsed = time.perf_counter() - started
    return {
        **timed,
        "steps": scheduler.current_step,
        "scheduler_calls": steps_run,
        "loop_seconds": round(elapsed, 3),
        "loop_cpu_seconds": round(time.process_time() - cpu_started, 3),
        "fast_path": fast.enabled,
        "fast_path_parked_request_steps": fast.parked_request_steps,
        "fast_path_handled_events": fast.handled_events,
        "fast_path_skipped_steps": fast.skipped_steps,
        "fast_path_plain_steps": fast.plain_steps,
        "reused_block_hashes": prefix_hashes.reused_blocks,
        "resolved": resolved_settings(engine.vllm_config, scheduler),
    }


def _run_on_clock(workload, config, model, engine, fast, live, recorder, submit, progress):
    """Replay with every step charged its cost by the profile, arrivals in seconds."""
    from analysis.engines.clock import VirtualClock, check_applies, load_profile, run_identity
    from analysis.engines.steps import StepLog
    from analysis.engines.timed_arrivals import TimedArrivals

    profile = load_profile(config.clock)
    differences = check_applies(profile, run_identity(config, model), anyway=config.clock_anyway)
    clock = VirtualClock()
    recorder.clock = clock.now
    steps = StepLog()
    steps.attach(engine.scheduler)
    arrivals = TimedArrivals.for_config(workload, config)
    calls = _drive_on_clock(
        engine.scheduler, fast, arrivals, live, recorder, submit, progress, clock, profile, steps
    )
    return {
        "scheduler_calls": calls,
        "clock": clock_facts(config, profile, differences, clock.now()),
        "steps_table": steps.frame(),
    }


def clock_facts(config, profile, differences: list[str], seconds: float) -> dict[str, Any]:
    """What a timed run's manifest says of its clock: the profile, what it predicts for, how
    it differs from the run (`clock_anyway`), and the seconds the run took on it."""
    return {
        "profile": str(config.clock),
        "predicts_for": {k: profile.identity.get(k) for k in ("machine", "dtype", "model")},
        "identity_differences": differences,
        "seconds": round(seconds, 6),
    }


def _drive_on_clock(
    scheduler, fast, arrivals, live, recorder, submit, progress, clock, profile, steps
) -> int:
    """The step loop of `_drive`, in seconds: submit what has arrived (each charged
    `admit_s`), idle until the next arrival when nothing runs, charge each step its modelled
    cost before its tokens come out, then the driver's `loop_s`. The decode fast path's
    parked decodes are charged with the step they belong to, and its skipped steps each as
    `schedule()` would have logged it (the same step table, to the bit, as without it)."""

    def admit() -> int:
        due = arrivals.due(clock.now())
        if due:
            recorder.arrival_seconds[due] = arrivals.arrival_s[due]
            submit(due)
            clock.advance(profile.admit_s * len(due))
        return len(due)

    def charge(step: int, admitted: int) -> Callable[[Any], None]:
        def on_scheduled(_: Any) -> None:
            charge_step(steps, fast, step, profile, clock, admitted)

        return on_scheduled

    calls = 0
    while live or arrivals.pending():
        admitted = admit()
        if not live:
            clock.wait_until(arrivals.next_time())
            continue
        step = scheduler.current_step + 1
        recorder.mark_step(step, clock.now())
        if fast.prepare(step) and fast.nothing_to_schedule():
            fast.restore()
            arrival = arrivals.next_time()
            skip_on_clock(
                scheduler,
                fast,
                step,
                clock,
                profile,
                steps,
                mark=recorder.mark_step,
                stop=lambda start, arrival=arrival: arrival is not None and arrival <= start,
            )
            continue
        finished = run_step(
            scheduler, fast, live, recorder.ids, recorder, step, charge(step, admitted)
        )
        calls += 1
        if finished:
            if progress is not None:
                progress.update(len(finished))
            arrivals.after_finished(finished, clock.now())
        clock.advance(profile.loop_s)
    return calls


def charge_step(steps, fast, step: int, profile, clock, admitted: int) -> None:
    """Charge the step just scheduled: the fast path's parked decodes added to what vLLM
    scheduled, then its modelled cost (`charge_scheduled`)."""
    steps.add_decodes(*fast.hidden_decodes(step))
    charge_scheduled(steps, profile, clock, admitted)


def charge_scheduled(steps, profile, clock, admitted: int) -> None:
    """Charge the step just logged its modelled cost on the clock (`admitted`: requests handed
    over before it)."""
    start = clock.now()
    cost = profile.step_seconds(steps.last())
    steps.timed(start, cost, admitted, profile.admit_s * admitted, profile.loop_s)
    clock.advance(cost)


def skip_on_clock(scheduler, fast, step, clock, profile, steps, mark, stop) -> None:
    """Steps with only parked decodes, from `step` to the next wake, without `schedule()`:
    each charged what it would have cost, and the run handed back to the step loop at the
    first step whose start `stop(start)` refuses (a request has arrived by then, say; the loop
    then admits it, as it would have). `mark(step, start)` marks each step after the first."""
    wake = fast.next_wake(step)
    finished = scheduler.finished_req_ids  # reported, then cleared, by `schedule()`
    scheduler.finished_req_ids = set()
    current = step
    while True:
        start = clock.now()
        if current > step:
            mark(current, start)
        steps.decodes_only(current, *fast.hidden_decodes(current), finished)
        cost = profile.step_seconds(steps.last())
        steps.timed(start, cost, 0, 0.0, profile.loop_s)
        clock.advance(cost)
        clock.advance(profile.loop_s)
        current += 1
        finished = ()
        if current == wake or stop(clock.now()):
            break
    fast.skipped_steps += current - step
    scheduler.current_step = current - 1


def last_turn_indices(workload: Workload) -> set[int]:
    """The requests after which no turn of their conversation follows (hashes not kept)."""
    return {turns[-1] for turns in workload.conversations if turns}


def new_request(
    workload: Workload, index: int, prefix_hashes: PrefixHashes, last_turns: set[int]
) -> Any:
    """The vLLM `Request` of workload request `index`, with its block hashes and the tokens it
    will be given (`_replay_outputs`)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    spec = workload.specs[index]
    outputs = workload.output_list(index)
    request = Request(
        request_id=spec.request_id,
        prompt_token_ids=workload.prompt_list(index),
        sampling_params=SamplingParams(max_tokens=len(outputs), ignore_eos=True),
        pooling_params=None,
        block_hasher=None,
    )
    prefix_hashes.attach(request, spec.conversation_id)
    if index in last_turns:
        prefix_hashes.forget(spec.conversation_id)
    else:
        prefix_hashes.remember(spec.conversation_id, request)
    request._replay_outputs = outputs
    request._park_wake = 0
    return request


def _drive(scheduler, fast, arrivals, live, ids, recorder, submit, progress) -> int:
    """The step loop: schedule, sample the workload's next tokens, update, submit arrivals."""
    submit(arrivals.initial())
    steps_run = 0
    while live:
        step = scheduler.current_step + 1
        recorder.mark_step(step, recorder.now())
        fast_step = fast.prepare(step)
        if fast_step and fast.nothing_to_schedule():
            # Only parked decodes until the next wake: vLLM would change nothing shared.
            fast.restore()
            wake = fast.next_wake(step)
            fast.skipped_steps += wake - step
            scheduler.current_step = wake - 1
            continue
        finished = run_step(scheduler, fast, live, ids, recorder, step)
        steps_run += 1
        if finished:
            if progress is not None:
                progress.update(len(finished))
            submit(arrivals.after_finished(finished))
    return steps_run


def run_step(scheduler, fast, live, ids, recorder, step: int, on_scheduled=None) -> list[int]:
    """One vLLM step: `schedule()`, the workload's next token for every request that finished
    its prefill, `update_from_output()`; returns the workload indices that finished.
    `on_scheduled(scheduler_output)` runs between the two (a clock charges the step there)."""
    from vllm.v1.outputs import ModelRunnerOutput

    scheduler_output = scheduler.schedule()
    if fast is not None:
        fast.restore()
    if on_scheduled is not None:
        on_scheduled(scheduler_output)
    req_ids = list(scheduler_output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for rid in req_ids:
        request = live[rid]
        if request.is_prefill_chunk:
            sampled.append([])
        else:
            sampled.append([request._replay_outputs[len(request._output_token_ids)]])
    model_output = ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )
    engine_outputs = scheduler.update_from_output(scheduler_output, model_output)
    finished: list[int] = []
    for outputs in engine_outputs.values():
        for output in outputs.outputs:
            index = ids[output.request_id]
            if output.new_token_ids:
                recorder.first_token(index, step)
            if output.finish_reason is not None:
                request = live.pop(output.request_id)
                recorder.finished(
                    index, step, _reason(output.finish_reason), request.num_output_tokens
                )
                finished.append(index)
    return finished


def _reason(reason: Any) -> str:
    return str(getattr(reason, "name", reason)).lower()


def resolved_settings(vllm_config: Any, scheduler: Any) -> dict[str, Any]:
    """The scheduler settings vLLM actually used (defaults resolved), for the manifest."""
    sched = vllm_config.scheduler_config
    cache = vllm_config.cache_config
    return {
        "scheduler_class": type(scheduler).__name__,
        "block_size": scheduler.block_size,
        "hash_block_size": scheduler.hash_block_size,
        "num_blocks": scheduler.kv_cache_manager.block_pool.num_gpu_blocks,
        "max_model_len": vllm_config.model_config.max_model_len,
        "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "enable_chunked_prefill": sched.enable_chunked_prefill,
        "long_prefill_token_threshold": sched.long_prefill_token_threshold,
        "scheduler_reserve_full_isl": getattr(sched, "scheduler_reserve_full_isl", None),
        "async_scheduling": sched.async_scheduling,
        "policy": str(sched.policy),
        "prefix_caching_hash_algo": cache.prefix_caching_hash_algo,
        "watermark": getattr(sched, "watermark", None),
    }
