"""Tests that a mutation audit found missing: each one fails when the named defect is put back.

1. a sweep result folder without its manifest counted as finished (`sweeps.is_done`);
2. the token-vs-block reuse table of a block-hash trace averaged per request, not per token;
3. the bf16 probe reading a CPU flag that torch lists as absent;
4. the predicted hit rate of a ShareGPT serving run forced to 0;
5. the sweep's ideal computed without the cached (recorded) replies;
6. vLLM's logged window of the last 1000 requests off by one at its boundary.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import sweeps
from analysis.data.blockhash import load_blockhash_trace
from analysis.data.traces import write_trace
from analysis.engines import RunConfig
from analysis.engines.synthetic import synthetic_trace
from analysis.metrics import bounds, hitrates, oracles
from analysis.platform import hardware

DATA = Path(__file__).parent / "data"


def test_a_result_folder_without_its_manifest_is_not_done(tmp_path: Path) -> None:
    """A run killed before its manifest leaves tables behind; resuming must run it again."""
    trace = tmp_path / "tiny.parquet"
    write_trace(trace, synthetic_trace(2))
    point = sweeps.Point("capacity", RunConfig(trace=str(trace)))
    folder = sweeps.result_folder(point, tmp_path)
    folder.mkdir(parents=True)
    pd.DataFrame({"tokens_hit": [0]}).to_parquet(folder / "admissions.parquet")
    assert not sweeps.is_done(point, folder)
    (folder / "manifest.json").write_text("{}")
    assert sweeps.is_done(point, folder)


def blockhash_ideal(frame: pd.DataFrame, base: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(hit tokens, prompt tokens) per request of a block-hash trace with an infinite cache, by
    brute force over prefix tuples of hash ids (`size` a multiple of the trace's `base`)."""
    per_block = size // base
    seen: set[tuple[int, ...]] = set()
    hits = []
    for ids, length in zip(frame["hash_ids"], frame["input_length"], strict=True):
        ids = tuple(int(i) for i in ids)
        full = min(len(ids) // per_block, int(length) // size)
        keys = [ids[: (j + 1) * per_block] for j in range(full)]
        hit = 0
        for key in keys[: (int(length) - 1) // size]:
            if key not in seen:
                break
            hit += 1
        hits.append(hit * size)
        seen.update(keys)
    return np.asarray(hits), frame["input_length"].to_numpy()


@pytest.mark.parametrize(
    ("name", "base", "sizes"),
    [("blockhash_mooncake.jsonl", 512, [512, 1024, 2048]), ("blockhash_qwen.jsonl", 16, [16, 32])],
)
def test_blockhash_reuse_table_weights_requests_by_their_tokens(
    name: str, base: int, sizes: list[int]
) -> None:
    frame, _ = load_blockhash_trace(DATA / name, base)
    table = bounds.token_vs_block_reuse(frame, sizes).set_index("block_size")
    per_request_means = []
    for size in sizes:
        hits, prompt = blockhash_ideal(frame, base, size)
        assert table.loc[size, "hit_tokens"] == hits.sum()
        assert table.loc[size, "hit_rate"] == pytest.approx(hits.sum() / prompt.sum())
        per_request_means.append((hits / prompt).mean())
    # the files tell the two averages apart, so a per-request mean cannot pass
    token_weighted = table.loc[sizes, "hit_rate"].to_numpy()
    assert not np.allclose(per_request_means, token_weighted)


@pytest.mark.parametrize(
    ("listed", "expected"), [({}, ()), ({"avx512_bf16": True}, ("avx512_bf16",))]
)
def test_bf16_probe_reads_the_flags_torch_says_are_present(
    monkeypatch: pytest.MonkeyPatch, listed: dict[str, bool], expected: tuple[str, ...]
) -> None:
    """torch lists every flag it knows, present (True) or absent (False): an AVX-512 CPU
    without bf16 instructions lists both bf16 flags as False and must get float32."""
    import torch

    capability = {"cpu_name": "fake", "avx512_bf16": False, "amx_bf16": False} | listed
    monkeypatch.setattr(torch._C._cpu, "_get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", hardware.DTYPE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hardware, "_MACHINE", None)
    facts = hardware.machine()
    assert facts.cpu_flags == expected
    assert hardware.choose_dtype().dtype == ("bfloat16" if expected else "float32")


def conversation_ideal_tokens(conversations: list[list[tuple[int, ...]]], block: int) -> int:
    """Hit tokens of an infinite cache emptied before each conversation (each conversation's
    prompts reuse only its own earlier prompts), by brute force."""
    return sum(int(oracles.brute_force_hits(prompts, block).sum()) for prompts in conversations)


def test_predicted_sharegpt_hit_rate_lies_between_two_ideal_caches() -> None:
    """The free-running ideal of a ShareGPT run: each turn reuses its conversation's earlier
    prompts (the server's replies are not the recorded ones, so nothing of them). Bounded
    below by one cache per conversation and above by one cache shared by all prompts."""
    from analysis.serving import ServingBenchConfig, bench_run, loadgen

    trace = synthetic_trace(6, turns=(2, 4), user_tokens=(20, 90), seed=3, shared_prefix=40)
    workload = loadgen.sharegpt_workload(trace, conversations=6, max_turns=4, max_model_len=4096)
    config = ServingBenchConfig(workload="sharegpt", block_size=16)
    predicted = bench_run._predicted(config, workload.conversations)["predicted_hit_rate"]
    conversations = [[s.prompt_ids for s in c] for c in workload.conversations]
    everything = [prompt for prompts in conversations for prompt in prompts]
    prompt_tokens = sum(len(p) for p in everything)
    low = conversation_ideal_tokens(conversations, 16) / prompt_tokens
    high = oracles.brute_force_hits(everything, 16).sum() / prompt_tokens
    assert 0 < low < high < 1  # the workload tells the bounds apart
    assert low - 1e-12 <= predicted <= high + 1e-12


def test_sweep_ideal_caches_recorded_replies(tmp_path: Path) -> None:
    """Replayed replies are decoded as recorded, so a later turn hits them: the ideal beside a
    sweep point must count them, or first-prefill rates rise above their "ideal"."""
    trace = synthetic_trace(5, turns=(2, 4), user_tokens=(20, 60), reply_tokens=(20, 60), seed=1)
    path = tmp_path / "tiny.parquet"
    write_trace(path, trace)
    rows = pd.DataFrame(
        {
            "trace": [str(path)] * 2,
            "limit": [math.nan] * 2,
            "block_size": [16, 16],
            "outputs": ["recorded", "free"],
            "max_output_tokens": [math.nan] * 2,
        }
    )
    ideal = sweeps.with_ideal(rows).set_index("outputs")["ideal_rate"]
    prompts = trace["prompt_tokens"].sum()
    with_replies = oracles.brute_force_hits(trace["prompt_ids"], 16, trace["response_ids"]).sum()
    prompts_only = oracles.brute_force_hits(trace["prompt_ids"], 16).sum()
    assert with_replies > prompts_only  # the trace tells the two apart
    assert ideal["recorded"] == pytest.approx(with_replies / prompts)
    assert ideal["free"] == pytest.approx(prompts_only / prompts)


def one_request_per_step(count: int) -> pd.DataFrame:
    """`count` first admissions, one per step, each of 100 tokens; only the first one hits."""
    rows = [(f"r{i}", f"c{i}", 0, "first", 100, 100 if i == 0 else 0, i + 1) for i in range(count)]
    columns = ["request_id", "conversation_id", "turn_index", "kind"]
    return pd.DataFrame(rows, columns=[*columns, "tokens_queried", "tokens_hit", "step"])


def test_logged_window_holds_exactly_the_last_1000_requests() -> None:
    """vLLM's CachingMetrics drops its oldest entries while more than 1000 requests remain:
    the first request's hit is in the logged rate after 1000 requests, gone after 1001."""
    assert hitrates.VLLM_LOG_WINDOW == 1000
    at_limit = hitrates.windowed(one_request_per_step(1000))["window_rate"].iloc[-1]
    one_more = hitrates.windowed(one_request_per_step(1001))["window_rate"].iloc[-1]
    assert at_limit == pytest.approx(100 / (1000 * 100))
    assert one_more == 0.0
    # the latest step is kept whatever its size
    one_step = one_request_per_step(1001).assign(step=1)
    assert hitrates.windowed(one_step)["window_rate"].iloc[-1] == pytest.approx(100 / 100_100)
