"""Engines: two ways to drive vLLM's scheduler and KV cache manager over one workload.

- `replay`: vLLM's V1 Scheduler + KVCacheManager driven without a model (`replay.py`).
- `vllm`: the real `vllm.LLM` engine, on CPU with a local random-weight Llama or on a GPU
  with a model the user names (`vllm_engine.py`).

Both are fed the same `Workload` (`workload.py`), fill the same `Recorder` (`recorder.py`) and
give the tables of one `RunResult` (`result.py`), plain data that the metrics read.
`analysis.runs.run` is the one entry point over both.
Importing this package does not import vLLM or torch; the engines import them when run.
"""

from __future__ import annotations

from analysis.engines.config import ConfigError, RunConfig, validate
from analysis.engines.result import RunResult, is_complete

__all__ = ["ConfigError", "RunConfig", "RunResult", "is_complete", "validate"]
