"""What a serving benchmark runs: its configuration (`ServingBenchConfig`), the key of one run
in it (`RunKey`), the run id that names the run's folder and the folder a cell is found in.

A module of its own because the single run, the whole benchmark and the calibration all take
the configuration, and the run id must stay the same wherever it is computed (cached runs are
found by it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from analysis.engines.config import poisson_label
from analysis.models import shapes as model_shapes
from analysis.platform.manifest import read_json
from analysis.serving.model_names import model_identity
from analysis.serving.server import GIB, MODES, ServerConfig
from analysis.serving.storage import _digest, is_reusable

WORKLOADS = ("synthetic", "sharegpt")


@dataclass(frozen=True)
class ServingBenchConfig:
    """One benchmark: every (mode, prefix regime, concurrency) run of one workload."""

    model: str | None = None  # None: the CPU default (`prefill-llama`)
    workload: str = "synthetic"  # synthetic | sharegpt
    prefixes: tuple[int, ...] = (0, 512, 1024, 2048)  # synthetic only
    concurrency: tuple[int, ...] = (1, 8)
    requests: int = 8  # measured requests per run; sharegpt: conversations per run
    # synthetic: at least this many measured requests per client, so that every cell goes
    # round its clients as often (0: `requests` in every cell)
    requests_per_client: int = 0
    modes: tuple[str, ...] = MODES
    suffix_tokens: int = 24
    output_tokens: int = 16
    warmup_requests: int = 1  # synthetic: sent alone first, to populate the cache
    max_turns: int = 4  # sharegpt: turns per conversation
    trace_path: str | None = None  # sharegpt: default data/traces/multi_turn.parquet
    request_timeout_s: float = 120.0
    run_deadline_s: float = 600.0
    seed: int = 0
    block_size: int = 32
    max_model_len: int = 4096
    kv_cache_memory_bytes: int | None = GIB
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = True
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    server_extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = 300.0
    load_format: str | None = None  # "dummy": a real architecture with random weights (GPU)
    repeats: int = 1  # measured repeats per cell, each from an emptied cache
    eligible_share: float = 1.0  # synthetic: share f of requests that use the shared prefix
    distinct_prefixes: int = 1  # synthetic: eligible requests cycle over this many prefixes
    churn_every: int = 0  # synthetic: a new prefix version every N measured requests (0: never)
    gauge_interval_s: float = 0.5  # KV-cache use sampled from /metrics this often (0: never)
    salt: str = ""  # synthetic: other prompts, same server (a run that must not reuse another's)
    # sharegpt: conversations started per second, open loop (Poisson, seeded by `seed` plus the
    # repeat), each turn after the previous reply; `concurrency` then caps those in flight.
    # None: a closed loop of `concurrency` clients.
    arrival_rate: float | None = None

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}, got {self.workload!r}")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"modes must be among {MODES}, got {bad}")
        if any(c < 1 for c in self.concurrency) or self.requests < 1 or self.repeats < 1:
            raise ValueError("concurrency, requests and repeats must be >= 1")
        if self.requests_per_client < 0:
            raise ValueError(f"requests_per_client must be >= 0, got {self.requests_per_client}")
        for name in RUN_LIMITS:
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        if self.arrival_rate is not None:
            if self.workload != "sharegpt":
                raise ValueError("arrival_rate (open-loop arrivals) needs workload='sharegpt'")
            if not (math.isfinite(self.arrival_rate) and self.arrival_rate > 0):
                raise ValueError(
                    f"arrival_rate must be a positive number of conversations per second, "
                    f"got {self.arrival_rate}"
                )
        if not 0.0 <= self.eligible_share <= 1.0:
            raise ValueError(f"eligible_share must lie in [0, 1], got {self.eligible_share}")
        longest = max(self.prefixes, default=0) + self.suffix_tokens + self.output_tokens
        if self.workload == "synthetic" and longest > self.max_model_len:
            raise ValueError(
                f"prefix {max(self.prefixes)} + suffix {self.suffix_tokens} + output "
                f"{self.output_tokens} exceeds max_model_len {self.max_model_len}"
            )

    def server_config(self, model: str, mode: str) -> ServerConfig:
        return ServerConfig(
            model=model,
            prefix_caching=mode == "cache",
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enforce_eager=self.enforce_eager,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            seed=self.seed,
            extra_args=self.server_extra_args,
            startup_timeout_s=self.startup_timeout_s,
            load_format=self.load_format or model_shapes.load_format(model),
        )

    def requests_at(self, concurrency: int) -> int:
        """Measured requests per run of a cell with `concurrency` clients (synthetic)."""
        return requests_in_cell(self.requests, self.requests_per_client, concurrency)

    def regimes(self) -> tuple[str, ...]:
        if self.workload == "sharegpt":
            return (poisson_label(self.arrival_rate) if self.arrival_rate else "sharegpt",)
        return tuple(str(p) for p in self.prefixes)


def requests_in_cell(requests: int, per_client: int, concurrency: int) -> int:
    """`requests`, or `per_client` rounds of the cell's clients where that is more."""
    return max(requests, per_client * concurrency)


def arrival_seed(config: ServingBenchConfig, repeat: int) -> int:
    """The seed of repeat `repeat`'s Poisson schedule in an open loop: one per repeat, so that
    the repeats measure as many seeds of arrivals (replay replays each with its own)."""
    return config.seed + repeat


@dataclass(frozen=True)
class RunKey:
    mode: str
    regime: str  # prefix length, "sharegpt" (closed loop) or "poisson<rate>" (open loop)
    concurrency: int


# Bumped when a run's summary changes meaning, so that runs cached before are measured again
# (2: statistics per repeat, then across repeats; load and requests in flight recorded).
SUMMARY_SCHEMA = 2


# Limits that make requests fail (timed out, not sent): part of a run's id, because a run
# under other limits may have other failures. Run ids made before they were part of it are
# still found, with the same limits in their manifest (`cell_dir`).
RUN_LIMITS = ("request_timeout_s", "run_deadline_s")


def run_id(config: ServingBenchConfig, model: str, key: RunKey, workload_hash: str = "") -> str:
    """`<workload>-<mode>-p<prefix>-c<concurrency>-<hash>`; the hash covers everything that
    shapes the run (model, server flags, workload parameters, the request timeout and run
    deadline and, for ShareGPT, the prompts themselves: `workload_hash`) except the swept
    lists."""
    return _run_id(config, model, key, workload_hash, with_limits=True)


def legacy_run_id(
    config: ServingBenchConfig, model: str, key: RunKey, workload_hash: str = ""
) -> str:
    """The id the same run had before `RUN_LIMITS` were part of run ids."""
    return _run_id(config, model, key, workload_hash, with_limits=False)


def cell_dir(
    root: Path, config: ServingBenchConfig, model: str, key: RunKey, workload_hash: str = ""
) -> Path:
    """The folder of a cell: under its run id, unless only a reusable cell under its legacy id
    exists, run with the same limits (such cells stay valid; a later write goes to the run id)."""
    current = root / run_id(config, model, key, workload_hash)
    legacy = root / legacy_run_id(config, model, key, workload_hash)
    if current.exists() or not is_reusable(legacy):
        return current
    ran_with = read_json(legacy / "manifest.json").get("config", {})
    same = all(ran_with.get(name) == getattr(config, name) for name in RUN_LIMITS)
    return legacy if same else current


def _run_id(
    config: ServingBenchConfig, model: str, key: RunKey, workload_hash: str, *, with_limits: bool
) -> str:
    shaping = asdict(config)
    ignored = ("model", "prefixes", "concurrency", "modes", "startup_timeout_s", "gauge_interval_s")
    for name in ignored + (() if with_limits else RUN_LIMITS):
        shaping.pop(name)
    if shaping["arrival_rate"] is None:  # closed loop: the ids runs had before open loops
        shaping.pop("arrival_rate")
    else:
        shaping["arrival_seed"] = "seed + repeat"  # (`arrival_seed`; once the seed alone)
    if not shaping["requests_per_client"]:  # the ids runs had before requests per client
        shaping.pop("requests_per_client")
    shaping.update(model_identity(model), mode=key.mode, regime=key.regime, c=key.concurrency)
    shaping["summary_schema"] = SUMMARY_SCHEMA
    if workload_hash:
        shaping["workload_hash"] = workload_hash
    regime = f"p{key.regime}" if key.regime.isdigit() else key.regime
    return f"{config.workload}-{key.mode}-{regime}-c{key.concurrency}-{_digest(shaping)}"
