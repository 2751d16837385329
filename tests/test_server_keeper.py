"""The report's server keeper: the study's servers from the first notebook that measures on
them to the last, only when a run has more than one such notebook. The servers themselves are
faked here (their keeping is tested on a real server in test_serving.py, and nbval runs
notebooks 08 and 10 on kept servers)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

from analysis.report.server_keeper import ServerKeeper
from analysis.serving import ServerPair, study


def _run(monkeypatch, names: list[str], launch: bool = False) -> list[str]:
    events: list[str] = []

    @contextmanager
    def fake_servers(profile: str = "cpu", pair=None):
        events.append(f"start {profile}" + (" (launched)" if pair is not None else ""))
        yield None
        events.append("stop")

    monkeypatch.setattr(study, "kept_servers", fake_servers)
    notebooks = [Path(f"notebooks/{n}-x.ipynb") for n in names]
    monkeypatch.setattr(ServerPair, "stop", lambda self: events.append("stop launched"))
    monkeypatch.setattr(
        study, "launch_servers", lambda pair, profile: events.append(f"launch {profile}")
    )
    with ServerKeeper(notebooks) as keeper:
        if launch:
            keeper.launch()
        for notebook in notebooks:
            if keeper.starting():
                events.append("(starting)")
            keeper.before(notebook)
            events.append(notebook.name[:2])
            keeper.after(notebook)
    return events


def test_servers_are_kept_from_the_first_measuring_notebook_to_the_last(monkeypatch):
    assert _run(monkeypatch, ["07", "08", "09", "10", "11", "12"]) == [
        "07", "start cpu", "08", "09", "10", "stop", "11", "12"
    ]  # fmt: skip


def test_a_run_with_one_measuring_notebook_keeps_nothing(monkeypatch):
    assert _run(monkeypatch, ["08", "09"]) == ["08", "09"]
    assert _run(monkeypatch, ["01", "10", "11"]) == ["01", "10", "11"]
    assert _run(monkeypatch, ["01", "10", "11"], launch=True) == ["01", "10", "11"]


def test_servers_launched_early_are_waited_for_at_the_first_measuring_notebook(monkeypatch):
    assert _run(monkeypatch, ["07", "08", "09", "10", "11"], launch=True) == [
        "launch cpu", "(starting)", "07", "(starting)", "start cpu (launched)", "08", "09", "10",
        "stop", "stop launched",
        "11",
    ]  # fmt: skip


def test_servers_are_stopped_when_a_notebook_fails_between(monkeypatch):
    events: list[str] = []

    @contextmanager
    def fake_servers(profile: str = "cpu", pair=None):
        events.append("start")
        try:
            yield None
        finally:
            events.append("stop")

    monkeypatch.setattr(study, "kept_servers", fake_servers)
    notebooks = [Path("08-a.ipynb"), Path("10-b.ipynb")]
    with pytest.raises(RuntimeError), ServerKeeper(notebooks) as keeper:
        keeper.before(notebooks[0])
        raise RuntimeError("notebook 08 failed")
    assert events == ["start", "stop"]
