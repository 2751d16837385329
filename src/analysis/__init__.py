"""Prefix Cache Lab: measure and explain prefix caching in LLM serving.

Importing `analysis` stays light: vLLM and torch are imported lazily by the engines.
"""

import logging
import os
import warnings

# vLLM's own log handler prints every INFO line to stdout, which buries notebook outputs and
# changes on every run; analysis.platform.engine_logs keeps that log in a file instead. Set
# VLLM_CONFIGURE_LOGGING=1 to get vLLM's own handlers back.
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
# Torch's C++ warnings (e.g. vLLM's CPU "NUMA binding" notice) print straight to stderr, past
# Python logging; errors still do (analysis.platform.engine_logs keeps vLLM's own log in a file).
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

# Notebook kernels have no ipywidgets: tqdm.auto (imported by vLLM and huggingface_hub) would
# warn about it in every executed notebook (analysis.platform.progress).
warnings.filterwarnings("ignore", message="IProgress not found")
# Ray (imported by vLLM) logs at INFO that ipywidgets is missing, once per notebook.
logging.getLogger("ray.widgets.util").setLevel(logging.WARNING)
# vLLM 0.32's kernel registry touches a deprecated torch attribute at every engine start.
warnings.filterwarnings("ignore", message="`torch.distributed.reduce_op` is deprecated")

# vLLM's warnings at import and engine start go to data/cache/logs/vllm.log
# (analysis.platform.engine_logs).
from analysis.platform.engine_logs import route_vllm_logs  # noqa: E402

route_vllm_logs()

__version__ = "0.1.0"
