"""A trace build's files as one set: written under temporary names, then swapped in together,
under a lock, so that a reader finds the old build or the new one, or a mix it can tell apart.

A module of its own: how files are staged, swapped and compared with their manifest entry is
apart from what the files hold (`storage`) and from when a build is redone (`ensure`).

- Writers take turns on a lock beside the folder (`set_lock`), held by `ensure_traces` from
  its up-to-date check to the end of its save: a second builder waits, then finds the first
  one's build. The next writer removes the temporary files a killed one left.
- Every file is written beside its target as `.NAME.<random>.tmp`, then all are renamed into
  place with SIGINT and SIGTERM held back, the manifest last (`swap_in`). If a rename fails,
  the files already replaced get their old content back, so a failed save leaves the old set.
  Only a SIGKILL between two renames leaves a mix: new files beside the old manifest (or none),
  which readers refuse because a file no longer matches its manifest entry.
- A file matches its entry when its size and modification time are the recorded ones (renames
  keep both); only otherwise (a copied folder, a mixed set) is its sha256 computed.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from analysis.platform.manifest import file_sha256, lock_beside


@contextmanager
def set_lock(folder: Path) -> Iterator[None]:
    """One writer at a time for the trace set in `folder` (`.FOLDER.lock` beside it)."""
    with lock_beside(Path(folder).resolve()):
        yield


def remove_stale_temps(folder: Path, names: Sequence[str]) -> None:
    """Temporary files of `names` that a killed writer left (call it holding `set_lock`)."""
    for stale in Path(folder).glob(".*.tmp"):
        if any(f".{name}." in stale.name for name in names):
            stale.unlink(missing_ok=True)


def staged_path(target: Path) -> Path:
    """An empty temporary file beside `target`, named so that `remove_stale_temps` finds it."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(name, 0o666 & ~mask)  # mkstemp makes 0600; give the usual mode
    return Path(name)


def file_entry(staged: Path, target_name: str, **extra: Any) -> dict[str, Any]:
    """The manifest entry of a staged file: its final name, size, modification time, sha256."""
    stat = staged.stat()
    return {
        "file": target_name,
        **extra,
        "bytes": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": file_sha256(staged),
    }


def matches_entry(path: Path, entry: dict[str, Any]) -> bool:
    """Whether `path` is the file its manifest entry describes: same size and modification
    time, or else the same sha256 (an entry without a sha256 vouches for nothing)."""
    stat = path.stat()
    if (entry.get("bytes"), entry.get("mtime_ns")) == (stat.st_size, stat.st_mtime_ns):
        return True
    return entry.get("sha256") is not None and file_sha256(path) == entry["sha256"]


def swap_in(staged: Sequence[tuple[Path, Path]]) -> None:
    """Rename each (staged, target) pair in order, with SIGINT and SIGTERM held back until the
    end; if a rename fails, every target already replaced gets its old content back."""
    with _signals_held():
        olds: list[Path] = []
        replaced: list[tuple[Path, Path | None]] = []
        try:
            for tmp, target in staged:
                old = _keep_old(target)
                olds += [old] if old is not None else []
                os.replace(tmp, target)
                replaced.append((target, old))
        except BaseException:
            for target, old in reversed(replaced):
                if old is None:
                    target.unlink(missing_ok=True)
                else:
                    os.replace(old, target)
            raise
        finally:
            for old in olds:
                old.unlink(missing_ok=True)


def _keep_old(target: Path) -> Path | None:
    """A second name for `target`'s current content (a hard link, else a copy), or None."""
    if not target.exists():
        return None
    old = target.with_name(f".{target.name}.old-{os.getpid()}.tmp")
    old.unlink(missing_ok=True)
    try:
        os.link(target, old)
    except OSError:  # a file system without hard links
        shutil.copy2(target, old)
    return old


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends: a Ctrl-C lands after the swap, not in it."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
