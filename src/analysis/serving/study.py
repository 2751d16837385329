"""The serving study of notebooks 08, 10, 11 and 12: one place that builds their benchmark
configurations, so that the decision write-up (12) finds the very runs the others cached.

Parameter sets: `cpu` (the default: the local random ~155 M `prefill-llama`, small grids,
request counts sized by a calibration to fit a stated budget) and `gpu` (a real architecture
with random weights, larger grids). A notebook passes its papermill parameters as overrides.

Sizing: `plan` measures the caching-off server's speed once (prefill tokens/s, decode step;
cached per server under data/results/serving/) and picks the measured requests per repeat so
that the notebook's cells fit `budget_s` by that estimate, between `min_requests` and
`max_requests`; request timeouts scale with the same estimate (a timeout is counted in the
run's `n_timeout` and notes, never fatal).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from analysis import serving
from analysis.serving.calibrate import planned_seconds
from analysis.serving.model_names import DEFAULT_CPU_MODEL
from analysis.serving.stats import STEADY_STATE_WAVES

MIB = 1 << 20
THRASH = "thrash"  # the label the thrash anti-pattern starts with


@dataclass(frozen=True)
class StudyParams:
    """What a serving notebook may change (papermill parameters override these)."""

    model: str | None = None  # None: "prefill-llama" (CPU); a folder or name on a GPU
    load_format: str | None = None  # "dummy": the architecture with random weights
    # shared prefix lengths (tokens) the server measures; replay predicts `PREDICTED_PREFIXES`
    prefixes: tuple[int, ...] = (0, 1024)
    concurrency: tuple[int, ...] = (1, 4)  # closed-loop clients
    suffix_tokens: int = 24
    output_tokens: int = 4
    repeats: int = 3
    budget_s: float = 40.0  # measurement time per notebook section, by the calibration
    min_requests: int = 4
    max_requests: int = 32
    conversations_max: int = 16  # ShareGPT: conversations per repeat at most
    max_turns: int = 4
    sharegpt_concurrency: int = 4
    dilution_prefix: int = 1024
    eligible_shares: tuple[float, ...] = (0.5,)
    thrash: bool = False  # anti-patterns: also a prefix set twice the KV pool (~20 s in bf16)
    anti_pattern_requests: int = 8  # anti-patterns: measured requests per repeat (2 rounds of 4)
    # anti-patterns: repeats (their claims are counts of hits, exact in every repeat; their
    # times, quoted beside, are per request within the run)
    anti_pattern_repeats: int = 1
    # notebook 11: shared fractions of the offline sweep (seed 004's 11 steps of 10 %: the
    # `cpu-study` and `gpu` sets)
    sweep_fractions: tuple[float, ...] = (0.0, 0.5, 1.0)
    block_size: int = 32
    max_model_len: int = 2048
    # the KV pool for a 2-byte (bf16) KV cache: `kv_pool_bytes` gives a float32 model twice
    # as many bytes, the same blocks (None: vLLM sizes the pool from free GPU memory)
    kv_cache_memory_bytes: int | None = 512 * MIB
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = True
    # more `vllm serve` flags, the same for both servers
    server_extra_args: tuple[str, ...] = ()
    # ShareGPT: closed-loop clients of notebook 10's real check of its prediction beyond the
    # clients measured (None: no check; 64 clients took 20 minutes on a 2-core AMD EPYC)
    check_clients: int | None = None

    def bench(self, **changes: Any) -> serving.ServingBenchConfig:
        """A benchmark config with these server flags (the same for every section, so one
        server pair serves a whole notebook)."""
        base = serving.ServingBenchConfig(
            model=self.model,
            load_format=self.load_format,
            prefixes=self.prefixes,
            concurrency=self.concurrency,
            suffix_tokens=self.suffix_tokens,
            output_tokens=self.output_tokens,
            repeats=self.repeats,
            max_turns=self.max_turns,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            kv_cache_memory_bytes=self.kv_pool_bytes(),
            gpu_memory_utilization=self.gpu_memory_utilization,
            enforce_eager=self.enforce_eager,
            server_extra_args=self.server_extra_args,
        )
        return dataclasses.replace(base, **changes)

    def kv_pool_bytes(self) -> int | None:
        """The KV pool's bytes for the model's KV dtype: `kv_cache_memory_bytes` holds a bf16
        cache, and a model run in float32 (a CPU without bf16) gets twice the bytes. The pool
        then has as many blocks on either kind of CPU, so that what the study counts (hits,
        evictions, the replayed curves) does not depend on which kind ran it: in 512 MiB a
        float32 pool held half the blocks, and notebook 10's replayed hit rates differed."""
        if self.kv_cache_memory_bytes is None:
            return None
        from analysis.models import resolve_model

        model = resolve_model(self.model, default=DEFAULT_CPU_MODEL)
        return self.kv_cache_memory_bytes * model.kv_value_bytes // 2


SEED_FRACTIONS = tuple(i / 10 for i in range(11))  # seed 004: 0-100 % shared in 10 % steps

PROFILES: dict[str, dict[str, Any]] = {
    "cpu": {},
    # The same CPU model and servers at decision grade: concurrency up to 32, 96 measured
    # requests per repeat (288 per cell; three waves of the 32 clients, so that a cell is a
    # steady state, not one burst), and the thrash case.
    "cpu-study": {
        "prefixes": (0, 256, 1024),
        "concurrency": (1, 8, 16, 32),
        "budget_s": 1800.0,
        "min_requests": 96,
        "max_requests": 96,
        "thrash": True,
        "anti_pattern_requests": 16,
        "anti_pattern_repeats": 3,
        "sweep_fractions": SEED_FRACTIONS,
        "check_clients": 64,
    },
    "gpu": {
        "model": "llama-3.1-8b",
        "load_format": "dummy",
        "prefixes": (0, 256, 512, 1024, 2048),
        "concurrency": (1, 8, 16, 32, 64),
        "output_tokens": 32,
        "budget_s": 300.0,
        "min_requests": 32,
        "max_requests": 128,
        "conversations_max": 64,
        "sharegpt_concurrency": 16,
        "eligible_shares": (0.25, 0.5, 0.75),
        "max_model_len": 4096,
        "kv_cache_memory_bytes": None,
        # the caching-on and caching-off servers run at once, on one GPU: each takes 40 %
        "gpu_memory_utilization": 0.4,
        # as the engine that measures the step-cost profile runs (eager, one schedule per
        # step), so that replay's clock holds for the servers: vLLM's CUDA default overlaps
        # the next schedule with the running step, which replay does not model
        "enforce_eager": True,
        "server_extra_args": ("--no-async-scheduling",),
        "thrash": True,
        "anti_pattern_requests": 16,
        "anti_pattern_repeats": 3,
        "sweep_fractions": SEED_FRACTIONS,
    },
}


# Shared prefixes (tokens) whose curves notebook 08 draws and notebook 12 reads: replay on the
# clock notebook 08 validated against the server, at the prefixes it did not measure too.
PREDICTED_PREFIXES = (0, 256, 512, 1024)


def predicted_prefixes(study: StudyParams) -> list[int]:
    """`PREDICTED_PREFIXES` and every prefix the server measured."""
    return sorted(set(PREDICTED_PREFIXES) | set(study.prefixes))


def unmeasured_prefixes(study: StudyParams) -> list[int]:
    """The predicted prefixes the server did not measure."""
    return [prefix for prefix in predicted_prefixes(study) if prefix not in study.prefixes]


def params(profile: str = "cpu", **overrides: Any) -> StudyParams:
    """The parameter set `profile` with the notebook's overrides (None values are ignored,
    lists become tuples)."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
    values = dict(PROFILES[profile])
    for name, value in overrides.items():
        if value is not None:
            values[name] = tuple(value) if isinstance(value, list) else value
    return StudyParams(**values)


@dataclass(frozen=True)
class Plan:
    """What the calibration chose, to be printed by the notebook."""

    calibration: serving.Calibration
    requests: int  # measured requests (or conversations, see `unit`) per repeat
    estimate_s: float
    timeout_s: float
    unit: str = "requests"
    per_client: int = 0  # and at least this many per client in every cell

    def describe(self, what: str) -> str:
        cal = self.calibration
        floor = f", at least {self.per_client} per client" if self.per_client else ""
        return (
            f"{what}: calibration {cal.prefill_tok_s:,.0f} prefill tokens/s, "
            f"{cal.decode_step_s * 1e3:.1f} ms per decode step, {cal.fixed_s * 1e3:.0f} ms fixed; "
            f"chose {self.requests} measured {self.unit} per repeat{floor} (estimate "
            f"{self.estimate_s:.0f} s); request timeout {self.timeout_s:.0f} s"
        )


def plan(
    pair: serving.ServerPair,
    study: StudyParams,
    cells: list[tuple[int, int, int]],
    *,
    budget_s: float | None = None,
    minimum: int | None = None,
    maximum: int | None = None,
    conversations: bool = False,
) -> Plan:
    """Requests per repeat for `cells` ((uncached tokens, output tokens, concurrency) per
    mode and cell) within the budget, at least `STEADY_STATE_WAVES` per client (unless the
    unit is a `conversations` of several requests), and a request timeout scaled to the
    slowest cell."""
    cal = serving.calibration(pair, study.bench())
    low = study.min_requests if minimum is None else minimum
    high = max(low, study.max_requests if maximum is None else maximum)
    budget = study.budget_s if budget_s is None else budget_s
    # every cell's clients go round several times: a steady state, not one burst (a closed
    # loop of conversations has several requests per conversation)
    per_client = 0 if conversations else STEADY_STATE_WAVES
    requests = serving.plan_requests(
        cal,
        cells,
        budget,
        repeats=study.repeats,
        minimum=low,
        maximum=high,
        per_client=per_client,
    )
    estimate = planned_seconds(cal, cells, requests, repeats=study.repeats, per_client=per_client)
    timeout = max(cal.timeout_s(u + study.suffix_tokens, o, c) for u, o, c in cells)
    unit = "conversations" if conversations else "requests"
    return Plan(cal, requests, estimate, timeout, unit, per_client)


def profile_calibration(profile: str = "cpu") -> tuple[serving.Calibration, str]:
    """The calibration of `profile`'s caching-off server and a phrase saying what it is, for
    turning tokens into time elsewhere: the cached one when notebook 08 has run with this
    profile, else measured now (which starts the profile's servers)."""
    study = params(profile)
    with serving.ServerPair() as pair:
        cal = serving.calibration(pair, study.bench())
    model = study.model or DEFAULT_CPU_MODEL
    return cal, (
        f"the calibration of the {profile!r} profile's caching-off vLLM server on this machine, "
        f"model {model}, {cal.probe_tokens:,}-token probes"
    )


def synthetic_cells(study: StudyParams) -> list[tuple[int, int, int]]:
    """Uncached tokens per request in both modes for every (prefix, concurrency)."""
    cells = []
    for prefix in study.prefixes:
        for c in study.concurrency:
            cells.append((prefix + study.suffix_tokens, study.output_tokens, c))  # off
            cells.append((study.suffix_tokens + study.block_size, study.output_tokens, c))  # on
    return cells


def say(message: str) -> None:
    """Progress and speed-dependent facts go to stderr (never compared by nbval)."""
    print(message, file=sys.stderr)


def pool_blocks(pair: serving.ServerPair, study: StudyParams) -> int | None:
    """KV blocks in the caching server's pool: computed when the study fixes the pool's bytes
    (the CPU sets), else as the running server reports it (a GPU sizes its pool from free
    memory, so this starts the server)."""
    model = serving.resolve_model(study.model)
    if study.kv_cache_memory_bytes:
        blocks = kv_pool_blocks(model, study.block_size, study.kv_pool_bytes())
        if blocks:
            return blocks
    return pair.get(study.bench(), model, ("cache",))["cache"].kv_capacity_blocks()


def kv_pool_blocks(model: str, block_size: int, pool_bytes: int) -> int | None:
    """Blocks that vLLM makes of a `pool_bytes` KV pool for `model` (None: shape unknown)."""
    from analysis.models import resolve_model

    per_block = resolve_model(model).kv_bytes_per_block(block_size)
    return pool_bytes // per_block if per_block else None


def thrash_prefixes(capacity_blocks: int | None, study: StudyParams, prefix: int) -> int:
    """How many distinct prefixes overflow the KV pool twice over (LRU then evicts each
    prefix before it comes round again); 8 when the pool size is unknown."""
    if not capacity_blocks:
        return 8
    blocks_per_prefix = max(1, math.ceil(prefix / study.block_size))
    return max(2, math.ceil(2 * capacity_blocks / blocks_per_prefix))


# --------------------------------------------------------------------------------------------
# Sections: each runs (or reads back) one notebook's measurements
# --------------------------------------------------------------------------------------------


def synthetic_section(
    pair: serving.ServerPair, study: StudyParams, *, force: bool = False
) -> tuple[Any, Plan]:
    """Notebook 08's grid: every prefix x concurrency, caching on and off, `repeats` each."""
    chosen = plan(pair, study, synthetic_cells(study))
    config = synthetic_config(study, chosen)
    return serving.run_serving_bench(config, servers=pair, force=force, progress=False), chosen


def launch_servers(pair: serving.ServerPair, profile: str = "cpu") -> None:
    """Start the study's two servers in `pair` without waiting for them (`kept_servers`
    waits), so that their start-up overlaps the notebooks before the study."""
    config = params(profile).bench()
    pair.launch(config, serving.resolve_model(config.model), serving.MODES)


@contextmanager
def kept_servers(
    profile: str = "cpu", pair: serving.ServerPair | None = None
) -> Iterator[serving.ServerPair]:
    """The study's caching-on and caching-off servers (the `profile` parameter set's flags,
    which every section of notebooks 08 and 10 shares), ready now (started in `pair` if it has
    them, else here) and kept for every notebook whose kernel starts inside the block
    (`serving.kept_servers`); stopped at its end."""
    from analysis.serving import kept_servers as kept

    config = params(profile).bench()
    with contextlib.ExitStack() as stack:
        if pair is None:
            pair = stack.enter_context(serving.ServerPair())
        else:
            stack.callback(pair.stop)
        pair.get(config, serving.resolve_model(config.model), serving.MODES)
        with kept.published(pair.servers.values()):
            yield pair


def synthetic_config(study: StudyParams, chosen: Plan) -> serving.ServingBenchConfig:
    """The benchmark configuration of notebook 08's grid, with the requests `plan` chose."""
    return study.bench(
        requests=chosen.requests,
        requests_per_client=chosen.per_client,
        request_timeout_s=chosen.timeout_s,
    )


def anti_pattern_section(
    pair: serving.ServerPair, study: StudyParams, *, force: bool = False
) -> Any:
    """Caching on, one client, the longest prefix: prefixes cycling over 4 variants, and a
    prefix that changes every 4 requests (churn). Each new prefix misses once (`new_prefixes`
    per repeat, a column of the table). With
    `study.thrash`, also K distinct prefixes twice the KV pool, round robin over two rounds:
    LRU evicts every prefix before its turn comes again, so the second round misses too."""
    from analysis.serving import loadgen

    prefix = max(study.prefixes)
    patterns: list[tuple[str, dict[str, Any]]] = [
        ("one shared prefix", {}),
        ("4 distinct prefixes, round robin", {"distinct_prefixes": 4}),
        ("churn: new prefix every 4 requests", {"churn_every": 4}),
    ]
    if study.thrash:
        k = thrash_prefixes(pool_blocks(pair, study), study, prefix)
        patterns.append(
            (
                f"{THRASH}: {k} distinct prefixes (2x the pool), round robin",
                {"distinct_prefixes": k, "requests": 2 * k},
            )
        )
    rows = []
    for label, changes in patterns:
        config = study.bench(
            prefixes=(prefix,),
            concurrency=(1,),
            modes=("cache",),
            repeats=study.anti_pattern_repeats,
            **({"requests": study.anti_pattern_requests} | changes),
        )
        table = serving.run_serving_bench(config, servers=pair, force=force, progress=False)
        # the misses a cache that evicts nothing would give (the thrash case evicts: None)
        fresh = None
        if not label.startswith(THRASH):
            fresh = loadgen.new_prefixes(
                config.requests, config.distinct_prefixes, config.churn_every
            )
        rows.append(table.assign(pattern=label, new_prefixes=fresh))
    import pandas as pd

    return pd.concat(rows, ignore_index=True)


def sharegpt_section(
    pair: serving.ServerPair, study: StudyParams, *, force: bool = False
) -> tuple[Any, Plan]:
    """Notebook 10: multi-turn ShareGPT conversations as closed-loop clients, on and off."""
    from analysis.serving import loadgen

    probe = loadgen.sharegpt_workload(
        conversations=study.conversations_max,
        max_turns=study.max_turns,
        output_tokens=study.output_tokens,
        max_model_len=study.max_model_len,
    )
    specs = [s for c in probe.conversations for s in c]
    turns = len(specs) / len(probe.conversations)
    mean_prompt = sum(len(s.prompt_ids) for s in specs) / len(specs)
    c = study.sharegpt_concurrency
    cells = [(int(mean_prompt * turns), study.output_tokens, c)]  # caching off, per conversation
    cells.append((int(mean_prompt * turns * 0.3), study.output_tokens, c))  # on: most is cached
    chosen = plan(
        pair, study, cells, minimum=max(c, 4), maximum=study.conversations_max, conversations=True
    )
    config = sharegpt_config(study, chosen)
    return serving.run_serving_bench(config, servers=pair, force=force, progress=False), chosen


# An open loop's rate, as a share of the conversations per second the caching-off server
# finished in the closed loop: busy enough that arrivals queue with caching off, not so busy
# that the queue only grows.
OPEN_LOOP_LOAD = 0.8

# What notebooks 10 and 12 predict of the conversations beyond what the server ran: closed
# loops of these many clients over the trace's first PREDICTED_CONVERSATIONS conversations.
PREDICTED_CLIENTS = (1, 2, 4, 8, 16, 32, 64)
PREDICTED_CONVERSATIONS = 256


# Notebook 10's check: conversations sent through `check_clients` clients, and the limits of
# one run that long (a turn may queue behind most of the others).
CHECK_CONVERSATIONS = 128
CHECK_REQUEST_TIMEOUT_S = 600
CHECK_RUN_DEADLINE_S = 3000


def sharegpt_check_config(study: StudyParams, clients: int) -> serving.ServingBenchConfig:
    """Notebook 10's check of its prediction where the server rarely goes: the trace's first
    `CHECK_CONVERSATIONS` conversations through `clients` closed-loop clients, on and off."""
    return study.bench(
        workload="sharegpt",
        concurrency=(clients,),
        requests=CHECK_CONVERSATIONS,
        request_timeout_s=CHECK_REQUEST_TIMEOUT_S,
        run_deadline_s=CHECK_RUN_DEADLINE_S,
    )


def sharegpt_check_section(
    pair: serving.ServerPair, study: StudyParams, *, force: bool = False
) -> tuple[Any, serving.ServingBenchConfig] | None:
    """The check's measured table and configuration (None where `study.check_clients` is)."""
    if study.check_clients is None:
        return None
    config = sharegpt_check_config(study, study.check_clients)
    return serving.run_serving_bench(config, servers=pair, force=force, progress=False), config


def conversations_to_predict(choice: int | str | None) -> int | None:
    """A notebook's `predicted_conversations` parameter as a count: None for the default
    (`PREDICTED_CONVERSATIONS`), "all" for every conversation of the trace (None here)."""
    if choice is None:
        return PREDICTED_CONVERSATIONS
    if choice == "all":
        return None
    if isinstance(choice, bool) or not isinstance(choice, int) or choice < 1:
        raise ValueError(f"predicted_conversations: a count >= 1, 'all' or None, got {choice!r}")
    return choice


def open_loop_rate(closed_loop: Any, chosen: Plan) -> float:
    """Conversations per second for notebook 10's open loop: `OPEN_LOOP_LOAD` of what the
    caching-off server finished in the closed loop (`closed_loop`, its table), to two
    significant digits (the rate names the cells)."""
    off = closed_loop[closed_loop["mode"] == "no_cache"].iloc[0]
    turns = off["requests_per_repeat"] / chosen.requests  # requests per conversation
    return float(f"{OPEN_LOOP_LOAD * off['req_s'] / turns:.2g}")


def sharegpt_open_loop_section(
    pair: serving.ServerPair,
    study: StudyParams,
    chosen: Plan,
    closed_loop: Any,
    *,
    force: bool = False,
) -> tuple[Any, float]:
    """Notebook 10: the closed loop's conversations again, started open loop at a rate (a
    Poisson process), on and off; returns the table and the rate."""
    rate = open_loop_rate(closed_loop, chosen)
    config = sharegpt_open_loop_config(study, chosen, rate)
    return serving.run_serving_bench(config, servers=pair, force=force, progress=False), rate


def sharegpt_open_loop_config(
    study: StudyParams, chosen: Plan, rate: float
) -> serving.ServingBenchConfig:
    """Notebook 10's open loop: `rate` conversations per second, capped at every conversation
    in flight (so the cap never holds one back, as in replay, which has none)."""
    return dataclasses.replace(
        sharegpt_config(study, chosen), arrival_rate=rate, concurrency=(chosen.requests,)
    )


def sharegpt_config(study: StudyParams, chosen: Plan) -> serving.ServingBenchConfig:
    """The benchmark configuration of notebook 10's conversations, with the conversations
    `plan` chose."""
    return study.bench(
        workload="sharegpt",
        concurrency=(study.sharegpt_concurrency,),
        requests=chosen.requests,
        request_timeout_s=chosen.timeout_s,
    )


def dilution_section(
    pair: serving.ServerPair, study: StudyParams, *, force: bool = False
) -> dict[str, Any]:
    """Mixed traffic at one client: a share f of requests shares a `dilution_prefix`-token
    prefix, the rest have unique prefixes of that length; plus f = 1 (caching on: all hit)
    and caching off (all miss). Returns the tables and requests of each."""
    prefix = study.dilution_prefix
    cells = [(prefix + study.suffix_tokens, study.output_tokens, 1)] * (
        2 + len(study.eligible_shares)
    )
    chosen = plan(pair, study, cells, budget_s=study.budget_s / 2)
    common = {
        "prefixes": (prefix,),
        "concurrency": (1,),
        "requests": chosen.requests,
        "request_timeout_s": chosen.timeout_s,
        "salt": "mixed",  # own prompts, measured next to the mixed runs (not 08's, earlier)
    }
    mixed = {}
    for share in study.eligible_shares:
        config = study.bench(modes=("cache",), eligible_share=share, **common)
        mixed[share] = serving.run_serving_bench(config, servers=pair, force=force, progress=False)
    base = serving.run_serving_bench(
        study.bench(**common), servers=pair, force=force, progress=False
    )
    return {"base": base, "mixed": mixed, "plan": chosen}


def engine_config(study: StudyParams, **overrides: Any) -> serving.PrefixSweepConfig:
    """Notebook 11: seed 004's offline sweep (the parameter set's shared fractions) and
    long-prefill table on the in-process engine, scaled to the parameter set."""
    values: dict[str, Any] = {
        "model": study.model,
        "load_format": study.load_format,
        "fractions": study.sweep_fractions,
        "num_prompts": 4,
        "input_len": 1000,
        "output_len": 24,
        "repeats": study.repeats,
        "budget_s": study.budget_s,
        "max_model_len": 2048,
        "long_input_len": 1536,
        "long_prompts": 2,
        "long_output_lens": (2, 16, 128),
        "long_rounds": 2,
        "kv_cache_memory_bytes": study.kv_pool_bytes(),
        "gpu_memory_utilization": study.gpu_memory_utilization,
        "enforce_eager": study.enforce_eager,
    }
    if study.load_format == "dummy":  # a GPU: the seed's sizes
        values.update(
            num_prompts=256,
            long_input_len=10240,
            long_prompts=10,
            long_rounds=3,
            long_output_lens=(2, 4, 8, 16, 32, 64, 128),
            max_model_len=10240 + 128,
        )
    values.update({k: (tuple(v) if isinstance(v, list) else v) for k, v in overrides.items()})
    return serving.PrefixSweepConfig(**values)


def vllm_source_line(relative: str, needle: str) -> str:
    """`path:line: text` of the first line of the installed vLLM's `relative` source file that
    contains `needle`: where a claim about vLLM's behaviour can be checked."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return f"vllm/{relative}: vLLM is not installed"
    path = Path(spec.origin).parent / relative
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if needle in line:
            return f"vllm/{relative}:{number}: {line.strip()}"
    return f"vllm/{relative}: {needle!r} not found (another vLLM version?)"
