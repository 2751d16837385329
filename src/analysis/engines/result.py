"""`RunResult`: the tables of one run, written as Parquet plus JSON, manifest last.

Folder `data/results/<config_id>/`:

- `admissions.parquet`: one row per admission from the waiting queue (vLLM's PrefixCacheStats
  records exactly these): request, conversation, turn, kind (`first` or `readmission` after
  a preemption), tokens queried (prompt + tokens generated so far), tokens hit, step, time.
- `requests.parquet`: one row per trace request: status (`finished` or `skipped` for prompts
  of max_model_len tokens or more), prompt and output tokens, cached tokens at the first
  admission, preemptions, admissions, submit / first-token / finish steps, TTFT where measured
  (real engine only), and the generated token ids when they are not the workload's outputs.
- `block_stats.parquet`: the block events' exact aggregates the figures read (events per
  kind, hits per block, reuse gaps in steps; `analysis.engines.blockstats`). A few kB whatever the
  run's length.
- `block_events.parquet`, only with `RunConfig.block_events = "full"`: one row per stored /
  hit / evicted block (block hash as the hex of its first 64 bits, block id, request, step,
  time). A whole-trace run has tens of millions of them (hundreds of MB), so by default they
  are kept only in memory, in the `RunResult` that `run()` returns.
- `counters.json`: the exported counters (`vllm:prefix_cache_queries`, ...), the summed
  `PrefixCacheStats` including the hidden preempted_* fields, and where each came from.
- `summary.json`: the headline numbers (analysis.metrics.hitrates.summarize).
- `steps.parquet`, where the engine ran on a clock (the real engine always; replay with a
  step-cost profile): one row per scheduler step, what it scheduled and how long it took
  (`analysis.engines.steps`).
- `manifest.json`: config, trace hash, versions, git commit, timings. Written last: a folder
  without it is an incomplete run. The whole folder is built under a temporary name and
  renamed into place at the end, so an interrupted run leaves nothing that looks complete.
  Writers of the same folder take turns (a lock file beside it): the last one wins whole, and
  a staging folder left by a killed writer is removed by the next one.

Steps are vLLM's scheduler steps (`Scheduler.current_step`), the same in both engines for the
same workload; times are seconds since the first request was submitted, taken at the start of
each step: in `vllm` the engine's wall clock, in `replay` on a clock the profile's modelled
time, in plain `replay` only the replay's own (no model runs), so compare those in steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.engines.blockstats import BlockStats
from analysis.engines.config import RunConfig
from analysis.platform.errors import ResultError
from analysis.platform.manifest import (
    read_json,
    restore_set_aside,
    staged_folder,
    write_json,
    write_parquet,
)

TABLES = ("admissions", "requests", "block_stats")
# The requests table's columns of time (seconds): they differ between runs of one config.
REQUEST_TIME_COLUMNS = ("arrival_s", "first_token_s", "finish_s", "ttft_s", "e2e_s")
OPTIONAL_TABLES = ("block_events", "steps")
MANIFEST = "manifest.json"


@dataclass
class RunResult:
    config: RunConfig
    config_id: str
    admissions: pd.DataFrame
    requests: pd.DataFrame
    block_stats: BlockStats
    block_events: pd.DataFrame | None  # None when read from a folder that kept aggregates
    counters: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    steps: pd.DataFrame | None = None  # per step: make-up and time (analysis.engines.steps)

    def generated_outputs(self) -> dict[str, list[int]]:
        """Token ids each request emitted (the real engine's own tokens in `free` mode)."""
        if "output_ids" in self.requests.columns:
            rows = self.requests[self.requests["status"] == "finished"]
            return {
                rid: [int(t) for t in ids]
                for rid, ids in zip(rows["request_id"], rows["output_ids"], strict=False)
            }
        return {}

    def write(self, folder: Path) -> Path:
        """Write every table, then the manifest, into a temporary folder renamed at the end."""
        folder = Path(folder)
        with staged_folder(folder) as staging:
            for name, frame in self.tables().items():
                write_parquet(staging / f"{name}.parquet", frame)
            write_json(staging / "counters.json", self.counters)
            write_json(staging / "summary.json", self.summary)
            write_json(staging / MANIFEST, self.manifest)
        return folder

    def tables(self) -> dict[str, pd.DataFrame]:
        """The tables a result folder holds: block events only when the config asks for them."""
        tables = {
            "admissions": self.admissions,
            "requests": self.requests,
            "block_stats": self.block_stats.to_frame(),
        }
        if self.config.block_events == "full" and self.block_events is not None:
            tables["block_events"] = self.block_events
        if self.steps is not None:
            tables["steps"] = self.steps
        return tables

    def without_block_events(self) -> RunResult:
        """The same result less the events its folder will not hold (to send it elsewhere)."""
        if self.config.block_events == "full":
            return self
        return replace(self, block_events=None)

    @classmethod
    def read(cls, folder: Path) -> RunResult:
        folder = Path(folder)
        if not is_complete(folder):
            raise FileNotFoundError(f"{folder} holds no complete run (no {MANIFEST})")
        manifest = _read_part(folder / MANIFEST, read_json)
        admissions, requests = (
            _read_part(folder / f"{name}.parquet", pd.read_parquet) for name in TABLES[:2]
        )
        events_path = folder / "block_events.parquet"
        events = _read_part(events_path, pd.read_parquet) if events_path.is_file() else None
        steps_path = folder / "steps.parquet"
        steps = _read_part(steps_path, pd.read_parquet) if steps_path.is_file() else None
        stats_path = folder / "block_stats.parquet"
        if stats_path.is_file():
            stats = BlockStats.from_frame(_read_part(stats_path, pd.read_parquet))
        elif events is not None:  # a folder written before the aggregates existed
            stats = BlockStats.from_events(events)
        else:
            raise ResultError(
                f"{folder} has neither block_stats nor block_events: run the point again "
                "with --force"
            )
        try:
            config = RunConfig.from_dict(manifest["config"])
            config_id = manifest["config_id"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultError(
                f"{folder / MANIFEST} is not a run manifest ({exc!r}); run the point again "
                "with --force"
            ) from None
        return cls(
            config=config,
            config_id=config_id,
            admissions=admissions,
            requests=requests,
            block_stats=stats,
            block_events=events,
            counters=_read_part(folder / "counters.json", read_json),
            summary=_read_part(folder / "summary.json", read_json),
            manifest=manifest,
            steps=steps,
        )


def _read_part(path: Path, reader: Callable[[Path], Any]) -> Any:
    """One file of a result folder, or a one-line ResultError naming it and the fix."""
    try:
        return reader(path)
    except Exception as exc:  # pyarrow, json and OS errors all mean the same here
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ResultError(
            f"{path} cannot be read ({reason}); run the point again with --force"
        ) from None


def is_complete(folder: Path) -> bool:
    """A folder with its manifest (written last). A result that a `--force` rewrite killed
    mid-swap left set aside is put back first: it is complete, and recomputing it wastes a run."""
    restore_set_aside(Path(folder))
    return (Path(folder) / MANIFEST).is_file()
