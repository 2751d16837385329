"""Engines: one interface, `run(trace, config) -> RunResult`, two engines.

- `replay`: vLLM's V1 Scheduler + KVCacheManager driven without a model (`replay.py`).
- `vllm`: the real `vllm.LLM` engine, on CPU with a local random-weight Llama or on a GPU
  with a model the user names (`vllm_engine.py`).

Both feed the same `Recorder` (`recorder.py`) and give the same `RunResult` (`result.py`).
Importing this package does not import vLLM or torch; the engines import them when run.
"""

from __future__ import annotations

from analysis.engines.config import ConfigError, RunConfig, validate
from analysis.engines.result import RunResult, is_complete
from analysis.engines.runner import config_id_for, run, run_and_write

__all__ = [
    "ConfigError",
    "RunConfig",
    "RunResult",
    "config_id_for",
    "is_complete",
    "run",
    "run_and_write",
    "validate",
]
