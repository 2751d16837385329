"""The command line: one entry point, user errors as one line, no traceback."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

import analysis
from analysis import cli
from analysis.data.experiments import prefix_hit_tokens, repeated_prompt_trace
from analysis.platform import errors


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert name in out


def test_unknown_grid_is_a_one_line_error(capsys):
    assert cli.main(["sweep", "--grid", "no-such-grid", "--list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no grid 'no-such-grid'") and "\n" not in err


def test_too_few_blocks_names_the_minimum(capsys, tmp_path):
    code = cli.main(["run", "--trace", str(tmp_path / "t.parquet"), "--num-blocks", "10"])
    assert code == 2
    assert ">= 513" in capsys.readouterr().err


def test_only_the_entry_point_and_the_commands_import_the_cli():
    package = Path(analysis.__file__).parent
    importers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if "analysis.cli" in names:
                importers.add(path.relative_to(package).as_posix())
    assert importers, "the scan found no importer at all: it is not looking at the package"
    assert {p for p in importers if not p.startswith("commands/")} == {"__main__.py"}


def test_core_errors_are_analysis_errors_and_keep_their_old_names():
    from analysis import serving
    from analysis.data import blockhash, sharegpt, tokenizer, traces
    from analysis.engines import config
    from analysis.metrics import bounds
    from analysis.serving import loadgen
    from analysis.sweeps import grid as sweep

    old_homes = {
        "ShareGPTSourceError": sharegpt,
        "TokenizerUnavailable": tokenizer,
        "TraceError": traces,
        "ConfigError": config,
        "GridError": sweep,
        "BlockHashError": blockhash,
        "BoundsError": bounds,
        "WorkloadError": loadgen,
        "ServerStartError": serving,
    }
    for name, module in old_homes.items():
        assert getattr(module, name) is getattr(errors, name), name
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)]
    assert all(issubclass(c, errors.AnalysisError) for c in classes)


def test_a_core_error_is_printed_as_one_line(capsys, tmp_path):
    trace = tmp_path / "empty.parquet"
    trace.write_bytes(b"")
    code = cli.main(["bounds", "--trace", str(trace), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"error: {trace}") and err.count("\n") == 1


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_a_reader_that_goes_away_ends_a_listing_quietly(unbuffered):
    import os
    import subprocess
    import sys

    # the reader is gone before the listing writes its first id (as `| head` is after a line):
    # written line by line or at the end, the write fails; no traceback, SIGPIPE's status
    listing = subprocess.Popen(
        [sys.executable, "-m", "analysis", "sweep", "--list", "--grid", "fleet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": unbuffered},
    )
    listing.stdout.close()
    _, err = listing.communicate(timeout=120)
    assert err == b"" and listing.returncode == 141


def test_prefix_hit_tokens_is_whole_blocks_before_the_last_token():
    assert prefix_hit_tokens(42, 16) == 32
    assert prefix_hit_tokens(33, 16) == 32
    assert prefix_hit_tokens(32, 16) == 16
    assert list(prefix_hit_tokens(np.array([1, 17, 18]), 16)) == [0, 16, 16]


def test_repeated_prompt_trace_has_the_trace_schema():
    frame = repeated_prompt_trace(np.arange(5), 3, reply_tokens=2)
    assert list(frame["conversation_id"]) == ["repeat000", "repeat001", "repeat002"]
    assert (frame["prompt_tokens"] == 5).all() and (frame["response_tokens"] == 2).all()


def test_every_make_target_the_docs_name_exists():
    import re

    root = Path(__file__).resolve().parents[1]
    makefile = (root / "Makefile").read_text()
    targets = set(re.findall(r"^([a-zA-Z][\w-]*):", makefile, re.MULTILINE))
    assert {"setup", "test", "report"} <= targets
    docs = [root / "README.md", root / "environment.yml", *root.glob("requirements/*.txt")]
    docs += [*root.glob("configs/*.toml"), *root.glob("notebooks/*.ipynb")]
    named = {}
    for path in docs:
        text = path.read_text()
        for match in re.finditer(r"`make ([\w-]+)|^#\s+make ([\w-]+)", text, re.MULTILINE):
            named.setdefault(match[1] or match[2], path.name)
    assert "setup" in named
    missing = {target: where for target, where in named.items() if target not in targets}
    assert not missing, f"named in the docs but not in the Makefile: {missing}"
