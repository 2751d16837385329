"""Models: what vLLM loads, resolved once per run.

- `local`: small random-weight Llamas built here, with the real Llama 3.2 tokenizer and chat
  template, so the real engine runs offline on a CPU;
- `shapes`: real architectures (config.json only) that vLLM loads with random weights;
- `resolved`: `resolve_model(name, dtype)`, the one `ResolvedModel` every stage reads (folder,
  weights, dtype and why, KV bytes per token and per block).
"""

from __future__ import annotations

from analysis.models.resolved import ResolvedModel, resolve_model

__all__ = ["ResolvedModel", "resolve_model"]
