"""`gpu-check`: prove a GPU machine. The real CUDA engine must count exactly as `replay` does.

Engine half: the six configurations first compared on an H100 (../facts/gpu.md) at block 16,
on the 1B shape: identical prompts, preemption under batch load, and the first ShareGPT
conversations and requests at a small and a large cache. Each runs through `replay` (any
machine) and, where CUDA is visible, through the real engine; the per-point verdict is SAME
when first-prefill and all-prefill hits and queries, preemptions and re-admissions agree.

Timing half (CUDA only): TTFT with a shared prefix of 0-2048 tokens, 1/8/32 requests at once,
caching on vs off, and seed 004's requests/s sweep, both on the 8B shape with random weights
(configs/gpu.toml [timing]). Everything lands in data/results/gpu-check/ with a manifest naming
the GPU, its driver and vLLM.
"""

from __future__ import annotations

import subprocess
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.engines.config import RunConfig

ENGINE_MODEL = "llama-3.2-1b"
COMMON = dict(model=ENGINE_MODEL, block_size=16, max_num_seqs=256, max_num_batched_tokens=8192)
COUNT_KEYS = (
    "first_hits",
    "first_queries",
    "all_hits",
    "all_queries",
    "preemptions",
    "readmissions",
)


@dataclass(frozen=True)
class EnginePoint:
    """One compared configuration: a trace (a frame builder or a trace name) and its config."""

    name: str
    trace: Callable[[], pd.DataFrame] | None  # None: the config's trace file
    config: RunConfig


def _identical() -> pd.DataFrame:
    from analysis.engines.synthetic import identical_requests

    return identical_requests(6, 199, reply_tokens=8)


def _long_prompts() -> pd.DataFrame:
    from analysis.engines.synthetic import synthetic_trace

    return synthetic_trace(num_conversations=8, turns=1, user_tokens=600, reply_tokens=200)


def engine_points() -> list[EnginePoint]:
    """The six configurations of ../facts/gpu.md, on the 1B shape."""
    small = RunConfig(trace="identical", max_model_len=1024, **COMMON)
    multi = RunConfig(
        trace="multi_turn", max_model_len=4096, mode="closed-loop", concurrency=8, limit=40
    ).with_(**COMMON)
    single = RunConfig(
        trace="single_turn", max_model_len=4096, mode="batch", limit=64, max_output_tokens=64
    ).with_(**COMMON)
    return [
        EnginePoint(
            "identical-200",
            _identical,
            small.with_(num_blocks=200, mode="closed-loop", concurrency=1),
        ),
        EnginePoint(
            "long-prompts-65",
            _long_prompts,
            small.with_(trace="long", num_blocks=65, mode="batch"),
        ),
        EnginePoint(
            "long-prompts-128",
            _long_prompts,
            small.with_(trace="long", num_blocks=128, mode="batch"),
        ),
        EnginePoint("multi40-300", None, multi.with_(num_blocks=300)),
        EnginePoint("multi40-3000", None, multi.with_(num_blocks=3000)),
        EnginePoint("single64-300", None, single.with_(num_blocks=300)),
    ]


def counts(result: Any) -> dict[str, int]:
    """What must agree between engines, from a RunResult."""
    summary = result.summary
    return {
        "first_hits": int(summary["first_prefill"]["hits"]),
        "first_queries": int(summary["first_prefill"]["queries"]),
        "all_hits": int(summary["all_prefill"]["hits"]),
        "all_queries": int(summary["all_prefill"]["queries"]),
        "preemptions": int(summary["preemptions"]),
        "readmissions": int(summary["readmissions"]),
    }


def verdict(replayed: dict[str, int], real: dict[str, int] | None) -> str:
    """SAME / DIFFERENT, or "replay only" where the real engine did not run."""
    if real is None:
        return "replay only"
    same = all(replayed[k] == real[k] for k in COUNT_KEYS)
    return "SAME" if same else "DIFFERENT"


def run_engine_points(
    points: Sequence[EnginePoint], cuda: bool, say: Callable[[str], None] = print
) -> pd.DataFrame:
    """Each point through replay, and through the real CUDA engine when `cuda`; one row each."""
    from analysis.runs import run

    rows = []
    for point in points:
        trace = point.trace() if point.trace is not None else None
        started = time.perf_counter()
        replayed = counts(run(trace, point.config.with_(engine="replay"), progress=False))
        row: dict[str, Any] = {"point": point.name, "replay_s": time.perf_counter() - started}
        row.update({f"replay_{k}": v for k, v in replayed.items()})
        real = None
        if cuda:
            started = time.perf_counter()
            result = run(trace, point.config.with_(engine="vllm", device="cuda"), progress=False)
            real = counts(result)
            row["vllm_s"] = time.perf_counter() - started
            row.update({f"vllm_{k}": v for k, v in real.items()})
            engine = result.manifest["engine"]
            row.update(
                forcing=engine["forcing"],
                model_runner=engine["model_runner"],
                forced_output_mismatches=engine["forced_output_mismatches"],
            )
        row["verdict"] = verdict(replayed, real)
        if row.get("forced_output_mismatches"):  # the engine did not emit the recorded replies
            row["verdict"] = "DIFFERENT"
        say(_point_line(point.name, replayed, real, row["verdict"]))
        rows.append(row)
    return pd.DataFrame(rows)


def _point_line(name: str, replayed: dict, real: dict | None, verdict_: str) -> str:
    def fmt(c: dict) -> str:
        return (
            f"first {c['first_hits']}/{c['first_queries']}, all {c['all_hits']}/"
            f"{c['all_queries']}, preemptions {c['preemptions']}"
        )

    line = f"{verdict_:<11} {name:<17} replay: {fmt(replayed)}"
    if real is not None and verdict_ != "SAME":
        line += f" | vllm: {fmt(real)}"
    return line


def timing_settings(grid: str = "gpu") -> dict[str, Any]:
    """The [timing] table of a grid file (configs/gpu.toml)."""
    from analysis.platform.paths import configs_dir

    return tomllib.loads((configs_dir() / f"{grid}.toml").read_text()).get("timing", {})


def run_timing(root: Path, settings: dict[str, Any], say: Callable[[str], None] = print) -> dict:
    """TTFT with a shared prefix (caching on vs off) and seed 004's sweep, on the timing shape
    with random weights; returns the two tables."""
    from analysis.models import shapes as model_shapes
    from analysis.serving import (
        PrefixSweepConfig,
        ServingBenchConfig,
        run_prefix_sweep,
        run_serving_bench,
        sweep_table,
    )

    name = settings.get("model", "llama-3.1-8b")
    model = str(model_shapes.materialise(name))
    fmt = model_shapes.load_format(model)
    common = dict(
        model=model,
        load_format=fmt,
        block_size=settings.get("block_size", 16),
        kv_cache_memory_bytes=None,
        gpu_memory_utilization=settings.get("gpu_memory_utilization", 0.6),
    )
    prefixes = tuple(settings.get("prefixes", (0, 512, 1024, 2048)))
    concurrency = tuple(settings.get("concurrency", (1, 8, 32)))
    bench = ServingBenchConfig(
        **common,
        prefixes=prefixes,
        concurrency=concurrency,
        requests=settings.get("requests", 32),
        max_model_len=settings.get("max_model_len", 4096),
        max_num_seqs=settings.get("max_num_seqs"),
        max_num_batched_tokens=settings.get("max_num_batched_tokens"),
    )
    say(f"TTFT: {name} (random weights), prefixes {prefixes}, {concurrency} requests at once")
    ttft = run_serving_bench(bench, progress=False, root=root / "serving", interleave=False)
    sweep_settings = settings.get("sweep", {})
    sweep_config = PrefixSweepConfig(
        **common,
        fractions=tuple(sweep_settings.get("fractions", (0.0, 0.5, 0.9, 1.0))),
        num_prompts=sweep_settings.get("num_prompts", 256),
        input_len=sweep_settings.get("input_len", 1000),
        output_len=sweep_settings.get("output_len", 24),
        max_model_len=sweep_settings.get("max_model_len", 2048),
        max_num_batched_tokens=settings.get("max_num_batched_tokens", 16384),
    )
    say(f"seed 004's sweep on {name}: {sweep_settings.get('num_prompts', 256)} prompts")
    sweep = sweep_table(run_prefix_sweep(sweep_config, progress=False, root=root / "serving"))
    return {"ttft": ttft, "sweep": sweep}


def cuda_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def machine() -> dict[str, Any]:
    """GPU, driver, CUDA, torch and vLLM, for the manifest."""
    info: dict[str, Any] = {}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except ImportError:
        info["vllm"] = None
    info.update(_nvidia_smi())
    return info


def _nvidia_smi() -> dict[str, str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    first = out.strip().splitlines()[0] if out.strip() else ""
    parts = [p.strip() for p in first.split(",")]
    if len(parts) < 3:
        return {}
    return {"gpu": parts[0], "driver": parts[1], "gpu_memory": parts[2]}


def results_root() -> Path:
    from analysis.platform.paths import results_dir

    return results_dir() / "gpu-check"


def check(
    root: Path | None = None,
    *,
    cuda: bool | None = None,
    timing: bool = True,
    only: Sequence[str] | None = None,
    say: Callable[[str], None] = print,
) -> int:
    """The whole check; returns the exit status (1 on any DIFFERENT point, else 0)."""
    from analysis.data.traces import ensure_traces
    from analysis.platform.manifest import git_commit, package_versions, write_json

    root = Path(root) if root else results_root()
    cuda = cuda_visible() if cuda is None else cuda
    if not cuda:
        say("no CUDA GPU visible: running the replay half only (the real engine needs a GPU)")
    else:
        info = machine()
        say(f"{info.get('gpu')}, driver {info.get('driver')}, vLLM {info.get('vllm')}")
    points = engine_points()
    if only:
        unknown = sorted(set(only) - {p.name for p in points})
        if unknown:
            from analysis.platform.errors import ConfigError

            known = ", ".join(p.name for p in points)
            raise ConfigError(f"unknown gpu-check point {unknown[0]!r}: choose among {known}")
        points = [p for p in points if p.name in only]
    if any(p.trace is None for p in points):
        ensure_traces(progress=False)
    started = time.perf_counter()
    table = run_engine_points(points, cuda, say)
    root.mkdir(parents=True, exist_ok=True)
    table.to_csv(root / "engine_check.csv", index=False)
    different = int((table["verdict"] == "DIFFERENT").sum())
    timing_files: list[str] = []
    if cuda and timing and not different:
        tables = run_timing(root, timing_settings(), say)
        for name, frame in tables.items():
            frame.to_csv(root / f"{name}.csv")
            timing_files.append(f"{name}.csv")
            say(f"{name}:\n{frame.to_string()}")
    write_json(
        root / "manifest.json",
        {
            "machine": machine(),
            "cuda": cuda,
            "engine_points": [{"name": p.name, "config": p.config.to_dict()} for p in points],
            "verdicts": dict(zip(table["point"], table["verdict"], strict=True)),
            "different": different,
            "timing": timing_files,
            "timing_settings": timing_settings() if timing_files else None,
            "seconds": round(time.perf_counter() - started, 1),
            "versions": package_versions(),
            "git_commit": git_commit(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    )
    say(f"results: {root}")
    if different:
        say(f"{different} point(s) DIFFERENT: the real engine and replay disagree")
        return 1
    return 0
