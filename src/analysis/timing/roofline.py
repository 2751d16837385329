"""A step-cost profile for a GPU that is not at hand: a roofline estimate.

A step's time from the model shape's work and the GPU's published peaks, in the same named
terms as a measured profile (`analysis.engines.clock.TERMS`), so replay runs on it unchanged:

- per token computed, its matmul FLOPs (2 x the parameters of the layers) at peak bf16 compute;
- per token sampled, the LM head's FLOPs (2 x hidden x vocabulary);
- per million prefill query-key pairs, attention's FLOPs (4 x layers x heads x head size each);
- per thousand context tokens a decode reads, their K and V bytes at peak memory bandwidth;
- per step, every weight read once at peak bandwidth, plus a host-side overhead per layer
  (eager mode launches each layer's kernels from Python), taken from a profile *measured* on
  a GPU of the same generation; the costs outside a step come from that profile too.

Compute and memory times are added, not overlapped, and peaks are never reached in practice:
this is an estimate, labelled so in its identity, to be read with its error against measured
points (`offline_prefill_errors`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.engines.clock import StepCostProfile
from analysis.engines.config import RunConfig
from analysis.metrics.oracles import Checks
from analysis.models.resolved import resolve_model
from analysis.runs import run

BF16_BYTES = 2


@dataclass(frozen=True)
class GpuPeaks:
    """A GPU's published dense bf16 compute and memory bandwidth."""

    name: str
    bf16_flops: float  # FLOP/s, dense (no sparsity)
    memory_bytes_s: float  # bytes/s
    source: str


GPUS = {
    "h100": GpuPeaks(
        "NVIDIA H100 SXM (roofline estimate)",
        989.4e12,
        3.35e12,
        "NVIDIA H100 Tensor Core GPU datasheet: SXM5, BF16 dense 989.4 TFLOPS, HBM3 3.35 TB/s",
    ),
    "h200": GpuPeaks(
        "NVIDIA H200 SXM (roofline estimate)",
        989.4e12,
        4.8e12,
        "NVIDIA H200 Tensor Core GPU datasheet: SXM, BF16 dense 989.4 TFLOPS, HBM3e 4.8 TB/s",
    ),
}


@dataclass(frozen=True)
class ShapeWork:
    """What one token, one sampled token, one attention pair and one read context token cost a
    model shape, in FLOPs and bytes."""

    layers: int
    layer_flops_per_token: float
    head_flops_per_sample: float
    flops_per_pair: float
    kv_bytes_per_token: float
    weight_bytes: float

    @classmethod
    def of(cls, model: str) -> ShapeWork:
        resolved = resolve_model(model, "bfloat16")
        config = json.loads((Path(resolved.path) / "config.json").read_text())
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
        head = int(config.get("head_dim") or hidden // heads)
        inter, vocab = int(config["intermediate_size"]), int(config["vocab_size"])
        attention = hidden * heads * head * 2 + hidden * kv_heads * head * 2  # q, o; k, v
        per_layer = attention + 3 * hidden * inter  # gate, up, down
        head_params = hidden * vocab
        embedding = 0 if config.get("tie_word_embeddings") else hidden * vocab
        return cls(
            layers=layers,
            layer_flops_per_token=2.0 * layers * per_layer,
            head_flops_per_sample=2.0 * head_params,
            flops_per_pair=4.0 * layers * heads * head,
            kv_bytes_per_token=2.0 * layers * kv_heads * head * BF16_BYTES,
            weight_bytes=float(layers * per_layer + head_params + embedding) * BF16_BYTES,
        )


def roofline_profile(
    gpu: str, model: str, measured: StepCostProfile, *, eager: bool = True
) -> StepCostProfile:
    """The roofline profile of `model` on `gpu`, its host-side costs from `measured` (a profile
    measured on a GPU of the same generation, in eager mode). With CUDA graphs (`eager=False`)
    a step launches no kernel from Python: no per-layer overhead."""
    peaks = GPUS[gpu]
    work = ShapeWork.of(model)
    measured_layers = int(measured.identity["model"]["num_layers"])
    measured_work = ShapeWork.of(measured.identity["model"]["name"])
    # The measured fixed cost less its own weight read: the host's overhead, per layer.
    overhead = measured.coefficients.get("fixed", 0.0)
    overhead -= measured_work.weight_bytes / peaks.memory_bytes_s
    per_layer = max(overhead, 0.0) / measured_layers if eager else 0.0
    coefficients = {
        "fixed": per_layer * work.layers + work.weight_bytes / peaks.memory_bytes_s,
        "token": work.layer_flops_per_token / peaks.bf16_flops,
        "sampled": work.head_flops_per_sample / peaks.bf16_flops,
        "prefill_pair": work.flops_per_pair * 1e6 / peaks.bf16_flops,
        "decode_context": (
            work.kv_bytes_per_token / peaks.memory_bytes_s + work.flops_per_pair / peaks.bf16_flops
        )
        * 1e3,
    }
    identity = {
        **measured.identity,
        "machine": {"gpu": peaks.name, "kind": "roofline"},
        "dtype": "bfloat16",
        "model": {**_model_identity(model)},
    }
    fit = {
        "method": "roofline estimate: published peaks, compute and memory added; host-side "
        "overhead per layer from a measured profile",
        "peaks": peaks.source,
        "overhead_per_layer_s": per_layer,
        "execution": "eager" if eager else "cuda-graphs",
    }
    return StepCostProfile(coefficients, measured.admit_s, measured.loop_s, identity, fit)


def _model_identity(model: str) -> dict[str, Any]:
    resolved = resolve_model(model, "bfloat16")
    return {
        "name": model,
        "num_layers": resolved.num_layers,
        "num_kv_heads": resolved.num_kv_heads,
        "head_size": resolved.head_size,
    }


# --------------------------------------------------------------------- the measured points
def offline_prefill_points(path: Path) -> pd.DataFrame:
    """Offline prefill times measured on an H100 (model, prefix, requests at once, caching on
    and off, seconds): the points a roofline estimate is checked against."""
    return pd.read_csv(path)


def _prefill_trace(prefix: int, requests: int, suffix: int, seed: int) -> pd.DataFrame:
    """One warm-up request that stores the prefix, then `requests` sharing it, each with a
    unique suffix, one output token each; the batch arrives long after the warm-up."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(1000, 100_000, prefix).tolist()
    rows = []
    for index in range(requests + 1):
        unique = rng.integers(1000, 100_000, suffix).tolist()
        rows.append(
            {
                "request_id": f"r{index}",
                "conversation_id": f"r{index}",
                "turn_index": 0,
                "prompt_ids": np.array(shared + unique, dtype=np.int32),
                "response_ids": np.array([7], dtype=np.int32),
                "prompt_tokens": prefix + suffix,
                "response_tokens": 1,
                "timestamp": 0.0 if index == 0 else 1000.0,
            }
        )
    return pd.DataFrame(rows)


def predict_offline_prefill(
    profile_path: Path,
    points: pd.DataFrame,
    *,
    suffix: int = 32,
    max_num_batched_tokens: int = 8192,
) -> pd.DataFrame:
    """Each point replayed on the profile's clock: the time from the batch's arrival to its
    last first token, caching on and off, beside the measured time and the relative error."""
    rows = []
    for point in points.itertuples(index=False):
        trace = _prefill_trace(int(point.prefix), int(point.requests), suffix, seed=0)
        config = RunConfig(
            trace="offline-prefill",
            model=str(point.model),
            block_size=16,
            num_blocks=(int(point.prefix) + suffix + 16) // 16 * (int(point.requests) + 2) + 64,
            max_model_len=int(point.prefix) + suffix + 16,
            max_num_batched_tokens=max_num_batched_tokens,
            mode="timestamps",
            clock=str(profile_path),
            clock_anyway=True,
            prefix_caching=bool(point.caching),
        )
        requests = run(trace, config, progress=False).requests
        batch = requests[requests["request_id"] != "r0"]
        predicted = float(batch["first_token_s"].max() - batch["arrival_s"].min())
        rows.append(
            {
                **point._asdict(),
                "predicted_s": predicted,
                "error": predicted / float(point.measured_s) - 1.0,
            }
        )
    return pd.DataFrame(rows)


def estimate_points(
    points: pd.DataFrame, measured: StepCostProfile, into: Path, gpus: tuple[str, ...] = ("h100",)
) -> pd.DataFrame:
    """Every measured point replayed on each GPU's roofline profile (written under `into`):
    one row per (gpu, point), with the measured H100 time and the estimate's relative error
    beside where the GPU is the H100 that measured them (elsewhere: none)."""
    into.mkdir(parents=True, exist_ok=True)
    frames = []
    for gpu in gpus:
        for (model, execution), group in points.groupby(["model", "execution"], sort=False):
            profile = roofline_profile(gpu, model, measured, eager=execution == "eager")
            path = into / f"roofline-{gpu}-{model}-{execution}.json"
            path.write_text(json.dumps(profile.to_dict(), indent=1))
            frames.append(predict_offline_prefill(path, group).assign(gpu=gpu))
    table = pd.concat(frames, ignore_index=True)
    table.loc[table["gpu"] != "h100", ["measured_s", "error"]] = np.nan
    return table[["gpu", *[c for c in table.columns if c != "gpu"]]]


def checks(estimates: pd.DataFrame) -> Checks:
    """What an estimate must get right whatever its error: caching never makes a prefill
    slower, and a GPU with more bandwidth and the same compute is never slower."""
    out = Checks()
    keys = ["gpu", "model", "execution", "prefix", "requests"]
    wide = estimates.pivot_table(index=keys, columns="caching", values="predicted_s")
    slower = int((wide[True] > wide[False] + 1e-12).sum())
    out.add("caching on is never estimated slower than off", 0, slower)
    if {"h100", "h200"} <= set(estimates["gpu"]):
        by_gpu = estimates.pivot_table(
            index=["model", "execution", "prefix", "requests", "caching"],
            columns="gpu",
            values="predicted_s",
        )
        out.add(
            "the H200 (more bandwidth, same compute) is never estimated slower",
            0,
            int((by_gpu["h200"] > by_gpu["h100"] + 1e-12).sum()),
        )
    return out
