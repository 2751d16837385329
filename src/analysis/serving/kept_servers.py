"""Servers kept for several notebooks: started once by the process that runs the notebooks
(`make report`, nbval) and handed to each notebook's kernel, instead of one start per notebook
(two vLLM starts cost about 45 s on 2 cores).

The keeper publishes its ready servers in a small JSON file named by the environment variable
`PREFIX_CACHE_LAB_SERVERS`, which the kernels it starts inherit. A kernel's `ServerPair` looks
a server up by its model and every flag it was started with, and attaches to it; anything
else, or a server that no longer answers, it starts itself, as a notebook run on its own always
does. The keeper alone stops them.

A module of its own: which servers are shared, and how a process finds them, is apart from
starting one (`server`) and from measuring on one (`benchmark`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from analysis.platform.manifest import process_alive
from analysis.serving.server import ServerConfig, VllmServer, _http
from analysis.serving.storage import _digest

ENV = "PREFIX_CACHE_LAB_SERVERS"


def identity(config: ServerConfig) -> str:
    """What makes two servers the same server: the model and every flag it is started with
    (not the port, nor how long this process waits for it to start or stop)."""
    return _digest({"model": config.model, "flags": config.flags()})


def entry(server: VllmServer) -> dict:
    """What a kernel needs to attach to a ready server of ours."""
    if server.pid is None or server.port is None:
        raise ValueError("only a server this process launched, and that is ready, can be kept")
    return {
        "identity": identity(server.config),
        "pid": server.pid,
        "port": server.port,
        "log_path": str(server.log_path),
        "command": server.command,
        "startup_s": server.startup_s,
    }


@contextmanager
def published(servers: Iterable[VllmServer]) -> Iterator[Path]:
    """Name these ready servers to every process started inside the block (through the
    environment); the file and the variable go when it ends. The servers are not stopped."""
    entries = [entry(s) for s in servers]
    fd, name = tempfile.mkstemp(prefix="prefix-cache-lab-servers-", suffix=".json")
    with os.fdopen(fd, "w") as out:
        json.dump(entries, out, indent=1)
    previous = os.environ.get(ENV)
    os.environ[ENV] = name
    try:
        yield Path(name)
    finally:
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous
        Path(name).unlink(missing_ok=True)


def lookup(config: ServerConfig) -> VllmServer | None:
    """An attached handle on the kept server started with exactly `config`, if one is
    published and still answers; None otherwise (the caller starts its own)."""
    path = os.environ.get(ENV)
    if not path:
        return None
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    wanted = identity(config)
    for found in entries:
        if found.get("identity") != wanted or not process_alive(int(found["pid"])):
            continue
        server = VllmServer.attached(
            config,
            port=int(found["port"]),
            log_path=Path(found["log_path"]),
            command=found["command"],
            startup_s=float(found["startup_s"]),
        )
        status, _ = _http(f"{server.base_url}/health")
        if status == 200:
            return server
    return None
