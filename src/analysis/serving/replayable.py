"""What a benchmark cell sent, beside what the server measured: rows a clock can replay.

A synthetic cell's prompts are deterministic, so they are rebuilt from its configuration and
joined to the per-request records of every repeat. `scheduler_limits` names the batch limits
the server ran with (vLLM's own defaults for an API server where the configuration left them
unset), so that whatever replays a cell schedules it under the same limits.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis.platform.errors import WorkloadError
from analysis.serving.bench_config import RunKey, ServingBenchConfig
from analysis.serving.bench_run import synthetic_specs
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
    context and batch limits."""
    return {
        "model": config.model or DEFAULT_CPU_MODEL,
        "block_size": config.block_size,
        "max_model_len": config.max_model_len,
        **scheduler_limits(config),
    }


def synthetic_cell_requests(config: ServingBenchConfig, table: pd.DataFrame) -> pd.DataFrame:
    """Every request of every repeat of the synthetic cells in `table` (the summary table of
    `run_serving_bench`): its prompt ids and reply length as sent, and what the client measured
    (`start_s`, `ttft_s`, `e2e_s`, `tpot_s`, `status`, `warmup`)."""
    if config.workload != "synthetic":
        raise WorkloadError(
            f"only synthetic cells are rebuilt from their config, not {config.workload!r}"
        )
    frames = []
    for cell in table.itertuples(index=False):
        key = RunKey(cell.mode, str(cell.prefix_regime), int(cell.concurrency))
        sent = pd.DataFrame(
            [
                {
                    "request_id": s.request_id,
                    "prompt_ids": list(s.prompt_ids),
                    "max_tokens": s.max_tokens,
                }
                for s in synthetic_specs(config, key)
            ]
        )
        measured = load_requests([cell.run_id])
        rows = measured.merge(sent, on="request_id", how="left", validate="many_to_one")
        if rows["prompt_ids"].isna().any():
            raise WorkloadError(
                f"run {cell.run_id} holds requests its configuration does not send: "
                "measure it again (force=True)"
            )
        frames.append(rows.assign(**_cell(cell)))
    return pd.concat(frames, ignore_index=True)


def _cell(cell: Any) -> dict[str, Any]:
    return {
        "mode": cell.mode,
        "prefix_regime": str(cell.prefix_regime),
        "concurrency": int(cell.concurrency),
    }


def server_torch_threads() -> int:
    """The torch threads a vLLM server's engine computes with: one for serving (vLLM lowers
    torch to one thread in its engine process), unless OMP_NUM_THREADS says otherwise."""
    import os

    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1
