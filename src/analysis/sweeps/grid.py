"""Sweep grids (`configs/*.toml`): the points of a grid, and where each point's result lives.

A grid is a list of series; each series is a cross product of traces, engines, block sizes
and numbers of blocks over a base of `RunConfig` fields. `make report` runs every point once
(papermill executes `notebooks/03-run-config.ipynb` per point, `make -j` runs points in
parallel); the explanatory notebooks then read the results, running inline only the points
that are still missing.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.platform.errors import GridError
from analysis.platform.paths import configs_dir

SERIES_KEYS = {"name", "traces", "engines", "block_sizes", "num_blocks"}
# The block size of a series' block-hash traces (`.jsonl`, `.jsonl.gz`: Mooncake 512, the
# Alibaba/Qwen traces 16), which replay as token traces (`data.blockhash.token_trace_file`).
BLOCKHASH_KEY = "blockhash_block_size"
DIMENSION_FIELDS = {"trace", "engine", "block_size", "num_blocks"}


@dataclass(frozen=True)
class Point:
    """One configuration of a grid, the series it belongs to, and the extra fields the series
    varies (beyond trace, engine, block size and number of blocks)."""

    series: str
    config: Any  # analysis.engines.RunConfig
    varying: tuple[tuple[str, Any], ...] = ()

    @property
    def point_id(self) -> str:
        c = self.config
        extra = "".join(f"-{_short(k)}{v}" for k, v in self.varying)
        trace = Path(c.trace).stem
        return f"{self.series}-{trace}-{c.engine}-b{c.block_size}-n{c.num_blocks}{extra}"


def _short(field_name: str) -> str:
    return {"concurrency": "c", "outputs": "", "mode": "", "max_output_tokens": "out"}.get(
        field_name, field_name.replace("_", "")
    )


def grid_path(name_or_path: str | Path) -> Path:
    """`default` -> configs/default.toml; a path is taken as it is."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = configs_dir() / f"{name_or_path}.toml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in (configs_dir()).glob("*.toml")))
        raise GridError(f"no grid {name_or_path!r}: choose one of {known} or give a .toml path")
    return path


def load_grid(name_or_path: str | Path) -> dict[str, Any]:
    path = grid_path(name_or_path)
    try:
        grid = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise GridError(f"{path}: not valid TOML ({exc})") from exc
    if not grid.get("series"):
        raise GridError(f"{path}: no [[series]] table")
    series = grid["series"]
    if not (isinstance(series, list) and all(isinstance(s, dict) for s in series)):
        raise GridError(
            f"{path}: `series` must be an array of tables, each written [[series]] "
            f"(got {type(series).__name__}: {series!r:.60})"
        )
    if not isinstance(grid.get("base", {}), dict):
        raise GridError(f"{path}: `base` must be a [base] table (got {grid['base']!r:.60})")
    return grid


LISTED_KEYS = ("traces", "engines", "block_sizes")


def _listed(series: dict[str, Any]) -> dict[str, Any]:
    """The series with a single trace, engine or block size written bare (`block_sizes = 16`)
    taken as a list of one, as a single number of blocks is (`num_blocks = 600`)."""
    listed = {k: v if isinstance(v, list) else [v] for k, v in series.items() if k in LISTED_KEYS}
    if isinstance(series.get("num_blocks"), int):
        listed["num_blocks"] = [series["num_blocks"]]
    return series | listed


def grid_points(name_or_path: str | Path, block_budget=None) -> list[Point]:
    """Every point of a grid, in file order.

    Each series crosses its traces, engines and block sizes, every other `RunConfig` field it
    gives as a list (e.g. `concurrency = [1, 8, 64]`), and its numbers of blocks: a list,
    "log:N" (N log-spaced counts from vLLM's minimum for max_model_len to no memory pressure)
    or "max" (no memory pressure). `block_budget(config)` sizes "no memory pressure"
    (default: `no_pressure_blocks`, which reads the trace)."""
    from analysis.engines import RunConfig

    grid = load_grid(name_or_path)
    base = dict(grid.get("base", {}))
    budget = block_budget or no_pressure_blocks
    points = []
    for series in map(_listed, grid["series"]):
        missing = SERIES_KEYS - set(series)
        if missing:
            raise GridError(f"series {series.get('name')!r} lacks {', '.join(sorted(missing))}")
        unnamed = [t for t in series["traces"] if not isinstance(t, str)]
        if unnamed:
            raise GridError(
                f"series {series['name']!r}: traces must be trace names or paths "
                f"(got {unnamed[0]!r})"
            )
        fields_ = base | {
            k: v for k, v in series.items() if k not in SERIES_KEYS and k != BLOCKHASH_KEY
        }
        unknown = sorted(set(fields_) - {f.name for f in dataclasses.fields(RunConfig)})
        if unknown:
            raise GridError(
                f"series {series['name']!r}: {', '.join(unknown)} is not a RunConfig field "
                "(see analysis.engines.RunConfig)"
            )
        dims = {
            "trace": [
                token_trace(trace, series, fields_.get("limit")) for trace in series["traces"]
            ],
            "engine": series["engines"],
            "block_size": series["block_sizes"],
        } | {k: v for k, v in fields_.items() if isinstance(v, list)}
        for values in itertools.product(*dims.values()):
            chosen = dict(zip(dims, values, strict=True))
            try:
                proto = RunConfig.from_dict(fields_ | chosen)
            except TypeError as exc:
                raise GridError(f"series {series['name']!r}: {exc}") from None
            varying = tuple((k, v) for k, v in chosen.items() if k not in DIMENSION_FIELDS)
            for num_blocks in _block_counts(series["num_blocks"], proto, budget):
                config = proto.with_(num_blocks=num_blocks)
                points.append(Point(series["name"], config, varying))
    return points


def token_trace(trace: str, series: dict[str, Any], limit: Any = None) -> str:
    """`trace` as a series names it, or, for a block-hash trace, the token trace file it
    replays as: its first `limit` conversations when the series fixes one number (a relative
    path is taken from the repository root)."""
    from analysis.data.blockhash import is_blockhash_path
    from analysis.platform.paths import repo_root

    if not is_blockhash_path(trace):
        return trace
    block_size = series.get(BLOCKHASH_KEY)
    if not isinstance(block_size, int) or block_size < 1:
        raise GridError(
            f"series {series.get('name')!r}: {trace} is a block-hash trace: give "
            f"{BLOCKHASH_KEY}, its own block size (512 for Mooncake, 16 for the Alibaba/Qwen "
            "traces)"
        )
    path = Path(trace) if Path(trace).is_absolute() else repo_root() / trace
    if not path.is_file():
        raise GridError(f"series {series.get('name')!r}: no block-hash trace at {path}")
    limit = limit if isinstance(limit, int) else None  # a list of limits: the whole file
    return _token_trace_file(str(path), path.stat().st_mtime_ns, block_size, limit)


@functools.lru_cache(maxsize=8)
def _token_trace_file(path: str, mtime_ns: int, block_size: int, limit: int | None) -> str:
    """Read and convert once per file version (grids are expanded many times)."""
    import sys

    from analysis.data.blockhash import load_blockhash_trace, token_trace_file

    frame, report = load_blockhash_trace(path, block_size)
    if report.malformed:
        print(report.summary(), file=sys.stderr)
    return str(token_trace_file(path, frame, limit))


def _block_counts(spec: str | list[int], proto, budget) -> list[int]:
    if isinstance(spec, list):
        return [int(n) for n in spec]
    if spec == "max":
        return [budget(proto)]
    if not (isinstance(spec, str) and spec.startswith("log:")):
        raise GridError(f"num_blocks must be a list, 'log:N' or 'max', got {spec!r}")
    count = spec[4:].strip()
    if not count.isdigit():
        raise GridError(f"num_blocks {spec!r}: N in 'log:N' must be a whole number, e.g. 'log:8'")
    return log_spaced_blocks(proto.min_num_blocks, budget(proto), int(count))


def log_spaced_blocks(low: int, high: int, count: int) -> list[int]:
    """`count` block counts from `low` to `high`, evenly spaced on a log axis, rounded to 2
    significant digits (the ends kept exact), so that axis labels read well."""
    if high <= low or count < 2:
        return [low]
    raw = np.geomspace(low, high, count)
    counts = [low] + [_round_sig(x) for x in raw[1:-1]] + [high]
    return sorted(set(counts))


def _round_sig(x: float, digits: int = 2) -> int:
    scale = 10 ** (math.floor(math.log10(x)) - digits + 1)
    return int(round(x / scale) * scale)


def no_pressure_blocks(config) -> int:
    """Blocks that hold every token of the sample at once (prompts and replies, no sharing
    assumed): with that many, nothing is ever evicted or preempted."""
    path = resolve_trace(config.trace)
    if not path.is_file():
        raise GridError(
            f"trace {config.trace!r} not found (looked for {path}): num_blocks 'max' and 'log:N' "
            "are sized from it; build it with `python -m analysis traces` or give num_blocks "
            "as a list"
        )
    tokens = _sample_tokens(
        str(path), path.stat().st_mtime_ns, config.limit, config.max_output_tokens
    )
    return int(np.ceil(tokens / config.block_size).sum()) + 1


@functools.lru_cache(maxsize=16)
def _sample_tokens(path: str, mtime_ns: int, limit: int | None, cap: int | None) -> np.ndarray:
    """Prompt + reply tokens per request of a trace sample (cached: grids ask many times)."""
    from analysis.data.traces import load_trace
    from analysis.engines.workload import limit_trace

    trace = limit_trace(load_trace(path), limit)
    replies = trace["response_tokens"]
    if cap is not None:
        replies = replies.clip(upper=cap)
    return (trace["prompt_tokens"] + replies).to_numpy()


def missing_traces(grid: dict[str, Any]) -> list[str]:
    """The token traces a grid's series name that are not built yet (block-hash files are the
    user's own: a missing one is an error of the grid, not a build still to come)."""
    from analysis.data.blockhash import is_blockhash_path

    names: set[str] = set()
    for series in grid["series"]:
        if isinstance(series, dict):  # a series without traces is grid_points' error to name
            names.update(t for t in _listed(series).get("traces", []) if isinstance(t, str))
    return sorted(t for t in names if not is_blockhash_path(t) and not resolve_trace(t).is_file())


def resolve_trace(trace: str) -> Path:
    from analysis.platform.paths import traces_dir

    path = Path(trace)
    return path if path.suffix == ".parquet" else traces_dir() / f"{trace}.parquet"


def points_frame(points: Iterable[Point]) -> pd.DataFrame:
    """The points as a table (one row each), for listing and for joining with results."""
    return pd.DataFrame(
        [{"point_id": p.point_id, "series": p.series} | p.config.to_dict() for p in points]
    )


def find_point(points: list[Point], point_id: str) -> Point:
    for point in points:
        if point.point_id == point_id:
            return point
    raise GridError(f"no point {point_id!r} in this grid: list them with --list")


def result_folder(point: Point, results: Path | None = None) -> Path:
    """`results/<config_id>` (default results: data/results)."""
    from analysis.platform.paths import results_dir
    from analysis.runs.runner import config_id_for

    return Path(results or results_dir()) / config_id_for(point.config)


def is_done(point: Point, folder: Path | None = None) -> bool:
    from analysis.engines import is_complete

    return is_complete(folder or result_folder(point))
