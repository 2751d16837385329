"""`calibrate`: measure a real engine's steps, fit a step-cost profile, and check it on
held-out workloads against the same real engine.

Measure: each calibration workload (`analysis.timing.workloads`) runs through the real vLLM
engine (`engine="vllm"`: the CPU build here, the CUDA build on a GPU), whose driver records
every step's make-up and wall time (`analysis.engines.steps`). Fit: `analysis.timing.fit`.
Validate: each held-out workload runs through the real engine again and through `replay`
on the fitted clock, with the same arrivals; the table sets predicted beside measured TTFT,
TPOT, end-to-end latency and throughput, with the relative error of each.

Everything lands in one folder: `steps.parquet` (every measured step, its workload named),
`profile.json` (the profile, its identity and residuals), `validation.csv`,
`requests.parquet` (per request, measured and predicted) and `manifest.json`, written last.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.engines.clock import StepCostProfile, run_identity
from analysis.engines.config import RunConfig
from analysis.timing.fit import calibration_method, fit_profile, fittable_steps, residual_summary
from analysis.timing.workloads import TimingWorkload, calibration_workloads, held_out_workloads

# The engine every workload runs on, per device (a workload changes what it needs); warmed up
# first, as a server is before its first client (RunConfig.warmup).
BASE = {
    "cpu": RunConfig(
        engine="vllm",
        device="cpu",
        block_size=32,
        num_blocks=2048,
        max_model_len=4096,
        max_num_seqs=256,
        outputs="recorded",
        warmup=True,
    ),
    "cuda": RunConfig(
        engine="vllm",
        device="cuda",
        model="llama-3.2-1b",
        block_size=16,
        num_blocks=8192,
        max_model_len=4096,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        outputs="recorded",
        warmup=True,
    ),
}


@dataclass
class Calibration:
    profile: StepCostProfile
    steps: pd.DataFrame
    validation: pd.DataFrame | None = None
    requests: pd.DataFrame | None = None
    held_out_steps: pd.DataFrame | None = None


def base_config(
    device: str,
    model: str | None = None,
    block_size: int | None = None,
    settings: Mapping[str, Any] | None = None,
) -> RunConfig:
    """The device's calibration engine, with another model, block size or engine settings
    (a server's batch limits, say: a profile holds for the settings it was measured with)."""
    base = BASE[device]
    if model is not None:
        base = base.with_(model=model)
    if block_size is not None:
        base = base.with_(block_size=block_size)
    return base.with_(**settings) if settings else base


def machine_identity(device: str) -> dict[str, Any]:
    """The machine a profile's times belong to: the GPU by name, or the CPU by what decides
    its speed (torch's capability, name, cores, and the threads torch computes with)."""
    from analysis.platform.hardware import machine

    facts = machine()
    if device == "cuda":
        return {"kind": "cuda", "gpu": facts.cuda_device}
    import torch

    return {
        "kind": "cpu",
        "cpu_capability": facts.cpu_capability,
        "cpu": facts.cpu_name,
        "cores": facts.cores,
        "torch_threads": torch.get_num_threads(),  # a server's engine runs on one
    }


def measure_steps(
    base: RunConfig,
    workloads: Sequence[TimingWorkload],
    say: Callable[[str], None] = print,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Every workload through the real engine; its steps with a `run` column, and the
    identity of what ran (model, vLLM, settings, dtype)."""
    from analysis.engines.vllm_args import config_model
    from analysis.runs import run

    frames = []
    identity: dict[str, Any] = {}
    for workload in workloads:
        config = workload.config(base)
        started = time.perf_counter()
        result = run(workload.frame(), config, progress=False)
        steps = result.steps.assign(run=workload.name)
        frames.append(steps)
        engine = result.manifest["engine"]
        identity = {
            **run_identity(config, config_model(config)),
            "dtype": engine["model_dtype"],
            "model_runner": engine["model_runner"],
        }
        say(
            f"  {workload.name}: {len(steps)} steps, {steps['wall_s'].sum():.2f} s of steps "
            f"({time.perf_counter() - started:.0f} s in all)"
        )
    return pd.concat(frames, ignore_index=True), identity


def calibrate(
    device: str = "cpu",
    *,
    model: str | None = None,
    block_size: int | None = None,
    settings: Mapping[str, Any] | None = None,
    validate: bool = True,
    repeats: int = 1,
    say: Callable[[str], None] = print,
) -> Calibration:
    """Measure, fit and (by default) validate on the held-out workloads, every real run on
    one engine (`shared_engines`: started and warmed up once, its prefix cache reset before
    each run), as a server serves one client after another."""
    from analysis.engines.vllm_engine import shared_engines

    base = base_config(device, model, block_size, settings)
    say(f"calibrating on the real {device} engine ({base.model or 'local tiny Llama'})")
    with shared_engines():
        steps, identity = measure_steps(base, calibration_workloads(device), say)
        identity["machine"] = machine_identity(device)
        profile = fit_profile(steps, identity, method=calibration_method(device))
        say(
            f"profile: {profile.coefficients}; decode batches {profile.decode_batch_s}; admit "
            f"{profile.admit_s:.2e} s, loop {profile.loop_s:.2e} s; fitted {profile.fit['fitted']}"
        )
        calibration = Calibration(profile, steps)
        if validate:
            validation, requests, held_out = validate_profile(
                profile, base, held_out_workloads(device), say, repeats=repeats
            )
            calibration.validation, calibration.requests = validation, requests
            calibration.held_out_steps = held_out
            residuals = residual_summary(profile, fittable_steps(held_out))
            calibration.profile = replace(profile, fit={**profile.fit, "held_out_steps": residuals})
    return calibration


def validate_profile(
    profile: StepCostProfile,
    base: RunConfig,
    workloads: Sequence[TimingWorkload],
    say: Callable[[str], None] = print,
    profile_path: Path | None = None,
    repeats: int = 1,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Each held-out workload on the real engine and on replay with the profile's clock:
    (statistics and errors per workload, per request, the real engine's steps).

    With `repeats` > 1 the real engine runs each workload again, and a row `measured again`
    sets each later repeat against the first in the same terms as the prediction: the
    engine's own repeat-to-repeat spread, beside which a prediction's error can be read."""
    import tempfile

    from analysis.data.traces import ensure_traces
    from analysis.platform.manifest import write_json
    from analysis.runs import run

    if any(w.trace is None for w in workloads):
        ensure_traces(progress=False)
    rows, requests, steps = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        path = profile_path or Path(scratch) / "profile.json"
        if profile_path is None:
            write_json(path, profile.to_dict())
        for workload in workloads:
            config = workload.config(base)
            measured = [run(workload.frame(), config, progress=False) for _ in range(repeats)]
            predicted = run(
                workload.frame(),
                config.with_(engine="replay", clock=str(path), device="cpu"),
                progress=False,
            )
            first = measured[0]
            steps.append(first.steps.assign(run=workload.name))
            table = compare_requests(first.requests, predicted.requests)
            rows.append(
                {"workload": workload.name, "against": "replay on the clock", **error_row(table)}
            )
            requests.append(table.assign(workload=workload.name))
            say(f"  {workload.name}: {_errors_line(rows[-1])}")
            for number, again in enumerate(measured[1:], start=2):
                table = compare_requests(first.requests, again.requests)
                rows.append(
                    {
                        "workload": workload.name,
                        "against": f"real engine, repeat {number}",
                        **error_row(table),
                    }
                )
                say(
                    f"  {workload.name}, repeat {number} against repeat 1: {_errors_line(rows[-1])}"
                )
    return (
        pd.DataFrame(rows),
        pd.concat(requests, ignore_index=True),
        pd.concat(steps, ignore_index=True),
    )


def _errors_line(row: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:+.1%}" for k, v in row.items() if k.endswith("_error"))


def compare_requests(measured: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """Per finished request: TTFT, TPOT and end-to-end, measured and predicted."""
    columns = ["request_id", "prompt_tokens", "cached_tokens", "output_tokens"]
    left = latencies(measured).add_prefix("measured_")
    right = latencies(predicted).add_prefix("predicted_")
    table = measured[columns].join(left).join(right)
    return table[(measured["status"] == "finished") & (predicted["status"] == "finished")]


def latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """TTFT, TPOT (decode time per token after the first) and end-to-end, per request."""
    decode_tokens = (requests["output_tokens"] - 1).clip(lower=1)
    return pd.DataFrame(
        {
            "ttft_s": requests["ttft_s"],
            "tpot_s": (requests["finish_s"] - requests["first_token_s"]) / decode_tokens,
            "e2e_s": requests["e2e_s"],
            "arrival_s": requests["arrival_s"],
            "finish_s": requests["finish_s"],
        },
        index=requests.index,
    )


def error_row(table: pd.DataFrame) -> dict[str, float]:
    """Measured and predicted statistics of one workload, with relative errors."""
    row: dict[str, float] = {"requests": int(len(table))}
    stats = {
        "mean_ttft_s": lambda side: table[f"{side}_ttft_s"].mean(),
        "p50_ttft_s": lambda side: table[f"{side}_ttft_s"].median(),
        "p90_ttft_s": lambda side: table[f"{side}_ttft_s"].quantile(0.9),
        "mean_tpot_s": lambda side: table[f"{side}_tpot_s"][table["output_tokens"] > 1].mean(),
        "mean_e2e_s": lambda side: table[f"{side}_e2e_s"].mean(),
        "throughput_req_s": lambda side: (
            len(table) / (table[f"{side}_finish_s"].max() - table[f"{side}_arrival_s"].min())
        ),
    }
    for name, stat in stats.items():
        measured, predicted = float(stat("measured")), float(stat("predicted"))
        row[f"measured_{name}"] = measured
        row[f"predicted_{name}"] = predicted
        row[f"{name.removesuffix('_s')}_error"] = (
            predicted / measured - 1.0 if measured > 0 else np.nan
        )
    return row


def write(calibration: Calibration, folder: Path, extra: dict[str, Any] | None = None) -> Path:
    """The calibration's folder, staged and swapped in, manifest last."""
    from analysis.platform.manifest import (
        git_commit,
        package_versions,
        staged_folder,
        write_json,
        write_parquet,
    )

    folder = Path(folder)
    with staged_folder(folder) as staging:
        write_parquet(staging / "steps.parquet", calibration.steps)
        write_json(staging / "profile.json", calibration.profile.to_dict())
        if calibration.validation is not None:
            calibration.validation.to_csv(staging / "validation.csv", index=False)
            write_parquet(staging / "requests.parquet", calibration.requests)
            write_parquet(staging / "held_out_steps.parquet", calibration.held_out_steps)
        write_json(
            staging / "manifest.json",
            {
                "identity": calibration.profile.identity,
                "fit": calibration.profile.fit,
                "versions": package_versions(),
                "git_commit": git_commit(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **(extra or {}),
            },
        )
    return folder
