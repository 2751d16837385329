"""Jupyter kernels started over IPC (Unix domain sockets) instead of TCP on localhost.

A kernel started over TCP without CurveZMQ keys warns at start-up ("Kernel is running over TCP
without encryption ... Use IPC transport"), once per notebook, and listens on five localhost
ports any local user can reach. Over IPC its sockets are files under Jupyter's runtime folder
(user-only), named after a connection file unique to the kernel, so that kernels started at
once (sweep workers, nbval) never share a socket and a kernel's working folder does not matter.

`make report` and the sweep hand papermill (nbclient's `kernel_manager_class`) a manager that
also appends the kernel process's own stderr (ipykernel's log: a warning, the traceback of a
reply cut off when Ctrl-C shuts the kernel down, an internal error) to `kernel_log_path()`:
kept, and off the terminal, where it buried the one line that says why a run stopped (a cell's
error comes back with the notebook; a kernel's death is a NotebookError). nbval builds its own
`KernelManager` (its kernel's stderr goes to /dev/null), replaced by `notebooks/conftest.py`
with `over_ipc(KernelManager)`. Where IPC is not available (Windows), the managers keep TCP.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from analysis.platform.paths import cache_dir

IPC_AVAILABLE = os.name == "posix"


def over_ipc(base: type) -> type:
    """`base` (a jupyter_client KernelManager class) starting its kernels over IPC, each with a
    connection file of its own under Jupyter's runtime folder (its sockets beside it)."""
    if not IPC_AVAILABLE:
        return base
    from jupyter_core.paths import jupyter_runtime_dir
    from traitlets import default

    class IpcKernelManager(base):  # type: ignore[valid-type, misc]
        @default("transport")
        def _transport_default(self) -> str:
            return "ipc"

        @default("connection_file")
        def _connection_file_default(self) -> str:
            # An absolute, unique path: the sockets are named after it ("<file>-ipc-<n>"), and
            # the default ("kernel-ipc", relative) would put them in the current folder.
            folder = jupyter_runtime_dir()
            os.makedirs(folder, mode=0o700, exist_ok=True)
            return os.path.join(folder, f"kernel-{uuid.uuid4()}.json")

    IpcKernelManager.__name__ = IpcKernelManager.__qualname__ = f"Ipc{base.__name__}"
    return IpcKernelManager


def kernel_log_path() -> Path:
    return cache_dir() / "logs" / "kernels.log"


def logging_to_file(base: type) -> type:
    """`base` (a KernelManager class) appending its kernels' stderr to `kernel_log_path()`."""

    class LoggedKernelManager(base):  # type: ignore[valid-type, misc]
        async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
            if "stderr" in kw:
                return await super()._async_launch_kernel(kernel_cmd, **kw)
            path = kernel_log_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as log:  # the kernel keeps its own copy
                log.write(f"--- kernel started {kw.get('cwd') or os.getcwd()}\n")
                log.flush()
                return await super()._async_launch_kernel(kernel_cmd, stderr=log, **kw)

    LoggedKernelManager.__name__ = LoggedKernelManager.__qualname__ = f"Logged{base.__name__}"
    return LoggedKernelManager


def papermill_kernel_arguments() -> dict[str, Any]:
    """What `papermill.execute_notebook` hands to nbclient: its kernel manager's class, which
    starts the kernel over IPC with its stderr in `kernel_log_path()`."""
    from jupyter_client.manager import AsyncKernelManager

    return {"kernel_manager_class": logging_to_file(over_ipc(AsyncKernelManager))}
