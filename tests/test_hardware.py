"""The dtype by capability: bf16 only where the CPU computes it natively, else float32.

The emulation test starts a real Python with torch dispatching AVX2 kernels and oneDNN limited
to AVX2 (what an AVX2-only CPU gives), and checks that the choice resolves to float32 there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from analysis.engines import ConfigError, RunConfig
from analysis.engines.config import validate
from analysis.hardware import MachineFacts, choose_dtype, default_dtype, machine_facts

# The variables that make this process see an AVX2-only CPU (torch's dispatch and oneDNN).
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}

SAPPHIRE_RAPIDS = MachineFacts(
    machine="x86_64",
    processor="Intel Xeon",
    cpu_cores=2,
    torch_threads=2,
    cpu_capability="AVX512",
    avx512_bf16=True,
    amx_tile=True,
    onednn_max_cpu_isa=None,
    cuda=False,
    cuda_device=None,
    cuda_bf16=None,
)
EPYC_AVX2 = replace(SAPPHIRE_RAPIDS, cpu_capability="AVX2", avx512_bf16=False, amx_tile=False)


def test_bf16_needs_the_instructions_and_avx512_dispatch_and_onednn():
    assert default_dtype("cpu", SAPPHIRE_RAPIDS).dtype == "bfloat16"
    assert default_dtype("cpu", EPYC_AVX2).dtype == "float32"
    assert "no AVX512-BF16 or AMX" in default_dtype("cpu", EPYC_AVX2).reason
    # the instructions are there but torch dispatches AVX2 kernels (ATEN_CPU_CAPABILITY)
    capped = replace(SAPPHIRE_RAPIDS, cpu_capability="AVX2")
    assert default_dtype("cpu", capped).dtype == "float32"
    # oneDNN (bf16 matmuls) limited below bf16
    onednn = replace(SAPPHIRE_RAPIDS, onednn_max_cpu_isa="avx512_core")
    assert default_dtype("cpu", onednn).dtype == "float32"
    assert "ONEDNN_MAX_CPU_ISA" in default_dtype("cpu", onednn).reason
    # AVX512-BF16 without AMX is enough
    assert default_dtype("cpu", replace(SAPPHIRE_RAPIDS, amx_tile=False)).dtype == "bfloat16"


def test_a_visible_gpu_decides_for_itself():
    h100 = replace(EPYC_AVX2, cuda=True, cuda_device="H100", cuda_bf16=True)
    assert default_dtype(None, h100).dtype == "bfloat16"
    assert default_dtype("cpu", h100).dtype == "float32"
    assert default_dtype(None, replace(h100, cuda_bf16=False)).dtype == "float16"


def test_explicit_dtype_wins_and_a_bad_one_is_a_one_line_error():
    assert choose_dtype("float32").dtype == "float32"
    assert "explicitly" in choose_dtype("bfloat16").reason
    with pytest.raises(ValueError, match="--dtype"):
        choose_dtype("fp8")
    with pytest.raises(ConfigError, match="dtype='fp8'"):
        validate(RunConfig(dtype="fp8"), check_environment=False)


def test_this_machine_reports_what_torch_says():
    import torch

    facts = machine_facts()
    assert facts.cpu_capability == torch.backends.cpu.get_cpu_capability()
    assert facts.cpu_cores >= 1
    assert json.loads(json.dumps(facts.to_dict()))["native_bf16"] == facts.native_bf16


def test_an_emulated_avx2_cpu_resolves_to_float32():
    probe = (
        "import json; from analysis.hardware import default_dtype, machine_facts; "
        "print(json.dumps([machine_facts().cpu_capability, default_dtype('cpu').to_dict()]))"
    )
    env = {**os.environ, **AVX2_ONLY}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    capability, choice = json.loads(out.stdout.strip().splitlines()[-1])
    assert capability == "AVX2"
    assert choice["dtype"] == "float32"


def test_dtype_is_part_of_the_config_identity():
    base = RunConfig()
    assert base.dtype is None
    pinned = base.with_(dtype="float32")
    assert pinned.config_id("t") != base.config_id("t")
    assert pinned.readable_prefix().endswith("-float32")


def test_cli_passes_dtype():
    from analysis.cli import build_parser
    from analysis.commands.run import config_from_args

    args = build_parser("run").parse_args(["run", "--dtype", "float32"])
    assert config_from_args(args).dtype == "float32"
    assert config_from_args(build_parser("run").parse_args(["run"])).dtype is None
