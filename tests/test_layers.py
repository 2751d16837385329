"""The layer contract of pyproject.toml (import-linter) holds, and it catches a circle.

`make lint` runs `lint-imports` on the package; this test runs it on a copy of the package with
one upward import added (a `platform` module importing `commands`), which closes a circle, and
expects it to fail there, so that a contract that checks nothing cannot pass unnoticed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(src: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_package_keeps_its_layers():
    done = lint_imports(ROOT / "src")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "analysis", copy / "analysis")
    paths = copy / "analysis" / "platform" / "paths.py"
    paths.write_text(paths.read_text() + "\nfrom analysis.commands import run as _circle  # noqa\n")
    done = lint_imports(copy)
    assert done.returncode != 0
    assert "analysis.platform is not allowed to import analysis.commands" in done.stdout
    assert "No cycles are allowed in analysis" in done.stdout
