"""Where serving runs live: one folder per run under `data/results/serving/<run id>/`
(`requests.parquet`, `gauges.parquet`, `summary.json`, then `manifest.json`, written last so
that a folder counts only once complete), and the readers that turn folders back into tables.

A cell's folder is written whole in a staging folder beside it and swapped in under a lock, so
that an interrupted write (or `--force` rewrite) leaves one whole cell, never a mix: the old
cell (set aside at worst, and put back by the next reader) or the new one. A written cell is
reused only if every request it planned succeeded (`is_reusable`); one with timeouts or errors
keeps its counts and notes and is run again next time.

A module of its own so that tables, notebooks and the report read results without the code
that produces them (no server, no load generator).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.platform.manifest import (
    read_json,
    restore_set_aside,
    staged_folder,
    write_json,
    write_parquet,
)
from analysis.platform.paths import results_dir


def serving_root() -> Path:
    return results_dir() / "serving"


def _digest(obj: Any, length: int = 10) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[
        :length
    ]


def is_finished(run_dir: Path) -> bool:
    """A run folder counts only once its manifest (written last) exists. A cell that a
    `--force` rewrite killed mid-swap left set aside is put back first, not measured again."""
    restore_set_aside(run_dir)
    return (run_dir / "manifest.json").is_file()


def is_reusable(run_dir: Path) -> bool:
    """A finished cell whose planned requests all succeeded: only such a cell is reused. Cells
    written before the manifest said so are judged by their summary's counts."""
    if not is_finished(run_dir):
        return False
    try:
        manifest = read_json(run_dir / "manifest.json")
        if "complete" in manifest:
            return manifest["complete"] is True
        summary = read_json(run_dir / "summary.json")
    except (OSError, ValueError):
        return False
    failed = sum(int(summary.get(f"n_{s}", 0) or 0) for s in ("timeout", "error", "not_sent"))
    return failed == 0 and int(summary.get("n_ok", 0) or 0) > 0


def _write_run(
    run_dir: Path,
    frame: pd.DataFrame,
    summary: dict[str, Any],
    manifest: dict[str, Any],
    gauges: pd.DataFrame | None = None,
) -> None:
    """Write a cell into a staging folder beside `run_dir`, manifest last, and swap it in under
    a lock: an interrupted write leaves one whole cell (the old or the new), never a mix."""
    with staged_folder(run_dir) as staging:
        write_parquet(staging / "requests.parquet", frame)
        if gauges is not None and not gauges.empty:
            write_parquet(staging / "gauges.parquet", gauges)
        write_json(staging / "summary.json", summary)
        write_json(staging / "manifest.json", manifest)  # last: marks the run complete

    return True


def load_summaries(
    run_dirs: Sequence[Path] | None = None, root: Path | None = None
) -> pd.DataFrame:
    """The summaries of finished runs (given folders, or every one under the serving root)."""
    if run_dirs is None:
        base = Path(root) if root else serving_root()
        # not the staging and set-aside folders of writers (dot names)
        run_dirs = sorted(p for p in base.glob("[!.]*") if p.is_dir()) if base.exists() else []
    rows = []
    for run_dir in run_dirs:
        if is_finished(run_dir) and (run_dir / "summary.json").is_file():
            rows.append({"run_id": run_dir.name, **read_json(run_dir / "summary.json")})
    return pd.DataFrame(rows)


def load_requests(run_ids: Sequence[str], root: Path | None = None) -> pd.DataFrame:
    """Per-request tables of the given runs, with a `run_id` column."""
    base = Path(root) if root else serving_root()
    frames = []
    for name in run_ids:
        frame = pd.read_parquet(base / name / "requests.parquet")
        frame.insert(0, "run_id", name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_gauges(run_ids: Sequence[str], root: Path | None = None) -> pd.DataFrame:
    """KV-cache use and queue lengths sampled during the given runs, with a `run_id` column."""
    base = Path(root) if root else serving_root()
    frames = []
    for name in run_ids:
        path = base / name / "gauges.parquet"
        if path.is_file():
            frame = pd.read_parquet(path)
            frame.insert(0, "run_id", name)
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
