"""Sweep executors: `local` (in this process, or in 2 spawned processes) and `ray` (a real
local Ray instance with 2 CPUs) give the same result tables; a killed Ray worker's point is
run again with the same result; an interrupted sweep resumes with the points it had not
finished; `--executor ray` without Ray is one line."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from analysis import sweeps
from analysis.engines import RunResult
from analysis.engines.result import REQUEST_TIME_COLUMNS
from analysis.engines.synthetic import synthetic_trace
from analysis.sweeps import executors

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    """A 4-point grid over a small synthetic trace: block sizes 16 and 32, two caches each."""
    from analysis.data.traces import write_trace

    folder = tmp_path_factory.mktemp("grid")
    trace = folder / "tiny.parquet"
    write_trace(trace, synthetic_trace(60, turns=(1, 4), user_tokens=(20, 300), seed=5))
    path = folder / "four.toml"
    path.write_text(
        f"""
[base]
mode = "closed-loop"
concurrency = 4
max_model_len = 2048

[[series]]
name = "capacity"
traces = ["{trace}"]
engines = ["replay"]
block_sizes = [16, 32]
num_blocks = [200, 2000]
"""
    )
    return path


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance with 2 CPUs for the module (executors leave it running)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def local_results(grid, tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("local")
    executors.run_points(sweeps.grid_points(grid), "local", results=results, progress=False)
    return results


def same_tables(folder_a: Path, folder_b: Path) -> None:
    """Two result folders hold the same tables (wall-clock columns and seconds aside)."""
    a, b = RunResult.read(folder_a), RunResult.read(folder_b)
    assert a.config_id == b.config_id
    pd.testing.assert_frame_equal(
        a.admissions.drop(columns="time_s"), b.admissions.drop(columns="time_s")
    )
    timing = list(REQUEST_TIME_COLUMNS)
    pd.testing.assert_frame_equal(a.requests.drop(columns=timing), b.requests.drop(columns=timing))
    assert a.block_stats == b.block_stats
    assert a.counters == b.counters
    for result in (a, b):
        result.summary["blocks"].pop("reuse_gap_seconds")
    assert a.summary == b.summary
    assert sorted(p.name for p in folder_a.iterdir()) == sorted(p.name for p in folder_b.iterdir())


def test_local_processes_give_the_same_tables_as_one_process(grid, local_results, tmp_path):
    points = sweeps.grid_points(grid)
    run = executors.run_points(points, "local", workers=2, results=tmp_path, progress=False)
    assert len(run.ran) == 4 and run.workers == 2
    for point in points:
        same_tables(
            sweeps.result_folder(point, local_results), sweeps.result_folder(point, tmp_path)
        )


def test_local_and_ray_give_identical_tables(grid, local_results, ray_instance, tmp_path):
    points = sweeps.grid_points(grid)
    assert len(points) == 4
    done = executors.run_points(points, "ray", results=tmp_path, progress=False)
    assert len(done.ran) == 4 and not done.skipped
    for point in points:
        same_tables(
            sweeps.result_folder(point, local_results), sweeps.result_folder(point, tmp_path)
        )
    # no staging folder left behind (writers' lock files may stay)
    assert not [p for p in tmp_path.glob(".*") if p.suffix != ".lock"]
    again = executors.run_points(points, "ray", results=tmp_path, progress=False)
    assert not again.ran and len(again.skipped) == 4


def _ray_workers_running(task: str) -> list[int]:
    """Workers of this test's own Ray instance (descendants of this process) running `task`."""
    import psutil

    pids = []
    for process in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(process.cmdline())
        except psutil.Error:  # ended meanwhile
            continue
        if cmdline.startswith(f"ray::{task}"):
            pids.append(process.pid)
    return pids


def test_killed_ray_worker_is_retried_with_the_same_result(
    grid, local_results, ray_instance, tmp_path
):
    point = sweeps.grid_points(grid)[0]
    outcome: dict[str, object] = {}

    def sweep_in_background() -> None:
        try:
            outcome["run"] = executors.run_points([point], "ray", results=tmp_path, progress=False)
        except BaseException as exc:  # reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=sweep_in_background)
    thread.start()
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and thread.is_alive() and time.monotonic() < deadline:
        running = _ray_workers_running("compute_point")
        if running:
            killed = running[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.01)
    thread.join(timeout=300)
    assert killed is not None, "the point finished before its worker could be killed"
    assert "error" not in outcome, outcome.get("error")
    assert [p.point_id for p in outcome["run"].ran] == [point.point_id]
    same_tables(sweeps.result_folder(point, local_results), sweeps.result_folder(point, tmp_path))


class Interrupt(KeyboardInterrupt):
    """Ctrl-C after the first finished point."""


@pytest.mark.parametrize(("executor", "workers"), [("local", 1), ("local", 2), ("ray", None)])
def test_interrupted_sweep_resumes_with_the_rest(grid, ray_instance, tmp_path, executor, workers):
    points = sweeps.grid_points(grid)

    def stop(point) -> None:
        raise Interrupt

    with pytest.raises(Interrupt):
        executors.run_points(
            points, executor, workers=workers, results=tmp_path, progress=False, on_done=stop
        )
    finished = [p for p in points if sweeps.is_done(p, sweeps.result_folder(p, tmp_path))]
    assert len(finished) == 1
    manifest = sweeps.result_folder(finished[0], tmp_path) / "manifest.json"
    written = manifest.stat().st_mtime_ns
    resumed = executors.run_points(
        points, executor, workers=workers, results=tmp_path, progress=False
    )
    assert [p.point_id for p in resumed.skipped] == [finished[0].point_id]
    assert len(resumed.ran) == 3
    assert manifest.stat().st_mtime_ns == written
    assert all(sweeps.is_done(p, sweeps.result_folder(p, tmp_path)) for p in points)


def test_several_grids_run_in_one_sweep_and_a_shared_point_runs_once(
    grid, monkeypatch, tmp_path, capsys
):
    """`make report` runs its notebooks' grids in one sweep (one pool of workers): every
    point of both grids is written, a point in both once; --list takes one grid."""
    from analysis.cli import main

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    other = tmp_path / "other.toml"  # one point of `grid` (16 x 200) and one of its own
    other.write_text(
        grid.read_text().replace("[16, 32]", "[16]").replace("[200, 2000]", "[200, 900]")
    )
    assert main(["sweep", "--grid", str(grid), str(other)]) == 0
    out = capsys.readouterr().out
    assert "5 point(s) run, 0 already complete, of 5 distinct in grid" in out
    assert str(grid) in out and str(other) in out
    points = sweeps.grid_points(grid) + sweeps.grid_points(other)
    assert all(sweeps.is_done(p) for p in points)
    assert main(["sweep", "--grid", str(grid), str(other), "--list"]) == 2
    assert capsys.readouterr().err.strip() == "--list and --point take one grid, got 2"


def test_ray_executor_without_ray_is_one_line(grid, monkeypatch, capsys):
    from analysis.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert main(["sweep", "--grid", str(grid), "--executor", "ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "needs Ray" in err and "pip install '.[ray]'" in err and "EXTRAS=ray" in err


def test_local_workers_take_real_engine_points_first_and_a_gpus_run_here(
    grid, monkeypatch, tmp_path
):
    """With workers, every point goes to them, the real engine's (the longest) first; a GPU
    engine's points run in this process, one at a time."""
    import analysis.runs

    mixed = tmp_path / "mixed.toml"
    mixed.write_text(
        grid.read_text().replace('engines = ["replay"]', 'engines = ["replay", "vllm"]')
    )
    here, elsewhere = [], []
    monkeypatch.setattr(
        analysis.runs, "run_and_write", lambda config, *a, **k: here.append(config.engine)
    )
    monkeypatch.setattr(
        executors,
        "_run_in_processes",
        lambda todo, *a: elsewhere.extend(p.config.engine for p in todo),
    )
    points = sweeps.grid_points(mixed)
    executors.run_points(points, "local", workers=2, results=tmp_path, progress=False)
    assert (here, elsewhere) == ([], ["vllm"] * 4 + ["replay"] * 4)

    elsewhere.clear()
    on_gpu = [replace(p, config=p.config.with_(device="cuda")) for p in points]
    executors.run_points(on_gpu, "local", workers=2, results=tmp_path, progress=False)
    assert (here, elsewhere) == (["vllm"] * 4 + ["replay"] * 4, [])


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def test_each_worker_gets_its_share_of_the_cores_for_torch() -> None:
    """Two real CPU engines side by side, each with every core's threads, ran 5x slower each."""
    from analysis.platform.hardware import usable_cores

    with executors.worker_pool(2) as pool:
        threads = pool.submit(_torch_threads).result(timeout=120)
    assert threads == max(1, usable_cores() // 2)


# --- one point, every way it can run: inline, through notebook 03 (`make sweep`), on Ray -------


@pytest.fixture(scope="module")
def every_field_grid(tmp_path_factory) -> Path:
    """A fleet point (2 replicas, the affinity router) and a replay point on a clock (Poisson
    arrivals, a think time): fields beyond the ones every point has."""
    from analysis.data.traces import write_trace

    folder = tmp_path_factory.mktemp("every-field")
    trace = folder / "tiny.parquet"
    write_trace(trace, synthetic_trace(40, turns=(1, 4), user_tokens=(20, 300), seed=7))
    profile = folder / "profile.json"
    coefficients = {"fixed": 0.004, "token": 2e-5, "new_request": 1e-3, "decode_context": 5e-4}
    profile.write_text(json.dumps({"coefficients": coefficients, "admit_s": 2e-4, "loop_s": 1e-4}))
    path = folder / "every-field.toml"
    path.write_text(
        f"""
[base]
max_model_len = 2048
max_num_seqs = 6

[[series]]
name = "fleet"
traces = ["{trace}"]
engines = ["fleet"]
block_sizes = [16]
num_blocks = [300]
replicas = 2
router = "affinity"
concurrency = 8

[[series]]
name = "timed"
traces = ["{trace}"]
engines = ["replay"]
block_sizes = [16]
num_blocks = [400]
mode = "poisson"
arrival_rate = 4.0
think_time_s = 0.5
clock = "{profile}"
"""
    )
    return path


@pytest.fixture(scope="module")
def every_field_inline(every_field_grid, tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("every-field-inline")
    points = sweeps.grid_points(every_field_grid)
    executors.run_points(points, "local", results=results, progress=False)
    return results


@pytest.mark.parametrize("way", ["notebook 03", "ray"])
def test_a_point_gives_the_same_result_inline_through_notebook_03_and_on_ray(
    every_field_grid, every_field_inline, monkeypatch, request, tmp_path, way
):
    """Row 14.9: `make sweep` runs each point through notebook 03, which rebuilt the config
    from some fields only: a fleet point ran one replica, round-robin, and was taken as done.
    Every field now reaches the engine whichever way the point runs."""
    from analysis.report.notebooks import run_point_notebook

    points = sweeps.grid_points(every_field_grid)
    assert "-x2-affinity-" in sweeps.result_folder(points[0]).name
    if way == "ray":
        pytest.importorskip("ray", reason="the ray extra is not installed (make setup EXTRAS=ray)")
        request.getfixturevalue("ray_instance")
        executors.run_points(points, "ray", results=tmp_path / "data" / "results", progress=False)
    else:
        monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))  # reports/, data/results/
        monkeypatch.setattr(
            "analysis.report.notebooks.notebooks_dir",
            lambda: Path(__file__).resolve().parents[1] / "notebooks",
        )
        for point in points:
            run_point_notebook(point, every_field_grid)
    for point in points:
        same_tables(
            sweeps.result_folder(point, every_field_inline),
            sweeps.result_folder(point, tmp_path / "data" / "results"),
        )


def test_a_sweep_worker_leaves_ctrl_c_to_the_sweep():
    """A worker interrupted inside the pool's queue handling could die holding the queue's lock
    and hang the sweep at exit (probe 5.7): workers ignore SIGINT, the sweep ends them."""
    with executors.worker_pool(1) as pool:
        assert pool.submit(signal.getsignal, signal.SIGINT).result(timeout=300) == signal.SIG_IGN


def test_ctrl_c_to_a_sweeps_process_group_ends_the_sweep_and_its_workers(grid, tmp_path):
    """Probe 5.7's recipe: Ctrl-C reaches the whole process group of `sweep --workers 2` while
    its workers start or compute; the sweep ends (rc 130) and leaves no process behind."""
    import subprocess

    import psutil

    from analysis.platform.processes import group_members

    env = os.environ | {"PREFIX_CACHE_LAB_ROOT": str(tmp_path)}
    command = [sys.executable, "-m", "analysis", "sweep", "--grid", str(grid), "--workers", "2"]
    sweep = subprocess.Popen(
        command,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and sweep.poll() is None:
        children = psutil.Process(sweep.pid).children()
        if sum("spawn_main" in " ".join(c.cmdline()) for c in children) == 2:
            break
        time.sleep(0.2)
    os.killpg(sweep.pid, signal.SIGINT)
    assert sweep.wait(timeout=120) == 130, sweep.stderr.read()
    time.sleep(1)
    assert group_members(sweep.pid) == []
