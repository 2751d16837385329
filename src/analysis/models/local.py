"""Small random-weight Llama models built locally, so the real vLLM engine runs offline on a CPU.

Prefix caching does not depend on the weights: a random model with the real Llama 3.2 tokenizer
and chat template exercises exactly the scheduler and KV cache manager a trained one would.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from analysis.data.chat_template import DEFAULT as DEFAULT_TEMPLATE
from analysis.data.tokenizer import tokenizer_dir
from analysis.platform.manifest import lock_beside
from analysis.platform.paths import cache_dir


@dataclass(frozen=True)
class RandomLlamaSpec:
    """Shape of a random-weight Llama. The defaults give ~34 M parameters (engine accounting)."""

    name: str = "tiny-llama"
    hidden_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 8192
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


TINY = RandomLlamaSpec()
# Big enough that prefill dominates a CPU step (~150 M parameters): for timing experiments.
PREFILL_BOUND = RandomLlamaSpec(
    name="prefill-llama",
    hidden_size=768,
    num_hidden_layers=8,
    num_attention_heads=12,
    num_key_value_heads=12,
    intermediate_size=2048,
)


def model_dir(spec: RandomLlamaSpec) -> Path:
    return cache_dir() / "models" / spec.name


def ensure_random_llama(spec: RandomLlamaSpec = TINY, dtype: str | None = None) -> Path:
    """Build the model folder on first use (a few seconds) and return it; later calls reuse it.

    `dtype` None: $PREFIX_CACHE_LAB_DTYPE, else bf16 where the CPU computes it natively and
    float32 elsewhere (`analysis.platform.hardware.choose_dtype`). The dtype and the chat template
    are part of the folder's stamp, so a folder built otherwise is rebuilt.
    """
    from analysis.platform.hardware import choose_dtype

    chosen = choose_dtype(dtype).dtype
    target = model_dir(spec)
    stamp = target / "spec.json"
    wanted = folder_stamp(spec, chosen)
    if _stamped(stamp, wanted):
        return target
    with lock_beside(target):  # sweep workers and notebooks may ask for it at the same time
        if not _stamped(stamp, wanted):  # another process may have built it meanwhile
            _build_random_llama(spec, chosen, target, wanted)
    return target


def _stamped(stamp: Path, wanted: dict) -> bool:
    return stamp.exists() and json.loads(stamp.read_text()) == wanted


def _build_random_llama(spec: RandomLlamaSpec, chosen: str, target: Path, wanted: dict) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    vocab = json.loads((tokenizer_dir() / "tokenizer.json").read_text())
    vocab_size = len(vocab["model"]["vocab"]) + len(vocab["added_tokens"])
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=128000,
        eos_token_id=128009,
        tie_word_embeddings=True,
        torch_dtype=chosen,
    )
    model = LlamaForCausalLM(config).to(getattr(torch, chosen))
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    with _no_progress_bars():
        model.save_pretrained(staging, safe_serialization=True)
    shutil.copy(tokenizer_dir() / "tokenizer.json", staging / "tokenizer.json")
    tok_config = json.loads((tokenizer_dir() / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = DEFAULT_TEMPLATE.engine_jinja()
    tok_config["model_max_length"] = spec.max_position_embeddings
    (staging / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (staging / "spec.json").write_text(json.dumps(wanted, indent=2))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers' "Writing model shards" bar, off unless a terminal shows it."""
    from transformers.utils import logging as hf_logging

    from analysis.platform.progress import interactive

    was_enabled = hf_logging.is_progress_bar_enabled()
    if not interactive():
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def folder_stamp(spec: RandomLlamaSpec, dtype: str) -> dict:
    """What a built folder must match to be reused: the shape, the dtype, the chat template."""
    template = hashlib.sha256(DEFAULT_TEMPLATE.engine_jinja().encode()).hexdigest()[:16]
    return {**asdict(spec), "dtype": dtype, "chat_template_sha256": template}


def folder_dtype(model: str | Path) -> str | None:
    """The dtype a local model folder was saved in (None: not a local folder)."""
    path = Path(model) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    return config.get("torch_dtype") or config.get("dtype")


def parameter_count(spec: RandomLlamaSpec, vocab_size: int = 128_256) -> int:
    """Parameters of a spec (tied embeddings), to size timing models without building them."""
    h, i, n = spec.hidden_size, spec.intermediate_size, spec.num_hidden_layers
    kv = spec.num_key_value_heads * spec.head_dim
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h
    return vocab_size * h + n * per_layer + h
