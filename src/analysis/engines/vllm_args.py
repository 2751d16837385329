"""The vLLM arguments both engines share, so that `replay` and `vllm` schedule alike.

`replay` builds its `VllmConfig` from exactly these `EngineArgs`; `vllm` passes them to
`vllm.LLM`. Two choices differ from vLLM's defaults, for both engines alike:

- `async_scheduling=False`: one `schedule()` and one `update_from_output()` per step, so a
  closed-loop client's next turn arrives at the same step boundary in both engines.
- `disable_log_stats=False`: the stat loggers (and so the exported counters) are on.
- `use_tqdm_on_load=False`: no weight-loading bar in the notebooks' outputs.

The dtype is always passed: vLLM's "auto" would run a float32 folder in bf16 on any x86 CPU,
~150x slower where bf16 is not native.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from analysis.engines.config import RunConfig

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# What vLLM is told when a named model runs without --dtype: its own choice.
AUTO = "auto"


def dtype_choice(config: RunConfig) -> dict[str, str]:
    """The dtype the run asks vLLM for, and why: --dtype, else by capability for the local
    model, else vLLM's own choice for a named model."""
    from analysis.hardware import choose_dtype

    if config.dtype is None and config.model is not None:
        return {"dtype": AUTO, "reason": "a named model without --dtype: vLLM's choice"}
    return choose_dtype(config.dtype, config.device).to_dict()


def resolve_model(config: RunConfig) -> str:
    """The model folder or name: the local random Llama (built on first use) by default."""
    if config.model is not None:
        return config.model
    from analysis.models import TINY, ensure_random_llama

    return str(ensure_random_llama(TINY, dtype_choice(config)["dtype"]))


def model_dtype(config: RunConfig, model: str) -> str:
    """The dtype vLLM runs the model in: --dtype, else the local folder's, else "auto"."""
    if config.dtype is not None:
        return config.dtype
    if config.model is None:
        from analysis.models import built_dtype

        return built_dtype(model) or AUTO
    return AUTO


def engine_kwargs(config: RunConfig, model: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": model,
        "block_size": config.block_size,
        "num_gpu_blocks_override": config.num_blocks,
        "max_model_len": config.max_model_len,
        "max_num_seqs": config.max_num_seqs,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "enable_prefix_caching": True,
        "prefix_caching_hash_algo": config.hash_algo,
        "enforce_eager": True,
        "seed": config.seed,
        "async_scheduling": False,
        "disable_log_stats": False,
        "use_tqdm_on_load": False,  # a bar per load: noise in notebooks, instant for small models
        "dtype": model_dtype(config, model),
    }
    if config.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = config.max_num_batched_tokens
    return kwargs


def model_shape(model: str) -> dict[str, Any]:
    """Layers, KV heads, head size and dtype from a local model's config.json."""
    path = Path(model) / "config.json"
    if not path.exists():
        return {}
    cfg = json.loads(path.read_text())
    heads = int(cfg["num_attention_heads"])
    return {
        "num_layers": int(cfg["num_hidden_layers"]),
        "num_kv_heads": int(cfg.get("num_key_value_heads", heads)),
        "head_size": int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        "dtype": str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
    }


def kv_bytes_per_block(model: str, block_size: int, dtype: str | None = None) -> int | None:
    """Bytes of K and V for one block over all layers (None if the shape is unknown).

    `dtype`: the dtype the engine runs in; None or "auto": the one in the model's config.
    """
    shape = model_shape(model)
    if not shape:
        return None
    used = shape["dtype"] if dtype in (None, AUTO) else dtype
    dtype_bytes = DTYPE_BYTES.get(used, 2)
    return (
        2
        * shape["num_layers"]
        * shape["num_kv_heads"]
        * shape["head_size"]
        * block_size
        * (dtype_bytes)
    )
