"""One model, resolved once per run: every fact about it that an engine, server or manifest reads.

A model name travels through the project as a string (`RunConfig.model`, `--model`), and
several things follow from it: the folder vLLM loads (a local random Llama built on first use,
a registered shape's folder, a user's folder or a hub name), whether its weights are random
(`load_format="dummy"`), the dtype vLLM is given and why, and the bytes of KV cache a token and
a block take. They are decided here, in one function, and handed down as a `ResolvedModel`, so
that the engines, the servers, the KV-pool arithmetic and the manifest cannot disagree.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from analysis.models import local, shapes
from analysis.platform.errors import ConfigError
from analysis.platform.hardware import choose_dtype, machine

# The local random-weight Llamas, by the names `--model` accepts.
BUILTIN_MODELS = {"tiny-llama": local.TINY, "prefill-llama": local.PREFILL_BOUND}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
FOLDER_REASON = "the folder's own (config.json): vLLM's 'auto' would cast a float32 one to bf16"
HUB_REASON = "the named model's own (vLLM dtype=auto)"


@dataclass(frozen=True)
class ResolvedModel:
    """What one run's model is (see the module doc)."""

    asked: str | None  # the name as given (None: the default local model)
    path: str  # the folder (or hub name) vLLM loads
    weights: str  # "registered shape", "local random" or "model"
    load_format: str | None  # "dummy" (random weights) for a registered shape, else vLLM's
    dtype: str  # the dtype vLLM is given ("auto": the checkpoint's own)
    dtype_reason: str
    folder_dtype: str | None  # the dtype the folder was saved in (None: not a local folder)
    num_layers: int | None = None  # from config.json; None for a hub name
    num_kv_heads: int | None = None
    head_size: int | None = None

    @property
    def shape_known(self) -> bool:
        return self.num_layers is not None

    @property
    def kv_dtype(self) -> str:
        """The dtype the KV cache is stored in: vLLM's dtype, or the checkpoint's under 'auto'."""
        if self.dtype != "auto":
            return self.dtype
        return self.folder_dtype or "bfloat16"

    @property
    def kv_value_bytes(self) -> int:
        """Bytes of one value in the KV cache."""
        return DTYPE_BYTES.get(self.kv_dtype, 2)

    def kv_bytes_per_token(self) -> int | None:
        """Bytes of K and V for one token over all layers (None if the shape is unknown)."""
        if not self.shape_known:
            return None
        return 2 * self.num_layers * self.num_kv_heads * self.head_size * self.kv_value_bytes

    def kv_bytes_per_block(self, block_size: int) -> int | None:
        per_token = self.kv_bytes_per_token()
        return None if per_token is None else per_token * block_size

    def weights_note(self) -> str:
        """What the manifest says about the weights the engine ran with."""
        return {
            "registered shape": "random (registered shape, load_format='dummy')",
            "local random": "random (the local random-weight Llama)",
        }.get(self.weights, "loaded from the model")

    def dtype_facts(self) -> dict[str, Any]:
        """The manifest's `dtype` entry: the dtype vLLM ran, why, and the folder's own."""
        return {
            "dtype": self.dtype,
            "reason": self.dtype_reason,
            "model_folder_dtype": self.folder_dtype,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_model(
    name: str | None, dtype: str | None = None, *, default: str = "tiny-llama"
) -> ResolvedModel:
    """Resolve `name` once: a built-in local model (built on first use, in `dtype` or the dtype
    the machine computes natively), a registered shape (its folder, random weights), a local
    folder, or a hub name (vLLM resolves it: it needs a network or a filled cache). `dtype`
    forces the dtype vLLM is given; `default` is the built-in used when `name` is None. A name
    that can be none of these is a ConfigError here, before any engine starts."""
    builtin = BUILTIN_MODELS.get(default if name is None else name)
    if builtin is not None:
        path = str(local.ensure_random_llama(builtin, dtype))
    elif shapes.is_shape(name):
        path = str(shapes.materialise(name))
    else:
        path = _folder_or_hub_name(name)
    load_format = shapes.load_format(name) or shapes.load_format(path)
    if builtin is not None:
        weights = "local random"
    else:
        weights = "registered shape" if load_format else "model"
    folder_dtype = local.folder_dtype(path)
    vllm_dtype, reason = _vllm_dtype(dtype, weights, folder_dtype)
    return ResolvedModel(
        asked=name,
        path=path,
        weights=weights,
        load_format=load_format,
        dtype=vllm_dtype,
        dtype_reason=reason,
        folder_dtype=folder_dtype,
        **_shape(path),
    )


def _folder_or_hub_name(name: str) -> str:
    """A local folder (its absolute path) or a hub name vLLM can load, else a ConfigError that
    lists the choices (vLLM would find out only after seconds, with a hub traceback)."""
    folder = Path(name).expanduser()
    if folder.exists():
        return str(folder.resolve())
    if not _hub_name(name):
        where, fix = "a hub name ('org/name')", "give a folder that exists"
    elif _hub_cached(name) or not _hub_offline():
        return name  # cached, or downloaded by vLLM
    else:
        where = "a hub model in the local cache (HF_HUB_OFFLINE is set)"
        fix = "fetch the hub model once with HF_HUB_OFFLINE=0"
    raise ConfigError(
        f"model {name!r} is neither a built-in ({', '.join(BUILTIN_MODELS)}), a registered shape "
        f"({', '.join(shapes.SHAPES)}), an existing folder, nor {where}: name one of those, "
        f"or {fix}"
    )


def _hub_name(name: str) -> bool:
    """Whether `name` has the form of a hub repository id ('org/name' or 'name')."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _hub_cached(name: str) -> bool:
    """Whether the local Hugging Face cache holds the model's config.json."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE, read now (the Makefile sets it; huggingface_hub reads it at import)."""
    return (os.environ.get("HF_HUB_OFFLINE") or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _vllm_dtype(asked: str | None, weights: str, folder_dtype: str | None) -> tuple[str, str]:
    """The dtype to give vLLM, and why.

    Asked for: that one. Random weights (a local random Llama, a registered shape): the
    machine's choice. Where the engine's device computes no bf16 (an AVX2 CPU), float32 for
    every model: vLLM would run a bf16 checkpoint there emulated, ~100x slower, and its CPU
    attention kernels stop the process (SIGILL). Otherwise a folder's own dtype, else "auto".
    """
    facts = machine()
    choice = choose_dtype(asked, facts=facts)
    if asked is not None or weights != "model":
        return choice.dtype, choice.reason
    if choice.dtype == "float32" and not facts.cuda:
        return choice.dtype, choice.reason
    if folder_dtype is not None:
        return folder_dtype, FOLDER_REASON
    return "auto", HUB_REASON


def _shape(path: str) -> dict[str, int]:
    """Layers, KV heads and head size from a local folder's config.json ({} for a hub name)."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return {}
    config = json.loads(config_file.read_text())
    heads = int(config["num_attention_heads"])
    return {
        "num_layers": int(config["num_hidden_layers"]),
        "num_kv_heads": int(config.get("num_key_value_heads", heads)),
        "head_size": int(config.get("head_dim") or config["hidden_size"] // heads),
    }
