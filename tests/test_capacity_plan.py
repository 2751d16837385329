"""Capacity planning: bounds in the engine's order, the target search, the Alibaba-format
round trip, `cached_tokens` in the API's terms, and `python -m analysis plan` end to end, its
`--out` folder written whole or not at all.

The engine tests run vLLM's own scheduler (`replay`) on real ShareGPT conversations (the
packaged copy, the real tokenizer), in a root of their own so that results stay apart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.data.blockhash import load_blockhash_trace
from analysis.data.blockhash_export import to_blockhash_records, write_blockhash_trace
from analysis.metrics import bounds
from analysis.metrics.cached_tokens import (
    cached_share_cdf,
    cached_tokens_table,
    compare_with_server,
    per_turn,
)
from analysis.platform.errors import BoundsError

BLOCK = 16


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A project root of the module's own, holding a 30-conversation ShareGPT trace pair."""
    from analysis.data.sharegpt import load_conversations
    from analysis.data.traces import TraceOptions, build_traces, write_trace

    folder = tmp_path_factory.mktemp("plan-root")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFIX_CACHE_LAB_ROOT", str(folder))
        conversations, _ = load_conversations(
            source="package", max_conversations=30, progress=False
        )
        traces = build_traces(
            conversations, TraceOptions(max_model_len=2048, max_conversations=30), progress=False
        )
        write_trace(folder / "multi.parquet", traces.multi)
        write_trace(folder / "single.parquet", traces.single)
        yield folder


@pytest.fixture
def in_root(root, monkeypatch):
    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(root))
    return root


def settings(**changes):
    from analysis.sweeps.capacity_plan import PlanSettings

    return PlanSettings(**({"concurrency": 8, "max_model_len": 2048, "points": 5} | changes))


# --------------------------------------------------------------------------- engine order
def test_admission_order_refuses_admissions_of_another_trace():
    admissions = pd.DataFrame({"request_index": [0, 5], "kind": ["first", "first"]})
    with pytest.raises(BoundsError, match="the trace has 3 requests"):
        bounds.admission_order(admissions, 3)
    twice = pd.DataFrame({"request_index": [0, 0], "kind": ["first", "first"]})
    with pytest.raises(BoundsError, match="two first admissions"):
        bounds.admission_order(twice, 3)


def test_readmissions_do_not_move_a_request():
    admissions = pd.DataFrame(
        {"request_index": [1, 0, 1, 2], "kind": ["first", "first", "readmission", "first"]}
    )
    assert bounds.admission_order(admissions, 3).tolist() == [1, 0, 2]


@pytest.mark.engine
def test_engine_order_is_the_schedulers_interleaving(in_root):
    from analysis.sweeps import capacity_plan

    trace = capacity_plan.plan_trace(in_root / "multi.parquet")
    alone = capacity_plan.replay_point(trace, settings(concurrency=1), 100_000)
    eight = capacity_plan.replay_point(trace, settings(concurrency=8), 100_000)
    one_by_one = bounds.admission_order(alone.admissions, len(trace.bounds_frame))
    assert one_by_one.tolist() == list(range(len(trace.bounds_frame)))  # one client: trace order
    ordered = bounds.in_engine_order(trace.bounds_frame, eight.admissions)
    assert ordered["request_id"].tolist() != trace.bounds_frame["request_id"].tolist()
    for _, turns in ordered.groupby("conversation_id", sort=False):
        assert turns["turn_index"].tolist() == sorted(turns["turn_index"])  # causality kept
    # interleaving lengthens reuse distances: a small LRU cache keeps less in engine order
    index_engine = bounds.index_trace(ordered, include_outputs=True)
    index_trace = bounds.index_trace(trace.bounds_frame, include_outputs=True)
    small = [64]
    assert (
        bounds.lru_hit_blocks(index_engine, BLOCK, small)[0]
        < bounds.lru_hit_blocks(index_trace, BLOCK, small)[0]
    )


# --------------------------------------------------------------------------- LRU for a target
def test_lru_capacity_for_is_the_smallest_capacity_that_reaches_the_hits():
    from analysis.engines.synthetic import synthetic_trace

    index = bounds.index_trace(synthetic_trace(12, turns=(2, 5), seed=3), include_outputs=True)
    ideal = int(bounds.ideal_hit_blocks(index, BLOCK).sum())
    capacities = np.arange(0, 400)
    hits = bounds.lru_hit_blocks(index, BLOCK, capacities)
    assert hits[-1] == ideal  # every reuse fits: LRU reaches the ideal
    for wanted in (0, 1, ideal // 3, ideal // 2, ideal - 1, ideal):
        expected = int(capacities[np.argmax(hits >= wanted)])
        assert bounds.lru_capacity_for(index, BLOCK, wanted) == expected
    assert bounds.lru_capacity_for(index, BLOCK, ideal + 1) is None


# --------------------------------------------------------------------------- the plan
@pytest.fixture(scope="module")
def multi_plan(root):
    from analysis.sweeps import capacity_plan

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFIX_CACHE_LAB_ROOT", str(root))
        trace = capacity_plan.plan_trace(root / "multi.parquet")
        yield capacity_plan.build_plan(trace, settings(refine=3))


@pytest.mark.engine
def test_bounds_in_engine_order_frame_the_engine(multi_plan, in_root):
    curves = multi_plan.curves[multi_plan.curves["order"] == "engine"]
    table = curves.pivot_table(index="capacity", columns="policy", values="hit_blocks")
    ideal_blocks = multi_plan.ideal_hit_blocks()
    assert (table["lru"] <= table["opt"]).all()
    assert (table["opt"] <= ideal_blocks).all()
    points = multi_plan.points.sort_values("num_blocks")
    assert points["first_prefill"].max() <= multi_plan.ideal["engine"] + 1e-12
    assert points["first_prefill"].iloc[0] < points["first_prefill"].iloc[-1]  # memory mattered


@pytest.mark.engine
def test_the_engine_search_brackets_the_target(multi_plan, in_root):
    from analysis.sweeps.capacity_target import search_engine_blocks

    grid = multi_plan.points.copy()
    rate = 0.97 * multi_plan.ideal["engine"]
    found = search_engine_blocks(multi_plan, rate)
    assert found.reached and found.rate >= rate
    measured = multi_plan.points.set_index("num_blocks")["first_prefill"]
    assert measured.loc[found.num_blocks] == found.rate
    if found.below is not None:
        assert measured.loc[found.below] < rate
        grid_above = grid[grid["first_prefill"] >= rate]["num_blocks"].min()
        assert found.num_blocks <= grid_above
    assert (multi_plan.points["found_by"] == "search").sum() <= multi_plan.settings.refine
    unreachable = search_engine_blocks(multi_plan, 1.01)
    assert not unreachable.reached and unreachable.num_blocks is None


# --------------------------------------------------------------------------- Alibaba format
def _two_turn_file(path):
    lines = [
        {"chat_id": 7, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 50,
         "output_length": 5, "type": "text", "turn": 1, "hash_ids": [1, 2, 3, 4]},
        {"chat_id": 8, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40,
         "output_length": 5, "type": "text", "turn": 1, "hash_ids": [1, 9, 10]},
        {"chat_id": 9, "parent_chat_id": 7, "timestamp": 1.0, "input_length": 90,
         "output_length": 5, "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4, 5, 6]},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_parent_links_give_reuse_per_turn(tmp_path):
    frame, report = load_blockhash_trace(_two_turn_file(tmp_path / "t.jsonl"), BLOCK)
    assert report.orphan_turns == 0
    table = bounds.ideal_hits_by_turn(bounds.index_trace(frame), BLOCK)
    first, second = table.iloc[0], table.iloc[1]
    # first turns: chat 8 shares block 1 with chat 7; second turn: 3 full blocks of chat 7's 3
    assert (first["turn"], first["requests"], first["hit_tokens"]) == ("0", 2, 16)
    assert (second["turn"], second["requests"], second["hit_tokens"]) == ("1", 1, 48)
    assert second["hit_rate"] == pytest.approx(48 / 90)


def test_a_trace_without_turns_has_no_reuse_per_turn():
    index = bounds.index_trace([[1] * 40, [1] * 40])
    with pytest.raises(BoundsError, match="no turns"):
        bounds.ideal_hits_by_turn(index, BLOCK)


@pytest.mark.engine
def test_sharegpt_written_in_the_alibaba_format_keeps_its_bounds(root, tmp_path):
    """The block-hash path and the token path agree on the same requests (prompts only)."""
    trace = pd.read_parquet(root / "multi.parquet")
    path = write_blockhash_trace(trace, tmp_path / "sharegpt_blksz_16.jsonl")
    frame, report = load_blockhash_trace(path, BLOCK)
    assert report.records == len(trace) and report.malformed == 0 and not report.reordered
    assert frame["turn_index"].tolist() == trace["turn_index"].tolist()  # parent links
    conversations = pd.factorize(frame["conversation_id"])[0]
    assert conversations.tolist() == pd.factorize(trace["conversation_id"])[0].tolist()
    tokens = bounds.index_trace(trace, include_outputs=False)
    hashes = bounds.index_trace(frame)
    ideal = bounds.ideal_bound(tokens, BLOCK).hit_tokens
    assert ideal > 0 and bounds.ideal_bound(hashes, BLOCK).hit_tokens == ideal
    capacities = [1, 10, 100, 1000]
    assert (
        bounds.lru_hit_blocks(hashes, BLOCK, capacities).tolist()
        == bounds.lru_hit_blocks(tokens, BLOCK, capacities).tolist()
    )


def test_the_export_chains_ids_like_vllm():
    trace = pd.DataFrame(
        {
            "conversation_id": ["a", "b"],
            "turn_index": [0, 0],
            "prompt_ids": [list(range(40)), [0] * 16 + list(range(16, 40))],
            "response_ids": [[1], [1]],
        }
    )
    first, second = to_blockhash_records(trace)
    assert first["hash_ids"][1] != second["hash_ids"][1]  # equal block, different prefix
    assert len(first["hash_ids"]) == 3  # ceil(40 / 16), as the published traces give


# --------------------------------------------------------------------------- cached_tokens
def test_cached_tokens_are_the_first_admissions_hits():
    requests = pd.DataFrame(
        {
            "request_id": ["a", "b", "c"],
            "conversation_id": ["x", "x", "y"],
            "turn_index": [0, 1, 0],
            "prompt_tokens": [100, 200, 50],
            "cached_tokens": [0, 96, -1],  # c never admitted (skipped)
        }
    )
    table = cached_tokens_table(requests)
    assert table["request_id"].tolist() == ["a", "b"]
    assert table["cached_share"].tolist() == [0.0, 0.48]
    cdf = cached_share_cdf(table, by="turn_index")
    assert cdf["requests_at_or_below"].tolist() == [1.0, 1.0]
    turns = per_turn(table, last_turn=1)
    assert turns["turn"].tolist() == ["0", "1+"]
    served = pd.DataFrame({"request_id": ["b", "z"], "cached_tokens": [80, 0]})
    compared = compare_with_server(table, served).set_index("request_id")
    assert compared.loc["b", "difference"] == -16
    assert compared.loc["a", "where"] == "expected only"
    assert compared.loc["z", "where"] == "served only"


@pytest.mark.engine
def test_cached_tokens_sum_to_the_exported_hits(multi_plan, in_root):
    from analysis.metrics.hitrates import first_prefill

    result = multi_plan.spare_run
    table = cached_tokens_table(result.requests)
    assert table["cached_tokens"].sum() == first_prefill(result.admissions).hits


# --------------------------------------------------------------------------- the command
def _plan(*args):
    from analysis.cli import main

    return main(["plan", "--max-model-len", "2048", "--points", "4", "--refine", "2", *args])


@pytest.mark.engine
@pytest.mark.parametrize("model", ["llama-3.2-1b", "llama-3.1-8b"])
@pytest.mark.parametrize("trace", ["multi.parquet", "single.parquet", "alibaba.jsonl"])
def test_plan_answers_a_target(in_root, capsys, model, trace):
    path = in_root / trace
    block_size = []
    if trace.endswith(".jsonl"):
        if not path.exists():
            write_blockhash_trace(pd.read_parquet(in_root / "multi.parquet"), path)
        block_size = ["--block-size", "16"]
    code = _plan("--trace", str(path), *block_size, "--model", model, "--target", "0.8", "--json")
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    answer = out["answer"]
    assert answer["model"] == model
    assert answer["target_rate"] == pytest.approx(0.8 * out["ideal"]["engine"])
    if answer["engine"]["reached"]:
        assert answer["engine"]["rate"] >= answer["target_rate"]
        assert answer["engine_bytes"] == answer["engine"]["num_blocks"] * answer["bytes_per_block"]
        assert answer["tensor_parallel"] == 1  # a few thousand blocks fit on one 80 GB GPU


@pytest.mark.engine
def test_plan_writes_its_tables(in_root, tmp_path, capsys):
    out = tmp_path / "plan"
    assert _plan("--trace", str(in_root / "multi.parquet"), "--out", str(out)) == 0
    text = capsys.readouterr().out
    assert "the engine reaches it at num_blocks" in text
    answer = json.loads((out / "answer.json").read_text())
    cached = pd.read_parquet(out / "cached_tokens.parquet")
    assert set(cached["num_blocks"]) == {answer["answer"]["engine"]["num_blocks"]}
    assert (out / "cached_tokens.csv").is_file() and (out / "curves.parquet").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "x.jsonl"], "give its block size"),
        (["--target", "1.5"], "not a share of the ideal"),
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--block-size", "0"], "--block-size must be a positive integer"),
    ],
)
def test_bad_plan_settings_are_one_line_errors(in_root, capsys, args, message):
    (in_root / "x.jsonl").write_text("")
    assert _plan("--trace", str(in_root / "multi.parquet"), *args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# --------------------------------------------------------------------------- the plan's folder
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda out: out.write_text("{}"), "a file is in the way"),
        (lambda out: (out.mkdir(), (out / "notes.txt").write_text("mine")), "'notes.txt'"),
    ],
    ids=["a file", "a folder of other files"],
)
def test_an_unusable_plan_out_is_refused_before_the_plan(
    tmp_path, monkeypatch, capsys, make, message
):
    """Probe 11.9: a file (or a folder of other files) as `--out` was refused only after the
    whole plan had run; now in one line before any work, and left as it was."""
    from analysis.commands import plan

    def no_work(args):
        raise AssertionError("the plan ran before --out was checked")

    monkeypatch.setattr(plan, "compute", no_work)
    out = tmp_path / "out"
    make(out)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert _plan("--out", str(out)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def _plan_files(out):
    return {p.name: p.read_bytes() for p in out.iterdir()}


@pytest.mark.engine
@pytest.mark.parametrize(
    ("fault", "code", "message"),
    [
        (OSError(28, "No space left on device"), 2, "the disk is full"),
        (KeyboardInterrupt(), 130, "interrupted: nothing partial was kept"),
    ],
    ids=["full disk", "Ctrl-C"],
)
def test_a_plan_write_that_fails_leaves_the_earlier_plan_whole(
    in_root, tmp_path, monkeypatch, capsys, fault, code, message
):
    """Probes 11.9 and 11.11: a full disk while the tables were written was an OSError
    traceback, and Ctrl-C left a header-only CSV and no answer.json beside earlier tables
    while saying that nothing partial was kept. Now the earlier plan stays whole."""
    out = tmp_path / "plan"
    args = ("--trace", str(in_root / "multi.parquet"), "--out", str(out))
    assert _plan(*args) == 0
    before = _plan_files(out)
    real_to_csv = pd.DataFrame.to_csv

    def to_csv(frame, path, *a, **k):
        if str(path).endswith("cached_tokens.csv"):
            real_to_csv(frame.head(0), path, *a, **k)  # the header, then the fault
            raise fault
        return real_to_csv(frame, path, *a, **k)

    monkeypatch.setattr(pd.DataFrame, "to_csv", to_csv)
    capsys.readouterr()
    assert _plan(*args, "--target", "0.5") == code
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert _plan_files(out) == before
    assert {p.name for p in tmp_path.iterdir()} == {"plan", ".plan.lock"}  # no staging left
    manifest = json.loads(before["manifest.json"])
    tables = ["cached_tokens", "curves", "engine_points"]
    assert manifest["limit"] is None and manifest["tables"] == tables


# In the child: plan A, held at its second table's write until the parent says go; it leaves
# its own curves and answer beside, to tell the two plans' files apart.
HELD_PLAN = """
import json, os, pathlib, sys, time
from analysis.sweeps import capacity_target
side, argv = pathlib.Path(sys.argv[1]), sys.argv[2:]
real_write, real_replace = capacity_target.write_plan_tables, os.replace
def write_plan_tables(plan, answer, folder):
    plan.curves.to_parquet(side / "curves.parquet")
    (side / "answer.json").write_text(json.dumps(capacity_target.plan_record(plan, answer)))
    return real_write(plan, answer, folder)
def replace(source, target, *args, **kwargs):
    if pathlib.Path(target).name == "engine_points.parquet":
        (side / "held").touch()
        while not (side / "go").exists():
            time.sleep(0.05)
    return real_replace(source, target, *args, **kwargs)
capacity_target.write_plan_tables, os.replace = write_plan_tables, replace
from analysis.cli import main
sys.exit(main(argv))
"""


@pytest.mark.engine
def test_two_plans_into_one_folder_leave_one_plans_whole_set(in_root, tmp_path, monkeypatch):
    """Probe 11.10: plan A held after its first table while plan B wrote into the same
    `--out`: both returned 0 and the folder mixed B's curves with A's answer."""
    from analysis.sweeps import capacity_target

    out, side = tmp_path / "plan", tmp_path / "a"
    side.mkdir()
    common = ["plan", "--max-model-len", "2048", "--points", "4", "--refine", "2"]
    common += ["--trace", str(in_root / "multi.parquet"), "--out", str(out)]
    src = Path(__file__).resolve().parents[1] / "src"
    env = os.environ | {"PYTHONPATH": str(src), "PREFIX_CACHE_LAB_ROOT": str(in_root)}
    a = subprocess.Popen(
        [sys.executable, "-c", HELD_PLAN, str(side), *common, "--limit", "20", "--target", "0.5"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 600
        while not (side / "held").exists() and a.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert (side / "held").exists(), a.stderr.read()[-2000:] if a.poll() is not None else ""
        written = {}
        real_write = capacity_target.write_plan_tables

        def write_plan_tables(plan, answer, folder):
            written.update(curves=plan.curves, answer=capacity_target.plan_record(plan, answer))
            return real_write(plan, answer, folder)

        monkeypatch.setattr(capacity_target, "write_plan_tables", write_plan_tables)
        assert _plan("--trace", str(in_root / "multi.parquet"), "--out", str(out)) == 0  # B
    finally:
        (side / "go").touch()
        _, err = a.communicate(timeout=600)
    assert a.returncode == 0, err[-2000:]
    plans = {
        "A": (
            pd.read_parquet(side / "curves.parquet"),
            json.loads((side / "answer.json").read_text()),
        ),
        "B": (written["curves"], written["answer"]),
    }
    answer = json.loads((out / "answer.json").read_text())
    (writer,) = [name for name, (_, record) in plans.items() if record == answer]
    curves = pd.read_parquet(out / "curves.parquet")
    pd.testing.assert_frame_equal(curves, plans[writer][0].reset_index(drop=True))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["limit"] == answer["limit"]


def test_the_target_check_can_fail_with_and_without_a_point_below():
    import pandas as pd

    from analysis.sweeps.capacity_reading import target_check
    from analysis.sweeps.capacity_target import EngineSearch

    points = pd.DataFrame({"num_blocks": [513, 850, 1400], "first_prefill": [0.07, 0.5, 0.8]})
    ok = EngineSearch(True, 850, 0.5, 513, 0.8)
    assert target_check("t", points, ok, 0.4)[3]
    assert not target_check("t", points, ok, 0.6)[3]  # the answer does not reach the target
    assert not target_check("t", points, ok, 0.05)[3]  # the point below reaches it too
    at_minimum = EngineSearch(True, 513, 0.07, None, 0.8)
    claim, fewest, answer, holds = target_check("t", points, at_minimum, 0.06)
    assert holds and "vLLM's minimum" in claim and fewest == answer == 513
    not_minimum = EngineSearch(True, 850, 0.5, None, 0.8)  # no point below, yet not the fewest
    assert not target_check("t", points, not_minimum, 0.4)[3]
    assert not target_check("t", points, at_minimum, 0.1)[3]


def test_the_order_check_fails_where_engine_order_needs_fewer_blocks_or_never_reaches():
    from types import SimpleNamespace

    from analysis.sweeps.capacity_reading import order_check

    def plan(in_trace, in_engine):
        blocks = {"trace": in_trace, "engine": in_engine}
        return SimpleNamespace(lru_blocks_for=lambda share, order: blocks[order])

    claim, oracle, measured, holds = order_check("multi_turn", plan(73, 1173), 0.9)
    assert holds and oracle == ">= 73" and measured == 1173 and "90%" in claim
    assert order_check("t", plan(417, 417), 0.9)[3]
    assert not order_check("t", plan(1173, 73), 0.9)[3]
    assert not order_check("t", plan(73, None), 0.9)[3]
