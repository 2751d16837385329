"""`python -m analysis report` re-executes a committed notebook without ever leaving it half
written: Ctrl-C, SIGKILL, a killed kernel or a failing cell leave its committed bytes as they
were, and each failure is one line.

The notebook here is a stand-in under a temporary root: one cell that writes its kernel's pid
and waits while a `hold` file exists, with a committed output. No vLLM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from analysis.report.notebooks import execute

NAME = "99-wait.ipynb"
WAIT = """import os, pathlib, time
pathlib.Path("kernel.pid").write_text(str(os.getpid()))
while pathlib.Path("hold").exists():
    time.sleep(0.05)
print("done")"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A repository root with one committed notebook (an output already in it) and a hold."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    cell = nbformat.v4.new_code_cell(WAIT)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="committed\n")]
    notebook = nbformat.v4.new_notebook(cells=[cell])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(notebook, notebooks / NAME)
    (notebooks / "hold").touch()
    return tmp_path


# `report 99 --no-html` with papermill's kernel shutdown stuck (it never returns) and the grace
# after a Ctrl-C cut to 2 s.
STUCK_SHUTDOWN = """import sys, time
import nbclient.client
from analysis.report import notebooks
notebooks.INTERRUPT_GRACE_S = 2.0
nbclient.client.NotebookClient._cleanup_kernel = lambda self: time.sleep(3600)
from analysis.cli import main
sys.exit(main(["report", "99", "--no-html"]))"""


def start_report(root: Path, *command: str) -> subprocess.Popen:
    """`report 99 --no-html` (or `command`, Python's arguments) in its own process group (a
    terminal's Ctrl-C reaches the group)."""
    env = dict(os.environ, PREFIX_CACHE_LAB_ROOT=str(root))
    return subprocess.Popen(
        [sys.executable, *(command or ("-m", "analysis", "report", "99", "--no-html"))],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kernel_pid(root: Path, report: subprocess.Popen) -> int:
    """The kernel's pid, once the cell runs (it writes it first)."""
    marker = root / "notebooks" / "kernel.pid"
    deadline = time.monotonic() + 120
    while not marker.is_file() or not marker.read_text():
        assert report.poll() is None, report.communicate()
        assert time.monotonic() < deadline, "the notebook's cell never started"
        time.sleep(0.05)
    return int(marker.read_text())


def wait_gone(pid: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def untouched(root: Path, committed: bytes) -> None:
    """The committed notebook has its bytes, and no partial copy is left beside it."""
    notebooks = root / "notebooks"
    assert (notebooks / NAME).read_bytes() == committed
    assert not list(notebooks.glob(".*.ipynb"))


def test_ctrl_c_leaves_the_committed_notebook_as_it_was(root):
    """Row 15.1: Ctrl-C erased the notebook's committed outputs (papermill writes in place as
    it goes), and a zmq traceback came before "nothing partial was kept"."""
    committed = (root / "notebooks" / NAME).read_bytes()
    report = start_report(root)
    kernel = kernel_pid(root, report)
    os.killpg(report.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    _, err = report.communicate(timeout=60)
    wait_gone(kernel)
    assert report.returncode == 130, err
    assert "Traceback" not in err and err.strip().endswith("interrupted: nothing partial was kept")
    untouched(root, committed)


def test_ctrl_c_ends_the_run_even_when_the_kernel_shutdown_hangs(root):
    """A Ctrl-C under load once left `report` waiting over a minute in papermill's kernel
    shutdown: after the grace the kernel is killed and the run ends as a Ctrl-C does."""
    committed = (root / "notebooks" / NAME).read_bytes()
    report = start_report(root, "-c", STUCK_SHUTDOWN)
    kernel = kernel_pid(root, report)
    started = time.monotonic()
    os.killpg(report.pid, signal.SIGINT)
    _, err = report.communicate(timeout=60)
    assert report.returncode == 130, err
    assert time.monotonic() - started < 30
    assert "Traceback" not in err, err
    assert err.strip().endswith("did not stop within 2 s and was killed; nothing partial was kept")
    wait_gone(kernel)
    with pytest.raises(ProcessLookupError):
        os.kill(kernel, 0)
    untouched(root, committed)


def test_ctrl_c_during_notebooks_side_by_side_stops_them_all(root):
    """`make report` runs most notebooks a few at a time, each from a thread: a Ctrl-C reached
    only the thread waiting for them, and the run went on until every running notebook had
    ended (here: never), its kernels orphaned once the run was killed."""
    notebooks = root / "notebooks"
    second = "98-wait.ipynb"
    waiting = nbformat.read(notebooks / NAME, as_version=4)
    waiting.cells[0].source = WAIT.replace('"kernel.pid"', '"kernel-98.pid"')
    nbformat.write(waiting, notebooks / second)
    committed = {name: (notebooks / name).read_bytes() for name in (NAME, second)}
    report = start_report(root, "-m", "analysis", "report", "98", "99", "--no-html")
    kernels = [kernel_pid(root, report)]
    marker = notebooks / "kernel-98.pid"
    deadline = time.monotonic() + 120
    while not marker.is_file() or not marker.read_text():
        assert report.poll() is None and time.monotonic() < deadline, report.communicate()
        time.sleep(0.05)
    kernels.append(int(marker.read_text()))
    os.killpg(report.pid, signal.SIGINT)
    out, err = report.communicate(timeout=60)
    assert "2 at a time" in out  # they did run side by side
    assert report.returncode == 130, err
    assert "Traceback" not in err and err.strip().endswith("interrupted: nothing partial was kept")
    for kernel in kernels:
        wait_gone(kernel)
        with pytest.raises(ProcessLookupError):
            os.kill(kernel, 0)
    for name, content in committed.items():
        assert (notebooks / name).read_bytes() == content
    assert not list(notebooks.glob(".*.ipynb"))
    assert not (root / "reports" / "failed").exists()  # a stop, not a failure


def test_a_sigkilled_report_leaves_the_committed_notebook_and_the_next_run_cleans_up(root):
    """Row 15.2: SIGKILL left the notebook half-executed, without outputs."""
    committed = (root / "notebooks" / NAME).read_bytes()
    report = start_report(root)
    kernel = kernel_pid(root, report)
    report.send_signal(signal.SIGKILL)
    report.communicate(timeout=60)
    os.kill(kernel, signal.SIGKILL)  # an orphaned kernel exits by itself, later
    wait_gone(kernel)
    notebooks = root / "notebooks"
    assert (notebooks / NAME).read_bytes() == committed
    (notebooks / "hold").unlink()
    again = start_report(root)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    executed = nbformat.read(notebooks / NAME, as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "done\n"
    assert executed.metadata["papermill"]["output_path"] == f"notebooks/{NAME}"
    assert not list(notebooks.glob(".*.ipynb"))  # the killed run's copy is gone too
    assert "notebook 99-wait" in (root / "reports" / "report-times.csv").read_text()


def test_a_killed_kernel_is_one_line_naming_the_notebook_and_memory(root):
    """Row 15.3: the kernel killed (as the OOM killer would) was a DeadKernelError traceback."""
    committed = (root / "notebooks" / NAME).read_bytes()
    report = start_report(root)
    os.kill(kernel_pid(root, report), signal.SIGKILL)
    _, err = report.communicate(timeout=120)
    assert report.returncode == 2, err
    assert err.startswith(f"error: {NAME}: its kernel died") and err.count("\n") == 1, err
    assert "memory" in err
    untouched(root, committed)


def test_a_failing_cell_is_one_line_and_its_executed_copy_is_kept_aside(root, monkeypatch):
    """A cell's error names the notebook, the error and the cell; the committed notebook stays,
    the executed copy up to the error goes to reports/failed/."""
    from analysis.platform.errors import NotebookError

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(root))
    notebook = root / "notebooks" / NAME
    broken = nbformat.read(notebook, as_version=4)
    broken.cells[0].source = "raise ValueError('a cut file')"
    nbformat.write(broken, notebook)
    committed = notebook.read_bytes()
    with pytest.raises(NotebookError) as error:
        execute(notebook, progress=False)
    assert str(error.value).startswith(f"{NAME}: ValueError: a cut file (cell 1); the executed")
    untouched(root, committed)
    assert "ValueError" in (root / "reports" / "failed" / NAME).read_text()


def test_a_ctrl_c_that_leaves_the_run_in_time_stops_the_clock(tmp_path):
    """In a Jupyter kernel the same Ctrl-C is the interrupt button: the KeyboardInterrupt leaves
    `execute` at once, and the clock must not end the kernel after the grace."""
    from analysis.report.notebooks import interrupt_within

    before = signal.getsignal(signal.SIGINT)
    partial = tmp_path / "partial.ipynb"
    partial.touch()
    with pytest.raises(KeyboardInterrupt), interrupt_within(0.2, partial):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the interrupt lands here
    time.sleep(0.5)  # past the grace: this process is still here
    assert partial.exists() and signal.getsignal(signal.SIGINT) is before


def test_the_readme_states_the_grace_the_code_gives():
    from analysis.platform.paths import repo_root
    from analysis.report.notebooks import INTERRUPT_GRACE_S

    readme = " ".join((repo_root() / "README.md").read_text().split())
    assert f"the kernel gets {INTERRUPT_GRACE_S:g} s to shut down" in readme
