"""What this machine computes fast, and so which dtype the local random models use.

A bf16 matmul is fast only where the CPU has bf16 instructions and torch dispatches to them:
on an AVX2-only CPU it ran ~150x slower than float32 (0.4 vs 68 GFLOP/s), and a fresh
`make test` took 40 min there. So the local models are bf16 only where bf16
is native (AVX512-BF16 or AMX tiles, with torch dispatching AVX512 kernels and oneDNN not
limited below bf16), float32 everywhere else; a visible GPU decides for itself. Prefix
caching does not depend on the dtype: only the speed and the KV bytes per block change.

torch is imported lazily, so that `import analysis` stays light.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import asdict, dataclass
from typing import Any

DTYPES = ("bfloat16", "float16", "float32")
# oneDNN ISA names (ONEDNN_MAX_CPU_ISA) that stop below bf16 instructions.
ONEDNN_ISAS_WITHOUT_BF16 = frozenset(
    {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
)


@dataclass(frozen=True)
class MachineFacts:
    """What the machine reports, as torch sees it (None where torch cannot say)."""

    machine: str  # platform.machine(), e.g. x86_64
    processor: str  # the CPU model name (/proc/cpuinfo), or platform.processor()
    cpu_cores: int  # cores this process may use
    torch_threads: int | None
    cpu_capability: str | None  # the ISA torch dispatches to: AVX512, AVX2, DEFAULT, ...
    avx512_bf16: bool | None  # the CPU has AVX512-BF16 (cpuinfo)
    amx_tile: bool | None  # the CPU has AMX tiles (cpuinfo)
    onednn_max_cpu_isa: str | None  # ONEDNN_MAX_CPU_ISA, when set
    cuda: bool
    cuda_device: str | None
    cuda_bf16: bool | None

    @property
    def native_bf16(self) -> bool:
        """The CPU computes bf16 in hardware and both torch and oneDNN are allowed to."""
        has_instructions = bool(self.avx512_bf16 or self.amx_tile)
        dispatched = (self.cpu_capability or "").upper().startswith("AVX512")
        onednn_isa = (self.onednn_max_cpu_isa or "ALL").upper()
        return has_instructions and dispatched and onednn_isa not in ONEDNN_ISAS_WITHOUT_BF16

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "native_bf16": self.native_bf16}


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype a model runs in, and why (recorded in the manifests)."""

    dtype: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@functools.cache
def machine_facts() -> MachineFacts:
    """The facts of this process's machine (torch is imported once, on first call)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - vLLM always brings torch
        torch = None
    cuda = bool(torch is not None and torch.cuda.is_available())
    return MachineFacts(
        machine=platform.machine(),
        processor=_processor_name(),
        cpu_cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1,
        torch_threads=torch.get_num_threads() if torch is not None else None,
        cpu_capability=_torch_call(torch, lambda t: t.backends.cpu.get_cpu_capability()),
        avx512_bf16=_torch_call(torch, lambda t: bool(t.cpu._is_avx512_bf16_supported())),
        amx_tile=_torch_call(torch, lambda t: bool(t.cpu._is_amx_tile_supported())),
        onednn_max_cpu_isa=os.environ.get("ONEDNN_MAX_CPU_ISA")
        or os.environ.get("DNNL_MAX_CPU_ISA"),
        cuda=cuda,
        cuda_device=torch.cuda.get_device_name(0) if cuda else None,
        cuda_bf16=bool(torch.cuda.is_bf16_supported()) if cuda else None,
    )


def default_dtype(device: str | None = None, facts: MachineFacts | None = None) -> DtypeChoice:
    """bf16 where `device` computes it natively, else float32 (CPU) or float16 (old GPU).

    `device` None means the GPU when one is visible, else the CPU.
    """
    facts = facts or machine_facts()
    device = device or ("cuda" if facts.cuda else "cpu")
    if device == "cuda":
        if facts.cuda_bf16:
            return DtypeChoice("bfloat16", f"the GPU ({facts.cuda_device}) computes bf16")
        return DtypeChoice("float16", f"the GPU ({facts.cuda_device}) has no bf16")
    if facts.native_bf16:
        units = " and ".join(
            name
            for name, present in (("AVX512-BF16", facts.avx512_bf16), ("AMX", facts.amx_tile))
            if present
        )
        return DtypeChoice(
            "bfloat16", f"the CPU computes bf16 natively ({units}, torch dispatches AVX512)"
        )
    return DtypeChoice("float32", f"no native bf16 on this CPU ({_why_not_bf16(facts)})")


def choose_dtype(explicit: str | None = None, device: str | None = None) -> DtypeChoice:
    """An explicit dtype (checked) wins; otherwise the machine's default for `device`."""
    if explicit is None:
        return default_dtype(device)
    check_dtype(explicit)
    return DtypeChoice(explicit, "asked for explicitly (--dtype)")


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(
            f"dtype={dtype!r} is not one of {', '.join(DTYPES)}: use --dtype "
            "float32 (any CPU) or bfloat16 (CPUs with AVX512-BF16/AMX, GPUs)"
        )


def _why_not_bf16(facts: MachineFacts) -> str:
    if not (facts.avx512_bf16 or facts.amx_tile):
        return f"no AVX512-BF16 or AMX; torch dispatches {facts.cpu_capability}"
    if not (facts.cpu_capability or "").upper().startswith("AVX512"):
        return f"torch dispatches {facts.cpu_capability}, below AVX512"
    return f"ONEDNN_MAX_CPU_ISA={facts.onednn_max_cpu_isa} stops below bf16"


def _torch_call(torch: Any, ask: Any) -> Any:
    """torch's answer, or None where this build cannot give it."""
    if torch is None:
        return None
    try:
        return ask(torch)
    except (AttributeError, RuntimeError):
        return None


def _processor_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
