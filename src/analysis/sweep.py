"""Sweep grids (`configs/*.toml`): the points of a grid, and running the ones not done yet.

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

from analysis.errors import GridError
from analysis.paths import repo_root, reports_dir

CONFIGS_DIR = "configs"
SERIES_KEYS = {"name", "traces", "engines", "block_sizes", "num_blocks"}
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
        path = repo_root() / CONFIGS_DIR / f"{name_or_path}.toml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in (repo_root() / CONFIGS_DIR).glob("*.toml")))
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
    return grid


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
    for series in grid["series"]:
        missing = SERIES_KEYS - set(series)
        if missing:
            raise GridError(f"series {series.get('name')!r} lacks {', '.join(sorted(missing))}")
        fields_ = base | {k: v for k, v in series.items() if k not in SERIES_KEYS}
        unknown = sorted(set(fields_) - {f.name for f in dataclasses.fields(RunConfig)})
        if unknown:
            raise GridError(
                f"series {series['name']!r}: {', '.join(unknown)} is not a RunConfig field "
                "(see analysis.engines.RunConfig)"
            )
        dims = {
            "trace": series["traces"],
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


def _block_counts(spec: str | list[int], proto, budget) -> list[int]:
    if isinstance(spec, list):
        return [int(n) for n in spec]
    if spec == "max":
        return [budget(proto)]
    if not (isinstance(spec, str) and spec.startswith("log:")):
        raise GridError(f"num_blocks must be a list, 'log:N' or 'max', got {spec!r}")
    return log_spaced_blocks(proto.min_num_blocks, budget(proto), int(spec[4:]))


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
    tokens = _sample_tokens(
        str(path), path.stat().st_mtime_ns, config.limit, config.max_output_tokens
    )
    return int(np.ceil(tokens / config.block_size).sum()) + 1


@functools.lru_cache(maxsize=16)
def _sample_tokens(path: str, mtime_ns: int, limit: int | None, cap: int | None) -> np.ndarray:
    """Prompt + reply tokens per request of a trace sample (cached: grids ask many times)."""
    from analysis.engines.workload import limit_trace
    from analysis.traces import load_trace

    trace = limit_trace(load_trace(path), limit)
    replies = trace["response_tokens"]
    if cap is not None:
        replies = replies.clip(upper=cap)
    return (trace["prompt_tokens"] + replies).to_numpy()


def resolve_trace(trace: str) -> Path:
    from analysis.paths import traces_dir

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
    from analysis.engines.runner import config_id_for
    from analysis.paths import results_dir

    return Path(results or results_dir()) / config_id_for(point.config)


def run_point(point: Point, *, force: bool = False, progress: bool | None = False) -> Path:
    """Run one point inline unless its result is complete; the result folder either way."""
    from analysis.engines import run_and_write

    folder, _ = run_and_write(point.config, force=force, progress=progress)
    return folder


def run_point_notebook(point: Point, grid: str | Path, *, force: bool = False) -> Path:
    """Run one point through `notebooks/03-run-config.ipynb` (papermill, parameters injected);
    the executed copy goes to reports/runs/<grid>/<point>.ipynb."""
    from analysis.report import RUN_CONFIG_NOTEBOOK, execute, notebooks_dir

    output = reports_dir() / "runs" / Path(grid).stem / f"{point.point_id}.ipynb"
    parameters = point.config.to_dict() | {"force": force}
    execute(notebooks_dir() / RUN_CONFIG_NOTEBOOK, output, parameters, progress=False)
    return output


def ensure_grid(name_or_path: str | Path, *, progress: bool = True) -> list[Point]:
    """Run every point of the grid whose result is missing (finished ones are kept), in one
    process per usable core."""
    from analysis.executors import run_points
    from analysis.hardware import usable_cores

    points = grid_points(name_or_path)
    run_points(points, "local", workers=usable_cores(), progress=progress)
    return points


def collect(name_or_path: str | Path, *, run_missing: bool = False) -> pd.DataFrame:
    """One row per finished point of the grid: its configuration and headline numbers.

    With `run_missing`, points without a result are run first (inline)."""
    from analysis.manifest import read_json

    points = ensure_grid(name_or_path) if run_missing else grid_points(name_or_path)
    rows = []
    for point in points:
        folder = result_folder(point)
        if not is_done(point, folder):
            continue
        summary = read_json(folder / "summary.json")
        rows.append(
            {"point_id": point.point_id, "series": point.series}
            | point.config.to_dict()
            | _headline(summary)
        )
    return pd.DataFrame(rows)


def _headline(summary: dict[str, Any]) -> dict[str, Any]:
    first, every = summary["first_prefill"], summary["all_prefill"]
    return {
        "requests": summary["requests_finished"],
        "requests_skipped": summary["requests_skipped"],
        "first_prefill_hits": first["hits"],
        "first_prefill_queries": first["queries"],
        "first_prefill_rate": first["rate"],
        "all_prefill_hits": every["hits"],
        "all_prefill_queries": every["queries"],
        "all_prefill_rate": every["rate"],
        "exported_rate": summary["exported"]["rate"],
        "preemptions": summary["preemptions"],
        "readmissions": summary["readmissions"],
        "recompute_share": summary["recompute_share"],
        "prompt_tokens": summary["prompt_tokens"],
        "output_tokens": summary["output_tokens"],
    }


def is_done(point: Point, folder: Path | None = None) -> bool:
    from analysis.engines import is_complete

    return is_complete(folder or result_folder(point))


def with_ideal(frame: pd.DataFrame) -> pd.DataFrame:
    """Add `ideal_rate`: the infinite-cache hit rate of each row's sample and block size.

    Replies count as cached when they are decoded as recorded (teacher forcing), as in the
    engine; rows whose replies are capped or free-running get the prompts-only ideal (free
    tokens never appear in a later prompt) or NaN (a cap is not modelled by the bound)."""
    from analysis import bounds
    from analysis.engines.workload import limit_trace
    from analysis.traces import load_trace

    frame = frame.copy()
    frame["ideal_rate"] = np.nan
    traces: dict[str, pd.DataFrame] = {}
    keys = ["trace", "limit", "block_size", "outputs", "max_output_tokens"]
    for key, rows in frame.groupby(keys, dropna=False, sort=False):
        trace, limit, block_size, outputs, cap = key
        if pd.notna(cap):
            continue
        if trace not in traces:
            traces[trace] = load_trace(resolve_trace(trace))
        sample = limit_trace(traces[trace], None if pd.isna(limit) else int(limit))
        rate = bounds.ideal_hit_rate(sample, int(block_size), include_outputs=outputs == "recorded")
        frame.loc[rows.index, "ideal_rate"] = rate
    return frame


def sample_limit(rows: pd.DataFrame) -> int | None:
    """The `limit` (first N conversations) shared by these result rows; None: whole traces."""
    limits = rows["limit"].drop_duplicates()
    if len(limits) != 1:
        raise GridError(f"rows mix samples (limit {sorted(map(str, limits))}): select one")
    value = limits.iloc[0]
    return None if value is None or pd.isna(value) else int(value)


def sample_words(rows: pd.DataFrame) -> str:
    """'first 500 conversations' or 'all conversations', for titles and printed tables."""
    limit = sample_limit(rows)
    return "all conversations" if limit is None else f"first {limit} conversations"


def read_result(name_or_path: str | Path, point_id: str):
    """The RunResult of one finished point: admissions, requests, block statistics (and block
    events where the point kept them in full)."""
    from analysis.engines import RunResult

    return RunResult.read(result_folder(find_point(grid_points(name_or_path), point_id)))
