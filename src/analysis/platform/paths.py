"""Paths of the project, resolved from the repository root (never from the working directory)."""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """The repository root: the `PREFIX_CACHE_LAB_ROOT` variable, else the folder above `src/`."""
    env = os.environ.get("PREFIX_CACHE_LAB_ROOT")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parents[3]  # <root>/src/analysis/platform/paths.py


def configs_dir() -> Path:
    """`configs/`: the sweep grids (`<name>.toml`)."""
    return repo_root() / "configs"


def data_dir() -> Path:
    return repo_root() / "data"


def traces_dir() -> Path:
    return data_dir() / "traces"


def results_dir() -> Path:
    return data_dir() / "results"


def cache_dir() -> Path:
    """Generated artefacts worth keeping between runs (the tiny local model, ...)."""
    return data_dir() / "cache"


def figures_dir() -> Path:
    """`figures/`, or `PREFIX_CACHE_LAB_FIGURES` (relative to the root): a study run with
    other parameters keeps its figures apart from the default ones."""
    return repo_root() / os.environ.get("PREFIX_CACHE_LAB_FIGURES", "figures")


def reports_dir() -> Path:
    return repo_root() / "reports"


def from_root(path: Path | str) -> str:
    """`path` relative to the repository root where it lies under it (as written, or once
    links are resolved), else as it is: what a committed output prints instead of a path that
    names one machine's checkout."""
    path = Path(path)
    root = repo_root()
    for candidate, base in ((path.absolute(), root.absolute()), (path.resolve(), root.resolve())):
        if candidate.is_relative_to(base):
            return candidate.relative_to(base).as_posix()
    return str(path)
