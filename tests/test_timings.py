"""`make report`'s stage times (reports/timings.json) and the package's progress bars.

Nothing here asserts on how long anything took: only that stages are recorded, kept in
order, estimated from the previous run, and printed.
"""

from __future__ import annotations

import io
import json
import sys

import nbformat
import pytest

from analysis import cli, timings
from analysis.progress import WIDGET_WARNING, bar


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    return tmp_path


def test_stage_runs_the_command_and_records_it(root, capsys):
    assert cli.main(["stage", "ok", "--", sys.executable, "-c", "print('hi')"]) == 0
    assert cli.main(["stage", "bad", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    data = json.loads((root / "reports" / "timings.json").read_text())
    assert [(s["name"], s["ok"]) for s in data["stages"]] == [("ok", True), ("bad", False)]
    assert data["machine"]["cpu_cores"] >= 1 and data["finished"] is False
    assert cli.main(["stage", "empty"]) == 2
    assert "no command given" in capsys.readouterr().err


def test_a_new_run_estimates_from_the_previous_one(root):
    timings.start_run()
    timings.record(timings.Stage("traces", 12.0))
    timings.record(timings.Stage("01-build-traces", 30.0))
    stages = timings.finish()
    assert [s.name for s in stages] == ["traces", "01-build-traces"]
    table = timings.format_table(stages)
    assert "traces" in table and "total" in table and "42.0" in table
    previous = timings.start_run()
    assert previous == {"traces": 12.0, "01-build-traces": 30.0}
    rows = timings.estimate(["traces", "sweep-inline", "09-new"], previous)
    assert rows[0] == ("traces", 12.0, "previous run here")
    assert rows[1] == ("sweep-inline", timings.REFERENCE_SECONDS["sweep-inline"], "reference")
    assert rows[2][1] == timings.DEFAULT_NOTEBOOK_SECONDS
    assert "estimated time" in timings.format_estimate(rows)
    assert timings.load()["stages"] == []


def test_report_appends_to_a_planned_run_and_starts_one_otherwise(root):
    timings.start_run()
    timings.record(timings.Stage("traces", 1.0))
    timings.ensure_run()  # planned, not finished: keep its stages
    assert [s["name"] for s in timings.load()["stages"]] == ["traces"]
    timings.finish()
    timings.ensure_run()  # finished: a new run
    assert timings.load()["stages"] == [] and timings.load()["previous"] == {"traces": 1.0}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_show_only_on_a_terminal(monkeypatch):
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    assert list(bar(range(3), desc="quiet")) == [0, 1, 2]
    assert captured.getvalue() == ""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert list(bar(range(3), desc="shown")) == [0, 1, 2]
    assert "shown" in terminal.getvalue()
    assert list(bar(range(3), enabled=False, desc="off")) == [0, 1, 2]
    assert "off" not in terminal.getvalue()


def test_an_executed_notebook_has_no_progress_noise(tmp_path):
    """A real kernel (papermill), tqdm.auto imported as vLLM does, a package bar drawn."""
    import papermill
    from tqdm.notebook import WARN_NOIPYW

    assert WIDGET_WARNING in WARN_NOIPYW  # the filter matches tqdm's own text
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("import analysis\nfrom tqdm.auto import tqdm"),
        nbformat.v4.new_code_cell(
            "from analysis.progress import bar\nfor _ in bar(range(5), desc='points'):\n    pass\n"
            "print('done')"
        ),
    ]
    source, output = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(notebook, source)
    papermill.execute_notebook(
        str(source), str(output), kernel_name="python3", progress_bar=False, cwd=str(tmp_path)
    )
    outputs = [o for cell in nbformat.read(output, 4).cells for o in cell.get("outputs", [])]
    assert [o.get("name") for o in outputs] == ["stdout"]
    assert outputs[0]["text"] == "done\n"


def test_report_plan_prints_the_estimate_and_starts_a_run(root, capsys):
    (root / "notebooks").mkdir()
    (root / "notebooks" / "01-first.ipynb").write_text("{}")
    assert cli.main(["report", "--plan"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ") and "estimated time" in out
    for stage in (*timings.PIPELINE_STAGES, "01-first", timings.HTML_STAGE):
        assert stage in out
    assert timings.load()["finished"] is False
