"""`make sweep` never takes a failed or killed point's half-written notebook as done.

The Makefile runs each point as `$(PY) -m analysis sweep --grid G --point P`, which writes
reports/runs/G/P.ipynb as papermill goes. Here PY is a stand-in that writes that notebook
half-way and then fails, is SIGKILLed, or succeeds; `make -n sweep-points` then says whether
make would run the point again. Fast: no notebook, no vLLM.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"
POINT = "capacity-single_turn-replay-b16-n513"
NOTEBOOK = Path("reports/runs/default") / f"{POINT}.ipynb"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")

# Called as `PY -m analysis sweep --grid G --point P`: a notebook half-way through, then `$END`.
STAND_IN = """#!/bin/sh
mkdir -p "reports/runs/$5"
echo '{"cells": "half-executed"}' > "reports/runs/$5/$7.ipynb"
$END
"""


def _make(folder: Path, *args: str, end: str = "exit 0") -> subprocess.Popen:
    python = folder / "stand-in-python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    command = ["make", "--no-print-directory", "-f", str(MAKEFILE), f"PY={python}", *args]
    env = dict(os.environ, END=end)
    return subprocess.Popen(
        command,
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: the test can kill make and its recipe at once
    )


def _run_point(folder: Path, end: str) -> int:
    make = _make(folder, "sweep-points", f"POINTS={POINT}", end=end)
    make.communicate(timeout=60)
    return make.returncode


def _would_run_again(folder: Path) -> bool:
    make = _make(folder, "-n", "sweep-points", f"POINTS={POINT}")
    out, _ = make.communicate(timeout=60)
    assert make.returncode == 0, out
    return f"--point {POINT}" in out


def test_a_finished_point_is_not_run_again(tmp_path):
    assert _run_point(tmp_path, "exit 0") == 0
    assert (tmp_path / NOTEBOOK).exists()
    assert not _would_run_again(tmp_path)


@pytest.mark.parametrize("end", ["exit 1", "kill -KILL $$"], ids=["fails", "killed"])
def test_a_point_that_fails_or_is_killed_is_run_again(tmp_path, end):
    assert _run_point(tmp_path, end) != 0
    assert not (tmp_path / NOTEBOOK).exists()  # the half-written notebook is gone
    assert _would_run_again(tmp_path)


def test_a_point_whose_make_was_sigkilled_is_run_again(tmp_path):
    make = _make(tmp_path, "sweep-points", f"POINTS={POINT}", end="sleep 600")
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / NOTEBOOK).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / NOTEBOOK).exists(), "the stand-in never wrote its notebook"
    finally:
        os.killpg(make.pid, signal.SIGKILL)  # make and the point together: nothing cleans up
        make.wait()
    assert (tmp_path / NOTEBOOK).exists()  # left half-written, as papermill leaves it
    assert _would_run_again(tmp_path)
