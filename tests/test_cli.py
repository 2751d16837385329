"""The command line: one entry point, user errors as one line, no traceback."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import cli
from analysis.experiments import prefix_hit_tokens, repeated_prompt_trace


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


def test_prefix_hit_tokens_is_whole_blocks_before_the_last_token():
    assert prefix_hit_tokens(42, 16) == 32
    assert prefix_hit_tokens(33, 16) == 32
    assert prefix_hit_tokens(32, 16) == 16
    assert list(prefix_hit_tokens(np.array([1, 17, 18]), 16)) == [0, 16, 16]


def test_repeated_prompt_trace_has_the_trace_schema():
    frame = repeated_prompt_trace(np.arange(5), 3, reply_tokens=2)
    assert list(frame["conversation_id"]) == ["repeat000", "repeat001", "repeat002"]
    assert (frame["prompt_tokens"] == 5).all() and (frame["response_tokens"] == 2).all()
