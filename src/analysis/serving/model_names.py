"""Which model a serving benchmark runs: `--model` resolved to a local folder or hub name, the
name the server answers to, and what of the model goes into a run id.

A module of its own because the server, the benchmark and the offline sweep all name models
the same way, and none of them should have to import another for it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from analysis.models import resolved

# Random-weight Llamas that `--model` may name; the first is the CPU default.
DEFAULT_CPU_MODEL = "prefill-llama"
BUILTIN_MODELS = (
    DEFAULT_CPU_MODEL,
    *(n for n in resolved.BUILTIN_MODELS if n != DEFAULT_CPU_MODEL),
)


def resolve_model(model: str | None) -> str:
    """A local folder or hub name for vLLM (`analysis.models.resolve_model`'s path). None or a
    built-in name builds (once) a random-weight Llama with the real tokenizer: `prefill-llama`
    (~155 M parameters, prefill dominates a CPU step, the default here) or `tiny-llama` (~34 M,
    for quick checks). A registered shape name (`llama-3.1-8b`, ...) gives its folder, loaded
    with random weights; a hub name is left for vLLM to resolve."""
    return resolved.resolve_model(model, default=DEFAULT_CPU_MODEL).path


def served_name(model: str) -> str:
    path = Path(model)
    return path.name if path.exists() else model


def model_identity(model: str) -> dict[str, str]:
    """What identifies a model in a run id: its name, and for a local folder its config's hash."""
    identity = {"model": served_name(model)}
    for name in ("spec.json", "config.json"):
        candidate = Path(model) / name
        if candidate.is_file():
            identity[name] = hashlib.sha256(candidate.read_bytes()).hexdigest()[:16]
    return identity
