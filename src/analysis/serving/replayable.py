"""What a benchmark cell sent, beside what the server measured: rows a clock can replay.

A cell's prompts are deterministic (synthetic requests, or the ShareGPT trace's first
conversations), so they are rebuilt from its configuration and joined to the per-request
records of every repeat. `scheduler_limits` names the batch limits
the server ran with (vLLM's own defaults for an API server where the configuration left them
unset), so that whatever replays a cell schedules it under the same limits.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.metrics.server_clocks import RECORDED_CLOCK_COLUMNS
from analysis.platform.errors import WorkloadError
from analysis.serving.bench_config import RunKey, ServingBenchConfig, arrival_seed
from analysis.serving.bench_run import sharegpt_specs, synthetic_specs
from analysis.serving.model_names import DEFAULT_CPU_MODEL
from analysis.serving.storage import load_requests


def scheduler_limits(config: ServingBenchConfig) -> dict[str, int]:
    """The token budget and the most requests per step of the benchmark's server: the
    configuration's, or vLLM's defaults for an OpenAI-compatible server on this platform
    (a CPU's differ from a GPU's, and from the offline engine's)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    tokens, sequences = EngineArgs.get_batch_defaults(world_size=1)
    server = UsageContext.OPENAI_API_SERVER
    return {
        "max_num_batched_tokens": config.max_num_batched_tokens or tokens[server],
        "max_num_seqs": config.max_num_seqs or sequences[server],
    }


def engine_settings(config: ServingBenchConfig) -> dict[str, Any]:
    """The benchmark server's engine as a run configuration's fields: its model, block size,
    context and batch limits, and its KV pool in blocks where the configuration fixes the
    pool's bytes (a pool vLLM sizes from free GPU memory is known only to a running server)."""
    from analysis.serving.study import kv_pool_blocks

    model = config.model or DEFAULT_CPU_MODEL
    settings = {
        "model": model,
        "block_size": config.block_size,
        "max_model_len": config.max_model_len,
        **scheduler_limits(config),
    }
    if config.kv_cache_memory_bytes:
        blocks = kv_pool_blocks(model, config.block_size, config.kv_cache_memory_bytes)
        if blocks:
            settings["num_blocks"] = blocks
    return settings


def cell_requests(
    config: ServingBenchConfig, table: pd.DataFrame, root: Path | None = None
) -> pd.DataFrame:
    """Every request of every repeat of the cells in `table` (the summary table of
    `run_serving_bench`): its prompt ids and reply length as sent, and what the client measured
    (`start_s`, `ttft_s`, `e2e_s`, `tpot_s`, `status`, `warmup`). ShareGPT cells also name
    each request's `conversation` (its turns go in order, each after the previous reply), and
    every repeat how its conversations arrived (`arrival_rate`, `arrival_seed`)."""
    frames = []
    for cell in table.itertuples(index=False):
        sent = pd.DataFrame(
            _sent(config, RunKey(cell.mode, str(cell.prefix_regime), int(cell.concurrency)))
        )
        measured = load_requests([cell.run_id], root)
        rows = measured.merge(sent, on="request_id", how="left", validate="many_to_one")
        if rows["prompt_ids"].isna().any():
            raise WorkloadError(
                f"run {cell.run_id} holds requests its configuration does not send: "
                "measure it again (force=True)"
            )
        frames.append(rows.assign(**_cell(cell), **_arrival_columns(config, rows)))
    return pd.concat(frames, ignore_index=True)


def recorded_cells(folder: Path) -> pd.DataFrame:
    """The cells a served comparison kept (`gpu-check --served` on another machine, say):
    its summary table `served/cells.csv` and the runs under `serving/`, each request as sent
    beside what the client measured, as `cell_requests` gives them. The benchmark's
    configuration is the one every run's manifest records (one, or a one-line error)."""
    import json

    folder = Path(folder)
    table = pd.read_csv(folder / "served" / "cells.csv", dtype={"prefix_regime": str})
    configs = {
        json.dumps(json.loads((folder / "serving" / run / "manifest.json").read_text())["config"])
        for run in table["run_id"]
    }
    if len(configs) != 1:
        raise WorkloadError(f"the runs under {folder / 'serving'} were not measured as one grid")
    fields = {
        name: tuple(value) if isinstance(value, list) else value
        for name, value in json.loads(configs.pop()).items()
    }
    return cell_requests(ServingBenchConfig(**fields), table, folder / "serving")


def _arrival_columns(config: ServingBenchConfig, rows: pd.DataFrame) -> dict[str, Any]:
    """How each repeat's conversations arrived: an open loop's rate per second and the seed
    of the repeat's Poisson schedule (NaN rate: a closed loop of clients)."""
    rate = math.nan if config.arrival_rate is None else float(config.arrival_rate)
    seeds = [arrival_seed(config, int(repeat)) for repeat in rows["repeat"]]
    return {"arrival_rate": rate, "arrival_seed": seeds}


def _sent(config: ServingBenchConfig, key: RunKey) -> list[dict[str, Any]]:
    """What one cell sends, as rows: synthetic requests, or ShareGPT conversations' turns."""
    if config.workload == "sharegpt":
        return _conversation_rows(config)
    return [
        {"request_id": s.request_id, "prompt_ids": list(s.prompt_ids), "max_tokens": s.max_tokens}
        for s in synthetic_specs(config, key)
    ]


def _conversation_rows(config: ServingBenchConfig) -> list[dict[str, Any]]:
    return [
        {
            "request_id": spec.request_id,
            "conversation": str(spec.group),
            "prompt_ids": list(spec.prompt_ids),
            "max_tokens": spec.max_tokens,
        }
        for conversation in sharegpt_specs(config).conversations
        for spec in conversation
    ]


def _cell(cell: Any) -> dict[str, Any]:
    """The cell's keys, and its server's own clocks over its measured requests (sums and
    counts over every repeat; NaN where the cell was measured before they were recorded)."""
    return {
        "mode": cell.mode,
        "prefix_regime": str(cell.prefix_regime),
        "concurrency": int(cell.concurrency),
        **{name: float(getattr(cell, name, math.nan)) for name in RECORDED_CLOCK_COLUMNS},
    }


def server_torch_threads() -> int:
    """The threads a vLLM server's model computes with on a CPU. The server runs the model in
    a worker process bound to the cores vLLM's own rule picks: the first NUMA node, one logical
    CPU per physical core on x86, and one core left to the engine core and the front end
    (`VLLM_CPU_OMP_THREADS_BIND` and `VLLM_CPU_NUM_OF_RESERVED_CPU` change it). The rule is
    asked, not copied; where vLLM binds nothing, or the model runs on a GPU, torch's own
    thread count."""
    from types import SimpleNamespace

    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return torch.get_num_threads()
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    one_rank = SimpleNamespace(
        parallel_config=SimpleNamespace(
            local_world_size=1, data_parallel_rank_local=None, _api_process_count=1
        ),
        kv_transfer_config=None,
    )
    cores = OMPProcessManager(one_rank).cpu_lists
    if cores:
        return len(cores[0])
    return torch.get_num_threads()


def synthetic_cells_to_predict(
    config: ServingBenchConfig,
    prefixes: Sequence[int],
    clients: Sequence[int],
    *,
    waves: int,
) -> pd.DataFrame:
    """The benchmark's workload at prefixes and client counts no server ran, both modes, as
    rows a clock can replay (nothing measured): each cell sends the benchmark's requests or
    `waves` rounds of its clients, whichever is more, so that it reaches a steady state."""
    rows = []
    for prefix in prefixes:
        for count in clients:
            cell_config = replace(config, requests=max(config.requests_at(count), waves * count))
            for mode in config.modes:
                key = RunKey(mode, str(prefix), int(count))
                for spec in synthetic_specs(cell_config, key):
                    rows.append(
                        {
                            "mode": mode,
                            "prefix_regime": str(prefix),
                            "concurrency": int(count),
                            "repeat": 0,
                            "request_id": spec.request_id,
                            "warmup": spec.warmup,
                            "prompt_ids": list(spec.prompt_ids),
                            "max_tokens": spec.max_tokens,
                        }
                    )
    return pd.DataFrame(rows)


def sharegpt_cells_to_predict(
    config: ServingBenchConfig, clients: Sequence[int], conversations: int | None
) -> pd.DataFrame:
    """The benchmark's ShareGPT conversations, cut and capped as it sends them, at client
    counts no server ran, both modes, closed loop, as rows a clock can replay (nothing
    measured): the trace's first `conversations` conversations, or with None every one the
    cut keeps (the whole multi-turn trace)."""
    if config.workload != "sharegpt":
        raise ValueError(
            f"conversations to predict need workload='sharegpt', not {config.workload!r}"
        )
    if conversations is not None and conversations < 1:
        raise ValueError(
            f"conversations to predict must be >= 1 (or None: all), got {conversations}"
        )
    closed = replace(config, requests=conversations or sys.maxsize, arrival_rate=None)
    sent = pd.DataFrame(_conversation_rows(closed))
    cells = [
        sent.assign(
            mode=mode,
            prefix_regime=closed.regimes()[0],
            concurrency=int(count),
            repeat=0,
            warmup=False,
        )
        for count in clients
        for mode in config.modes
    ]
    return pd.concat(cells, ignore_index=True)
