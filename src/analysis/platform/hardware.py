"""What this machine computes well, and the dtype the local random models use because of it.

A bf16 matmul is fast only where the CPU has bf16 instructions (AVX512-BF16 or AMX); elsewhere
(an AVX2-only laptop or cloud CPU) it runs about 100x slower than float32, which turns minute-long
notebooks into half-hour ones. So the local models are bf16 where bf16 is native and float32
otherwise. torch is asked, never the model name: `ATEN_CPU_CAPABILITY=avx2` makes torch itself
report an AVX2 machine, and the choice follows.

torch is imported only when a fact is asked for (`import analysis` stays light).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

DTYPES = ("bfloat16", "float32")
DTYPE_ENV = "PREFIX_CACHE_LAB_DTYPE"
# torch's capability names that have 512-bit vectors (the ones with bf16 instructions).
AVX512_OR_BETTER = ("AVX512", "AVX512_BF16", "AVX512_VNNI", "AMX")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN runs torch's bf16 matmuls: capped at one of these ISAs (ONEDNN_MAX_CPU_ISA) it has no
# bf16 instructions, and a bf16 matmul ran at 0.3 GFLOP/s while torch still said AVX512.
ONEDNN_ISAS_WITHOUT_BF16 = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
)


@dataclass(frozen=True)
class Machine:
    """The facts that decide the dtype, as torch reports them."""

    cpu_capability: str  # torch.backends.cpu.get_cpu_capability(): "AVX2", "AVX512", ...
    cpu_flags: tuple[str, ...]  # the bf16-related flags torch's cpuinfo reports present
    cpu_name: str
    cores: int  # CPUs this process may use
    cuda: bool
    cuda_device: str | None = None
    cuda_bf16: bool = False  # the GPU computes bf16 (Ampere or newer)
    onednn_max_cpu_isa: str | None = None  # $ONEDNN_MAX_CPU_ISA, when set

    @property
    def onednn_bf16(self) -> bool:
        """oneDNN (torch's bf16 matmuls) is not capped below the bf16 instructions."""
        return (self.onednn_max_cpu_isa or "ALL").upper() not in ONEDNN_ISAS_WITHOUT_BF16

    @property
    def native_bf16(self) -> bool:
        """AVX-512 (as torch dispatches), bf16 instructions (AVX512-BF16 or AMX), and oneDNN
        allowed to use them."""
        return (
            self.cpu_capability.upper() in AVX512_OR_BETTER
            and any(flag in self.cpu_flags for flag in BF16_FLAGS)
            and self.onednn_bf16
        )

    def to_dict(self) -> dict[str, Any]:
        facts = asdict(self)
        facts["cpu_flags"] = list(self.cpu_flags)
        facts["native_bf16"] = self.native_bf16
        return facts


@dataclass(frozen=True)
class DtypeChoice:
    """A dtype and the reason for it, for the manifest."""

    dtype: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


_MACHINE: Machine | None = None


def machine() -> Machine:
    """This machine's facts (asked once per process)."""
    global _MACHINE
    if _MACHINE is None:
        _MACHINE = _probe()
    return _MACHINE


def _probe() -> Machine:
    import torch

    info: dict[str, Any] = {}
    try:
        info = dict(torch._C._cpu._get_cpu_capability())
    except (AttributeError, RuntimeError):  # older torch or a non-x86 build
        info = {}
    cuda = bool(torch.cuda.is_available())
    return Machine(
        cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
        cpu_flags=tuple(f for f in BF16_FLAGS if info.get(f)),
        cpu_name=str(info.get("cpu_name", "")),
        cores=usable_cores(),
        cuda=cuda,
        cuda_device=torch.cuda.get_device_name(0) if cuda else None,
        cuda_bf16=bool(cuda and torch.cuda.is_bf16_supported()),
        onednn_max_cpu_isa=os.environ.get("ONEDNN_MAX_CPU_ISA")
        or os.environ.get("DNNL_MAX_CPU_ISA"),
    )


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def check_dtype(dtype: str, source: str) -> str:
    """`dtype` if it is one the local models can be built in, else a one-line error."""
    from analysis.platform.errors import ConfigError

    if dtype not in DTYPES:
        raise ConfigError(f"{source}={dtype!r} is not one of {', '.join(DTYPES)}")
    return dtype


def choose_dtype(explicit: str | None = None, facts: Machine | None = None) -> DtypeChoice:
    """The dtype of the local random models: explicit, else $PREFIX_CACHE_LAB_DTYPE, else bf16
    where the engine's device computes it natively (a bf16 GPU, or a CPU with AVX512-BF16 or
    AMX) and float32 where it does not."""
    if explicit is not None:
        return DtypeChoice(check_dtype(explicit, "dtype"), "asked for (--dtype / RunConfig.dtype)")
    env = os.environ.get(DTYPE_ENV)
    if env:
        return DtypeChoice(check_dtype(env, DTYPE_ENV), f"asked for (${DTYPE_ENV})")
    facts = facts or machine()
    if facts.cuda_bf16:  # the GPU build runs the engine on the GPU, which computes bf16
        return DtypeChoice("bfloat16", f"the GPU computes bf16 natively ({facts.cuda_device})")
    if facts.native_bf16:
        flags = "+".join(facts.cpu_flags)
        return DtypeChoice("bfloat16", f"CPU has native bf16 ({facts.cpu_capability}, {flags})")
    capped = "" if facts.onednn_bf16 else f", ONEDNN_MAX_CPU_ISA={facts.onednn_max_cpu_isa}"
    return DtypeChoice(
        "float32",
        f"CPU has no native bf16 (torch capability {facts.cpu_capability}, "
        f"bf16 flags: {'+'.join(facts.cpu_flags) or 'none'}{capped}): bf16 would be emulated, "
        "~100x slower",
    )
