"""A target hit rate turned into blocks, bytes and GPUs: the answer a capacity plan gives.

"x % of the ideal" is read twice. From the LRU bound in engine order: the cache alone, kept
between requests, exact from one stack-distance pass. From the engine: the smallest
`num_blocks` at which replay (vLLM's scheduler) measures that rate, searched between the grid's
points by bisection with a few more runs; this count also holds the running requests' blocks,
and it is the number vLLM's `num_gpu_blocks` must reach. Bytes come from the model's KV layout
(`analysis.models.memory`, checked against vLLM's own KV cache spec), GPUs from vLLM's memory
formula at a given `gpu_memory_utilization`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.sweeps.capacity_plan import CapacityPlan, engine_point_row, replay_point


@dataclass(frozen=True)
class EngineSearch:
    """The smallest engine point found that reaches a rate, and how narrowly it was bracketed."""

    reached: bool
    num_blocks: int | None  # the smallest num_blocks measured at or above the rate
    rate: float | None  # what replay measured there
    below: int | None  # the largest num_blocks measured below the rate (None: none tried)
    best_rate: float  # the highest rate any point measured (the answer when not reached)


@dataclass(frozen=True)
class TargetAnswer:
    """One target read off a plan, in blocks, tokens, bytes and GPUs."""

    share_of_ideal: float
    ideal_rate: float
    target_rate: float
    lru_blocks: int | None  # the LRU bound in engine order (the cache alone)
    engine: EngineSearch
    model: str
    kv_cache_dtype: str
    bytes_per_block: int
    gpu: str
    gpu_memory_utilization: float
    tensor_parallel: int | None  # the smallest degree whose KV budget holds the engine's blocks
    gpu_share: float | None  # the engine's KV bytes / one GPU's memory, at that degree
    gpu_num_blocks: int | None  # the blocks vLLM would allocate per GPU at that degree
    assumed: str | None  # what the KV budget assumed (activations and CUDA graphs)

    @property
    def engine_bytes(self) -> int | None:
        blocks = self.engine.num_blocks
        return None if blocks is None else blocks * self.bytes_per_block

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"engine_bytes": self.engine_bytes}


def search_engine_blocks(plan: CapacityPlan, rate: float) -> EngineSearch:
    """The smallest measured `num_blocks` whose first-prefill rate reaches `rate`, narrowed by
    up to `plan.settings.refine` bisection runs between the grid points around it. Each run is
    appended to `plan.points` (found_by = "search"); a rate searched before is not searched
    again (every model and KV dtype asks the same engine the same question)."""
    if rate not in plan.searches:
        plan.searches[rate] = _search(plan, rate)
    return plan.searches[rate]


def _search(plan: CapacityPlan, rate: float) -> EngineSearch:
    below, above = _bracket(plan.points, rate)
    for _ in range(plan.settings.refine):
        if below is None or above is None or above - below <= 1:
            break
        middle = (below + above) // 2
        row = engine_point_row(replay_point(plan.trace, plan.settings, middle))
        plan.points = pd.concat(
            [plan.points, pd.DataFrame([row | {"found_by": "search"}])], ignore_index=True
        )
        below, above = (below, middle) if row["first_prefill"] >= rate else (middle, above)
    points = plan.points.set_index("num_blocks")["first_prefill"]
    return EngineSearch(
        reached=above is not None,
        num_blocks=above,
        rate=None if above is None else float(points.loc[above]),
        below=below,
        best_rate=float(points.max()),
    )


def _bracket(points: pd.DataFrame, rate: float) -> tuple[int | None, int | None]:
    """(largest num_blocks below `rate` under the first point reaching it, that point)."""
    ordered = points.sort_values("num_blocks")
    reaching = ordered[ordered["first_prefill"] >= rate]
    if reaching.empty:
        return int(ordered["num_blocks"].max()), None
    above = int(reaching["num_blocks"].iloc[0])
    under = ordered[ordered["num_blocks"] < above]
    return (int(under["num_blocks"].iloc[-1]) if len(under) else None), above


def answer_target(
    plan: CapacityPlan,
    share_of_ideal: float,
    *,
    model: str = "llama-3.1-8b",
    kv_cache_dtype: str = "auto",
    gpu: str = "h100-80gb",
    gpu_memory_utilization: float = 0.9,
    reserve_bytes: int = 0,
) -> TargetAnswer:
    """Blocks, bytes and GPUs for `share_of_ideal` of the engine-order ideal hit rate."""
    from analysis.models import memory
    from analysis.platform.errors import ConfigError

    if not 0 < share_of_ideal <= 1:
        raise ConfigError(f"target {share_of_ideal} is not a share of the ideal in (0, 1]")
    size = plan.trace.block_size
    ideal_rate = plan.ideal["engine"]
    target_rate = share_of_ideal * ideal_rate
    engine = search_engine_blocks(plan, target_rate)
    layout = memory.kv_layout(model, kv_cache_dtype)
    parallelism = None
    if engine.num_blocks is not None:
        parallelism = memory.smallest_parallelism(
            engine.num_blocks,
            model,
            memory.GPUS[gpu],
            size,
            kv_cache_dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            reserve_bytes=reserve_bytes,
        )
    return TargetAnswer(
        share_of_ideal=share_of_ideal,
        ideal_rate=ideal_rate,
        target_rate=target_rate,
        lru_blocks=plan.lru_blocks_for(share_of_ideal),
        engine=engine,
        model=model,
        kv_cache_dtype=kv_cache_dtype,
        bytes_per_block=layout.bytes_per_block(size),
        gpu=gpu,
        gpu_memory_utilization=gpu_memory_utilization,
        tensor_parallel=None if parallelism is None else parallelism.tensor_parallel,
        gpu_share=None if parallelism is None else parallelism.kv_share_of_gpu,
        gpu_num_blocks=None if parallelism is None else parallelism.budget.num_blocks,
        assumed=None if parallelism is None else parallelism.budget.assumed,
    )


def answer_sentence(answer: TargetAnswer, block_size: int) -> str:
    """The answer in words, every number from `answer`."""
    share = f"{answer.share_of_ideal:.0%} of the ideal ({answer.target_rate:.2%})"
    lru = (
        f"the LRU bound in engine order keeps it with {answer.lru_blocks:,} cached blocks"
        if answer.lru_blocks is not None
        else "the LRU bound cannot reach it"
    )
    engine = answer.engine
    if not engine.reached:
        return (
            f"{share}: {lru}; the engine does not reach it at any num_blocks tried "
            f"(best {engine.best_rate:.2%})."
        )
    gib = engine.num_blocks * answer.bytes_per_block / 2**30
    text = (
        f"{share}: {lru}; the engine reaches it at num_blocks = {engine.num_blocks:,} "
        f"(measured {engine.rate:.2%}"
        + (f"; {engine.below:,} blocks measured less" if engine.below is not None else "")
        + f") = {engine.num_blocks * block_size:,} tokens = {gib:.2f} GiB of KV cache for "
        f"{answer.model} ({answer.kv_cache_dtype} KV, {answer.bytes_per_block:,} bytes a block)"
    )
    if answer.tensor_parallel is None:
        return text + f"; more than tensor parallelism 8 on {answer.gpu} provides."
    return text + (
        f"; on {answer.gpu} at gpu_memory_utilization {answer.gpu_memory_utilization}: "
        f"tensor parallelism {answer.tensor_parallel} (vLLM would allocate "
        f"{answer.gpu_num_blocks:,} blocks), the KV cache taking {answer.gpu_share:.1%} of "
        f"each GPU's memory ({answer.assumed})."
    )


def plan_record(plan: CapacityPlan, answer: TargetAnswer) -> dict[str, Any]:
    """The plan and its answer as plain JSON values (what `plan --json` prints)."""
    record = {
        "trace": plan.trace.label,
        "block_size": plan.trace.block_size,
        "limit": plan.trace.limit,
        "concurrency": plan.settings.concurrency,
        "notes": plan.trace.notes,
        "ideal": plan.ideal,
        "engine_points": plan.points.to_dict("records"),
        "answer": answer.to_dict(),
    }
    return json.loads(json.dumps(record, default=_plain))


def write_plan_tables(plan: CapacityPlan, answer: TargetAnswer, folder: Path) -> Path:
    """The curves, the engine points and the per-request `cached_tokens` of the answer's run
    (Parquet and CSV), `answer.json`, then `manifest.json`: staged and swapped in whole under
    a lock, so that two plans into one folder leave one plan's set and an interrupted or failed
    write leaves the folder as it was. A file system that refuses is one line (`OutputError`)."""
    from analysis.platform.errors import OutputError
    from analysis.platform.manifest import staged_folder
    from analysis.platform.writable import output_error

    folder = check_plan_folder(folder)
    tables = plan_tables(plan, answer)
    try:
        with staged_folder(folder) as staging:
            _write_plan_files(staging, plan, answer, tables)
    except OutputError:
        raise
    except OSError as exc:
        raise output_error(folder, exc) from None
    return folder


PLAN_TABLES = ("curves", "engine_points", "cached_tokens")
PLAN_FILES = frozenset(
    {f"{name}.{ext}" for name in PLAN_TABLES for ext in ("parquet", "csv")}
    | {"answer.json", "manifest.json"}
)


def check_plan_folder(folder: str | Path) -> Path:
    """The folder a plan will replace, asked before the plan's work: writable, and new, empty
    or a plan's own (the swap replaces the folder whole, so a folder holding anything else is
    refused rather than emptied). `OutputError` (one line) if not."""
    from analysis.platform.errors import OutputError
    from analysis.platform.writable import ensure_replaceable

    folder = ensure_replaceable(Path(folder).resolve())
    if folder.is_dir():
        others = sorted(p.name for p in folder.iterdir() if p.name not in PLAN_FILES)
        if others:
            raise OutputError(
                f"cannot write to {folder}: it holds files a plan did not write ({others[0]!r}"
                f"{f' and {len(others) - 1} more' if len(others) > 1 else ''}), and a plan "
                "replaces its folder whole: choose a new or empty folder"
            )
    return folder


def plan_tables(plan: CapacityPlan, answer: TargetAnswer) -> dict[str, pd.DataFrame]:
    """The tables a plan folder holds; `cached_tokens` comes from the answer's engine point
    (its result folder read back, or the point run when that folder is missing)."""
    from analysis.metrics.cached_tokens import cached_tokens_table

    blocks = answer.engine.num_blocks or int(plan.points["num_blocks"].max())
    requests = replay_point(plan.trace, plan.settings, blocks).requests
    frames = (plan.curves, plan.points, cached_tokens_table(requests).assign(num_blocks=blocks))
    return dict(zip(PLAN_TABLES, frames, strict=True))


def _write_plan_files(
    staging: Path, plan: CapacityPlan, answer: TargetAnswer, tables: dict[str, pd.DataFrame]
) -> None:
    """Every file of a plan folder into `staging`, the manifest last (it marks the set whole)."""
    from analysis.platform.manifest import write_json, write_parquet

    for name, frame in tables.items():
        write_parquet(staging / f"{name}.parquet", frame)
        frame.to_csv(staging / f"{name}.csv", index=False)
    write_json(staging / "answer.json", plan_record(plan, answer))
    write_json(staging / "manifest.json", plan_manifest(plan, sorted(tables)))


def plan_manifest(plan: CapacityPlan, tables: list[str]) -> dict[str, Any]:
    """What made a plan folder: its trace and settings, the tables, versions, commit, time."""
    from analysis.platform.manifest import git_commit, package_versions

    return {
        "trace": plan.trace.label,
        "replay_file": str(plan.trace.replay_file),
        "block_size": plan.trace.block_size,
        "limit": plan.trace.limit,
        "settings": asdict(plan.settings),
        "tables": tables,
        "versions": package_versions(),
        "git_commit": git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers; anything else JSON cannot hold as its text."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)
