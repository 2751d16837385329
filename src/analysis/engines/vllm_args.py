"""The vLLM arguments both engines share, so that `replay` and `vllm` schedule alike.

`replay` builds its `VllmConfig` from exactly these `EngineArgs`; `vllm` passes them to
`vllm.LLM`. Two choices differ from vLLM's defaults, for both engines alike:

- `async_scheduling=False`: one `schedule()` and one `update_from_output()` per step, so a
  closed-loop client's next turn arrives at the same step boundary in both engines.
- `disable_log_stats=False`: the stat loggers (and so the exported counters) are on.

A registered shape (analysis.models.shapes, e.g. `llama-3.1-8b`) is a real architecture with
random weights: its folder is written on first use and vLLM loads it with `load_format="dummy"`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from analysis.engines.config import RunConfig
from analysis.models.local import vllm_dtype

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def resolve_model(config: RunConfig) -> str:
    """The model folder or name: the local random Llama (built on first use, in
    `config.dtype` or the dtype the CPU computes natively) by default, a registered shape's
    folder (analysis.models.shapes, written on first use) for a shape name."""
    from analysis.models import shapes as model_shapes

    if model_shapes.is_shape(config.model):
        return str(model_shapes.materialise(config.model))
    if config.model is not None:
        return config.model
    from analysis.models.local import TINY, ensure_random_llama

    return str(ensure_random_llama(TINY, config.dtype))


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
        "use_tqdm_on_load": False,  # no "Loading safetensors" bar in notebooks and logs
    }
    if config.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = config.max_num_batched_tokens
    fmt = kwargs_load_format(config, model)
    if fmt is not None:
        kwargs["load_format"] = fmt
    # vLLM's "auto" would run a float32 folder in bf16: give the folder's dtype (or the asked one).
    kwargs["dtype"] = config.dtype or vllm_dtype(model)
    return kwargs


def kwargs_load_format(config: RunConfig, model: str) -> str | None:
    """ "dummy" (random weights) for a registered shape, else None (vLLM's own default)."""
    from analysis.models.shapes import load_format

    return load_format(config.model) or load_format(model)


def weights_note(config: RunConfig, model: str) -> str:
    """What the manifest says about the weights the engine ran with."""
    if kwargs_load_format(config, model) is not None:
        return "random (registered shape, load_format='dummy')"
    if config.model is None:
        return "random (the local random-weight Llama)"
    return "loaded from the model"


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
    """Bytes of K and V for one block over all layers (None if the shape is unknown), in
    `dtype` when the engine casts the model, else in the dtype the folder was saved in."""
    shape = model_shape(model)
    if not shape:
        return None
    dtype_bytes = DTYPE_BYTES.get(dtype or shape["dtype"], 2)
    return (
        2
        * shape["num_layers"]
        * shape["num_kv_heads"]
        * shape["head_size"]
        * block_size
        * dtype_bytes
    )
