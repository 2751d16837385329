"""No child outlives its parent: a SIGKILLed (or SIGHUPed) parent leaves no sweep worker and no
vLLM server behind (Linux's parent-death signal, `analysis.platform.processes`).

Each test starts a small parent script in a subprocess, reads the pids of its children from
the parent's first line of output, kills the parent with a signal it cannot catch or does not
handle, and waits (bounded) until every child is gone. The real-server test is marked `engine`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from analysis.platform import processes

pytestmark = pytest.mark.skipif(not processes.SUPPORTED, reason="parent-death signal: Linux only")

CHILD_THAT_SLEEPS = "[sys.executable, '-c', 'import time; time.sleep(600)']"


def _name(signum: int) -> str:
    return signal.Signals(signum).name


def _survivors(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still running (not gone, not a zombie) after up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [pid for pid in pids if _running(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start_parent(tmp_path: Path, body: str) -> subprocess.Popen:
    script = tmp_path / "parent.py"
    # SIGHUP's default action (the test runner may have been started under nohup, which
    # ignores it, and an ignored disposition is inherited)
    default_hup = "import signal\nsignal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
    script.write_text(default_hup + textwrap.dedent(body))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )


def _children_of(parent: subprocess.Popen) -> list[int]:
    """The pids the parent prints on its first line, once its children are running."""
    line = parent.stdout.readline()
    if not line:
        raise AssertionError(f"the parent died before its children ran: {parent.stderr.read()}")
    return [int(pid) for pid in line.split()]


def _kill_parent_and_find_survivors(
    parent: subprocess.Popen, pids: list[int], signum: int, timeout_s: float
) -> list[int]:
    try:
        assert _survivors(pids, 0) == pids  # all running before the parent dies
        parent.send_signal(signum)
        parent.wait(timeout=30)
        return _survivors(pids, timeout_s)
    finally:
        parent.kill()
        parent.wait()
        for pid in pids:  # never leave a child behind, even when the test fails
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------- the kernel's tie


TIED_CHILD = (
    "import sys, time; from analysis.platform.processes import die_with_parent; "
    "die_with_parent(int(sys.argv[1])); print('tied', flush=True); time.sleep(600)"
)


def test_a_child_tied_with_the_helper_dies_with_its_sigkilled_parent(tmp_path):
    parent = _start_parent(
        tmp_path,
        f"""\
        import os, subprocess, sys, time
        command = [sys.executable, "-c", {TIED_CHILD!r}, str(os.getpid())]
        child = subprocess.Popen(command, stdout=subprocess.PIPE)
        child.stdout.readline()  # tied
        print(child.pid, flush=True)
        time.sleep(600)
        """,
    )
    pids = _children_of(parent)
    assert _kill_parent_and_find_survivors(parent, pids, signal.SIGKILL, 30) == []


def test_a_child_whose_parent_died_before_it_was_tied_ends_itself():
    code = (
        "import time; from analysis.platform.processes import die_with_parent; "
        "die_with_parent(-1); time.sleep(600)"  # -1: not our parent, as if it had died
    )
    child = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert child.returncode == -signal.SIGKILL


# ---------------------------------------------------------------------------- sweep workers


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=_name)
def test_the_sweep_worker_pool_dies_with_its_killed_parent(tmp_path, signum):
    parent = _start_parent(
        tmp_path,
        """\
        import time
        import psutil
        from analysis.sweeps.executors import worker_pool

        def workers():
            me = psutil.Process()
            return [p for p in me.children() if "spawn_main" in " ".join(p.cmdline())]

        if __name__ == "__main__":
            with worker_pool(2) as pool:
                futures = [pool.submit(time.sleep, 600) for _ in range(2)]
                while len(workers()) < 2:
                    time.sleep(0.1)
                time.sleep(1.0)  # both have run the initializer and taken a task
                print(*(p.pid for p in psutil.Process().children()), flush=True)
                time.sleep(600)
        """,
    )
    pids = _children_of(parent)  # the 2 workers and multiprocessing's resource tracker
    assert len(pids) >= 2
    assert _kill_parent_and_find_survivors(parent, pids, signum, 30) == []


# ---------------------------------------------------------------------------- the vLLM server

SERVER_PARENT = """\
import sys, time
from analysis import serving
from analysis.serving import server as serving_server
{patch}
server = serving.VllmServer(serving.ServerConfig(model={model!r}, stop_grace_s={grace}))
{start}
while len(serving_server._group_members(server.pgid)) < 2:
    time.sleep(0.1)
print(*serving_server._group_members(server.pgid), flush=True)
time.sleep(600)
"""

# `vllm serve` stand-in: a grandchild in its group that only SIGKILL ends (as a hung engine).
STAND_IN = (
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); "
    "time.sleep(600)"
)
STAND_IN_PATCH = (
    f"serving_server.server_launcher = lambda model: [sys.executable, '-c', {STAND_IN!r}]"
)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP], ids=_name)
def test_a_server_group_launched_as_serve_bench_does_ends_with_its_killed_parent(tmp_path, signum):
    """A stand-in for `vllm serve` (no vLLM), fast: the guard ends the whole group."""
    body = SERVER_PARENT.format(
        patch=STAND_IN_PATCH, model="tiny-llama", grace=0.5, start="server.launch()"
    )
    parent = _start_parent(tmp_path, body)
    pids = _children_of(parent)
    assert len(pids) == 2  # the stand-in and its SIGTERM-proof child
    assert _kill_parent_and_find_survivors(parent, pids, signum, 30) == []


def _guards() -> list[psutil.Process]:
    """This process's guard children, by the command line they run."""
    found = []
    for child in psutil.Process().children():
        try:
            if "end_group_at_eof" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def test_a_stopped_server_leaves_no_guard_behind(monkeypatch):
    from analysis import serving
    from analysis.serving import server as serving_server

    monkeypatch.setattr(
        serving_server, "server_launcher", lambda model: [sys.executable, "-c", STAND_IN]
    )
    server = serving.VllmServer(serving.ServerConfig(model="tiny-llama", stop_grace_s=0.5))
    server.launch()
    guards = _guards()
    deadline = time.monotonic() + 30  # a guard just forked shows our command line until exec
    while not guards and time.monotonic() < deadline:
        time.sleep(0.05)
        guards = _guards()
    assert len(guards) == 1
    server.stop()
    assert _survivors([guards[0].pid], 0) == []
    assert serving_server._group_members(server.pgid) == []


@pytest.mark.engine
def test_a_real_vllm_server_and_its_engine_core_end_with_a_sigkilled_parent(tmp_path):
    from analysis import serving

    model = serving.resolve_model("tiny-llama")
    body = SERVER_PARENT.format(patch="", model=model, grace=20.0, start="server.start()")
    parent = _start_parent(tmp_path, body)
    pids = _children_of(parent)  # the API server and its engine core, one process group
    assert _kill_parent_and_find_survivors(parent, pids, signal.SIGKILL, 90) == []
