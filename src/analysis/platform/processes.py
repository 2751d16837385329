"""Child processes that end with their parent, whatever ends the parent (SIGKILL included).

Signal handlers and `atexit` run only when the parent may still run code; a SIGKILL, an
out-of-memory kill or a closed terminal's SIGHUP used to leave the children re-parented to
PID 1, where they held gigabytes or a port for good. Two ties, for two kinds of children:

- One process (a sweep worker): `die_with_parent`, run in the child, asks Linux to SIGKILL it
  when its parent dies (`prctl(PR_SET_PDEATHSIG)`). Other systems have no such call: there it
  does nothing, and a child may outlive a parent killed without warning. The kernel's
  "parent" is the *thread* that started the child: the signal also fires when that thread
  ends while the process lives on, so tie only children that their starting thread waits for.
- A process group (a vLLM server: the API server and its engine-core process, which the
  kernel's signal to the API server alone would not reach): `guard_group` starts a small
  guard process that waits for the end of a pipe only the parent holds, which comes when the
  parent exits or dies, however it dies, and then ends the whole group (`terminate_group`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import IO

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
SUPPORTED = sys.platform.startswith("linux")  # where `die_with_parent` does something


def die_with_parent(parent_pid: int) -> None:
    """In a child: have the kernel SIGKILL this process when its parent dies (Linux only).

    `parent_pid` is the parent's pid as the parent saw it before starting the child: if the
    parent died before this call, the child is already an orphan and ends itself now. Use
    it as a process pool's `initializer` (with `initargs=(os.getpid(),)`)."""
    if not SUPPORTED:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # orphaned before the tie was made
        os.kill(os.getpid(), signal.SIGKILL)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    import psutil

    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def terminate_group(pgid: int, proc: subprocess.Popen | None, grace_s: float) -> None:
    """SIGTERM the group, wait up to `grace_s` for all of it to exit, then SIGKILL the rest."""
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        _signal_group(pgid, signum)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()  # reap our direct child so that it stops counting
            if not group_members(pgid):
                return
            time.sleep(0.1)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)


def guard_group(pgid: int, grace_s: float, log: IO[bytes] | None = None) -> subprocess.Popen:
    """Start a guard that ends process group `pgid` (`terminate_group`) once this process
    exits or dies; `dismiss_guard` it after stopping the group yourself.

    The guard reads its stdin, a pipe whose writing end only this process holds (it is not
    inherited across `exec`), until the end of file: the kernel closes that end when this
    process dies, by any signal. The guard has a session of its own, so that a Ctrl-C or a
    closed terminal that ends this process does not end the guard first. `log`: where the
    guard's own errors go (default: nowhere)."""
    code = f"from {__name__} import end_group_at_eof; end_group_at_eof({pgid}, {grace_s!r})"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=log if log is not None else subprocess.DEVNULL,
        start_new_session=True,
    )


def end_group_at_eof(pgid: int, grace_s: float) -> None:
    """The guard's body: wait until the parent closes (or no longer holds) our stdin, then end
    the group; nothing to do when the parent has stopped it already."""
    sys.stdin.buffer.read()
    terminate_group(pgid, None, grace_s)


def dismiss_guard(guard: subprocess.Popen) -> None:
    """Release a guard whose group is stopped: it finds the group empty and exits."""
    with contextlib.suppress(OSError):
        guard.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        guard.wait(timeout=15.0)
