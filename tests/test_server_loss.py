"""A real `vllm serve` killed in the middle of a benchmark: a one-line error that says so, no
process of the server left behind, the runs finished before kept and not run again."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from analysis import serving
from analysis.platform.errors import AnalysisError, ServerLostError

pytestmark = pytest.mark.engine


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group, found by scanning every process (not serving's own
    bookkeeping)."""
    members = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def server_processes() -> list[psutil.Process]:
    """Children of this process that lead their own group: the launched servers (not their
    guards, which lead a group of their own too)."""
    return [
        c
        for c in psutil.Process().children()
        if os.getpgid(c.pid) == c.pid and "end_group_at_eof" not in " ".join(c.cmdline())
    ]


def test_server_killed_mid_benchmark(tmp_path):
    config = serving.ServingBenchConfig(
        model=serving.resolve_model("tiny-llama"),
        prefixes=(0, 64, 128),
        concurrency=(1,),
        requests=2,
        modes=("cache",),
        suffix_tokens=8,
        output_tokens=4,
        max_model_len=512,
        kv_cache_memory_bytes=64 << 20,
        request_timeout_s=30.0,
    )
    killed: list[int] = []
    lines: list[str] = []

    def log(message: str) -> None:
        lines.append(message)
        if "mean TTFT" in message and not killed:  # the first run is written: kill the server
            (server,) = server_processes()
            killed.append(server.pid)
            assert len(group_members(server.pid)) >= 1
            os.kill(server.pid, signal.SIGKILL)  # the launcher only: its children must not linger

    with pytest.raises(ServerLostError) as caught:
        serving.run_serving_bench(config, root=tmp_path, log=log, progress=False)
    message = str(caught.value)
    assert isinstance(caught.value, AnalysisError) and "\n" not in message
    assert "during the benchmark" in message and "port" in message
    assert "finished runs are kept" in message
    assert killed and group_members(killed[0]) == []  # no orphan of the killed server
    assert server_processes() == []
    runs = sorted(p for p in tmp_path.iterdir() if p.name.startswith("synthetic-"))
    finished = [p for p in runs if serving.is_finished(p)]
    assert len(finished) == 1 and "-p0-" in finished[0].name
    stamp = (finished[0] / "manifest.json").stat().st_mtime_ns

    # the same benchmark again: the finished run is kept, the two others are done
    table = serving.run_serving_bench(config, root=tmp_path, log=lines.append, progress=False)
    assert sorted(table["prefix_regime"].astype(str)) == ["0", "128", "64"]
    assert (finished[0] / "manifest.json").stat().st_mtime_ns == stamp
    assert sum("mean TTFT" in line for line in lines) == 1 + 2
    assert server_processes() == []
