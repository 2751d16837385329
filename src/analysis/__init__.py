"""Prefix Cache Lab: measure and explain prefix caching in LLM serving.

Importing `analysis` stays light: vLLM and torch are imported lazily by the engines.
"""

import logging
import os
import warnings

# vLLM's own log handler prints every INFO line to stdout, which buries notebook outputs and
# changes on every run; without it, vLLM's warnings and errors still reach stderr. Set
# VLLM_CONFIGURE_LOGGING=1 to get vLLM's full logs back.
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

# Notebook kernels have no ipywidgets: tqdm.auto (imported by vLLM and huggingface_hub) would
# warn about it in every executed notebook (analysis.progress).
warnings.filterwarnings("ignore", message="IProgress not found")
# Ray (imported by vLLM) logs at INFO that ipywidgets is missing, once per notebook.
logging.getLogger("ray.widgets.util").setLevel(logging.WARNING)

__version__ = "0.1.0"
