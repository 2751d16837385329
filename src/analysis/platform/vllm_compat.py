"""Workarounds for vLLM 0.32 bugs that this project runs into, each with the reason.

vLLM's kernel registry (`vllm.triton_utils.dispatcher`) scans every loaded module at engine
start and calls `vars()` on every attribute that seems to have a `__dict__`. llvmlite's
`binding.ffi.lib` (loaded with numba, which `analysis.metrics.bounds` uses) answers *any* attribute,
`__dict__` included, through `__getattr__`, so the scan fails with "'_lib_fn_wrapper' object
has no attribute 'get'" whenever bounds ran earlier in the same process (a notebook, a test
session). Making that `__getattr__` refuse dunder names restores plain Python behaviour.
"""

from __future__ import annotations

import sys


def guard_llvmlite_against_vllm_scan() -> None:
    """Make llvmlite's lazy library object refuse dunder attributes (idempotent)."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    lib = vars(ffi).get("lib") if ffi is not None else None
    if lib is None:
        return
    wrapper_class = type(lib)
    original = wrapper_class.__dict__.get("__getattr__")
    if original is None or getattr(original, "dunder_safe", False):
        return

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return original(self, name)

    __getattr__.dunder_safe = True
    wrapper_class.__getattr__ = __getattr__


def before_engine_start() -> None:
    """Everything to do before creating a vLLM engine in this process."""
    guard_llvmlite_against_vllm_scan()
