"""Serving cells: a cell whose requests failed is kept with its counts but run again, the
request timeout is part of a cell's key (older cells stay found), a bad timeout is refused in
one line, a failed `--force` rewrite leaves the old cell whole, and one killed mid-swap leaves
it to be reused. No vLLM server is started: the server and the HTTP client are stand-ins."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis import cli, serving
from analysis.serving import benchmark, loadgen, storage
from analysis.serving.bench_config import RunKey, legacy_run_id, run_id
from analysis.serving.loadgen.client import PhaseTiming


class StandInServer:
    """What the benchmark asks of a server, answering at once."""

    def __init__(self, config, log_path) -> None:
        self.config = config
        self.startup_s = 0.0
        self.command = ["stand-in"]
        self.base_url = "http://127.0.0.1:9"
        self.model_name = "stand-in"

    def launch(self) -> StandInServer:
        return self

    def stop(self) -> None:
        pass

    def reset_prefix_cache(self) -> bool:
        return True

    def counters(self) -> dict[str, float]:
        return {}

    def counters_after(self, before, finished) -> dict[str, float]:
        return {}

    def model_cores(self) -> list[int] | None:
        return None


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """`run_serving_bench` on stand-ins; `state.status` is what every request ends with,
    `state.sent` counts the requests sent, `state.ttft_s` is their TTFT."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    state = SimpleNamespace(status="ok", sent=0, ttft_s=0.01, root=tmp_path / "serving")

    async def run_burst(base_url, model_name, specs, concurrency, *, timeout_s, **_):
        state.sent += len(specs)
        ok = state.status == "ok"
        results = [
            loadgen.RequestResult(
                request_id=s.request_id,
                group=s.group,
                turn_index=s.turn_index,
                warmup=s.warmup,
                status=state.status,
                sent_prompt_tokens=len(s.prompt_ids),
                output_tokens=s.max_tokens if ok else 0,
                start_s=0.0,
                ttft_s=state.ttft_s if ok else math.nan,
                e2e_s=2 * state.ttft_s if ok else math.nan,
            )
            for s in specs
        ]
        return results, PhaseTiming(start_s=0.0, end_s=1.0)

    monkeypatch.setattr(benchmark, "VllmServer", StandInServer)
    monkeypatch.setattr(benchmark, "resolve_model", lambda name: name)
    monkeypatch.setattr(benchmark, "warm_server", lambda server, config: None)
    monkeypatch.setattr(benchmark, "prefill_speed", lambda server: math.nan)
    monkeypatch.setattr(benchmark, "_latest_probes", {})  # no probe from another test
    monkeypatch.setattr(loadgen, "run_burst", run_burst)
    state.config = serving.ServingBenchConfig(
        model=str(model),
        prefixes=(0,),
        concurrency=(1,),
        requests=2,
        modes=("cache",),
        suffix_tokens=8,
        output_tokens=4,
        max_model_len=512,
        gauge_interval_s=0.0,
    )
    state.run = lambda config=None, **kw: serving.run_serving_bench(
        config or state.config, root=state.root, progress=False, log=lambda m: None, **kw
    )
    state.key = RunKey("cache", "0", 1)
    return state


def cell_files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())}


def test_a_cell_with_timed_out_requests_is_written_but_run_again(bench):
    bench.status = "timeout"
    table = bench.run()
    assert table.loc[0, "n_timeout"] == 2 and table.loc[0, "n_ok"] == 0  # kept, with counts
    assert "incomplete: 0 of 3 requests succeeded" in table.loc[0, "notes"]
    (cell,) = bench.root.glob("synthetic-*")
    assert json.loads((cell / "manifest.json").read_text())["complete"] is False
    assert serving.is_finished(cell) and not storage.is_reusable(cell)

    bench.status, bench.sent = "ok", 0
    table = bench.run()  # no --force: the failed cell is measured again
    assert bench.sent == 3 and table.loc[0, "n_ok"] == 2
    assert "incomplete" not in table.loc[0, "notes"]
    assert storage.is_reusable(cell)
    bench.sent = 0
    bench.run()
    assert bench.sent == 0  # now it is reused


def test_a_cell_written_before_the_manifest_said_complete_is_judged_by_its_counts(tmp_path):
    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / "manifest.json").write_text("{}")
    (cell / "summary.json").write_text(json.dumps({"n_ok": 0, "n_timeout": 2}))
    assert serving.is_finished(cell) and not storage.is_reusable(cell)
    (cell / "summary.json").write_text(json.dumps({"n_ok": 2, "n_timeout": 0}))
    assert storage.is_reusable(cell)


def test_the_request_timeout_is_part_of_a_cells_key(bench):
    config, model = bench.config, bench.config.model
    shorter = dataclasses.replace(config, request_timeout_s=30.0)
    assert run_id(shorter, model, bench.key) != run_id(config, model, bench.key)
    assert legacy_run_id(shorter, model, bench.key) == legacy_run_id(config, model, bench.key)

    bench.run()
    bench.sent = 0
    bench.run(shorter)  # another timeout: another cell
    assert bench.sent == 3
    assert len(list(bench.root.glob("synthetic-*"))) == 2


def test_a_cell_cached_under_its_older_id_is_found_with_the_same_timeout(bench):
    bench.run()
    (cell,) = bench.root.glob("synthetic-*")
    legacy = bench.root / legacy_run_id(bench.config, bench.config.model, bench.key)
    cell.rename(legacy)  # as cells cached before the timeout was in the id
    bench.sent = 0
    table = bench.run()
    assert bench.sent == 0 and table.loc[0, "run_id"] == legacy.name
    bench.run(dataclasses.replace(bench.config, request_timeout_s=30.0))
    assert bench.sent == 3  # its manifest records another timeout: not that cell


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan])
def test_a_request_timeout_that_is_not_positive_is_refused(value):
    with pytest.raises(ValueError, match="request_timeout_s must be a positive number"):
        serving.ServingBenchConfig(request_timeout_s=value)


def test_the_command_refuses_a_negative_timeout_in_one_line(monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("a benchmark started with a negative timeout")

    monkeypatch.setattr(serving, "run_serving_bench", refuse)
    argv = ["serve-bench", "--request-timeout", "-1", "--prefixes", "0", "--no-progress"]
    assert cli.main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "request_timeout_s" in error and "-1" in error


@pytest.mark.parametrize("fails_at", ["summary.json", "swap"])
def test_a_failed_force_rewrite_leaves_the_old_cell_whole(bench, monkeypatch, fails_at):
    bench.run()
    (cell,) = bench.root.glob("synthetic-*")
    before = cell_files(cell)
    real_write_json, real_rename = storage.write_json, Path.rename

    def write_json(path, obj):
        if path.name == fails_at:
            raise OSError(5, "Input/output error")
        real_write_json(path, obj)

    def rename(self, target):
        if fails_at == "swap" and ".partial-" in self.name:
            raise OSError(5, "Input/output error")
        return real_rename(self, target)

    monkeypatch.setattr(storage, "write_json", write_json)
    monkeypatch.setattr(Path, "rename", rename)
    bench.ttft_s = 0.5  # the new measurement differs
    with pytest.raises(OSError):
        bench.run(force=True)
    monkeypatch.undo()
    assert cell_files(cell) == before
    assert [p.name for p in bench.root.iterdir() if p.name.startswith(".synthetic")] == [
        f".{cell.name}.lock"
    ]


# In the child: the cell rewritten with other numbers, SIGKILLed as its staging folder is
# renamed into the cell's place (the old cell already set aside).
KILLED_REWRITE = """
import os, pathlib, signal, sys
import pandas as pd
from analysis.platform.manifest import read_json
from analysis.serving import storage
cell = pathlib.Path(sys.argv[1])
real_rename = pathlib.Path.rename
def rename(self, target):
    if ".partial-" in self.name:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_rename(self, target)
pathlib.Path.rename = rename
frame = pd.read_parquet(cell / "requests.parquet").assign(ttft_s=0.5)
storage._write_run(cell, frame, read_json(cell / "summary.json"), read_json(cell / "manifest.json"))
"""


def test_a_force_rewrite_killed_at_the_swap_leaves_the_old_cell_reused(bench):
    """Probe 10.7: `serve-bench --force` killed at the staging-to-final rename used to leave
    both cells set aside, and the next run discarded both and measured the cell again."""
    bench.run()
    (cell,) = bench.root.glob("synthetic-*")
    before = cell_files(cell)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_REWRITE, str(cell)],
        env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not cell.exists()
    bench.sent = 0
    bench.run()  # no --force
    assert bench.sent == 0  # the old cell was put back and reused, not measured again
    assert cell_files(cell) == before


def test_one_cells_speed_probe_after_is_the_next_cells_before(bench, monkeypatch):
    probes: list[float] = []

    def probe(server) -> float:  # each probe answers a new speed
        probes.append(1000.0 + len(probes))
        return probes[-1]

    monkeypatch.setattr(benchmark, "prefill_speed", probe)
    table = bench.run(dataclasses.replace(bench.config, prefixes=(0, 64, 128)))
    assert probes == [1000.0, 1001.0, 1002.0, 1003.0]  # three cells, four probes, not six
    speeds = table.sort_values("prefix_regime", key=lambda s: s.astype(int))[
        ["prefill_tok_s_before", "prefill_tok_s_after"]
    ]
    assert speeds.values.tolist() == [[1000.0, 1001.0], [1001.0, 1002.0], [1002.0, 1003.0]]


def test_a_fresh_probe_on_an_idle_server_opens_the_next_benchmark(bench, monkeypatch):
    probes: list[float] = []
    finished = {"vllm:request_success": 0.0}

    def probe(server) -> float:
        probes.append(1000.0 + len(probes))
        return probes[-1]

    monkeypatch.setattr(benchmark, "prefill_speed", probe)
    monkeypatch.setattr(StandInServer, "counters", lambda self: dict(finished))
    first = bench.run()
    second = bench.run(force=True)  # straight after: the first's probe after is its before
    assert probes == [1000.0, 1001.0, 1002.0]
    assert second.loc[0, "prefill_tok_s_before"] == first.loc[0, "prefill_tok_s_after"]

    finished["vllm:request_success"] += 1  # a request ran on the server since: probed again
    bench.run(force=True)
    assert probes == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0]

    monkeypatch.setattr(benchmark, "PROBE_FRESH_S", -1.0)  # too old: probed again
    bench.run(force=True)
    assert len(probes) == 7
