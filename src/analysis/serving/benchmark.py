"""The serving benchmark: TTFT, end-to-end latency and throughput with prefix caching on and
off (two servers, everything else equal), every (mode, prefix regime, concurrency) cell not
already cached under `data/results/serving/`, each repeat from an emptied cache, with the
servers of both modes interleaved; and `ServerPair`, which keeps those servers running across
benchmarks.

A module of its own: it schedules runs on servers and records them; the single run, the
server and the storage each live in their own module.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.platform.manifest import git_commit, package_versions
from analysis.serving import kept_servers
from analysis.serving.bench_config import RunKey, ServingBenchConfig, cell_dir, run_id
from analysis.serving.bench_run import (
    combine_repeats,
    completeness,
    execute_run,
    planned_requests,
    prefill_speed,
    sharegpt_specs,
    speed_note,
    synthetic_specs,
    warm_server,
    workload_digest,
)
from analysis.serving.model_names import resolve_model, served_name
from analysis.serving.server import VllmServer
from analysis.serving.storage import _digest, _write_run, is_reusable, load_summaries, serving_root
from analysis.serving.tables import summary_table

# A speed probe stands for the next cell's probe before it while its server has finished no
# request since and it is at most this old: the cell after it in one benchmark, and the first
# cell of the next benchmark when they follow each other (notebook 08's anti-patterns are
# three benchmarks, notebook 10's mixed traffic two). Each probe costs about 2 s on 2 cores.
PROBE_FRESH_S = 30.0
# base URL -> (prefill tokens/s, time.monotonic() of the probe, the server's finished requests)
_latest_probes: dict[str, tuple[float, float, float]] = {}


def _finished_requests(server: VllmServer) -> float:
    return server.counters().get("vllm:request_success", 0.0)


def _probe(server: VllmServer) -> float:
    """A new speed probe, remembered with the server's finished requests once it counts the
    probe's own (`prefill_speed` waits for them)."""
    rate = prefill_speed(server)
    _latest_probes[server.base_url] = (rate, time.monotonic(), _finished_requests(server))
    return rate


def _speed_before(server: VllmServer) -> float:
    """The server's latest probe if nothing ran on it since and it is fresh, else a new one."""
    latest = _latest_probes.get(server.base_url)
    if latest is not None:
        rate, at, finished = latest
        if time.monotonic() - at <= PROBE_FRESH_S and _finished_requests(server) == finished:
            return rate
    return _probe(server)


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
    run_dir: Path,
    config: ServingBenchConfig,
    model: str,
    server: VllmServer,
    interleaved: bool,
    complete: bool,
) -> dict[str, Any]:
    return {
        "run_id": run_dir.name,
        "complete": complete,  # every planned request succeeded: reused by later calls
        "config": asdict(config),
        "model": model,
        "server_command": server.command,
        "server_startup_s": server.startup_s,
        "server_model_cores": server.model_cores(),  # None: vLLM bound no cores (a GPU)
        "interleaved": interleaved,
        "versions": package_versions(),
        "git_commit": git_commit(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


class ServerPair:
    """The caching-on and caching-off servers of one benchmark, started together on first
    use and reused by every later benchmark whose server flags are the same (a notebook
    starts each server once). `with ServerPair() as pair:`; stopped on exit. A server that
    the process running the notebooks keeps for all of them (`kept_servers`) is used instead
    of a new one, and left running."""

    def __init__(self, root: Path | None = None, log: Any = None) -> None:
        self.root = Path(root) if root else serving_root()
        self.servers: dict[str, VllmServer] = {}
        self.say = log or (lambda message: print(message, file=sys.stderr))

    def __enter__(self) -> ServerPair:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def launch(self, config: ServingBenchConfig, model: str, modes: Sequence[str]) -> None:
        """Start the servers `get` will hand out without waiting for them (a server with other
        flags is stopped first, a kept one attached), so that their start-up overlaps other
        work: `get` then waits."""
        wanted = {m: config.server_config(model, m) for m in modes}
        stale = [m for m, c in wanted.items() if m in self.servers and self.servers[m].config != c]
        for mode in stale:
            self.servers.pop(mode).stop()
        for mode in [m for m in modes if m not in self.servers]:
            kept = kept_servers.lookup(wanted[mode])
            if kept is not None:
                self.say(f"using the kept vLLM server ({mode}) at {kept.base_url}")
                self.servers[mode] = kept
        for mode in [m for m in modes if m not in self.servers]:
            digest = _digest(asdict(wanted[mode]))
            server = VllmServer(wanted[mode], self.root / "logs" / f"server-{mode}-{digest}.log")
            self.say(f"starting vLLM server ({mode}, {served_name(model)})")
            self.servers[mode] = server.launch()

    def get(self, config: ServingBenchConfig, model: str, modes: Sequence[str]) -> dict:
        """Running servers for `modes` with `config`'s flags (restarted if they differ),
        started now or by an earlier `launch`, and warmed up once ready."""
        self.launch(config, model, modes)
        starting = [m for m in modes if not math.isfinite(self.servers[m].startup_s)]
        for mode in starting:
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
    keys = [RunKey(m, r, c) for m in config.modes for r, c in pairs]
    if force:  # a rewrite goes under the current run id
        dirs = {k: root / run_id(config, model, k, digest) for k in keys}
    else:
        dirs = {k: cell_dir(root, config, model, k, digest) for k in keys}
    pending = [k for k, d in dirs.items() if force or not is_reusable(d)]
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
                planned = dict.fromkeys(keys, 0)
                probe = live_servers[keys[0].mode]
                speed_before = _speed_before(probe)
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
                        planned[key] += planned_requests(specs)
                speed_after = _probe(probe)
                for key, (frames, summaries, gauges) in collected.items():
                    live = live_servers[key.mode]
                    frame = pd.concat(frames, ignore_index=True)
                    complete, incomplete = completeness(frame, planned[key])
                    summary = combine_repeats(summaries, frame)
                    summary["prefill_tok_s_before"] = speed_before
                    summary["prefill_tok_s_after"] = speed_after
                    summary["speed_note"] = speed_note(speed_before, speed_after)
                    summary["notes"] = "; ".join(
                        n for n in (summary["notes"], summary["speed_note"], incomplete) if n
                    )
                    summary["model"] = served_name(model)
                    summary["server_startup_s"] = live.startup_s
                    summary["interleaved"] = len(live_servers) > 1
                    manifest = _run_manifest(
                        dirs[key], config, model, live, len(live_servers) > 1, complete
                    )
                    _write_run(dirs[key], frame, summary, manifest, pd.DataFrame(gauges))
                    say(
                        f"{dirs[key].name}: mean TTFT {summary['mean_ttft_s']:.3f} s, "
                        f"{summary['req_s']:.2f} req/s {summary['notes']}".rstrip()
                    )
    return summary_table(load_summaries(list(dirs.values())))
