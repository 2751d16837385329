"""Seed 004's offline sweep on the in-process engine (`vllm.LLM`): requests/s against the
shared fraction of 1000-token prompts, caching on and off, plus its long-prefill table; run,
cached one folder per mode under `data/results/serving/`, and tabulated.

A module of its own: no server and no load generator over HTTP, only the engine in this
process; it shares the model names and the result folders with the server benchmark.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.models import resolved
from analysis.models import shapes as model_shapes
from analysis.platform.manifest import git_commit, package_versions, write_json, write_parquet
from analysis.serving import loadgen
from analysis.serving.model_names import model_identity, resolve_model, served_name
from analysis.serving.server import GIB, MODES
from analysis.serving.storage import _digest, is_finished, serving_root


@dataclass(frozen=True)
class PrefixSweepConfig:
    """Requests/s against the shared fraction of each prompt, caching on vs off (seed 004:
    1000-token prompts, 24 output tokens, max_num_batched_tokens 1024)."""

    model: str | None = None
    fractions: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    num_prompts: int = 16
    input_len: int = 1000
    output_len: int = 24
    modes: tuple[str, ...] = MODES
    block_size: int = 32
    max_model_len: int = 2048
    kv_cache_memory_bytes: int | None = GIB // 2
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int = 1024
    enforce_eager: bool = True
    seed: int = 0
    repeats: int = 1  # timed batches per fraction (each from an emptied cache)
    load_format: str | None = None  # "dummy": a real architecture with random weights (GPU)
    # Seed 004's long-prefill table: `long_prompts` unique prompts of `long_input_len` tokens,
    # sent `long_rounds` times per output length (round 1 cold, later rounds cached). 0: skip.
    long_input_len: int = 0
    long_prompts: int = 10
    long_output_lens: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128)
    long_rounds: int = 3
    budget_s: float | None = None  # per mode: fewer repeats (>= 2) when the first batch is slow
    # Both modes' engines kept at once and their timed batches alternated (on, off, off, on,
    # ...), so that a change in the machine's speed falls on both modes alike; False: one
    # engine after the other, minutes apart (see `interleaves`).
    interleaved: bool = True

    @property
    def interleaves(self) -> bool:
        """Whether the modes' batches alternate: asked for, and each engine's KV pool fixed in
        bytes. An engine sized by `gpu_memory_utilization` claims a share of the GPU's memory,
        and two such shares need not fit at once: those run one after the other."""
        return self.interleaved and self.gpu_memory_utilization is None

    def __post_init__(self) -> None:
        if self.long_input_len and (
            self.long_input_len + max(self.long_output_lens, default=0) > self.max_model_len
        ):
            raise ValueError(
                f"long_input_len {self.long_input_len} + output exceeds max_model_len "
                f"{self.max_model_len}"
            )
        if self.repeats < 1 or self.num_prompts < 1:
            raise ValueError(f"repeats and num_prompts must be >= 1, got {self.repeats}")
        if any(not 0.0 <= f <= 1.0 for f in self.fractions):
            raise ValueError(f"fractions must lie in [0, 1], got {self.fractions}")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"modes must be among {MODES}, got {bad}")
        if self.input_len + self.output_len > self.max_model_len:
            raise ValueError(
                f"input_len + output_len ({self.input_len + self.output_len}) exceeds "
                f"max_model_len {self.max_model_len}"
            )


def sweep_run_id(config: PrefixSweepConfig, model: str, mode: str) -> str:
    shaping = asdict(config)
    shaping.pop("model")
    shaping.pop("modes")
    shaping.update(model_identity(model), mode=mode)
    return f"prefix-sweep-{mode}-{_digest(shaping)}"


def _engine(config: PrefixSweepConfig, model: str, mode: str) -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if Path(model).exists():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM

    kwargs: dict[str, Any] = {}
    if config.kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes
    if config.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
    load_format = config.load_format or model_shapes.load_format(model)
    if load_format is not None:
        kwargs["load_format"] = load_format
    from analysis.platform.vllm_compat import before_engine_start

    before_engine_start()
    return LLM(
        model=model,
        block_size=config.block_size,
        enable_prefix_caching=mode == "cache",
        max_model_len=config.max_model_len,
        max_num_batched_tokens=config.max_num_batched_tokens,
        enforce_eager=config.enforce_eager,
        seed=config.seed,
        dtype=resolved.resolve_model(model).dtype,
        use_tqdm_on_load=False,
        **kwargs,
    )


def _sweep_modes(
    config: PrefixSweepConfig, model: str, modes: Sequence[str], progress: bool
) -> dict[str, list[dict]]:
    """One engine per mode, all started first; per fraction, `repeats` timed `generate`s of
    all prompts, each from an emptied cache, the modes' batches alternated in mirrored order
    (a, b, b, a, ...) so that a drift in the machine's speed lands on every mode alike; then
    each mode's long-prefill table."""
    import gc

    from tqdm import tqdm
    from vllm import SamplingParams

    engines: dict[str, Any] = {}
    startup_s: dict[str, float] = {}
    for mode in modes:
        started = time.perf_counter()
        engines[mode] = _engine(config, model, mode)
        startup_s[mode] = time.perf_counter() - started
    params = SamplingParams(
        max_tokens=config.output_len, ignore_eos=True, temperature=0.0, seed=config.seed
    )
    # Untimed, same shape as a timed batch: the first batch of a shape pays one-off costs
    # (allocations, kernel set-up) that would otherwise land on the first fraction.
    warm = loadgen.prefix_sweep_prompts(
        0.0, config.num_prompts, config.input_len, seed=config.seed + 1
    )
    batch_s = []
    for mode, llm in engines.items():
        llm.generate([{"prompt_token_ids": p} for p in warm], params, use_tqdm=False)
        batch_s.append(_timed_batch(llm, warm, params, mode, 0.0, -1)["elapsed_s"])
    repeats = sweep_repeats(config, max(batch_s))  # the same for every mode: paired batches
    rows: dict[str, list[dict]] = {mode: [] for mode in modes}
    order = itertools.count()  # each timed batch's place in the run
    bar = tqdm(
        config.fractions,
        desc=f"prefix sweep ({', '.join(modes)})",
        disable=not progress or not sys.stderr.isatty(),
        leave=False,
    )
    try:
        for fraction in bar:
            prompts = loadgen.prefix_sweep_prompts(
                fraction, config.num_prompts, config.input_len, seed=config.seed
            )
            for repeat in range(repeats):
                for mode in modes if repeat % 2 == 0 else modes[::-1]:
                    row = _timed_batch(engines[mode], prompts, params, mode, fraction, repeat)
                    row["shared_tokens"] = round(fraction * config.input_len)
                    row["engine_startup_s"] = startup_s[mode]
                    row["order"] = next(order)
                    rows[mode].append(row)
        if config.long_input_len:
            for mode, llm in engines.items():
                rows[mode] += _long_prefill(llm, config, mode)
    finally:
        bar.close()
        engines.clear()
        gc.collect()
    return rows


def sweep_repeats(config: PrefixSweepConfig, batch_s: float) -> int:
    """Repeats per fraction that fit `config.budget_s` given one batch's time (at least 2,
    at most `config.repeats`)."""
    if config.budget_s is None or batch_s <= 0:
        return config.repeats
    fitting = int(config.budget_s // (batch_s * len(config.fractions)))
    return max(min(config.repeats, 2), min(config.repeats, fitting))


def _long_prefill(llm: Any, config: PrefixSweepConfig, mode: str) -> list[dict]:
    """Seed 004's long-prefill table: per output length, an emptied cache, then the same
    unique long prompts `long_rounds` times; requests/s per round."""
    from vllm import SamplingParams

    prompts = [
        [loadgen.BOS_ID, *loadgen.ordinary_ids(config.long_input_len - 1, "long", i)]
        for i in range(config.long_prompts)
    ]
    rows = []
    for output_len in config.long_output_lens:
        params = SamplingParams(
            max_tokens=output_len, ignore_eos=True, temperature=0.0, seed=config.seed
        )
        llm.reset_prefix_cache()
        for round_index in range(1, config.long_rounds + 1):
            t0 = time.perf_counter()
            outputs = llm.generate(
                [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False
            )
            elapsed = time.perf_counter() - t0
            prompt_tokens = sum(len(p) for p in prompts)
            cached = sum(int(o.num_cached_tokens or 0) for o in outputs)
            rows.append(
                {
                    "mode": mode,
                    "experiment": "long_prefill",
                    "output_len": output_len,
                    "round": round_index,
                    "num_prompts": len(prompts),
                    "elapsed_s": elapsed,
                    "req_s": len(prompts) / elapsed,
                    "prompt_tokens": prompt_tokens,
                    "cached_tokens": cached,
                    "hit_rate": cached / prompt_tokens,
                }
            )
    return rows


def _timed_batch(
    llm: Any, prompts: list[list[int]], params: Any, mode: str, fraction: float, repeat: int
) -> dict[str, Any]:
    """One `generate` of all prompts from an emptied cache, timed."""
    llm.reset_prefix_cache()
    t0 = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    prompt_tokens = sum(len(p) for p in prompts)
    cached = sum(int(o.num_cached_tokens or 0) for o in outputs)
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "mode": mode,
        "experiment": "sweep",
        "fraction": float(fraction),
        "repeat": repeat,
        "num_prompts": len(prompts),
        "elapsed_s": elapsed,
        "req_s": len(prompts) / elapsed,
        "output_tok_s": generated / elapsed,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "hit_rate": cached / prompt_tokens,
    }


def run_prefix_sweep(
    config: PrefixSweepConfig,
    *,
    force: bool = False,
    progress: bool = True,
    root: Path | None = None,
) -> pd.DataFrame:
    """Seed 004's sweep, one cached run folder per mode (`sweep.parquet`, `manifest.json`);
    returns one row per (mode, fraction)."""
    root = Path(root) if root else serving_root()
    model = resolve_model(config.model)
    run_dirs = {mode: root / sweep_run_id(config, model, mode) for mode in config.modes}
    missing = [mode for mode, run_dir in run_dirs.items() if force or not is_finished(run_dir)]
    # interleaved, every mode is measured again with a missing one, so that their batches
    # pair up; else the missing ones, one after the other
    if not missing:
        groups = []
    elif config.interleaves:
        groups = [list(config.modes)]
    else:
        groups = [[mode] for mode in missing]
    measured = {}
    for group in groups:
        measured.update(_sweep_modes(config, model, group, progress))
    frames = []
    for mode, run_dir in run_dirs.items():
        if mode in measured:
            rows = measured[mode]
            for row in rows:
                row["model"] = served_name(model)
            write_parquet(run_dir / "sweep.parquet", pd.DataFrame(rows))
            write_json(
                run_dir / "manifest.json",
                {
                    "run_id": run_dir.name,
                    "config": asdict(config),
                    "model": model,
                    "versions": package_versions(),
                    "git_commit": git_commit(),
                    "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
            )
        frame = pd.read_parquet(run_dir / "sweep.parquet")
        frame.insert(0, "run_id", run_dir.name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def sweep_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per (shared fraction, mode): the median requests/s of the timed batches with a 95 %
    interval from resampling the batches (`serving_stats.across_repeats`), and the realized
    hit rate (prompt tokens the engine served from cache, its own count); then caching on
    against off side by side with their ratio. The x-axis of seed 004's figure should be
    `hit_rate_cache`, not the shared fraction."""
    from analysis.serving import stats as serving_stats

    rows = sweep[sweep["experiment"] == "sweep"] if "experiment" in sweep.columns else sweep
    records = []
    for (fraction, mode), group in rows.groupby(["fraction", "mode"]):
        rates = group["req_s"].to_numpy(dtype=float)
        summary = serving_stats.across_repeats([np.array([rate]) for rate in rates])
        records.append(
            {
                "fraction": fraction,
                "mode": mode,
                "req_s": summary.value,
                "lo": summary.low if rates.size > 1 else summary.value,
                "hi": summary.high if rates.size > 1 else summary.value,
                "hit_rate": float(group["hit_rate"].median()),
                "batches": len(group),
            }
        )
    long = pd.DataFrame(records)
    wide = long.pivot(index="fraction", columns="mode", values=["req_s", "lo", "hi", "hit_rate"])
    wide.columns = [
        name if column == "req_s" else f"{name}_{column}" for column, name in wide.columns
    ]
    wide = wide.reset_index()
    if {"cache", "no_cache"} <= set(wide.columns):
        wide["speedup"] = wide["cache"] / wide["no_cache"]
    wide["batches"] = long.groupby("fraction")["batches"].min().to_numpy()
    return wide


def ratio_interval(
    numerator: Sequence[float], denominator: Sequence[float], seed: int = 0
) -> tuple[float, float, float]:
    """mean(numerator) / mean(denominator) with a bootstrap 95 % interval (each side
    resampled on its own): e.g. caching on vs off at a 0 % hit rate, batch by batch."""
    top = np.asarray(numerator, dtype=float)
    bottom = np.asarray(denominator, dtype=float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, top.size, (2000, top.size))
    draws_b = rng.integers(0, bottom.size, (2000, bottom.size))
    ratios = top[draws].mean(axis=1) / bottom[draws_b].mean(axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(top.mean() / bottom.mean()), float(low), float(high)


def long_prefill_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """Seed 004's long-prefill table: requests/s per (mode, round) against the output length."""
    if "experiment" not in sweep or not (sweep["experiment"] == "long_prefill").any():
        return pd.DataFrame()
    rows = sweep[sweep["experiment"] == "long_prefill"].copy()
    rows["row"] = rows["mode"] + "-round" + rows["round"].astype(int).astype(str)
    table = rows.pivot_table(index="row", columns="output_len", values="req_s", aggfunc="first")
    table.columns.name = "output_len"
    return table


# Seed 004's long-prefill claim reads as reproduced when requests/s x output length in the
# cached round varies by less than this factor over the output lengths (flat: ~ 1/output_len).
LONG_PREFILL_FLAT = 2.0


def long_prefill_verdict(table: pd.DataFrame) -> str:
    """Seed 004's "once cached, throughput ~ 1/output_len", read from the cached round:
    "reproduced" when requests/s x output length stays within `LONG_PREFILL_FLAT`, else "only
    roughly"; "" when the table has no cached round."""
    if table.empty or "cache-round2" not in table.index:
        return ""
    cached = table.loc["cache-round2"]
    products = cached * cached.index
    return "reproduced" if products.max() / products.min() < LONG_PREFILL_FLAT else "only roughly"


def long_prefill_reading(table: pd.DataFrame) -> str:
    """The long-prefill table in one sentence, from the run: requests/s x output length in
    the cached round (flat if throughput ~ 1/output length) and the verdict."""
    verdict = long_prefill_verdict(table)
    if not verdict:
        return "No cached round ran, so the long-prefill claim is not read."
    cached = table.loc["cache-round2"]
    products = cached * cached.index
    shown = ", ".join(f"{v:.2f} at {k:g}" for k, v in products.items())
    lengths = products.index.max() / products.index.min()
    return (
        f"Requests/s x output length in the cached round: {shown} output tokens "
        f"({products.max() / products.min():.1f}x from lowest to highest, over a {lengths:g}x "
        f"range of output lengths); throughput ~ 1/output length: {verdict} (the rule: "
        f"reproduced when that product moves less than {LONG_PREFILL_FLAT:g}x, else only "
        "roughly)."
    )
