"""`run(trace, config) -> RunResult`: one interface over both engines.

The trace is a DataFrame with the columns of `analysis.data.traces` (or a path / trace name). The
engine fills a `Recorder`; this module turns what it recorded into the result tables, the
counters and the manifest, and checks vLLM's own statistics against the per-admission rows.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.engines.blockstats import BlockStats
from analysis.engines.config import ConfigError, RunConfig, config_digest, validate
from analysis.engines.recorder import Recorder
from analysis.engines.result import RunResult
from analysis.engines.vllm_args import config_model
from analysis.engines.workload import Workload, build_workload
from analysis.models.resolved import ResolvedModel
from analysis.platform.manifest import file_sha256


def run(
    trace: pd.DataFrame | str | Path | None,
    config: RunConfig,
    *,
    outputs: Mapping[str, Sequence[int]] | None = None,
    progress: bool | None = None,
) -> RunResult:
    """Run `config` over `trace` (None: the trace named by config.trace) with its engine.

    `outputs` gives explicit output tokens per request id (for example the tokens another
    engine generated), instead of the recorded or free ones.
    """
    validate(config)
    started = time.perf_counter()
    frame, trace_info = load_trace_frame(trace, config)
    extra = ""
    if outputs is not None:
        from analysis.engines.config import ExplicitOutputs

        extra = ExplicitOutputs({k: tuple(v) for k, v in outputs.items()}).digest()
        trace_info["explicit_outputs_sha256"] = extra
    config_id = f"{config.readable_prefix()}-{config_digest(config, trace_info['sha256'], extra)}"
    workload = build_workload(frame, config, outputs)
    model = config_model(config)  # resolved once, handed to the engine and the manifest
    check_runnable(workload, trace_info["source"], config, model)
    recorder = Recorder(num_requests=len(workload.specs), block_size=config.block_size)
    bar = _progress_bar(workload, config, progress)
    prepared = time.perf_counter()
    try:
        if config.engine == "replay":
            from analysis.engines.replay import run_replay

            engine_facts = run_replay(workload, config, recorder, model, bar)
        elif config.engine == "fleet":
            from analysis.engines.fleet.driver import run_fleet

            engine_facts = run_fleet(workload, config, recorder, model, bar)
        else:
            from analysis.engines.vllm_engine import run_vllm

            engine_facts = run_vllm(workload, config, recorder, model, bar)
    finally:
        if bar is not None:
            bar.close()
    finished = time.perf_counter()
    engine_sums = recorder.check_against_engine_stats()
    result = assemble(workload, config, config_id, recorder, engine_facts)
    from analysis.metrics import hitrates

    result.summary = hitrates.summarize(result)
    result.manifest = build_manifest(
        config,
        model,
        config_id,
        trace_info,
        engine_facts,
        timings={
            "prepare_s": round(prepared - started, 3),
            "engine_s": round(finished - prepared, 3),
            "total_s": round(time.perf_counter() - started, 3),
        },
        engine_sums=engine_sums,
    )
    return result


def check_runnable(
    workload: Workload, source: str, config: RunConfig, model: ResolvedModel
) -> None:
    """Refuse a trace with nothing to run (its rates would be NaN) or with impossible token ids."""
    from analysis.platform.errors import TraceError

    runnable = [s for s in workload.specs if not s.skipped]
    if not runnable:
        raise TraceError(
            f"trace {source}: nothing to run: {len(workload.specs)} requests, "
            f"{len(workload.skipped)} with prompts of max_model_len={config.max_model_len} "
            "tokens or more; give a non-empty trace or raise --max-model-len"
        )
    pieces = [p for s in runnable for p in (s.prompt, s.outputs) if len(p)]
    low = min(int(p.min()) for p in pieces)
    high = max(int(p.max()) for p in pieces)
    if low < 0:
        raise TraceError(f"trace {source}: token id {low} is negative; rebuild the trace")
    vocab = _vocab_size(model)
    if vocab is not None and high >= vocab:
        raise TraceError(
            f"trace {source}: token id {high} is outside the model's vocabulary ({vocab} ids); "
            "build the trace with the model's tokenizer"
        )


def _vocab_size(model: ResolvedModel) -> int | None:
    """The vocabulary size of the run's model when it is a local folder (None: unknown)."""
    import json

    path = Path(model.path) / "config.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("vocab_size")


def config_id_for(config: RunConfig, trace: str | Path | None = None) -> str:
    """The result folder name of `config` over a trace file (hashes the file, runs nothing)."""
    path = resolve_trace_path(trace if trace is not None else config.trace)
    return f"{config.readable_prefix()}-{config_digest(config, file_sha256(path))}"


def run_and_write(
    config: RunConfig,
    results: Path | None = None,
    *,
    force: bool = False,
    progress: bool | None = None,
) -> tuple[Path, RunResult | None]:
    """Run `config` over its trace file into `results/<config_id>/`, unless already complete.

    Returns the folder and the result (None when a complete result was already there). The
    results folder is checked writable before the run, so a full or read-only disk costs no
    computing; a write that fails all the same is one line (`OutputError`) too.
    """
    from analysis.engines.result import is_complete
    from analysis.platform.paths import results_dir
    from analysis.platform.writable import ensure_writable, output_error

    validate(config)
    folder = Path(results or results_dir()) / config_id_for(config)
    if is_complete(folder) and not force:
        return folder, None
    ensure_writable(folder.parent)
    if config.model is not None:  # an unknown name or a missing folder: before the trace loads
        config_model(config)
    result = run(None, config, progress=progress)
    try:
        result.write(folder)
    except OSError as exc:
        raise output_error(folder.parent, exc) from None
    return folder, result


def load_trace_frame(
    trace: pd.DataFrame | str | Path | None, config: RunConfig
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The trace frame and its identity (path, sha256 of the file or of the frame's tokens)."""
    if isinstance(trace, pd.DataFrame):
        return trace, {"source": "frame", "rows": len(trace), "sha256": frame_sha256(trace)}
    path = resolve_trace_path(trace if trace is not None else config.trace)
    frame = _read_trace(path)
    return frame, {"source": str(path), "rows": len(frame), "sha256": file_sha256(path)}


def resolve_trace_path(trace: str | Path) -> Path:
    from analysis.platform.paths import traces_dir

    path = Path(trace)
    if path.suffix != ".parquet" and not path.exists():
        path = traces_dir() / f"{trace}.parquet"
    if not path.is_file():
        raise ConfigError(
            f"trace {str(trace)!r} not found (looked for {path}): build it with "
            "`python -m analysis traces` or give a .parquet path"
        )
    return path


def _read_trace(path: Path) -> pd.DataFrame:
    """The trace, read once per process while its size and modification time stay the same: a
    sweep worker runs many points of one trace, and reading the whole multi-turn trace takes
    about a second. Runs only read the frame (`build_workload` limits it into a new one)."""
    stat = path.stat()
    return _read_trace_once(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _read_trace_once(path: str, size: int, mtime_ns: int) -> pd.DataFrame:
    from analysis.data.traces import load_trace

    return load_trace(Path(path))


def frame_sha256(frame: pd.DataFrame) -> str:
    """Content hash of a trace frame: ids, conversation, turn and every token."""
    digest = hashlib.sha256()
    for column in ("request_id", "conversation_id", "turn_index"):
        digest.update("\x1f".join(map(str, frame[column].tolist())).encode())
        digest.update(b"\x1e")
    for column in ("prompt_ids", "response_ids"):
        for ids in frame[column]:
            array = np.asarray(ids, dtype=np.int32)
            digest.update(len(array).to_bytes(8, "little"))
            digest.update(array.tobytes())
    return digest.hexdigest()


def _progress_bar(workload: Workload, config: RunConfig, progress: bool | None) -> Any:
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return None
    from analysis.platform.progress import bar as tqdm

    total = sum(not s.skipped for s in workload.specs)
    return tqdm(total=total, unit="req", desc=f"{config.engine} b{config.block_size}")


def assemble(
    workload: Workload,
    config: RunConfig,
    config_id: str,
    recorder: Recorder,
    engine_facts: dict[str, Any],
) -> RunResult:
    specs = workload.specs
    meta = pd.DataFrame(
        {
            "request_index": np.arange(len(specs), dtype=np.int32),
            "request_id": [s.request_id for s in specs],
            "conversation_id": [s.conversation_id for s in specs],
            "turn_index": np.array([s.turn_index for s in specs], dtype=np.int32),
        }
    )
    admissions = _admissions_table(recorder, meta)
    requests = _requests_table(workload, recorder, meta, admissions, engine_facts)
    events = recorder.block_events_frame()
    counters = _counters(recorder, requests, engine_facts)
    steps = engine_facts.pop("steps_table", None)
    return RunResult(
        config=config,
        config_id=config_id,
        admissions=admissions,
        requests=requests,
        block_stats=BlockStats.from_events(events),
        block_events=events,
        counters=counters,
        steps=steps,
    )


def _admissions_table(recorder: Recorder, meta: pd.DataFrame) -> pd.DataFrame:
    raw = recorder.admissions_frame()
    frame = raw.merge(meta, on="request_index", how="left", sort=False)
    frame["kind"] = np.where(frame["readmission"], "readmission", "first")
    frame["admission"] = frame.groupby("request_index").cumcount().astype(np.int32)
    columns = [
        "request_index",
        "request_id",
        "conversation_id",
        "turn_index",
        "kind",
        "admission",
        "tokens_queried",
        "tokens_hit",
        "step",
        "time_s",
    ]
    if recorder.fleet:
        columns.append("replica")
    return frame[columns]


def _requests_table(
    workload: Workload,
    recorder: Recorder,
    meta: pd.DataFrame,
    admissions: pd.DataFrame,
    engine_facts: dict[str, Any],
) -> pd.DataFrame:
    specs = workload.specs
    n = len(specs)
    first = admissions[admissions["kind"] == "first"].set_index("request_index")
    cached = np.full(n, -1, dtype=np.int64)
    first_step = np.full(n, -1, dtype=np.int64)
    cached[first.index.to_numpy()] = first["tokens_hit"].to_numpy()
    first_step[first.index.to_numpy()] = first["step"].to_numpy()
    counts = np.bincount(admissions["request_index"].to_numpy(), minlength=n)
    preemptions = np.bincount(recorder.preemptions_frame()["request_index"].to_numpy(), minlength=n)
    frame = meta.copy()
    frame["status"] = np.where(
        [s.skipped for s in specs],
        "skipped",
        np.where(recorder.finish_step >= 0, "finished", "unfinished"),
    )
    frame["prompt_tokens"] = np.array([s.prompt_tokens for s in specs], dtype=np.int64)
    frame["output_tokens"] = recorder.output_tokens
    frame["target_output_tokens"] = np.array([len(s.outputs) for s in specs], dtype=np.int64)
    frame["recorded_output_tokens"] = np.array(
        [s.recorded_output_tokens for s in specs], dtype=np.int64
    )
    frame["cached_tokens"] = cached
    frame["preemptions"] = preemptions.astype(np.int64)
    frame["admissions"] = counts.astype(np.int64)
    frame["submit_step"] = recorder.submit_step
    frame["first_admission_step"] = first_step
    frame["first_token_step"] = recorder.first_token_step
    frame["finish_step"] = recorder.finish_step
    frame["finish_reason"] = recorder.finish_reason
    arrival = recorder.arrival_times()
    frame["arrival_s"] = arrival
    frame["first_token_s"] = recorder.first_token_seconds
    frame["finish_s"] = recorder.finish_seconds
    measured = engine_facts.pop("ttft_s", None)  # the real engine's; replay's only on a clock
    if measured is None and recorder.clock is not None:
        measured = recorder.first_token_seconds - arrival
    frame["ttft_s"] = np.full(n, np.nan) if measured is None else measured
    frame["e2e_s"] = recorder.finish_seconds - arrival
    if recorder.fleet:
        frame["replica"] = recorder.replica_of
    generated = engine_facts.pop("generated", None)
    if generated is not None:
        frame["output_ids"] = [np.asarray(generated.get(i, []), dtype=np.int32) for i in range(n)]
    return frame


def _counters(
    recorder: Recorder, requests: pd.DataFrame, engine_facts: dict[str, Any]
) -> dict[str, Any]:
    stats = recorder.stats.to_dict()
    exported = engine_facts.pop("exported", None)
    if exported is None:
        emitted = requests["first_token_step"] >= 0
        exported = {
            "vllm:prefix_cache_queries": stats["queries"],
            "vllm:prefix_cache_hits": stats["hits"],
            "vllm:num_preemptions": int(requests["preemptions"].sum()),
            "vllm:prompt_tokens": int(requests.loc[emitted, "prompt_tokens"].sum()),
            "vllm:prompt_tokens_cached": int(requests.loc[emitted, "cached_tokens"].sum()),
            "vllm:generation_tokens": int(requests["output_tokens"].sum()),
            "vllm:request_success": int((requests["status"] == "finished").sum()),
        }
        source = (
            "replay: computed from vLLM's per-step PrefixCacheStats and Request counters, "
            "the inputs of vLLM's Prometheus counters (no Prometheus registry in replay)"
        )
    else:
        source = "vllm: llm.get_metrics() (Prometheus counters), difference over the run"
    return {
        "exported": exported,
        "exported_source": source,
        "prefix_cache_stats": stats,
        "prefix_cache_stats_source": (
            "sum of Scheduler.make_stats().prefix_cache_stats over every step, including "
            "the preempted_* fields vLLM exports nowhere"
        ),
        # vLLM logs one window per engine: a fleet has no fleet-wide one to check.
        "logged_window_hit_rate": None if recorder.fleet else recorder.caching_metrics.hit_rate,
        "logged_window_hit_rate_source": (
            "vLLM's CachingMetrics (last 1000 requests), as its logging stat logger, fed with "
            "the same per-step PrefixCacheStats (none for a fleet: one window per replica)"
        ),
        "logger_window_hit_rate": engine_facts.pop("logged_window_hit_rate", None),
    }


def build_manifest(
    config: RunConfig,
    model: ResolvedModel,
    config_id: str,
    trace_info: dict[str, Any],
    engine_facts: dict[str, Any],
    timings: dict[str, float],
    engine_sums: dict[str, int],
) -> dict[str, Any]:
    from analysis.platform.hardware import machine
    from analysis.platform.manifest import git_commit, package_versions

    return {
        "config_id": config_id,
        "config": config.to_dict(),
        "trace": trace_info,
        "engine": engine_facts,
        "machine": machine().to_dict(),
        "dtype": model.dtype_facts(),
        "timings": timings,
        "checks": {"per_admission_sums_equal_prefix_cache_stats": engine_sums},
        "versions": package_versions(),
        "git_commit": git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
