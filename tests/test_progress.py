"""Progress bars only on a terminal; executed notebooks keep no progress-bar noise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.platform import progress
from analysis.report.notebooks import progress_noise


def test_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "interactive", lambda: False)
    assert progress.bar(range(3)).disable
    monkeypatch.setattr(progress, "interactive", lambda: True)
    assert not progress.bar(range(3)).disable
    assert progress.bar(range(3), enabled=False).disable
    assert progress.bar(range(3), disable=True).disable  # a call site's own switch still works
    assert list(progress.bar(range(3), enabled=False)) == [0, 1, 2]


def test_import_analysis_filters_the_iprogress_warning() -> None:
    code = (
        "import warnings, analysis\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.warn('IProgress not found. Please update jupyter and ipywidgets.')\n"
        "    warnings.warn('another warning')\n"
        "print([str(w.message) for w in seen])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['another warning']"


def test_progress_noise_is_found_in_stderr_outputs(tmp_path: Path) -> None:
    def stream(name: str, text: str) -> dict:
        return {"output_type": "stream", "name": name, "text": [text]}

    cells = [
        {"cell_type": "code", "outputs": [stream("stderr", "\rsweep points: 0point [00:00]")]},
        {"cell_type": "code", "outputs": [stream("stderr", "TqdmWarning: IProgress not found")]},
        {"cell_type": "code", "outputs": [stream("stderr", "a real warning\n")]},
        {"cell_type": "code", "outputs": [stream("stdout", "\rprinted on purpose")]},
    ]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    assert progress_noise(path) == [
        "sweep points: 0point [00:00]",
        "TqdmWarning: IProgress not found",
    ]


@pytest.mark.engine
def test_vllm_start_up_warnings_go_to_the_log_file_not_stderr(tmp_path: Path) -> None:
    """A real vLLM config build at block 16 on the CPU warns that the CPU backend prefers
    multiples of 32: that line must land in vLLM's log file, and stderr must stay clean."""
    code = (
        "from analysis.platform.engine_logs import log_path\n"
        "from analysis.engines.config import RunConfig\n"
        "from analysis.engines.replay import build_replay_engine\n"
        "from analysis.engines.vllm_args import config_model\n"
        "config = RunConfig(engine='replay', block_size=16, num_blocks=600, max_model_len=8192)\n"
        "build_replay_engine(config, config_model(config))\n"
        "print(log_path())\n"
    )
    env = {**os.environ, "VLLM_CONFIGURE_LOGGING": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    log = Path(out.stdout.strip().splitlines()[-1]).read_text(encoding="utf-8")
    assert "prefers block_size is multiples of 32" in log
    assert "block_size" not in out.stderr, out.stderr
    assert "WARNING" not in out.stderr and "Warning" not in out.stderr, out.stderr
