"""The local random Llamas: one folder per dtype, saved in that dtype, KV bytes that follow it."""

from __future__ import annotations

import json

from analysis.engines import RunConfig
from analysis.engines.vllm_args import engine_kwargs, kv_bytes_per_block, resolve_model
from analysis.hardware import default_dtype
from analysis.models import TINY, built_dtype, ensure_random_llama


def test_each_dtype_has_its_own_folder_saved_in_that_dtype():
    wide = ensure_random_llama(TINY, "float32")
    narrow = ensure_random_llama(TINY, "bfloat16")
    assert wide != narrow and wide.name == narrow.name == TINY.name
    assert built_dtype(wide) == "float32" and built_dtype(narrow) == "bfloat16"
    assert json.loads((wide / "spec.json").read_text())["dtype"] == "float32"
    from safetensors import safe_open

    with safe_open(str(wide / "model.safetensors"), "pt") as weights:
        assert str(weights.get_tensor(next(iter(weights.keys()))).dtype) == "torch.float32"
    # a folder whose stamp names another dtype is rebuilt, not reused
    stamp = wide / "spec.json"
    stamp.write_text(json.dumps({**json.loads(stamp.read_text()), "dtype": "bfloat16"}))
    assert built_dtype(ensure_random_llama(TINY, "float32")) == "float32"
    assert json.loads(stamp.read_text())["dtype"] == "float32"


def test_default_model_follows_the_machine_and_vllm_is_told_the_dtype():
    config = RunConfig()
    model = resolve_model(config)
    assert built_dtype(model) == default_dtype("cpu").dtype
    assert engine_kwargs(config, model)["dtype"] == default_dtype("cpu").dtype
    pinned = config.with_(dtype="float32")
    assert engine_kwargs(pinned, resolve_model(pinned))["dtype"] == "float32"
    # a named model without --dtype: vLLM chooses
    assert engine_kwargs(config.with_(model="some/model"), "some/model")["dtype"] == "auto"


def test_kv_bytes_per_block_follow_the_dtype():
    wide = str(ensure_random_llama(TINY, "float32"))
    narrow = str(ensure_random_llama(TINY, "bfloat16"))
    per_token_bf16 = 2 * TINY.num_hidden_layers * TINY.num_key_value_heads * TINY.head_dim * 2
    assert kv_bytes_per_block(narrow, 32) == 32 * per_token_bf16
    assert kv_bytes_per_block(wide, 32) == 2 * 32 * per_token_bf16
    assert kv_bytes_per_block(narrow, 32, "float32") == kv_bytes_per_block(wide, 32)
    assert kv_bytes_per_block(wide, 32, "auto") == kv_bytes_per_block(wide, 32)
