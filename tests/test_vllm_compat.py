"""The llvmlite guard: after numba is loaded, vLLM's module scan must not trip on ffi.lib."""

from __future__ import annotations

import sys

import pytest

from analysis.platform.vllm_compat import guard_llvmlite_against_vllm_scan


def test_guard_makes_llvmlite_lib_refuse_dunder_attributes():
    pytest.importorskip("numba")
    import llvmlite.binding.ffi  # noqa: F401  (numba loads it too)

    lib = vars(sys.modules["llvmlite.binding.ffi"])["lib"]
    guard_llvmlite_against_vllm_scan()
    guard_llvmlite_against_vllm_scan()  # idempotent
    assert not hasattr(lib, "__dict__")  # what vLLM's scan asks before calling vars()
    assert callable(lib.LLVMPY_GetProcessTriple)  # ordinary lookups still work
