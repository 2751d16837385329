"""Capacity planning (analysis.models.memory) checked against vLLM 0.32's own functions.

Every number the planner gives is compared with the vLLM function that decides it on a GPU,
called for real (no mock): `FullAttentionSpec.page_size_bytes` (bytes per block),
`get_kv_cache_config_from_groups` (number of blocks), `request_memory` (the GPU share),
`ModelConfig.get_num_kv_heads` / `verify_with_parallel_config` (tensor parallelism). The
`VllmConfig`s are built as the replay engine builds them, once per module.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest

from analysis.engines import RunConfig
from analysis.engines.vllm_args import config_model, engine_kwargs
from analysis.models import ResolvedModel
from analysis.models import shapes as model_shapes
from analysis.models.memory import (
    GPUS,
    Gpu,
    KvLayout,
    kv_budget,
    kv_layout,
    parameter_count,
    requested_bytes,
    smallest_parallelism,
    tensor_parallel_degrees,
    weight_bytes,
)
from analysis.platform.errors import ConfigError

SHAPES = sorted(model_shapes.SHAPES)
H100 = GPUS["h100-80gb"]
GIB = 2**30


@pytest.fixture(scope="module", autouse=True)
def shapes_root(tmp_path_factory):
    """Shapes are written under a temporary root, not the repository's data/cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path_factory.mktemp("root")))
        yield


@pytest.fixture(scope="module")
def vllm_configs(shapes_root):
    """One VllmConfig per registered shape, as `build_replay_engine` builds it, in bf16 (so that
    vLLM's own kv_cache_dtype="auto" is the checkpoint's bf16, as on a GPU), without the
    `num_gpu_blocks_override` the runs set (it would replace the computed number of blocks)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    configs = {}
    for name in SHAPES:
        run = RunConfig(model=name, dtype="bfloat16")
        args = EngineArgs(**engine_kwargs(run, config_model(run)))
        config = args.create_engine_config(usage_context=UsageContext.LLM_CLASS)
        config.cache_config.num_gpu_blocks_override = None
        configs[name] = config
    return configs


def vllm_kv_heads(vllm_config, tensor_parallel: int) -> int:
    """vLLM's KV heads per GPU under `tensor_parallel` (ModelConfig.get_num_kv_heads)."""
    parallel = copy.copy(vllm_config.parallel_config)
    parallel.tensor_parallel_size = tensor_parallel
    return vllm_config.model_config.get_num_kv_heads(parallel)


def vllm_groups(vllm_config, kv_cache_dtype: str, block_size: int, tensor_parallel: int):
    """vLLM's KV cache groups for the model: one FullAttentionSpec per decoder layer, its dtype
    from vLLM's own kv_cache_dtype conversion (what the attention layers use)."""
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    model_config = vllm_config.model_config
    spec = FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=vllm_kv_heads(vllm_config, tensor_parallel),
        head_size=model_config.get_head_size(),
        dtype=kv_cache_dtype_str_to_dtype(kv_cache_dtype, model_config),
    )
    layers = model_config.get_num_layers(vllm_config.parallel_config)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    return [KVCacheGroupSpec(names, spec)]


def vllm_num_blocks(vllm_config, groups, available_memory: int) -> int:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

    return get_kv_cache_config_from_groups(vllm_config, groups, available_memory).num_blocks


def test_importing_the_planner_loads_no_torch_vllm_or_transformers():
    code = (
        "import sys, analysis.models.memory; "
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.engine
@pytest.mark.parametrize("tensor_parallel", [1, 2])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("name", SHAPES)
def test_bytes_per_block_is_the_sum_of_vllms_page_sizes(
    vllm_configs, name, kv_cache_dtype, block_size, tensor_parallel
):
    layout = kv_layout(name, kv_cache_dtype, tensor_parallel)
    (group,) = vllm_groups(vllm_configs[name], kv_cache_dtype, block_size, tensor_parallel)
    pages = sum(group.kv_cache_spec.page_size_bytes for _ in group.layer_names)
    assert layout.bytes_per_block(block_size) == pages
    assert layout.bytes_per_token() * block_size == pages
    assert layout.kv_heads_per_gpu == group.kv_cache_spec.num_kv_heads


@pytest.mark.engine
@pytest.mark.parametrize("kv_layout_name", ["LBNHC", "BLHNC"])  # layer-outer, block-outer
@pytest.mark.parametrize(("kv_cache_dtype", "block_size"), [("auto", 16), ("fp8", 32)])
@pytest.mark.parametrize("name", SHAPES)
def test_num_blocks_is_vllms(
    vllm_configs, monkeypatch, name, kv_cache_dtype, block_size, kv_layout_name
):
    vllm_config = vllm_configs[name]
    monkeypatch.setattr(vllm_config.cache_config, "kv_cache_layout", kv_layout_name)
    monkeypatch.setattr(vllm_config.cache_config, "block_size", block_size)
    groups = vllm_groups(vllm_config, kv_cache_dtype, block_size, 1)
    layout = kv_layout(name, kv_cache_dtype)
    per_block = layout.bytes_per_block(block_size)
    for available in (0, per_block - 1, per_block, 10 * GIB + 12_345, 70 * GIB):
        assert layout.num_blocks_for(available, block_size) == vllm_num_blocks(
            vllm_config, groups, available
        ), available


@pytest.mark.engine
def test_fp8_is_half_of_bf16_and_equals_vllm_so_a_wrong_size_would_fail(vllm_configs):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    bf16, fp8 = kv_layout("llama-3.1-8b"), kv_layout("llama-3.1-8b", "fp8")
    assert fp8.bytes_per_block(16) * 2 == bf16.bytes_per_block(16) == 2 * 2**20
    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype=torch.float8_e4m3fn
    )
    vllm_bytes = 32 * spec.page_size_bytes
    assert fp8.bytes_per_block(16) == vllm_bytes
    fp8_counted_as_two_bytes = dataclasses.replace(fp8, kv_bytes_per_value=2)
    assert fp8_counted_as_two_bytes.bytes_per_block(16) != vllm_bytes


@pytest.mark.engine
@pytest.mark.parametrize("name", SHAPES)
def test_tensor_parallel_degrees_are_those_vllm_accepts(vllm_configs, name):
    vllm_config = vllm_configs[name]
    kv_heads = vllm_config.model_config.get_total_num_kv_heads()
    accepted = []
    for degree in range(1, 9):
        parallel = copy.copy(vllm_config.parallel_config)
        parallel.tensor_parallel_size = degree
        try:  # the attention heads split evenly (ModelConfig)
            vllm_config.model_config.verify_with_parallel_config(parallel)
        except ValueError:
            continue
        # QKVParallelLinear: divide(tp, kv heads) when tp >= kv heads, else divide(kv heads, tp)
        big, small = (degree, kv_heads) if degree >= kv_heads else (kv_heads, degree)
        if big % small == 0:
            accepted.append(degree)
    ours = []
    for degree in range(1, 9):
        try:
            layout = kv_layout(name, tensor_parallel=degree)
        except ConfigError:
            continue
        ours.append(degree)
        assert layout.kv_heads_per_gpu == vllm_kv_heads(vllm_config, degree)
    assert ours == accepted
    assert tensor_parallel_degrees(name) == tuple(d for d in (1, 2, 4, 8) if d in accepted)


def test_kv_heads_are_replicated_when_gpus_outnumber_them():
    layout = KvLayout(num_layers=28, num_kv_heads=4, head_size=128, kv_bytes_per_value=2)
    assert dataclasses.replace(layout, tensor_parallel=8).kv_heads_per_gpu == 1
    assert dataclasses.replace(layout, tensor_parallel=2).kv_heads_per_gpu == 2


def test_parameter_counts_are_the_published_ones():
    # Hugging Face model pages (safetensors "Model size"): 8,030,261,248 and 1,235,814,400.
    assert parameter_count(str(model_shapes.materialise("llama-3.1-8b"))) == 8_030_261_248
    assert parameter_count(str(model_shapes.materialise("llama-3.2-1b"))) == 1_235_814_400


def test_weight_bytes_split_over_gpus():
    assert weight_bytes("llama-3.1-8b") == 2 * 8_030_261_248
    assert weight_bytes("llama-3.1-8b", tensor_parallel=2) == 8_030_261_248
    assert weight_bytes("llama-3.2-1b", 1, tensor_parallel=8) == math.ceil(1_235_814_400 / 8)


@pytest.mark.engine
@pytest.mark.parametrize("gpu", sorted(GPUS))
@pytest.mark.parametrize("utilization", [0.5, 0.9, 0.95, 1.0])
def test_requested_memory_is_vllms_request_memory(vllm_configs, gpu, utilization):
    from vllm.v1.worker.utils import request_memory

    total = GPUS[gpu].total_bytes
    snapshot = SimpleNamespace(total_memory=total, free_memory=total, device_="cuda:0")
    cache_config = copy.copy(vllm_configs["llama-3.1-8b"].cache_config)
    cache_config.gpu_memory_utilization = utilization
    assert requested_bytes(GPUS[gpu], utilization) == request_memory(snapshot, cache_config)


@pytest.mark.engine
def test_an_h100_budget_for_llama_8b_gives_vllms_number_of_blocks(vllm_configs, monkeypatch):
    layout = kv_layout("llama-3.1-8b")
    weights = weight_bytes("llama-3.1-8b")
    budget = kv_budget(H100, layout, 16, weights_bytes=weights)
    assert budget.requested_bytes == math.ceil(81559 * 2**20 * 0.9) == 76_968_728_986
    assert budget.kv_bytes == 76_968_728_986 - 16_060_522_496
    assert (budget.num_blocks, budget.tokens) == (29_043, 464_688)
    assert "upper bound" in budget.assumed
    vllm_config = vllm_configs["llama-3.1-8b"]
    # The engine core resolves the layout from the attention backend; LBNHC is vLLM's NHD.
    monkeypatch.setattr(vllm_config.cache_config, "kv_cache_layout", "LBNHC")
    groups = vllm_groups(vllm_config, "auto", 16, 1)
    for reserve in (0, 3 * GIB):
        budget = kv_budget(H100, layout, 16, weights_bytes=weights, reserve_bytes=reserve)
        assert budget.num_blocks == vllm_num_blocks(vllm_config, groups, budget.kv_bytes)


def test_a_reserve_larger_than_what_is_left_gives_no_blocks():
    layout = kv_layout("llama-3.1-8b")
    weights = weight_bytes("llama-3.1-8b")
    budget = kv_budget(H100, layout, 16, weights_bytes=weights, reserve_bytes=70 * GIB)
    assert budget.kv_bytes < 0 and budget.num_blocks == 0 and budget.tokens == 0
    assert "70.00 GiB for activations" in budget.assumed


def test_smallest_parallelism_takes_the_fewest_gpus_that_hold_the_blocks():
    one = smallest_parallelism(1_000, "llama-3.1-8b", H100, 16)
    assert one.tensor_parallel == 1 and one.budget.num_blocks == 29_043
    assert one.kv_share_of_gpu == pytest.approx(1_000 * 2 * 2**20 / H100.total_bytes)
    two = smallest_parallelism(40_000, "llama-3.1-8b", H100, 16)
    assert two.tensor_parallel == 2 and two.budget.num_blocks == 65_744
    assert two.kv_share_of_gpu == pytest.approx(40_000 * 2**20 / H100.total_bytes)
    assert smallest_parallelism(10**7, "llama-3.1-8b", H100, 16) is None


def test_smallest_parallelism_skips_degrees_whose_weights_do_not_fit():
    small = Gpu("8 GiB", 8 * GIB)  # 7.2 GiB at 0.9: llama-3.1-8b's 15 GiB fit on 4 GPUs only
    assert smallest_parallelism(10, "llama-3.1-8b", small, 16).tensor_parallel == 4


def test_smallest_parallelism_never_offers_a_degree_vllm_refuses():
    # Qwen2.5-7B: 28 attention heads, so vLLM refuses 8 GPUs; 4 is the most it can take.
    assert tensor_parallel_degrees("qwen2.5-7b") == (1, 2, 4)
    assert smallest_parallelism(10**6, "qwen2.5-7b", H100, 16) is None


HUB_ONLY = ResolvedModel(
    asked="org/not-local",
    path="org/not-local",
    weights="model",
    load_format=None,
    dtype="auto",
    dtype_reason="",
    folder_dtype=None,
)
LAYOUT = KvLayout(num_layers=32, num_kv_heads=8, head_size=128, kv_bytes_per_value=2)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: kv_layout("llama-3.1-8b", "fp4"), "kv_cache_dtype 'fp4' .* use one of auto"),
        (lambda: kv_layout("llama-3.1-8b", tensor_parallel=3), "neither divides .* 1, 2, 4, 8"),
        (lambda: kv_layout("qwen2.5-7b", tensor_parallel=8), "28 attention heads.* 1, 2, 4$"),
        (lambda: kv_layout(HUB_ONLY), "'org/not-local' has no local config.json"),
        (lambda: KvLayout(32, 8, 128, 2, tensor_parallel=6), "tensor_parallel=6"),
        (lambda: LAYOUT.bytes_per_block(0), "block_size=0 must be a positive integer"),
        (lambda: requested_bytes(H100, 0), r"gpu_memory_utilization=0 is outside \(0, 1\]"),
        (lambda: requested_bytes(H100, 1.5), r"=1.5 is outside \(0, 1\]: .* e\.g\. 0\.9"),
        (
            lambda: kv_budget(H100, LAYOUT, 16, weights_bytes=100 * GIB),
            r"weights \(100\.00 GiB per GPU\) exceed .* H100 80GB .* use tensor parallelism",
        ),
        (lambda: kv_budget(H100, LAYOUT, 16, weights_bytes=-1), "weights_bytes=-1 is negative"),
        (
            lambda: smallest_parallelism(0, "llama-3.1-8b", H100, 16),
            "needed_blocks=0 must be a positive integer",
        ),
    ],
)
def test_bad_inputs_are_one_line_config_errors(call, message):
    with pytest.raises(ConfigError, match=message) as caught:
        call()
    assert "\n" not in str(caught.value)
