"""The local models' dtype follows what the CPU computes natively, and an explicit one wins.

Unit tests fake the machine facts; the end-to-end ones build the real model folder under torch's
AVX2 emulation (`ATEN_CPU_CAPABILITY=avx2`) and run the real CPU engine in float32.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.engines.config import RunConfig, validate
from analysis.platform.errors import ConfigError
from analysis.platform.hardware import DTYPE_ENV, Machine, choose_dtype, machine

AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def fake(capability: str, flags: tuple[str, ...]) -> Machine:
    return Machine(cpu_capability=capability, cpu_flags=flags, cpu_name="x", cores=2, cuda=False)


@pytest.fixture(autouse=True)
def no_env_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DTYPE_ENV, raising=False)


@pytest.mark.parametrize(
    ("capability", "flags", "expected"),
    [
        ("AVX512", ("avx512_bf16", "amx_bf16"), "bfloat16"),
        ("AVX512", ("amx_bf16",), "bfloat16"),
        ("AVX512", (), "float32"),  # AVX-512 without bf16 instructions (e.g. Skylake-X)
        ("AVX2", ("avx512_bf16", "amx_bf16"), "float32"),  # torch dispatches AVX2 only
        ("DEFAULT", (), "float32"),
    ],
)
def test_dtype_by_capability(capability: str, flags: tuple[str, ...], expected: str) -> None:
    choice = choose_dtype(None, fake(capability, flags))
    assert choice.dtype == expected
    assert capability in choice.reason


@pytest.mark.parametrize(
    ("isa", "expected"),
    [
        (None, "bfloat16"),
        ("AVX2", "float32"),
        ("avx512_core", "float32"),
        ("AVX10_1_512_AMX", "bfloat16"),
    ],
)
def test_onednn_capped_below_bf16_means_float32(isa: str | None, expected: str) -> None:
    """oneDNN runs the bf16 matmuls: capped below bf16 it is slow whatever torch dispatches."""
    facts = replace(fake("AVX512", ("avx512_bf16", "amx_bf16")), onednn_max_cpu_isa=isa)
    choice = choose_dtype(None, facts)
    assert choice.dtype == expected
    if expected == "float32":
        assert f"ONEDNN_MAX_CPU_ISA={isa}" in choice.reason


def test_a_bf16_gpu_gets_bf16_whatever_the_host_cpu() -> None:
    gpu = Machine("AVX2", (), "x", 2, cuda=True, cuda_device="NVIDIA H100", cuda_bf16=True)
    assert choose_dtype(None, gpu).dtype == "bfloat16"
    old_gpu = Machine("AVX2", (), "x", 2, cuda=True, cuda_device="Tesla T4", cuda_bf16=False)
    assert choose_dtype(None, old_gpu).dtype == "float32"


def test_explicit_dtype_wins_over_env_and_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    native = fake("AVX512", ("avx512_bf16",))
    monkeypatch.setenv(DTYPE_ENV, "float32")
    assert choose_dtype(None, native).dtype == "float32"
    assert choose_dtype("bfloat16", native).dtype == "bfloat16"
    assert "asked for" in choose_dtype("bfloat16", native).reason


def test_bad_dtype_is_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="dtype='fp8' is not one of bfloat16, float32"):
        validate(RunConfig(dtype="fp8"), check_environment=False)
    monkeypatch.setenv(DTYPE_ENV, "half")
    with pytest.raises(ConfigError, match=f"{DTYPE_ENV}='half'"):
        choose_dtype(None, fake("AVX2", ()))


def test_dtype_none_keeps_earlier_config_ids_and_explicit_changes_them() -> None:
    import hashlib

    from analysis.engines.config import FLEET_FIELDS, OPTIONAL_FIELDS

    base = RunConfig()
    # the absence of the fields added later (dtype; a fleet's replicas and router; time; caching)
    later = ("dtype", *FLEET_FIELDS, *OPTIONAL_FIELDS)
    before = {k: v for k, v in base.to_dict().items() if k not in later}
    payload = json.dumps(
        {"config": before, "trace_hash": "h", "extra": ""}, sort_keys=True, separators=(",", ":")
    )
    assert base.config_id("h").endswith(hashlib.sha256(payload.encode()).hexdigest()[:10])
    assert base.config_id("h") != base.with_(dtype="float32").config_id("h")
    assert base.with_(dtype="float32").readable_prefix().endswith("-float32")
    timed = base.with_(think_time_s=1.0, clock="p.json")
    assert timed.config_id("h") != base.config_id("h")
    assert timed.readable_prefix().endswith("-think1-timed")
    uncached = base.with_(prefix_caching=False)
    assert uncached.config_id("h") != base.config_id("h")
    assert uncached.readable_prefix().endswith("-nocache")


def test_this_machine_is_described() -> None:
    facts = machine().to_dict()
    assert facts["cpu_capability"] and facts["cores"] >= 1
    assert facts["native_bf16"] == (choose_dtype().dtype == "bfloat16")


def test_avx2_emulation_builds_a_float32_model(tmp_path: Path) -> None:
    """A fresh process under the AVX2 emulation builds the local model in float32."""
    env = {**os.environ, **AVX2_ENV, "PREFIX_CACHE_LAB_ROOT": str(tmp_path)}
    env.pop(DTYPE_ENV, None)
    code = (
        "import json, torch; from analysis.models.local import ensure_random_llama; "
        "from analysis.platform.hardware import choose_dtype; "
        "print(json.dumps([str(ensure_random_llama()), torch.backends.cpu.get_cpu_capability(),"
        " choose_dtype().reason]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    folder, capability, reason = json.loads(out.stdout.strip().splitlines()[-1])
    assert capability == "AVX2"
    config = json.loads((Path(folder) / "config.json").read_text())
    assert (config.get("torch_dtype") or config.get("dtype")) == "float32"
    assert json.loads((Path(folder) / "spec.json").read_text())["dtype"] == "float32"
    assert "no native bf16" in reason


def test_folder_of_another_dtype_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from analysis.data.chat_template import DEFAULT
    from analysis.models import resolve_model
    from analysis.models.local import ensure_random_llama, folder_dtype

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    bf16 = resolve_model(None, "bfloat16")
    folder = Path(bf16.path)
    assert folder_dtype(folder) == "bfloat16"
    assert ensure_random_llama(dtype="float32") == folder
    assert folder_dtype(folder) == "float32"
    float32 = resolve_model(None, "float32")
    assert float32.path == bf16.path
    assert float32.kv_bytes_per_block(32) == 2 * bf16.kv_bytes_per_block(32)
    template = json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]
    assert template == DEFAULT.engine_jinja()


def test_vllm_is_told_the_folder_dtype(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's dtype="auto" turns a float32 checkpoint into bf16: the folder's dtype is passed;
    where the CPU has no native bf16, every model runs in float32."""
    from analysis.engines.vllm_args import engine_kwargs
    from analysis.models import resolve_model
    from analysis.models.local import ensure_random_llama
    from analysis.platform import hardware

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # a hub name below is a fixture, never fetched
    folder = str(ensure_random_llama(dtype="float32"))
    shape = "llama-3.2-1b"  # its config.json says bfloat16
    for facts, hub, random_shape in (
        (fake("AVX512", ("amx_bf16",)), "auto", "bfloat16"),
        # no native bf16: vLLM's CPU kernels would stop (SIGILL) on bf16, so float32 throughout
        (fake("AVX2", ()), "float32", "float32"),
    ):
        monkeypatch.setattr(hardware, "_MACHINE", facts)
        assert resolve_model(folder).dtype == "float32"
        assert resolve_model(folder, "bfloat16").dtype == "bfloat16"
        assert resolve_model("org/name").dtype == hub
        assert resolve_model(shape).dtype == random_shape
        config = RunConfig(model=shape)
        assert engine_kwargs(config, resolve_model(shape))["dtype"] == random_shape


@pytest.mark.engine
def test_float32_engine_counts_equal_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real CPU engine with a float32 model caches exactly what replay says it caches."""
    from analysis.engines.synthetic import synthetic_trace
    from analysis.runs import run

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    monkeypatch.setenv(DTYPE_ENV, "float32")  # as on a CPU without bf16, through the env path
    trace = synthetic_trace(num_conversations=4, turns=(2, 3), user_tokens=(20, 60), seed=1)
    config = RunConfig(
        trace="test",
        engine="vllm",
        block_size=32,
        num_blocks=128,
        max_model_len=1024,
        max_output_tokens=16,
    )
    real = run(trace, config, progress=False)
    replayed = run(trace, config.with_(engine="replay"), progress=False)
    assert real.manifest["dtype"]["dtype"] == "float32"
    assert real.manifest["dtype"]["model_folder_dtype"] == "float32"
    assert real.manifest["engine"]["model_dtype"] == "float32"  # not vLLM's auto bf16 cast
    assert real.manifest["machine"]["cpu_capability"]
    assert real.summary["first_prefill"]["hits"] > 0
    for key in ("first_prefill", "all_prefill", "exported", "preemptions"):
        assert real.summary[key] == replayed.summary[key], key
    assert real.counters["prefix_cache_stats"] == replayed.counters["prefix_cache_stats"]
    assert real.manifest["engine"]["num_cached_tokens_mismatches"] == 0


def test_run_command_takes_dtype() -> None:
    from analysis.cli import build_parser
    from analysis.commands.run import config_from_args

    args = build_parser("run").parse_args(["run", "--dtype", "float32"])
    assert config_from_args(args).dtype == "float32"
    assert config_from_args(build_parser("run").parse_args(["run"])).dtype is None
