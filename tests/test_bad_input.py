"""Bad input ends in one line naming it and the fix (exit status 2), never in a traceback.

One test per class of the reliability probe of 2026-11-24 (its row numbers in the names'
docstrings). None of them starts an engine: each input is refused before one would start.
Inputs that once made the process allocate without bound run in a child process under a 4 GiB
address-space limit, so that a regression fails the test instead of the machine.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis import cli
from analysis.data.traces import trace_schema
from analysis.runs import runner

MEMORY_LIMIT = 4 * 2**30  # bytes of address space for a child process given a huge number


def write_trace(path: Path, prompts: list[list[int | None] | None]) -> Path:
    """A trace of one conversation, one turn per prompt, with the trace's own schema."""
    rows = [
        {
            "request_id": f"c0/{turn}",
            "conversation_id": "c0",
            "turn_index": turn,
            "prompt_ids": prompt,
            "response_ids": [11, 12],
            "prompt_tokens": len(prompt or []),
            "response_tokens": 2,
            "timestamp": float(turn),
        }
        for turn, prompt in enumerate(prompts)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=trace_schema()), path)
    return path


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "good.parquet", [list(range(1, 40)), list(range(1, 80))])


def run_argv(trace: Path, results: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--trace",
        str(trace),
        "--num-blocks",
        "600",
        "--results-dir",
        str(results),
        "--no-progress",
        *extra,
    ]


def one_line_error(capsys: pytest.CaptureFixture[str], code: int) -> str:
    """The CLI's error line, after checking that it is the only line and the status is 2."""
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def no_computing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any run fail loudly: these inputs must be refused before the run computes."""

    def computed(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run computed before its input was refused")

    monkeypatch.setattr(runner, "run", computed)


# --- models (rows 3.7, 3.8, 3.9) ---------------------------------------------------------------


@pytest.mark.parametrize("engine", ["replay", "vllm"])
@pytest.mark.parametrize("model", ["no-such-model", "probe/nomodel", "{tmp}/nomodel"])
def test_an_unknown_model_or_missing_folder_is_refused_before_an_engine_starts(
    capsys, monkeypatch, tmp_path, trace, engine, model
):
    """Rows 3.7-3.9: a hub traceback after 7-17 s, with either engine."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = model.format(tmp=tmp_path)
    argv = run_argv(trace, tmp_path / "res", "--engine", engine, "--model", model)
    err = one_line_error(capsys, cli.main([*argv, "--block-size", "32"]))
    assert f"model {model!r}" in err
    assert "tiny-llama" in err and "llama-3.2-1b" in err  # the choices


def test_an_uncached_hub_name_is_left_to_vllm_when_online(monkeypatch):
    from analysis.models import resolve_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert resolve_model("org/name").path == "org/name"  # vLLM downloads it


# --- trace content (rows 2.11, 2.12) -----------------------------------------------------------


@pytest.mark.parametrize("prompt", [None, [1, 2, None, 4]], ids=["null-list", "null-id"])
def test_a_null_token_id_names_the_request(capsys, tmp_path, prompt):
    """Row 2.11: a TypeError traceback in build_workload."""
    bad = write_trace(tmp_path / "null.parquet", [list(range(1, 40)), prompt])
    err = one_line_error(capsys, cli.main(run_argv(bad, tmp_path / "res")))
    assert "'c0/1'" in err and "null" in err and "rebuild the trace" in err


def test_an_empty_prompt_names_the_request(capsys, tmp_path):
    """Row 2.12: a ValueError deep in vLLM's find_longest_cache_hit, after 14 s."""
    bad = write_trace(tmp_path / "empty.parquet", [list(range(1, 40)), []])
    err = one_line_error(capsys, cli.main(run_argv(bad, tmp_path / "res")))
    assert "'c0/1' has an empty prompt" in err and "rebuild the trace" in err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.iloc[::-1], "conversation 'c0': turn 0 comes after a turn with the same or"),
        (lambda t: t.iloc[[0, 1, 0, 1]], "request id 'c0/0' appears 2 times (2 repeated ids)"),
    ],
    ids=["turns-reversed", "rows-twice"],
)
def test_turns_out_of_order_or_repeated_ids_are_refused(capsys, tmp_path, trace, change, message):
    """Rows 2.9, 2.10: run took a conversation's turns in row order (48 % instead of 61 %, or
    the conversation replayed twice), without a word."""
    bad = tmp_path / "bad.parquet"
    pq.write_table(
        pa.Table.from_pandas(change(pq.read_table(trace).to_pandas()), preserve_index=False), bad
    )
    err = one_line_error(capsys, cli.main(run_argv(bad, tmp_path / "res")))
    assert message in err and "rebuild the trace" in err


def rewrite_trace(source: Path, target: Path, change) -> Path:
    """`source` with `change` applied to its frame, written as a Parquet trace at `target`."""
    frame = change(pq.read_table(source).to_pandas())
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), target)
    return target


def understated(frame):
    return frame.assign(prompt_tokens=1)


def twice(frame):
    return frame.iloc[[0, 1, 0, 1]]


def reversed_turns(frame):
    return frame.iloc[::-1]


STAGES = {
    "run": lambda trace, tmp: run_argv(trace, tmp / "res"),
    "bounds": lambda trace, tmp: ["bounds", "--trace", str(trace), "--no-progress"],
    "bounds-outputs": lambda trace, tmp: [
        "bounds", "--trace", str(trace), "--include-outputs", "--no-progress"
    ],
    "plan": lambda trace, tmp: ["plan", "--trace", str(trace), "--points", "2"],
    "grid-max": lambda trace, tmp: [
        "sweep", "--grid", str(write_grid(tmp / "grid.toml", str(trace), '"max"')), "--list"
    ],
}  # fmt: skip


@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (understated, "request 'c0/0' has prompt_tokens 1 but 39 prompt_ids (2 requests disagree)"),
        (twice, "request id 'c0/0' appears 2 times (2 repeated ids)"),
        (reversed_turns, "conversation 'c0': turn 0 comes after a turn with the same or"),
    ],
    ids=["counts-understated", "rows-twice", "turns-reversed"],
)
def test_every_stage_refuses_what_run_refuses(
    capsys, monkeypatch, tmp_path, trace, stage, change, message
):
    """Probes 2.7, 2.9, 2.10 (2026-11-26): run used the ids while a grid with num_blocks "max"
    sized from prompt_tokens (n31 instead of n102); bounds took every row twice (65.07 %
    instead of 38.36 %) or turns reversed, which run refused. One check, in every stage."""
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))  # plan's points, if it ran
    bad = rewrite_trace(trace, tmp_path / "bad.parquet", change)
    err = one_line_error(capsys, cli.main(STAGES[stage](bad, tmp_path)))
    assert f"trace {bad}: {message}" in err and "rebuild the trace" in err


def test_bounds_names_the_request_with_a_null_token_id(capsys, tmp_path):
    bad = write_trace(tmp_path / "null.parquet", [list(range(1, 40)), [1, None, 3]])
    err = one_line_error(capsys, cli.main(["bounds", "--trace", str(bad), "--no-progress"]))
    assert "request c0/1 has a null token id" in err


# --- output folders (rows 8.1, 8.3, 8.4) -------------------------------------------------------


def test_a_results_dir_that_is_a_file_is_refused_before_computing(
    capsys, tmp_path, trace, no_computing
):
    """Row 8.4: a FileExistsError traceback after the whole run was computed."""
    in_the_way = tmp_path / "good.json"
    in_the_way.write_text("[]")
    err = one_line_error(capsys, cli.main(run_argv(trace, in_the_way)))
    assert f"cannot write to {in_the_way}: a file is in the way" in err


def test_a_traces_out_that_is_a_file_is_refused_before_building(capsys, tmp_path):
    """Rows 8.3, 8.4 for `traces`: a FileExistsError traceback (and a half-written set)."""
    sharegpt = tmp_path / "sharegpt.json"
    turns = [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"}]
    sharegpt.write_text(json.dumps([{"id": "a", "conversations": turns}]))
    in_the_way = tmp_path / "out"
    in_the_way.write_text("not a folder")
    argv = ["traces", "--source", "file", "--path", str(sharegpt), "--out", str(in_the_way)]
    err = one_line_error(capsys, cli.main(argv))
    assert f"cannot write to {in_the_way}: a file is in the way" in err


@pytest.mark.parametrize(
    ("code", "reason"),
    [(errno.EROFS, "read-only"), (errno.ENOSPC, "disk is full")],
)
def test_a_read_only_or_full_disk_is_refused_before_computing(
    capsys, monkeypatch, tmp_path, trace, no_computing, code, reason
):
    """Rows 8.1 and 8.3: OSError tracebacks after the whole run was computed. The file system
    under `results` refuses new files (a read-only one new folders too), with its own errno."""
    results = tmp_path / "res"
    real_open, real_mkdir = open, os.mkdir

    def refused(path: object) -> bool:
        return str(path).startswith(str(results))

    def fake_open(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        mode = args[0] if args else kwargs.get("mode", "r")
        if refused(path) and set(mode) & set("wax+"):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if refused(path) and code == errno.EROFS:
            raise OSError(code, os.strerror(code), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    err = one_line_error(capsys, cli.main(run_argv(trace, results)))
    assert f"cannot write to {results}" in err and reason in err


def test_a_failed_final_write_is_one_line_naming_the_folder(capsys, monkeypatch, tmp_path, trace):
    """Row 8.1: the disk fills up while the result is written (after the check passed)."""

    def full_disk(folder: Path) -> Path:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "requests.parquet"))

    monkeypatch.setattr(runner, "run", lambda *a, **k: SimpleNamespace(write=full_disk))
    results = tmp_path / "res"
    err = one_line_error(capsys, cli.main(run_argv(trace, results)))
    assert f"cannot write to {results}: the disk is full" in err


# --- block-hash traces and bounds (rows 4.10-4.13) ---------------------------------------------


def test_a_gz_that_is_not_gzip_is_one_line(capsys, tmp_path):
    """Row 4.10: a gzip.BadGzipFile traceback."""
    fake = tmp_path / "notgz.jsonl.gz"
    line = {"hash_ids": [1, 2], "input_length": 40, "output_length": 4, "timestamp": 0}
    fake.write_text(json.dumps(line) + "\n")
    argv = ["bounds", "--trace", str(fake), "--block-size", "16", "--no-progress"]
    err = one_line_error(capsys, cli.main(argv))
    assert f"{fake} is not a readable gzip file" in err


def test_a_length_beyond_int64_is_a_counted_skip(capsys, tmp_path):
    """An input_length of 10^20 stopped the import with an OverflowError traceback."""
    trace = tmp_path / "overflow.jsonl"
    good = {"hash_ids": [1, 2], "input_length": 40, "output_length": 4, "timestamp": 0}
    trace.write_text(json.dumps(good) + "\n" + json.dumps(good | {"input_length": 10**20}) + "\n")
    argv = ["bounds", "--trace", str(trace), "--block-size", "16", "--no-progress"]
    assert cli.main(argv) == 0
    assert "skipped: length out of range 1" in capsys.readouterr().out


def bounds_in_a_child(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m analysis bounds ...` under MEMORY_LIMIT of address space."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run(
        [sys.executable, "-m", "analysis", "bounds", *argv, "--no-progress"],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=300,
        check=False,
    )


def test_a_huge_input_length_is_refused_with_the_memory_estimate(tmp_path):
    """Row 4.11: one line claiming 10^12 tokens grew to 21.9 GB and met the OOM killer."""
    trace = tmp_path / "huge_len.jsonl"
    line = {"hash_ids": [1, 2], "input_length": 10**15, "output_length": 4, "timestamp": 0}
    trace.write_text(json.dumps(line) + "\n")
    done = bounds_in_a_child("--trace", str(trace), "--block-size", "16")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "line 1" in done.stderr and "GiB of memory" in done.stderr


def test_a_huge_vllm_capacity_costs_what_the_trace_does(tmp_path, trace):
    """Row 4.12: `--capacities 10^12 --policies vllm` filled memory with free-queue entries.
    A pool that never evicts gives the ideal hit rate."""
    capacity = 10**12
    argv = ["--trace", str(trace), "--capacities", str(capacity), "--policies", "vllm", "--json"]
    done = bounds_in_a_child(*argv)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    (row,) = result["curves"]
    assert row["policy"] == "vllm" and row["capacity"] == capacity
    assert row["hit_rate"] == result["ideal_hit_rate"] > 0


def test_a_vllm_pool_beyond_the_trace_gives_the_same_hits(trace):
    """The pool is simulated at the size the trace can fill: any larger pool is the same."""
    from analysis.data.traces import load_trace
    from analysis.metrics import bounds

    keys = bounds.block_keys(load_trace(trace), 16)
    enough = int(keys.allocated.sum()) + 1
    small, large = bounds.simulate_vllm(keys, enough), bounds.simulate_vllm(keys, 50 * enough)
    assert (small.hit_blocks == large.hit_blocks).all()
    assert (small.evictions, small.duplicates) == (large.evictions, large.duplicates)


def test_bounds_refuses_block_size_0_on_a_parquet_trace(capsys, trace):
    """Row 4.13: block size 0 silently became 16."""
    argv = ["bounds", "--trace", str(trace), "--block-size", "0", "--no-progress"]
    err = one_line_error(capsys, cli.main(argv))
    assert "--block-size must be a positive integer (got 0)" in err


# --- sweep grids (rows 9.5, 9.6) ---------------------------------------------------------------


def write_grid(path: Path, trace: str, num_blocks: str) -> Path:
    """A one-series grid; `num_blocks` is written as given (TOML: '"max"', '[600]')."""
    path.write_text(
        f"""[[series]]
name = "s"
traces = ["{trace}"]
engines = ["replay"]
block_sizes = [16]
num_blocks = {num_blocks}
"""
    )
    return path


@pytest.mark.parametrize("num_blocks", ['"max"', '"log:4"'])
def test_a_grid_sized_from_a_missing_trace_is_one_line_even_for_list(capsys, tmp_path, num_blocks):
    """Row 9.5: a FileNotFoundError traceback from no_pressure_blocks."""
    missing = tmp_path / "missing.parquet"
    grid = write_grid(tmp_path / "grid.toml", str(missing), num_blocks)
    err = one_line_error(capsys, cli.main(["sweep", "--grid", str(grid), "--list"]))
    assert f"trace {str(missing)!r} not found" in err and "num_blocks" in err


def test_a_grid_with_log_of_a_non_number_is_one_line(capsys, tmp_path, trace):
    """Row 9.6: a ValueError traceback from int('abc')."""
    grid = write_grid(tmp_path / "grid.toml", str(trace), '"log:abc"')
    err = one_line_error(capsys, cli.main(["sweep", "--grid", str(grid), "--list"]))
    assert "'log:abc'" in err and "whole number" in err


def test_a_sweep_into_an_unwritable_results_folder_stops_before_computing(
    capsys, monkeypatch, tmp_path, trace, no_computing
):
    """Rows 8.1-8.4 for `sweep`: its results folder is checked before the first point runs."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "data").write_text("a file where the data folder should be")
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(root))
    grid = write_grid(tmp_path / "grid.toml", str(trace), "[600]")
    err = one_line_error(capsys, cli.main(["sweep", "--grid", str(grid)]))
    assert f"cannot write to {root / 'data' / 'results'}: a file is in the way" in err


@pytest.mark.engine
def test_a_failing_sweep_point_is_one_line_and_leaves_no_notebook_taken_as_done(
    capsys, monkeypatch, tmp_path
):
    """Row 5.12: a 56-line papermill traceback, and the failed notebook left as make's target."""
    bad = write_trace(tmp_path / "empty.parquet", [list(range(1, 40)), []])
    grid = tmp_path / "bad.toml"
    grid.write_text(
        f"""
[base]
max_model_len = 2048

[[series]]
name = "bad"
traces = ["{bad}"]
engines = ["replay"]
block_sizes = [16]
num_blocks = [300]
"""
    )
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))  # reports/ and data/ go there
    monkeypatch.setattr("analysis.report.notebooks.notebooks_dir", lambda: runner_notebooks())
    code = cli.main(["sweep", "--grid", str(grid), "--point", "bad-empty-replay-b16-n300"])
    err = one_line_error(capsys, code)
    assert "point bad-empty-replay-b16-n300 failed: TraceError" in err and "empty prompt" in err
    assert not list((tmp_path / "reports" / "runs" / "bad").glob("[!.]*.ipynb"))  # no target


def runner_notebooks() -> Path:
    return Path(__file__).resolve().parents[1] / "notebooks"


def test_a_write_probe_left_by_a_killed_process_is_removed_and_a_live_ones_kept(tmp_path):
    """A process SIGKILLed between writing its probe and removing it leaves the probe behind;
    the next writer removes it, not the probe of a process still running."""
    from analysis.platform.writable import PROBE_PREFIX, ensure_writable

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f"{PROBE_PREFIX}{dead.pid}"
    live = tmp_path / f"{PROBE_PREFIX}{os.getppid()}"
    orphan.write_bytes(b"\0")
    live.write_bytes(b"\0")
    ensure_writable(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]
