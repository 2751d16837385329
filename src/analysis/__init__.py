"""Prefix Cache Lab: measure and explain prefix caching in LLM serving.

Importing `analysis` stays light: vLLM and torch are imported lazily by the engines.
"""

import os
import warnings

# vLLM's own log handler prints every INFO line to stdout, which buries notebook outputs and
# changes on every run; without it, vLLM's warnings and errors still reach stderr. Set
# VLLM_CONFIGURE_LOGGING=1 to get vLLM's full logs back.
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
# tqdm.auto (vLLM imports it) warns in a Jupyter kernel without ipywidgets; the package shows
# bars only on a terminal (analysis.progress), so in an executed notebook it is only noise.
warnings.filterwarnings("ignore", message="IProgress not found")

__version__ = "0.1.0"
