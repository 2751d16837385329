"""Interruptions and races with real processes: a sweep killed with SIGKILL resumes where it
stopped, two writers of one result folder (or one figure folder) leave one whole result, and a
damaged result table is a one-line error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis.data.traces import write_trace
from analysis.engines.synthetic import synthetic_trace
from analysis.platform import paths

SRC = Path(__file__).resolve().parents[1] / "src"
BLOCKS = (200, 300, 400)

# In the child: SIGKILL itself after the second point's second table is written (the worst
# moment: a result folder half built). Only the moment is arranged; the kill is real.
KILL_MID_WRITE = """
import os, signal, sys
import analysis.engines.result as result
original, seen = result.write_parquet, []
def write_then_die(path, frame):
    original(path, frame)
    seen.append(path.name)
    if seen.count("requests.parquet") == 2:
        os.kill(os.getpid(), signal.SIGKILL)
result.write_parquet = write_then_die
from analysis.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def lab(tmp_path) -> dict:
    """A project root of its own (data/ under tmp_path; the model cache shared), a trace and a
    grid of three replay points."""
    cache = paths.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cache").symlink_to(cache)
    trace = tmp_path / "data" / "traces" / "kill.parquet"
    trace.parent.mkdir()
    write_trace(trace, synthetic_trace(30, turns=(1, 3), seed=21))
    grid = tmp_path / "grid.toml"
    grid.write_text(
        f"""
[base]
mode = "batch"
max_model_len = 2048
[[series]]
name = "kill"
traces = ["{trace}"]
engines = ["replay"]
block_sizes = [16]
num_blocks = {list(BLOCKS)}
"""
    )
    env = os.environ | {
        "PYTHONPATH": str(SRC),
        "PREFIX_CACHE_LAB_ROOT": str(tmp_path),
        "PYTHONHASHSEED": "0",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
    }
    return {"root": tmp_path, "grid": grid, "env": env, "results": tmp_path / "data" / "results"}


def sweep_argv(lab: dict) -> list[str]:
    return ["sweep", "--grid", str(lab["grid"])]


def point_folders(lab: dict) -> dict[int, Path]:
    """The result folder of each number of blocks (the folder name carries n<blocks>)."""
    found = {}
    for folder in lab["results"].iterdir():
        for blocks in BLOCKS:
            if f"-n{blocks}-" in folder.name and not folder.name.startswith("."):
                found[blocks] = folder
    return found


def complete(folder: Path) -> bool:
    return (folder / "manifest.json").is_file()


def resume_and_check(lab: dict, finished_before: dict[int, Path]) -> None:
    stamps = {b: (f / "manifest.json").stat().st_mtime_ns for b, f in finished_before.items()}
    again = subprocess.run(
        [sys.executable, "-m", "analysis", *sweep_argv(lab)],
        env=lab["env"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    folders = point_folders(lab)
    assert set(folders) == set(BLOCKS) and all(complete(f) for f in folders.values())
    for blocks, stamp in stamps.items():  # finished points were not run again
        assert (folders[blocks] / "manifest.json").stat().st_mtime_ns == stamp
        assert f"-n{blocks}-" not in again.stdout
    assert again.stdout.count("] kill-") == len(BLOCKS) - len(stamps)
    leftovers = [p.name for p in lab["results"].iterdir() if p.name.startswith(".")]
    assert all(name.endswith(".lock") for name in leftovers), leftovers
    for folder in folders.values():  # every table of every point reads back whole
        summary = json.loads((folder / "summary.json").read_text())
        requests = pd.read_parquet(folder / "requests.parquet")
        assert summary["requests_finished"] == (requests["status"] == "finished").sum() > 0


@pytest.mark.engine
def test_sweep_killed_mid_write_redoes_the_half_written_point_only(lab):
    killed = subprocess.run(
        [sys.executable, "-c", KILL_MID_WRITE, *sweep_argv(lab)],
        env=lab["env"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    finished = {b: f for b, f in point_folders(lab).items() if complete(f)}
    assert list(finished) == [BLOCKS[0]]
    half = [p for p in lab["results"].iterdir() if ".partial-" in p.name]
    assert len(half) == 1 and (half[0] / "requests.parquet").is_file()
    assert not (half[0] / "manifest.json").exists()
    resume_and_check(lab, finished)


@pytest.mark.engine
def test_sweep_killed_from_outside_between_points_resumes(lab):
    process = subprocess.Popen(
        [sys.executable, "-m", "analysis", *sweep_argv(lab)],
        env=lab["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        first_line = process.stdout.readline()  # "[1/3] kill-...": point 1 is written
        assert first_line.startswith("[1/3] kill-"), first_line
        process.send_signal(signal.SIGKILL)  # point 2 is being computed or written
        assert process.wait(timeout=60) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    finished = {b: f for b, f in point_folders(lab).items() if complete(f)}
    assert BLOCKS[0] in finished and len(finished) < len(BLOCKS)
    resume_and_check(lab, finished)


# ----------------------------------------------------------------------------- two writers

WRITER = """
import sys, time
from pathlib import Path
from analysis.engines import RunResult
source, target, tag, start = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], float(sys.argv[4])
result = RunResult.read(source)
result.manifest["writer"] = result.summary["writer"] = result.counters["writer"] = tag
result.requests["writer"] = tag
while time.time() < start:
    pass
for _ in range(40):
    result.write(target)
"""


@pytest.mark.engine
def test_two_processes_writing_one_result_folder_leave_one_whole_result(tmp_path):
    from analysis.engines import RunConfig, RunResult
    from analysis.runs import run

    config = RunConfig(
        trace="synthetic", engine="replay", block_size=16, num_blocks=300, max_model_len=2048
    )
    source = run(synthetic_trace(6, seed=22), config, progress=False).write(tmp_path / "source")
    target = tmp_path / "results" / "one-point"
    start = time.time() + 3  # both processes past their imports, then write at once
    env = os.environ | {"PYTHONPATH": str(SRC)}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(source), str(target), tag, str(start)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("A", "B")
    ]
    for writer in writers:
        _, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err[-2000:]  # neither writer fails
    result = RunResult.read(target)
    tags = {
        result.manifest["writer"],
        result.summary["writer"],
        result.counters["writer"],
        *result.requests["writer"],
    }
    assert tags in ({"A"}, {"B"})  # one writer's result, whole
    leftovers = {p.name for p in target.parent.iterdir()} - {"one-point", ".one-point.lock"}
    assert not leftovers  # no staging or set-aside folder left behind


# Writer A pauses inside its swap (old folder moved aside, its own not yet in place) while
# writer B writes: without turns, B puts its folder in the gap and A's rename then fails.
PAUSED_WRITER = """
import pathlib, sys, time
from analysis.engines import RunResult
source, target, tag, pause = sys.argv[1:5]
original = pathlib.Path.rename
def slow_rename(self, other):
    if ".partial-" in self.name:
        time.sleep(float(pause))
    return original(self, other)
pathlib.Path.rename = slow_rename
result = RunResult.read(pathlib.Path(source))
result.manifest["writer"] = tag
result.write(pathlib.Path(target))
"""


@pytest.mark.engine
def test_a_writer_paused_mid_swap_does_not_break_another(tmp_path):
    from analysis.engines import RunConfig, RunResult
    from analysis.runs import run

    config = RunConfig(
        trace="synthetic", engine="replay", block_size=16, num_blocks=300, max_model_len=2048
    )
    source = run(synthetic_trace(6, seed=24), config, progress=False).write(tmp_path / "source")
    target = tmp_path / "results" / "one-point"
    RunResult.read(source).write(target)  # an earlier result: both writers replace it
    env = os.environ | {"PYTHONPATH": str(SRC)}
    slow = subprocess.Popen(
        [sys.executable, "-c", PAUSED_WRITER, str(source), str(target), "A", "8"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while target.exists() and time.time() < deadline:  # A has moved the old folder aside
        time.sleep(0.05)
    assert not target.exists()
    fast = subprocess.run(
        [sys.executable, "-c", PAUSED_WRITER, str(source), str(target), "B", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    _, slow_err = slow.communicate(timeout=300)
    assert slow.returncode == 0, slow_err[-2000:]
    assert fast.returncode == 0, fast.stderr[-2000:]
    assert RunResult.read(target).manifest["writer"] == "B"  # B waited its turn, then won


FIGURES = """
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from analysis import plots
folder, tag = sys.argv[1], sys.argv[2]
for number in range(12):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, number])
    ax.set_title(f"{tag}{number}")
    plots.save_figure(fig, f"{tag}-{number}", f"figure {tag} {number}", folder=folder)
    plt.close(fig)
"""


def test_two_processes_saving_figures_into_one_folder_lose_no_caption(tmp_path):
    env = os.environ | {"PYTHONPATH": str(SRC)}
    savers = [
        subprocess.Popen(
            [sys.executable, "-c", FIGURES, str(tmp_path), tag],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    for saver in savers:
        _, err = saver.communicate(timeout=300)
        assert saver.returncode == 0, err[-2000:]
    readme = (tmp_path / "README.md").read_text()
    for tag in ("a", "b"):
        for number in range(12):
            assert f"| [{tag}-{number}]({tag}-{number}.png) | figure {tag} {number} |" in readme
            assert (tmp_path / f"{tag}-{number}.png").stat().st_size > 0


# ----------------------------------------------------------------------- a rewrite killed mid-swap

# In the child: write `folder` through `staged_folder` (three parts, then the manifest) and
# SIGKILL itself at one moment of the swap. Only the moment is arranged; the kill is real.
KILLED_SWAP = """
import os, pathlib, signal, sys
from analysis.platform import manifest
folder, moment = pathlib.Path(sys.argv[1]), sys.argv[2]
stops = {"set-aside": "." + folder.name + ".old", "move-in": folder.name}
real_rename, real_unlink, trashed = pathlib.Path.rename, os.unlink, []
def rename(self, target):
    name = pathlib.Path(target).name
    if stops.get(moment) == name or (moment == "discard" and ".trash-" in name):
        os.kill(os.getpid(), signal.SIGKILL)
    trashed.append(".trash-" in name)
    return real_rename(self, target)
def unlink(*args, **kwargs):
    real_unlink(*args, **kwargs)
    if moment == "mid-delete" and any(trashed):  # one file of the old folder deleted
        os.kill(os.getpid(), signal.SIGKILL)
pathlib.Path.rename, os.unlink = rename, unlink
with manifest.staged_folder(folder) as staging:
    for index in range(3):
        (staging / f"part-{index}.txt").write_text("new")
    (staging / "manifest.json").write_text("new")
"""


def _write_whole(folder: Path, tag: str) -> None:
    from analysis.platform.manifest import staged_folder

    with staged_folder(folder) as staging:
        for index in range(3):
            (staging / f"part-{index}.txt").write_text(tag)
        (staging / "manifest.json").write_text(tag)


@pytest.mark.parametrize("moment", ["set-aside", "move-in", "discard", "mid-delete"])
def test_a_rewrite_killed_at_any_moment_of_its_swap_leaves_one_whole_result(tmp_path, moment):
    """Probes 5.10 and 10.7: a `--force` rewrite killed during the staging-to-final swap used
    to leave the old and the new folder both set aside, and the next run deleted both."""
    from analysis.engines.result import is_complete

    folder = tmp_path / "results" / "one-point"
    _write_whole(folder, "old")
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_SWAP, str(folder), moment],
        env=os.environ | {"PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert is_complete(folder)  # the next reader finds a whole result, old or new
    contents = {p.read_text() for p in folder.iterdir()}
    assert contents in ({"old"}, {"new"}) and len(list(folder.iterdir())) == 4
    if moment in ("set-aside", "move-in"):
        assert contents == {"old"}  # the new folder never moved in: the old one is back
    _write_whole(folder, "later")  # the next writer clears what the killed one left
    assert {p.read_text() for p in folder.iterdir()} == {"later"}
    assert {p.name for p in folder.parent.iterdir()} == {"one-point", ".one-point.lock"}


def test_a_file_where_a_result_folder_goes_is_refused_not_replaced(tmp_path):
    """A swap would set the file aside and delete it: refused in one line before the write."""
    from analysis.platform.errors import OutputError

    folder = tmp_path / "one-point"
    folder.write_text("a user's file")
    with pytest.raises(OutputError, match="a file is in the way"):
        _write_whole(folder, "new")
    assert folder.read_text() == "a user's file"
    assert [p.name for p in tmp_path.iterdir()] == ["one-point"]


@pytest.mark.engine
def test_run_force_killed_at_the_swap_keeps_the_old_result_for_the_next_run(lab, capsys):
    """Probe 5.10: `run --force` killed at the staging-to-final rename; the next `run` used to
    recompute. Now the old result is put back and reused."""
    from analysis.cli import main

    argv = ["run", "--trace", "kill", "--engine", "replay", "--num-blocks", "300"]
    argv += ["--max-model-len", "2048", "--no-progress"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFIX_CACHE_LAB_ROOT", str(lab["root"]))
        assert main(argv) == 0
        (folder,) = lab["results"].glob("[!.]*")
        before = (folder / "manifest.json").read_bytes()
        killed = subprocess.run(
            [sys.executable, "-c", KILL_AT_MOVE_IN, *argv, "--force"],
            env=lab["env"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        assert not folder.exists()  # killed between setting the old aside and moving in
        capsys.readouterr()
        assert main(argv) == 0
    assert "already finished" in capsys.readouterr().out
    assert (folder / "manifest.json").read_bytes() == before


# In the child: the command, SIGKILLed as its staging folder is renamed into the final place.
KILL_AT_MOVE_IN = """
import os, pathlib, signal, sys
real_rename = pathlib.Path.rename
def rename(self, target):
    if ".partial-" in self.name:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_rename(self, target)
pathlib.Path.rename = rename
from analysis.cli import main
sys.exit(main(sys.argv[1:]))
"""


# ----------------------------------------------------------------------------- damaged results


@pytest.mark.engine
@pytest.mark.parametrize(
    ("part", "damage"),
    [
        ("admissions.parquet", lambda data: data[: len(data) // 2]),
        ("block_stats.parquet", lambda data: b"PAR1" + b"\0" * 64 + b"PAR1"),
        ("requests.parquet", lambda data: b""),
        ("summary.json", lambda data: data[:-5]),
        ("manifest.json", lambda data: b'{"no": "config"}'),
    ],
)
def test_a_damaged_result_is_a_one_line_error_naming_the_file(tmp_path, part, damage):
    from analysis.engines import RunConfig, RunResult
    from analysis.platform.errors import ResultError
    from analysis.runs import run

    config = RunConfig(
        trace="synthetic", engine="replay", block_size=16, num_blocks=300, max_model_len=2048
    )
    folder = run(synthetic_trace(4, seed=23), config, progress=False).write(tmp_path / "r")
    path = folder / part
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ResultError) as caught:
        RunResult.read(folder)
    message = str(caught.value)
    assert message.startswith(str(path)) and "--force" in message and "\n" not in message


def test_two_processes_building_the_local_model_at_once_both_get_it(tmp_path: Path) -> None:
    """Sweep workers start together on a fresh clone: each asks for the local random Llama.
    Before the lock, the second one's build removed the first one's staging folder
    (FileNotFoundError on spec.json)."""
    code = (
        "from analysis.models.local import ensure_random_llama\n"
        "print(ensure_random_llama(dtype='float32'))\n"
    )
    env = {**os.environ, "PREFIX_CACHE_LAB_ROOT": str(tmp_path), "PYTHONPATH": str(SRC)}
    builders = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [b.communicate(timeout=300) for b in builders]
    assert [b.returncode for b in builders] == [0, 0, 0], [err[-500:] for _, err in outputs]
    folder = Path(outputs[0][0].strip())
    assert {out.strip() for out, _ in outputs} == {str(folder)}
    assert json.loads((folder / "spec.json").read_text())["dtype"] == "float32"
    assert not list(folder.parent.glob("*.partial"))
