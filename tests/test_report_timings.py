"""`make report`'s stage timings: recorded as stages finish, tabled at the end, and the last
finished run kept for the next estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.report import timings
from analysis.report.notebooks import report_notebooks

REPO_NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.fixture(autouse=True)
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    return tmp_path


def test_stages_are_recorded_tabled_and_kept_for_the_next_estimate(tmp_root: Path) -> None:
    timings.begin()
    assert timings.run_stage("ok stage", "true") == 0
    assert timings.run_stage("failing stage", "exit 3") == 3
    timings.record("notebook 01-x", 75.0)
    done = timings.finish()
    assert [s["stage"] for s in done["stages"]] == ["ok stage", "failing stage", "notebook 01-x"]
    assert [s["ok"] for s in done["stages"]] == [True, False, True]
    text = timings.table(done)
    assert "notebook 01-x" in text and "1m15s" in text and "(failed)" in text
    saved = json.loads((tmp_root / "reports" / "timings.json").read_text())
    assert saved["finished"] and saved["total_s"] == done["total_s"]
    timings.begin()  # the next run: the finished one becomes "previous"
    again = timings.load()
    assert again["stages"] == [] and again["previous"]["stages"] == done["stages"]
    estimate = timings.estimate([], {"replay": 3})
    assert "last finished run here took" in estimate and "3 replay" in estimate


def test_a_standalone_command_after_a_finished_run_starts_a_new_record() -> None:
    timings.record("first", 1.0)
    timings.finish()
    timings.record("second", 2.0)
    assert [s["stage"] for s in timings.load()["stages"]] == ["second"]


def test_stated_run_times_are_read_from_the_first_cell(tmp_root: Path) -> None:
    cell = {
        "cell_type": "markdown",
        "source": ["# Q\n", "**Run time on a 2-core CPU.** About 20-40 s.\n"],
    }
    path = tmp_root / "x.ipynb"
    path.write_text(json.dumps({"cells": [cell]}))
    assert timings.stated_seconds(path) == 40.0
    cell["source"][1] = "**Run time on a 2-core CPU.** About 5 minutes the first time.\n"
    path.write_text(json.dumps({"cells": [cell]}))
    assert timings.stated_seconds(path) == 300.0
    cell["source"][1] = "**Run time.** About 2.5 minutes on a quiet 2-core CPU.\n"
    path.write_text(json.dumps({"cells": [cell]}))
    assert timings.stated_seconds(path) == 150.0


def test_a_notebook_clearly_slower_than_stated_is_named() -> None:
    assert timings.overrun(334.5, 120.0) == "longer than the 2m00s its first cell states"
    assert timings.overrun(150.0, 120.0) is None  # within half again and 10 s
    assert timings.overrun(334.5, None) is None


def test_every_committed_notebook_states_a_run_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(REPO_NOTEBOOKS.parent))
    stated = {p.name: timings.stated_seconds(p) for p in report_notebooks()}
    assert all(v is not None for v in stated.values()), stated


def test_format_seconds_carries_rounded_minutes():
    from analysis.report.timings import format_seconds

    assert format_seconds(659.7) == "11m00s"
    assert format_seconds(125) == "2m05s"
    assert format_seconds(42.3) == "42 s"


def write_grid(path: Path, trace: str, *, broken: bool = False) -> Path:
    series = f'[[series]]\nname = "s"\ntraces = ["{trace}"]\nengines = ["replay"]\n'
    path.write_text(series + ("" if broken else 'block_sizes = [16]\nnum_blocks = "max"\n'))
    return path


def test_an_estimate_refuses_an_unknown_or_broken_grid(tmp_root: Path, capsys) -> None:
    """Probe 9.9 (2026-11-26): `report --estimate --grid nosuch` printed an estimate, rc 0
    (every error of the grid was swallowed). Only traces not built yet leave the count open."""
    from analysis import cli
    from analysis.platform.errors import GridError

    assert cli.main(["report", "--estimate", "--grid", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no grid 'nosuch'") and err.count("\n") == 1
    assert timings.pending_points(str(write_grid(tmp_root / "g.toml", "unbuilt"))) is None
    trace = tmp_root / "t.parquet"
    trace.write_bytes(b"")
    with pytest.raises(GridError, match="lacks block_sizes, num_blocks"):
        timings.pending_points(str(write_grid(tmp_root / "b.toml", str(trace), broken=True)))
    # a series without traces, or with a number for them, was a TypeError traceback
    (tmp_root / "none.toml").write_text('[[series]]\nname = "s"\nengines = ["replay"]\n')
    with pytest.raises(GridError, match="lacks block_sizes, num_blocks, traces"):
        timings.pending_points(str(tmp_root / "none.toml"))
    (tmp_root / "int.toml").write_text(
        '[[series]]\nname = "s"\ntraces = 5\nengines = ["replay"]\nblock_sizes = [16]\n'
        "num_blocks = [600]\n"
    )
    with pytest.raises(GridError, match="traces must be trace names or paths"):
        timings.pending_points(str(tmp_root / "int.toml"))


def test_an_estimate_counts_a_point_of_two_grids_once(tmp_root: Path) -> None:
    from analysis.data.traces import write_trace
    from analysis.engines.synthetic import synthetic_trace

    trace = tmp_root / "t.parquet"
    write_trace(trace, synthetic_trace(4, seed=1))
    series = f'[[series]]\nname = "s"\ntraces = ["{trace}"]\nengines = ["replay"]\n'
    (tmp_root / "a.toml").write_text(series + "block_sizes = [16]\nnum_blocks = [600, 700]\n")
    (tmp_root / "b.toml").write_text(series + "block_sizes = [16]\nnum_blocks = [700, 800]\n")
    grids = str(tmp_root / "a.toml"), str(tmp_root / "b.toml")
    assert timings.pending_points(grids[0]) == {"replay": 2}
    assert timings.pending_points(*grids) == {"replay": 3}


def test_the_total_is_the_wall_time_with_what_no_stage_timed_shown(monkeypatch) -> None:
    """A server start waited for between notebooks, or a process starting between stages, is
    in no stage: it is a row of its own, so that the total is the run's wall time."""
    clock = {"now": 1000.0}
    monkeypatch.setattr(timings.time, "time", lambda: clock["now"])
    timings.begin(setup_s=10.0)  # the set-up ran for 10 s before this call
    timings.record("environment set-up", 10.0)
    timings.record("traces", 20.0)
    clock["now"] = 1050.0
    done = timings.finish()
    assert done["stages"][-1] == {"stage": timings.OUTSIDE, "seconds": 30.0, "ok": True}
    assert done["total_s"] == 60.0  # 10 s of set-up and 50 s since
    assert timings.table(done).splitlines()[-1].split() == ["total", "1m00s"]


def test_an_overrun_beside_the_starting_servers_says_why(tmp_root: Path, capsys) -> None:
    from analysis.commands.report import say_done

    cell = {"cell_type": "markdown", "source": ["**Run time on a 2-core CPU.** About 20 s.\n"]}
    path = tmp_root / "02-x.ipynb"
    path.write_text(json.dumps({"cells": [cell]}))
    say_done(path, 41.0)
    say_done(path, 41.0, servers_starting=True)
    say_done(path, 25.0, servers_starting=True)  # within what it states: nothing to explain
    alone, beside, within = capsys.readouterr().out.splitlines()
    assert alone == "  02-x.ipynb: 41 s (longer than the 20 s its first cell states)"
    assert beside.endswith("states, the serving study's servers starting beside it)")
    assert within == "  02-x.ipynb: 25 s"
