"""Registered model shapes: real architectures written offline, loaded with random weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.data.chat_template import DEFAULT
from analysis.engines import RunConfig
from analysis.engines.synthetic import synthetic_trace
from analysis.engines.vllm_args import config_model, engine_kwargs
from analysis.models import shapes as model_shapes
from analysis.runs import run


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("name", sorted(model_shapes.SHAPES))
def test_materialise_writes_the_published_config_once(root, name):
    folder = model_shapes.materialise(name)
    assert folder == root / "data" / "cache" / "shapes" / name
    assert json.loads((folder / "config.json").read_text()) == model_shapes.SHAPES[name]
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    assert tok["chat_template"] == DEFAULT.engine_jinja()
    assert (folder / "tokenizer.json").stat().st_size > 1_000_000
    stamp = json.loads((folder / model_shapes.MARKER).read_text())
    assert stamp["shape"] == name and "random" in stamp["weights"]
    assert not list(folder.glob("*.safetensors"))
    written = (folder / "config.json").stat().st_mtime_ns
    assert model_shapes.materialise(name) == folder
    assert (folder / "config.json").stat().st_mtime_ns == written
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]


def test_a_damaged_folder_is_rewritten(root):
    folder = model_shapes.materialise("llama-3.2-1b")
    (folder / "config.json").write_text("{}")
    model_shapes.materialise("llama-3.2-1b")
    assert json.loads((folder / "config.json").read_text()) == model_shapes.SHAPES["llama-3.2-1b"]


def test_load_format_is_dummy_only_for_shapes(root, tmp_path):
    folder = model_shapes.materialise("llama-3.1-8b")
    assert model_shapes.load_format("llama-3.1-8b") == "dummy"
    assert model_shapes.load_format(str(folder)) == "dummy"
    assert model_shapes.load_format("meta-llama/Llama-3.1-8B-Instruct") is None
    assert model_shapes.load_format(str(tmp_path)) is None
    assert model_shapes.load_format(None) is None
    assert not model_shapes.is_shape("meta-llama/Llama-3.1-8B-Instruct")
    with pytest.raises(ValueError, match="unknown model shape 'llama-9b'"):
        model_shapes.materialise("llama-9b")


def test_a_shape_name_becomes_its_folder_with_dummy_weights(root, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # a hub name below is a fixture, never fetched
    config = RunConfig(engine="vllm", device="cuda", model="llama-3.1-8b", block_size=16)
    model = config_model(config)
    assert model.path == str(root / "data" / "cache" / "shapes" / "llama-3.1-8b")
    kwargs = engine_kwargs(config, model)
    assert kwargs["load_format"] == "dummy"
    assert "random" in model.weights_note()
    real = RunConfig(engine="vllm", device="cuda", model="meta-llama/Llama-3.1-8B-Instruct")
    hub = config_model(real)
    assert hub.path == real.model
    assert "load_format" not in engine_kwargs(real, hub)
    assert hub.weights_note() == "loaded from the model"
    assert hub.kv_bytes_per_block(16) is None  # no config.json: the shape is unknown


@pytest.mark.engine
@pytest.mark.parametrize("name", sorted(model_shapes.SHAPES))
def test_vllm_accepts_each_shape_from_its_config_alone(root, name):
    from vllm.engine.arg_utils import EngineArgs

    folder = model_shapes.materialise(name)
    vllm_config = EngineArgs(
        model=str(folder), load_format="dummy", max_model_len=4096, block_size=16
    ).create_engine_config()
    hf = vllm_config.model_config.hf_config
    assert hf.num_hidden_layers == model_shapes.SHAPES[name]["num_hidden_layers"]
    assert hf.hidden_size == model_shapes.SHAPES[name]["hidden_size"]
    assert vllm_config.load_config.load_format == "dummy"


@pytest.mark.engine
def test_replay_runs_on_the_1b_shape_as_on_the_default_model(root):
    """Block accounting does not depend on the model: the same counts as the default model."""
    trace = synthetic_trace(num_conversations=6, turns=(1, 3), user_tokens=(20, 80), seed=3)
    config = RunConfig(trace="t", engine="replay", block_size=16, num_blocks=70, max_model_len=1024)
    shaped = run(trace, config.with_(model="llama-3.2-1b"), progress=False)
    default = run(trace, config, progress=False)
    assert shaped.summary["first_prefill"]["queries"] > 0
    for key in ("first_prefill", "all_prefill", "preemptions"):
        assert shaped.summary[key] == default.summary[key], key


@pytest.mark.engine
def test_the_real_cpu_engine_runs_the_1b_shape_with_random_weights():
    """End to end: vLLM builds the 1B architecture without a weight file, forces the recorded
    replies, counts as replay does, and the manifest says the weights were random (~1-2 min)."""
    from analysis.engines.synthetic import identical_requests

    trace = identical_requests(3, 100, reply_tokens=4)
    config = RunConfig(
        trace="t",
        engine="vllm",
        model="llama-3.2-1b",
        block_size=32,
        num_blocks=40,
        max_model_len=1024,
        concurrency=1,
    )
    real = run(trace, config, progress=False)
    replayed = run(trace, config.with_(engine="replay"), progress=False)
    engine = real.manifest["engine"]
    assert engine["load_format"] == "dummy" and "random" in engine["weights"]
    assert engine["forced_output_mismatches"] == 0
    assert real.summary["first_prefill"] == replayed.summary["first_prefill"]
    assert real.summary["first_prefill"]["hits"] == 2 * (99 // 32 * 32)


def test_serving_resolves_shapes_with_random_weights(monkeypatch):
    """The serving benchmark takes a shape name: its folder, served with --load-format dummy
    (a real folder or hub name keeps vLLM's default loading)."""
    from analysis import serving

    folder = serving.resolve_model("llama-3.1-8b")
    assert folder == str(model_shapes.materialise("llama-3.1-8b"))
    flags = serving.ServingBenchConfig(model="llama-3.1-8b").server_config(folder, "cache").flags()
    assert flags[flags.index("--load-format") + 1] == "dummy"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # a hub name as a fixture, never fetched
    plain = serving.ServingBenchConfig().server_config("meta-llama/Llama-3.2-1B", "cache")
    assert "--load-format" not in plain.flags()
