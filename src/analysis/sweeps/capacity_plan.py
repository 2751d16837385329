"""How much KV memory buys which hit rate: a trace's capacity curve, in the engine's order.

One plan is a trace at one block size and one concurrency. It runs vLLM's scheduler (`replay`)
at a few `num_blocks`, and draws the bounds from the trace alone on the same axis:

- the engine's points: the first-prefill hit rate replay measures at each `num_blocks` (what
  vLLM exports as its prefix-cache hit rate);
- the ideal, LRU and Belady bounds **in the engine's admission order**, taken from a replay run
  with memory to spare (where the order follows from the concurrency alone), so that the
  curves see the same interleaving of conversations as the points;
- LRU in trace order, for contrast: the curve the trace alone suggests.

A bound's capacity is the blocks kept between requests; the engine's `num_blocks` also holds
the blocks of the requests it is running, so the points lie right of the curves. The replay
runs use the project's small local model: the counts do not depend on the model, whose shape
only turns blocks into bytes (`analysis.models.memory`).

Block-hash traces (Mooncake, the Alibaba/Qwen "KVCache in the wild" traces) are replayed as
the token traces `analysis.data.blockhash.blockhash_to_trace` makes of them, written once
under data/cache/blockhash/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.platform.errors import ConfigError

SHAREGPT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class PlanTrace:
    """A trace made ready for a plan: the file replay reads, and what the bounds index."""

    label: str
    replay_file: Path  # a token trace (Parquet) the engine replays
    bounds_frame: pd.DataFrame  # the rows replay runs (limited), token or block-hash
    block_size: int
    include_outputs: bool  # replies cached (token traces, teacher-forced) or not (block hashes)
    limit: int | None
    notes: list[str] = field(default_factory=list)  # what the import skipped or assumed


@dataclass(frozen=True)
class PlanSettings:
    """What the engine points share: everything but `num_blocks`."""

    concurrency: int = 16
    max_model_len: int = 8192
    points: int = 8  # replay points between vLLM's minimum and memory to spare
    refine: int = 4  # extra replay runs that narrow the engine's answer for a target


def plan_trace(
    trace: str | Path, block_size: int | None = None, limit: int | None = None
) -> PlanTrace:
    """`trace` (a ShareGPT trace name, a .parquet, or a block-hash .jsonl / .jsonl.gz) ready
    for a plan. A block-hash trace needs its own block size (16 for the Alibaba/Qwen traces,
    512 for Mooncake); a token trace defaults to 16."""
    from analysis.data.blockhash import is_blockhash_path

    path = Path(trace)
    if is_blockhash_path(path):
        return _blockhash_plan_trace(path, block_size, limit)
    from analysis.data.traces import load_trace
    from analysis.engines.workload import limit_trace
    from analysis.runs.runner import resolve_trace_path

    file = resolve_trace_path(trace)
    frame = limit_trace(load_trace(file), limit)
    return PlanTrace(
        label=file.stem,
        replay_file=file,
        bounds_frame=frame,
        block_size=block_size or SHAREGPT_BLOCK_SIZE,
        include_outputs=True,
        limit=limit,
    )


def _blockhash_plan_trace(path: Path, block_size: int | None, limit: int | None) -> PlanTrace:
    from analysis.data.blockhash import load_blockhash_trace, token_trace_file
    from analysis.engines.workload import limit_trace

    if block_size is None:
        raise ConfigError(
            f"{path.name} is a block-hash trace: give its block size (--block-size 16 for the "
            "Alibaba/Qwen traces, 512 for Mooncake)"
        )
    frame, report = load_blockhash_trace(path, block_size)
    replay_file = token_trace_file(path, frame)
    limited = limit_trace(frame, limit)
    limited.attrs = dict(frame.attrs)
    return PlanTrace(
        label=path.name.split(".")[0],
        replay_file=replay_file,
        bounds_frame=limited,
        block_size=block_size,
        include_outputs=False,
        limit=limit,
        notes=[report.summary()],
    )


def replay_config(trace: PlanTrace, settings: PlanSettings, num_blocks: int) -> Any:
    """The `RunConfig` of one engine point."""
    from analysis.engines.config import RunConfig

    return RunConfig(
        trace=str(trace.replay_file),
        engine="replay",
        block_size=trace.block_size,
        num_blocks=int(num_blocks),
        max_model_len=settings.max_model_len,
        mode="closed-loop",
        concurrency=settings.concurrency,
        limit=trace.limit,
    )


def replay_point(trace: PlanTrace, settings: PlanSettings, num_blocks: int) -> Any:
    """The `RunResult` of one engine point: run once, then read from data/results/."""
    from analysis.engines import RunResult
    from analysis.runs import run_and_write

    folder, result = run_and_write(replay_config(trace, settings, num_blocks), progress=False)
    return result if result is not None else RunResult.read(folder)


def spare_blocks(trace: PlanTrace, settings: PlanSettings) -> int:
    """A `num_blocks` that never evicts: every block the rows could store, plus the null block
    (and at least vLLM's minimum for `max_model_len`)."""
    frame = trace.bounds_frame
    if "prompt_ids" in frame.columns:
        tokens = frame["prompt_ids"].map(len).sum() + frame["response_ids"].map(len).sum()
    else:
        tokens = frame["input_length"].sum() + frame["output_length"].sum()
    stored = math.ceil(int(tokens) / trace.block_size) + len(frame)
    return max(stored + 1, minimum_blocks(trace, settings))


def minimum_blocks(trace: PlanTrace, settings: PlanSettings) -> int:
    """vLLM refuses fewer blocks: one request of `max_model_len` plus the null block."""
    return math.ceil(settings.max_model_len / trace.block_size) + 1


def engine_capacities(trace: PlanTrace, settings: PlanSettings) -> list[int]:
    """`settings.points` values of `num_blocks`, geometric from vLLM's minimum to no eviction."""
    low, high = minimum_blocks(trace, settings), spare_blocks(trace, settings)
    values = np.unique(np.round(np.geomspace(low, high, settings.points)).astype(np.int64))
    return [int(v) for v in values]


def engine_point_row(result: Any) -> dict[str, Any]:
    """One engine point: its capacity and the hit rates vLLM counted."""
    from analysis.metrics.hitrates import all_prefill, first_prefill

    first = first_prefill(result.admissions)
    return {
        "num_blocks": int(result.config.num_blocks),
        "first_prefill": first.rate,
        "all_prefill": all_prefill(result.admissions).rate,
        "preemptions": int(result.summary.get("preemptions", 0)),
    }


def engine_points(trace: PlanTrace, settings: PlanSettings) -> tuple[pd.DataFrame, Any]:
    """The engine's points at `engine_capacities`, and the run with memory to spare (whose
    admissions give the engine order)."""
    rows, spare = [], None
    for num_blocks in engine_capacities(trace, settings):
        result = replay_point(trace, settings, num_blocks)
        rows.append(engine_point_row(result) | {"found_by": "grid"})
        spare = result
    return pd.DataFrame(rows), spare


@dataclass
class CapacityPlan:
    """A trace's capacity curve: the engine's points and the bounds on one axis (blocks)."""

    trace: PlanTrace
    settings: PlanSettings
    points: pd.DataFrame  # one row per engine point (num_blocks, first_prefill, ...)
    curves: pd.DataFrame  # one row per (order, policy, capacity): the bounds
    ideal: dict[str, float]  # the infinite-cache hit rate in each order
    indexes: dict[str, Any]  # the bounds' TraceIndex per order ("engine", "trace")
    spare_run: Any  # the RunResult with memory to spare, whose admissions gave the order
    searches: dict[float, Any] = field(default_factory=dict)  # rate -> the engine's search

    def ideal_hit_blocks(self, order: str = "engine") -> int:
        from analysis.metrics import bounds

        return int(bounds.ideal_hit_blocks(self.indexes[order], self.trace.block_size).sum())

    def lru_blocks_for(self, share_of_ideal: float, order: str = "engine") -> int | None:
        """The LRU capacity that keeps `share_of_ideal` of the ideal's hits, in `order`."""
        from analysis.metrics import bounds

        wanted = math.ceil(round(share_of_ideal * self.ideal_hit_blocks(order), 9))
        return bounds.lru_capacity_for(self.indexes[order], self.trace.block_size, wanted)


def build_plan(trace: PlanTrace, settings: PlanSettings, curve_points: int = 24) -> CapacityPlan:
    """Run the engine points, then draw the bounds in the order the engine admitted requests."""
    from analysis.metrics import bounds

    points, spare = engine_points(trace, settings)
    ordered = bounds.in_engine_order(trace.bounds_frame, spare.admissions)
    indexes = {
        "engine": bounds.index_trace(ordered, include_outputs=trace.include_outputs),
        "trace": bounds.index_trace(trace.bounds_frame, include_outputs=trace.include_outputs),
    }
    size = trace.block_size
    capacities = bounds.default_capacities(indexes["engine"], size, curve_points, low=1)
    frames = [
        bounds.capacity_curves(indexes["engine"], size, capacities, ["lru", "opt"]).assign(
            order="engine"
        ),
        bounds.capacity_curves(indexes["trace"], size, capacities, ["lru"]).assign(order="trace"),
    ]
    curves = pd.concat(frames, ignore_index=True)
    curves["policy"] = curves["policy"].astype(str)
    return CapacityPlan(
        trace=trace,
        settings=settings,
        points=points,
        curves=curves,
        ideal={order: bounds.ideal_hit_rate(index, size) for order, index in indexes.items()},
        indexes=indexes,
        spare_run=spare,
    )
