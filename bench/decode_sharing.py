"""Decodes over shared cached blocks against decodes over blocks of their own, on the real engine.

Replay's clock charges a decode step by the context tokens its decodes read (`decode_context`),
wherever those tokens live. With prefix caching, requests that share a prefix read the same KV
blocks; on a CPU those blocks stay in the processor's caches, and a step reads less memory.
Here the real CPU engine decodes the same number of requests over the same context lengths
twice: once sharing one cached prefix, once each with a prefix of its own. `shared / own` is
the ratio of the median decode step (only steps with every request decoding), each arm run
twice, interleaved, on one engine (`shared_engines`), with the torch threads the server's
worker computes with (`server_torch_threads`). The ratio is what a context-only step model
misses (notebook 08's many-client cells with a long cached prefix).
`BENCH_DECODE_REQUESTS` sets the requests decoding together (default 4).
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

PREFIX_TOKENS = 1024
SUFFIX_TOKENS = 32
OUTPUT_TOKENS = 64


def prompts_trace(requests: int, shared: bool, seed: int) -> pd.DataFrame:
    """`requests` single-turn requests of one 1024-token prefix (shared, or one each) and a
    unique 32-token suffix, each replying with 64 tokens."""
    from analysis.engines.synthetic import BOS_ID, TEXT_ID_LIMIT, _frame, _row

    rng = np.random.default_rng(seed)
    common = rng.integers(0, TEXT_ID_LIMIT, PREFIX_TOKENS)
    rows = []
    for i in range(requests):
        head = common if shared else rng.integers(0, TEXT_ID_LIMIT, PREFIX_TOKENS)
        tail = rng.integers(0, TEXT_ID_LIMIT, SUFFIX_TOKENS)
        prompt = np.concatenate([[BOS_ID], head, tail]).astype(np.int32)
        reply = rng.integers(0, TEXT_ID_LIMIT, OUTPUT_TOKENS).astype(np.int32)
        rows.append(_row(f"r{i}", 0, prompt, reply, i))
    return _frame(rows)


def main() -> dict[str, float]:
    import torch

    from analysis.engines.vllm_engine import shared_engines
    from analysis.runs import run
    from analysis.serving.replayable import server_torch_threads
    from analysis.timing.calibration import base_config

    requests = int(os.environ.get("BENCH_DECODE_REQUESTS", "4"))
    threads = server_torch_threads()
    torch.set_num_threads(threads)
    print(
        f"{requests} requests decoding together, {threads} torch thread(s) as the server's worker"
    )
    # the engine the clock is calibrated on, sized for these requests
    config = base_config("cpu", model="prefill-llama").with_(
        num_blocks=1024, max_model_len=2048, mode="batch"
    )
    medians: dict[str, list[float]] = {"shared": [], "own": []}
    with shared_engines():
        for repeat in (1, 2):
            for arm in medians:
                result = run(prompts_trace(requests, arm == "shared", repeat), config)
                steps = result.steps
                decoding = steps[
                    (steps["prefill_requests"] == 0) & (steps["sequences"] == requests)
                ]
                medians[arm].append(float(decoding["wall_s"].median()))
                print(
                    f"{arm:6s} prefix, run {repeat}: {len(decoding)} steps of {requests} decodes, "
                    f"median {medians[arm][-1] * 1e3:.2f} ms, "
                    f"{int(decoding['decode_context'].median())} context tokens read per step"
                )
    shared, own = np.median(medians["shared"]), np.median(medians["own"])
    return {f"decode step, {requests} requests: shared prefix / own prefix": shared / own}
