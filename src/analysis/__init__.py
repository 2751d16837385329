"""Prefix Cache Lab: measure and explain prefix caching in LLM serving.

Importing `analysis` stays light: vLLM and torch are imported lazily by the engines.
"""

import os

# vLLM's own log handler prints every INFO line to stdout, which buries notebook outputs and
# changes on every run; without it, vLLM's warnings and errors still reach stderr. Set
# VLLM_CONFIGURE_LOGGING=1 to get vLLM's full logs back.
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

__version__ = "0.1.0"
