"""vLLM's start-up chatter goes to a log file, not into the notebooks.

Every in-process engine start prints a dozen warnings that say nothing about the experiment
(no Triton, NUMA binding, LD_PRELOAD advice, the global seed, ...). In an executed notebook
they are the first thing a reader sees, and they differ from machine to machine. They are
kept, in full and from INFO up, in `data/cache/logs/vllm.log`; errors still reach stderr, and
a failed start still raises. `VLLM_CONFIGURE_LOGGING=1` gives vLLM its own handlers back.

Torch's C++ warnings (the `[W... utils.cpp] Warning: NUMA binding` line) bypass Python
logging: `import analysis` sets `TORCH_CPP_LOG_LEVEL=ERROR` before torch loads.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from analysis.platform.paths import cache_dir

# vLLM's loggers, and torch's "Triton not available" notice that vLLM's CPU start triggers.
LOGGERS = ("vllm", "torch._library.triton")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_path() -> Path:
    return cache_dir() / "logs" / "vllm.log"


def _ours(handler: logging.Handler) -> bool:
    return getattr(handler, "prefix_cache_lab", False)


def route_vllm_logs() -> Path | None:
    """Send vLLM's log records to `log_path()` (errors also to stderr); idempotent. Returns
    the log file, or None when vLLM configures its own logging."""
    if os.environ.get("VLLM_CONFIGURE_LOGGING") == "1":
        return None
    path = log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in LOGGERS:
        _route(logging.getLogger(name), path)
    return path


def _route(logger: logging.Logger, path: Path) -> None:
    if any(_ours(h) for h in logger.handlers):
        return
    to_file = logging.FileHandler(path, encoding="utf-8", delay=True)
    to_file.setFormatter(logging.Formatter(FORMAT))
    to_stderr = logging.StreamHandler()
    to_stderr.setLevel(logging.ERROR)
    to_stderr.setFormatter(logging.Formatter("vLLM %(levelname)s: %(message)s"))
    for handler in (to_file, to_stderr):
        handler.prefix_cache_lab = True
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
