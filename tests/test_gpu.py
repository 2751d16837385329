"""The real CUDA engine, where a GPU is visible: recorded outputs under the model runner vLLM
resolves (Model Runner V2 by default: trace replay), a registered shape with random weights, and
the same counts as `replay`. Skipped, with the reason, on machines without CUDA."""

from __future__ import annotations

import pytest

from analysis.engines import RunConfig
from analysis.engines.synthetic import synthetic_trace
from analysis.runs import run


def _cuda_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(not _cuda_visible(), reason="no CUDA GPU visible (torch.cuda)"),
]


def test_recorded_outputs_on_the_gpu_engine_count_like_replay():
    trace = synthetic_trace(num_conversations=8, turns=(1, 3), user_tokens=(40, 200), seed=5)
    config = RunConfig(
        trace="gpu-test",
        engine="vllm",
        device="cuda",
        model="llama-3.2-1b",
        block_size=16,
        num_blocks=80,  # vLLM's minimum at 1024 tokens is 65: some preemption
        max_model_len=1024,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        mode="closed-loop",
        concurrency=4,
    )
    real = run(trace, config, progress=False)
    replayed = run(trace, config.with_(engine="replay"), progress=False)
    engine = real.manifest["engine"]
    expected = "trace-replay" if engine["model_runner"] == "v2" else "logits-processor"
    assert engine["forcing"] == expected
    assert engine["forced_output_mismatches"] == 0
    assert engine["load_format"] == "dummy" and "random" in engine["weights"]
    for key in ("first_prefill", "all_prefill", "preemptions", "readmissions"):
        assert real.summary[key] == replayed.summary[key], key
