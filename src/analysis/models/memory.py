"""Capacity planning: how many KV blocks a model gets on a GPU, worked out without a GPU.

The number of blocks is the parameter prefix caching depends on most: a conversation's next turn
hits only while its earlier blocks are still cached. On a GPU, vLLM chooses it at start: it
profiles the model, takes `gpu_memory_utilization` of the GPU, subtracts what is not KV cache
and divides the rest by the bytes of one block. The sweeps here run any number of blocks on a
CPU, so a reader needs to know which of those numbers a real H100 or H200 would give, and which
model, KV dtype and tensor-parallel degree give it. This module does vLLM's arithmetic offline,
from the model's config.json, and each step mirrors one vLLM 0.32 function (the tests compare
against the function itself, not a copy of its formula):

- bytes per block: `FullAttentionSpec.page_size_bytes` summed over layers
  (`vllm/v1/core/kv_cache_utils.py` `_get_kv_cache_bytes_per_block`);
- number of blocks: `available_memory // bytes_per_block` (`get_kv_cache_config_from_groups`);
- KV budget: `Worker.determine_available_memory` (`vllm/v1/worker/gpu_worker.py`): the
  requested memory (`request_memory`: ceil(total * gpu_memory_utilization)) minus weights,
  peak activations, non-torch memory and the CUDA-graph estimate.

vLLM measures activations, non-torch memory and CUDA graphs at start; nothing offline can, so
the caller states them as one `reserve_bytes` and every result says what it assumed.

torch and transformers are imported inside the functions that need them (`import analysis`
stays light).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from analysis.models.resolved import ResolvedModel, resolve_model
from analysis.platform.errors import ConfigError

GIB = 2**30
MIB = 2**20

# Bytes per stored K or V value, by vLLM's `kv_cache_dtype` name. "auto" is the checkpoint's own
# dtype (config.json `torch_dtype`): bf16 for the registered shapes, what a GPU run stores.
KV_CACHE_DTYPES: dict[str, int | None] = {
    "auto": None,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float32": 4,
}
# The tensor-parallel degrees a single node offers (one to eight GPUs).
TENSOR_PARALLEL_DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Gpu:
    """A GPU model and the total memory the driver reports for it (what vLLM's
    `MemorySnapshot.total_memory` reads)."""

    name: str
    total_bytes: int


# Totals as nvidia-smi prints them, not the marketing GB: H100 80GB HBM3 is 81559 MiB
# (NVIDIA/nccl#1264, modal-labs/modal-client#2797); H200 141GB is 143771 MiB.
GPUS = {
    "h100-80gb": Gpu("H100 80GB", 81559 * MIB),
    "h200-141gb": Gpu("H200 141GB", 143771 * MIB),
}


@dataclass(frozen=True)
class KvLayout:
    """The KV cache of one model on one GPU: what decides the bytes of a block."""

    num_layers: int
    num_kv_heads: int  # the model's total; a GPU holds `kv_heads_per_gpu` of them
    head_size: int
    kv_bytes_per_value: int
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        check_tensor_parallel(self.num_kv_heads, self.tensor_parallel)

    @property
    def kv_heads_per_gpu(self) -> int:
        """vLLM's `ModelConfig.get_num_kv_heads`: heads split over the GPUs, replicated (one per
        GPU) when there are more GPUs than KV heads."""
        return max(1, self.num_kv_heads // self.tensor_parallel)

    def bytes_per_token(self) -> int:
        """K and V of one token over all layers, on one GPU."""
        return (
            2 * self.num_layers * self.kv_heads_per_gpu * self.head_size * self.kv_bytes_per_value
        )

    def bytes_per_block(self, block_size: int) -> int:
        """One block on one GPU: the sum of the layers' `page_size_bytes` in vLLM."""
        _check_positive(block_size, "block_size", "give the tokens per KV block, e.g. 16")
        return self.bytes_per_token() * block_size

    def num_blocks_for(self, available_bytes: int, block_size: int) -> int:
        """The blocks vLLM makes of `available_bytes` of KV memory on one GPU (0 if none)."""
        return max(0, available_bytes // self.bytes_per_block(block_size))


@dataclass(frozen=True)
class KvBudget:
    """The KV cache vLLM would allocate on one GPU, and what this estimate assumed."""

    gpu: str
    block_size: int
    tensor_parallel: int
    gpu_memory_utilization: float
    requested_bytes: int  # ceil(total * gpu_memory_utilization), vLLM's `request_memory`
    weights_bytes: int  # per GPU
    reserve_bytes: int  # activations + non-torch memory + CUDA graphs, as the caller assumed
    kv_bytes: int  # per GPU; negative when weights and reserve exceed the requested memory
    bytes_per_block: int
    num_blocks: int
    assumed: str

    @property
    def tokens(self) -> int:
        """Tokens the KV cache holds on one GPU (every block full)."""
        return self.num_blocks * self.block_size

    @property
    def gib(self) -> float:
        return self.kv_bytes / GIB


@dataclass(frozen=True)
class ParallelismChoice:
    """The smallest tensor-parallel degree that holds `needed_blocks`, and its budget."""

    tensor_parallel: int
    needed_blocks: int
    budget: KvBudget
    kv_share_of_gpu: float  # needed_blocks' KV bytes / one GPU's total memory


def as_resolved(model: ResolvedModel | str) -> ResolvedModel:
    """A model name resolved once (a registered shape is written offline on first use)."""
    return model if isinstance(model, ResolvedModel) else resolve_model(model)


def kv_layout(
    model: ResolvedModel | str, kv_cache_dtype: str = "auto", tensor_parallel: int = 1
) -> KvLayout:
    """The KV layout of `model` under vLLM's `kv_cache_dtype` and a tensor-parallel degree;
    a ConfigError for a model with no local config.json or a degree vLLM refuses."""
    resolved = as_resolved(model)
    _require_shape(resolved)
    check_tensor_parallel(resolved.num_kv_heads, tensor_parallel)
    check_attention_heads(resolved, tensor_parallel)
    return KvLayout(
        num_layers=resolved.num_layers,
        num_kv_heads=resolved.num_kv_heads,
        head_size=resolved.head_size,
        kv_bytes_per_value=kv_value_bytes(kv_cache_dtype, resolved),
        tensor_parallel=tensor_parallel,
    )


def kv_value_bytes(kv_cache_dtype: str, model: ResolvedModel) -> int:
    """Bytes of one stored value; "auto" is the checkpoint's dtype (what a GPU run stores), not
    the float32 this project may choose for a CPU without bf16."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(
            f"kv_cache_dtype {kv_cache_dtype!r} is not one this planner knows: "
            f"use one of {', '.join(KV_CACHE_DTYPES)}"
        )
    size = KV_CACHE_DTYPES[kv_cache_dtype]
    if size is not None:
        return size
    checkpoint = model.folder_dtype or model.kv_dtype
    if KV_CACHE_DTYPES.get(checkpoint) is None:
        named = ", ".join(name for name in KV_CACHE_DTYPES if name != "auto")
        raise ConfigError(
            f"the model's own dtype {checkpoint!r} (kv_cache_dtype='auto') has no known size: "
            f"name the kv_cache_dtype, one of {named}"
        )
    return KV_CACHE_DTYPES[checkpoint]


def check_tensor_parallel(num_kv_heads: int, tensor_parallel: int) -> None:
    """vLLM's `QKVParallelLinear` splits the KV heads over the GPUs when the degree divides
    them, replicates them when it is a multiple of them, and fails on anything else."""
    if tensor_parallel >= 1 and _kv_split_ok(num_kv_heads, tensor_parallel):
        return
    valid = [t for t in range(1, 2 * num_kv_heads + 1) if _kv_split_ok(num_kv_heads, t)]
    raise ConfigError(
        f"tensor_parallel={tensor_parallel} neither divides nor is a multiple of the model's "
        f"{num_kv_heads} KV heads: use one of {', '.join(map(str, valid))}, ..."
    )


def check_attention_heads(model: ResolvedModel, tensor_parallel: int) -> None:
    """vLLM's `ModelConfig.verify_with_parallel_config`: the attention heads (from config.json)
    must split evenly over the GPUs (Qwen2.5-7B's 28 heads refuse 8 GPUs)."""
    heads = _attention_heads(model)
    if heads is None or (tensor_parallel >= 1 and heads % tensor_parallel == 0):
        return
    valid = [t for t in TENSOR_PARALLEL_DEGREES if heads % t == 0]
    raise ConfigError(
        f"tensor_parallel={tensor_parallel} does not divide the model's {heads} attention heads "
        f"(vLLM refuses it): use one of {', '.join(map(str, valid))}"
    )


def tensor_parallel_degrees(model: ResolvedModel | str) -> tuple[int, ...]:
    """The degrees of `TENSOR_PARALLEL_DEGREES` vLLM accepts for `model`."""
    resolved = as_resolved(model)
    _require_shape(resolved)
    heads = _attention_heads(resolved)
    return tuple(
        t
        for t in TENSOR_PARALLEL_DEGREES
        if _kv_split_ok(resolved.num_kv_heads, t) and (heads is None or heads % t == 0)
    )


@functools.lru_cache(maxsize=32)
def parameter_count(folder: str) -> int:
    """Parameters of the model in `folder`, built on torch's meta device (no memory, no
    weights); `model.parameters()` yields tied embeddings once, as vLLM stores them."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def weight_bytes(model: ResolvedModel | str, dtype_bytes: int = 2, tensor_parallel: int = 1) -> int:
    """Bytes of weights on one GPU: all parameters / tensor_parallel, rounded up.

    An approximation under tensor parallelism: vLLM splits the attention and MLP matrices and
    the vocabulary, but every GPU keeps a full copy of the norms (under 0.01% of the parameters
    of the registered shapes), pads the vocabulary to a multiple of the degree's shards, and
    replicates the K and V projections when the degree exceeds the KV heads; none of this is
    counted here.
    """
    resolved = as_resolved(model)
    _require_shape(resolved)
    _check_positive(dtype_bytes, "dtype_bytes", "give the bytes of one weight, e.g. 2 for bf16")
    _check_positive(tensor_parallel, "tensor_parallel", "give the number of GPUs, e.g. 1")
    return math.ceil(parameter_count(resolved.path) * dtype_bytes / tensor_parallel)


def requested_bytes(gpu: Gpu, gpu_memory_utilization: float) -> int:
    """vLLM's `request_memory`: the share of the GPU the engine may use, rounded up."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(
            f"gpu_memory_utilization={gpu_memory_utilization} is outside (0, 1]: "
            "give the share of the GPU vLLM may use, e.g. 0.9 (vLLM's default)"
        )
    return math.ceil(gpu.total_bytes * gpu_memory_utilization)


def kv_budget(
    gpu: Gpu,
    layout: KvLayout,
    block_size: int,
    *,
    gpu_memory_utilization: float = 0.9,
    weights_bytes: int,
    reserve_bytes: int = 0,
) -> KvBudget:
    """The KV memory and number of blocks vLLM would give `layout` on one `gpu`
    (`Worker.determine_available_memory`, then `get_kv_cache_config_from_groups`).

    `weights_bytes` is per GPU (see `weight_bytes`); `reserve_bytes` stands for what vLLM
    measures at start and this cannot: peak activations, non-torch memory (NCCL, CUDA context)
    and the CUDA-graph estimate. With the default 0 the result is an upper bound.
    """
    requested = requested_bytes(gpu, gpu_memory_utilization)
    _check_not_negative(weights_bytes, "weights_bytes")
    _check_not_negative(reserve_bytes, "reserve_bytes")
    if weights_bytes > requested:
        raise ConfigError(
            f"the model's weights ({weights_bytes / GIB:.2f} GiB per GPU) exceed "
            f"gpu_memory_utilization={gpu_memory_utilization} of one {gpu.name} "
            f"({requested / GIB:.2f} GiB): use tensor parallelism (more GPUs), a larger GPU "
            "or a higher gpu_memory_utilization"
        )
    kv_bytes = requested - weights_bytes - reserve_bytes
    return KvBudget(
        gpu=gpu.name,
        block_size=block_size,
        tensor_parallel=layout.tensor_parallel,
        gpu_memory_utilization=gpu_memory_utilization,
        requested_bytes=requested,
        weights_bytes=weights_bytes,
        reserve_bytes=reserve_bytes,
        kv_bytes=kv_bytes,
        bytes_per_block=layout.bytes_per_block(block_size),
        num_blocks=layout.num_blocks_for(kv_bytes, block_size),
        assumed=_assumptions(reserve_bytes),
    )


def smallest_parallelism(
    needed_blocks: int,
    model: ResolvedModel | str,
    gpu: Gpu,
    block_size: int,
    kv_cache_dtype: str = "auto",
    *,
    gpu_memory_utilization: float = 0.9,
    weight_dtype_bytes: int = 2,
    reserve_bytes: int = 0,
) -> ParallelismChoice | None:
    """The smallest tensor-parallel degree (1, 2, 4, 8, those vLLM accepts for the model) whose
    per-GPU number of blocks reaches `needed_blocks`; None if even the largest cannot. Blocks
    count as vLLM's `num_blocks` (the null block included, as `RunConfig.num_blocks`)."""
    _check_positive(needed_blocks, "needed_blocks", "give the number of KV blocks a run needs")
    resolved = as_resolved(model)
    requested = requested_bytes(gpu, gpu_memory_utilization)
    for degree in tensor_parallel_degrees(resolved):
        weights = weight_bytes(resolved, weight_dtype_bytes, degree)
        if weights > requested:
            continue  # the weights alone do not fit: more GPUs
        layout = kv_layout(resolved, kv_cache_dtype, degree)
        budget = kv_budget(
            gpu,
            layout,
            block_size,
            gpu_memory_utilization=gpu_memory_utilization,
            weights_bytes=weights,
            reserve_bytes=reserve_bytes,
        )
        if budget.num_blocks >= needed_blocks:
            share = needed_blocks * budget.bytes_per_block / gpu.total_bytes
            return ParallelismChoice(degree, needed_blocks, budget, share)
    return None


def _assumptions(reserve_bytes: int) -> str:
    """What a budget assumed, in words, for a table or a figure's caption."""
    if reserve_bytes == 0:
        reserve = "no activations, non-torch memory or CUDA graphs (an upper bound)"
    else:
        reserve = f"{reserve_bytes / GIB:.2f} GiB for activations, non-torch memory, CUDA graphs"
    return f"weights from the parameter count; {reserve}; vLLM measures these at start"


def _kv_split_ok(num_kv_heads: int, tensor_parallel: int) -> bool:
    return num_kv_heads % tensor_parallel == 0 or tensor_parallel % num_kv_heads == 0


def _attention_heads(model: ResolvedModel) -> int | None:
    """`num_attention_heads` from the model folder's config.json (None: no local folder)."""
    config_file = Path(model.path) / "config.json"
    if not config_file.is_file():
        return None
    return int(json.loads(config_file.read_text())["num_attention_heads"])


def _require_shape(model: ResolvedModel) -> None:
    if not model.shape_known:
        raise ConfigError(
            f"model {model.asked or model.path!r} has no local config.json, so its KV shape is "
            "unknown: give a registered shape (e.g. llama-3.1-8b) or a model folder"
        )


def _check_positive(value: int, name: str, fix: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name}={value!r} must be a positive integer: {fix}")


def _check_not_negative(value: int, name: str) -> None:
    if value < 0:
        raise ConfigError(f"{name}={value} is negative: give bytes (0 or more)")
