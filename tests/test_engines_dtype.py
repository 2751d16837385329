"""Prefix caching does not depend on the dtype: the real CPU engine in float32 (what an
AVX2-only CPU runs) counts exactly what replay counts, and what the engine counts in bf16.

The engine really runs in float32 (vLLM's "auto" would turn a float32 folder into bf16 on an
x86 CPU): the resolved settings and the manifest say so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.engines import RunConfig, RunResult, run
from analysis.engines.synthetic import synthetic_trace
from analysis.hardware import machine_facts

pytestmark = pytest.mark.engine

CONFIG = RunConfig(
    trace="test",
    engine="vllm",
    block_size=32,
    max_model_len=1024,
    max_output_tokens=16,
    mode="closed-loop",
    concurrency=3,
    num_blocks=48,
)


@pytest.fixture(scope="module")
def trace() -> pd.DataFrame:
    return synthetic_trace(
        seed=5,
        num_conversations=6,
        turns=(2, 3),
        user_tokens=(20, 120),
        shared_prefix=64,
        reply_tokens=(10, 40),
    )


@pytest.fixture(scope="module")
def real_float32(trace: pd.DataFrame) -> RunResult:
    return run(trace, CONFIG.with_(dtype="float32"), progress=False)


def counts(result: RunResult) -> dict:
    return {
        "summary": {k: result.summary[k] for k in ("first_prefill", "all_prefill", "preemptions")},
        "exported": result.counters["exported"],
        "prefix_cache_stats": result.counters["prefix_cache_stats"],
        "cached_tokens": result.requests["cached_tokens"].tolist(),
    }


def test_float32_engine_runs_in_float32_and_equals_replay(trace, real_float32):
    real = real_float32
    assert real.manifest["engine"]["resolved"]["dtype"] == "float32"
    assert real.manifest["dtype"] == {
        "dtype": "float32",
        "reason": "asked for explicitly (--dtype)",
    }
    assert real.manifest["machine"]["cpu_capability"] == machine_facts().cpu_capability
    assert real.summary["requests_finished"] == len(trace)
    assert real.summary["first_prefill"]["hits"] > 0
    replayed = run(trace, CONFIG.with_(dtype="float32", engine="replay"), progress=False)
    assert counts(real) == counts(replayed)
    pd.testing.assert_frame_equal(
        real.admissions.drop(columns=["time_s"]), replayed.admissions.drop(columns=["time_s"])
    )
    assert real.manifest["engine"]["resolved"] == replayed.manifest["engine"]["resolved"]
    assert real.manifest["engine"]["num_cached_tokens_mismatches"] == 0


@pytest.mark.skipif(
    not machine_facts().native_bf16, reason="bf16 is ~150x slower than float32 on this CPU"
)
def test_bf16_and_float32_engines_count_the_same(trace, real_float32):
    narrow = run(trace, CONFIG.with_(dtype="bfloat16"), progress=False)
    assert narrow.manifest["engine"]["resolved"]["dtype"] == "bfloat16"
    assert counts(narrow) == counts(real_float32)
    np.testing.assert_array_equal(
        narrow.requests["output_tokens"].to_numpy(),
        real_float32.requests["output_tokens"].to_numpy(),
    )
