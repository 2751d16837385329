"""The vLLM arguments both engines share, so that `replay` and `vllm` schedule alike.

`replay` builds its `VllmConfig` from exactly these `EngineArgs`; `vllm` passes them to
`vllm.LLM`. Prefix caching is on unless the run turns it off (`RunConfig.prefix_caching`). Two
choices differ from vLLM's defaults, for both engines alike:

- `async_scheduling=False`: one `schedule()` and one `update_from_output()` per step, so a
  closed-loop client's next turn arrives at the same step boundary in both engines.
- `disable_log_stats=False`: the stat loggers (and so the exported counters) are on.

A registered shape (analysis.models.shapes, e.g. `llama-3.1-8b`) is a real architecture with
random weights: its folder is written on first use and vLLM loads it with `load_format="dummy"`.
"""

from __future__ import annotations

from typing import Any

from analysis.engines.config import RunConfig
from analysis.models.resolved import ResolvedModel, resolve_model

# Settings both engines always take (the rest comes from the RunConfig).
SHARED_SETTINGS: dict[str, Any] = {
    "enforce_eager": True,
    "async_scheduling": False,
    "disable_log_stats": False,
}


def config_model(config: RunConfig) -> ResolvedModel:
    """The run's model, resolved (once per run: the runner hands it to the engine)."""
    return resolve_model(config.model, config.dtype)


def engine_kwargs(config: RunConfig, model: ResolvedModel) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": model.path,
        "block_size": config.block_size,
        "num_gpu_blocks_override": config.num_blocks,
        "max_model_len": config.max_model_len,
        "max_num_seqs": config.max_num_seqs,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        **SHARED_SETTINGS,
        "enable_prefix_caching": config.prefix_caching,
        "prefix_caching_hash_algo": config.hash_algo,
        "seed": config.seed,
        "use_tqdm_on_load": False,  # no "Loading safetensors" bar in notebooks and logs
    }
    if config.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = config.max_num_batched_tokens
    if model.load_format is not None:
        kwargs["load_format"] = model.load_format
    # vLLM's "auto" would run a float32 folder in bf16: the resolved model says which dtype.
    kwargs["dtype"] = model.dtype
    return kwargs
