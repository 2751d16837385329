"""Whether an output folder can be written, asked before the work that fills it.

A run that computes for minutes and only then finds its folder on a full or read-only disk, or
a file where the folder should be, loses that work. Creating the folder and writing one small
file first costs nothing; an `OSError` met at either moment becomes one line naming the folder.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from analysis.platform.errors import OutputError

PROBE_BYTES = 4096  # one page: a disk with no room left refuses it
PROBE_PREFIX = ".write-probe-"  # then the writing process's id

# errno -> what is wrong and what to do (any other errno: the system's own words).
REASONS = {
    errno.ENOSPC: "the disk is full: free some space or choose another folder",
    errno.EDQUOT: "the disk quota is used up: free some space or choose another folder",
    errno.EROFS: "the file system is read-only: choose a writable folder",
    errno.EACCES: "permission denied: choose a folder you can write to",
    errno.EPERM: "permission denied: choose a folder you can write to",
    errno.EEXIST: "a file is in the way: remove it or choose another folder",
    errno.ENOTDIR: "a file is in the way: remove it or choose another folder",
}


def ensure_writable(folder: str | Path) -> Path:
    """Create `folder` (and its parents), write and remove a probe file in it; `OutputError`
    (one line) if the file system refuses."""
    folder = Path(folder)
    probe = folder / f"{PROBE_PREFIX}{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as handle:
            handle.write(b"\0" * PROBE_BYTES)
        probe.unlink()
    except OSError as exc:
        with contextlib.suppress(OSError):  # a probe half-written on a full disk
            probe.unlink(missing_ok=True)
        raise output_error(folder, exc) from None
    remove_orphan_probes(folder)
    return folder


def remove_orphan_probes(folder: Path) -> None:
    """Remove the probes of processes that no longer run: one killed between writing its
    probe and removing it (SIGKILL leaves no chance to clean up) left it behind."""
    import psutil

    for probe in folder.glob(f"{PROBE_PREFIX}*"):
        pid = probe.name.removeprefix(PROBE_PREFIX)
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            with contextlib.suppress(OSError):  # another process removed it first
                probe.unlink()


def ensure_replaceable(folder: str | Path) -> Path:
    """Before the work whose folder `manifest.staged_folder` will swap in as `folder`: its
    parent can be written (the staging folder is made there) and no file stands in its place
    (the swap would set the file aside and delete it). `OutputError` (one line) if not."""
    folder = Path(folder)
    refuse_file_in_the_way(folder)
    ensure_writable(folder.parent)
    return folder


def refuse_file_in_the_way(folder: str | Path) -> None:
    """`OutputError` when something other than a folder stands where `folder` will go. One
    `stat`, not `exists()` then `is_dir()`: another writer's swap may take the folder away
    between two looks, and a folder missing for a moment is not a file in the way."""
    folder = Path(folder)
    try:
        mode = folder.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISDIR(mode):
        raise output_error(folder, NotADirectoryError(errno.ENOTDIR, "not a folder"))


def output_error(folder: str | Path, exc: OSError) -> OutputError:
    """One line for an `OSError` met while creating or writing `folder`."""
    reason = REASONS.get(exc.errno or 0)
    if reason is None:
        reason = f"{exc.strerror or exc}: choose another folder"
    return OutputError(f"cannot write to {folder}: {reason}")
