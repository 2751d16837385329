"""Notebook kernels start over IPC (`analysis.report.kernels`): no TCP ports, no "Kernel is
running over TCP without encryption" warning, whether papermill (`make report`, the sweep) or
nbval (`make nbval`, through notebooks/conftest.py) starts them. No vLLM."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import nbformat
import pytest

from analysis.report import kernels

ROOT = Path(__file__).resolve().parents[1]
WARNING = "without encryption"

pytestmark = pytest.mark.skipif(not kernels.IPC_AVAILABLE, reason="IPC transport: POSIX only")


def test_a_kernel_over_ipc_runs_from_another_folder_and_leaves_no_socket(tmp_path):
    from jupyter_client.manager import KernelManager

    manager = kernels.over_ipc(KernelManager)(kernel_name="python3")
    log = (tmp_path / "kernel.log").open("w")
    manager.start_kernel(cwd=str(tmp_path), stderr=log)  # the client's folder is another
    client = manager.client()
    try:
        client.start_channels()
        client.wait_for_ready(timeout=60)
        reply = client.execute_interactive("import os; os.getcwd()", timeout=60)
        assert reply["content"]["status"] == "ok"
        assert manager.transport == "ipc"
        assert os.path.isabs(manager.ip) and Path(manager.connection_file).is_file()
        sockets = [f"{manager.ip}-{port}" for port in manager.ports]
        assert all(Path(s).is_socket() for s in sockets)
    finally:
        client.stop_channels()
        manager.shutdown_kernel()
        log.close()
    assert not [s for s in sockets if Path(s).exists()]
    assert not Path(manager.connection_file).exists()
    assert WARNING not in (tmp_path / "kernel.log").read_text()


def test_report_kernels_log_to_a_file_and_do_not_warn(tmp_path, monkeypatch):
    from analysis.report.notebooks import execute

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    cell = nbformat.v4.new_code_cell("import sys; print('hi'); print('err', file=sys.__stderr__)")
    notebook = nbformat.v4.new_notebook(cells=[cell])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    path = tmp_path / "t.ipynb"
    nbformat.write(notebook, path)
    execute(path, progress=False)
    assert nbformat.read(path, as_version=4).cells[0].outputs[0]["text"] == "hi\n"
    log = kernels.kernel_log_path().read_text()
    assert log.startswith("--- kernel started") and "err\n" in log  # the kernel's own stderr
    assert WARNING not in log


def test_nbval_kernels_start_over_ipc_through_the_notebooks_conftest(monkeypatch):
    import nbval.kernel

    monkeypatch.setattr(nbval.kernel, "KernelManager", nbval.kernel.KernelManager)
    spec = importlib.util.spec_from_file_location(
        "notebooks_conftest", ROOT / "notebooks/conftest.py"
    )
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    running = nbval.kernel.RunningKernel(nbval.kernel.CURRENT_ENV_KERNEL_NAME)
    try:
        assert running.km.transport == "ipc"
    finally:
        running.stop()
