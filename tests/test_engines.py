"""Engines: configuration checks, workload and arrivals (fast), and the `replay` engine
(vLLM's own scheduler, marked `engine`) on small synthetic traces."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis.engines import ConfigError, RunConfig, RunResult, is_complete, validate
from analysis.engines.result import REQUEST_TIME_COLUMNS
from analysis.engines.synthetic import identical_requests, synthetic_trace
from analysis.engines.workload import Arrivals, build_workload, limit_trace

SMALL = {"block_size": 16, "num_blocks": 400, "max_model_len": 2048}


# --------------------------------------------------------------------------- configuration
def test_too_few_blocks_names_the_minimum():
    config = RunConfig(block_size=16, num_blocks=100, max_model_len=8192)
    with pytest.raises(ConfigError, match=r"--num-blocks >= 513 \(ceil\(max_model_len"):
        validate(config, check_environment=False)
    validate(config.with_(num_blocks=513), check_environment=False)


def test_cpu_engine_needs_a_multiple_of_32_and_suggests_replay():
    config = RunConfig(engine="vllm", device="cpu", block_size=16, num_blocks=1024)
    with pytest.raises(ConfigError, match="--block-size 32, or --engine replay"):
        validate(config, check_environment=False)
    validate(config.with_(engine="replay"), check_environment=False)


def test_gpu_engine_without_a_gpu_is_refused(monkeypatch):
    import analysis.engines.config as config_module

    monkeypatch.setattr(config_module, "_cuda_available", lambda: False)
    config = RunConfig(engine="vllm", device="cuda", model="some/model", num_blocks=1024)
    with pytest.raises(ConfigError, match="no GPU is visible"):
        validate(config)


def test_missing_vllm_is_a_one_line_error(monkeypatch):
    import analysis.engines.config as config_module

    monkeypatch.setattr(config_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="vLLM is not installed: run `make setup`"):
        validate(RunConfig())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mode": "sometimes"}, "mode='sometimes' is not one of"),
        ({"concurrency": 0}, "concurrency must be a positive integer"),
        ({"max_num_batched_tokens": 64, "max_num_seqs": 256}, "below max_num_seqs"),
        ({"max_model_len": 16384, "num_blocks": 2000}, "exceeds the local random model"),
    ],
)
def test_bad_values_are_named(changes, message):
    with pytest.raises(ConfigError, match=message):
        validate(RunConfig().with_(**changes), check_environment=False)


def test_config_id_is_readable_and_changes_with_config_and_trace():
    config = RunConfig(trace="multi_turn", block_size=16, num_blocks=256, concurrency=8)
    config_id = config.config_id("trace-a")
    assert config_id.startswith("multi_turn-replay-b16-n256-cl8-")
    assert len(config_id.rsplit("-", 1)[1]) == 10
    assert config.config_id("trace-a") == config_id
    assert config.config_id("trace-b") != config_id
    assert config.with_(num_blocks=257).config_id("trace-a") != config_id
    assert RunConfig.from_dict(config.to_dict()) == config


def test_a_point_config_with_a_name_that_is_no_field_is_refused():
    """Row 14.9: a field name that does not reach the engine is an error, never dropped."""
    fleet = RunConfig(engine="fleet", replicas=2, router="affinity", think_time_s=0.5)
    assert RunConfig.from_fields(fleet.to_dict()) == fleet
    with pytest.raises(ConfigError, match="replica is not a RunConfig field"):
        RunConfig.from_fields({"engine": "fleet", "replica": 2})


# --------------------------------------------------------------------------- workload
@pytest.mark.parametrize("engine", ["replay", "fleet"])
def test_a_device_changes_no_id_of_an_engine_without_a_model(engine):
    """Probe 3.6 (2026-11-26): `run --engine replay --device cuda` wrote a second folder
    (another config id, the same numbers). Replay and fleet run no model: the device is not
    part of their identity, and the ids made on cpu stay as they were."""
    cpu = RunConfig(engine=engine)
    assert cpu.with_(device="cuda").config_id("t") == cpu.config_id("t")
    vllm = RunConfig(engine="vllm", model="m")
    assert vllm.with_(device="cuda").config_id("t") != vllm.config_id("t")


def test_synthetic_turns_extend_the_previous_turn():
    trace = synthetic_trace(5, turns=4, seed=1)
    for _, turns in trace.groupby("conversation_id"):
        rows = turns.sort_values("turn_index")
        for earlier, later in zip(rows.itertuples(), rows.iloc[1:].itertuples(), strict=False):
            history = np.concatenate([earlier.prompt_ids, earlier.response_ids])
            assert np.array_equal(later.prompt_ids[: len(history)], history)


def test_outputs_recorded_free_capped_and_explicit():
    trace = synthetic_trace(3, turns=2, reply_tokens=(30, 40), seed=2)
    recorded = build_workload(trace, RunConfig())
    assert all(
        np.array_equal(s.outputs, r)
        for s, r in zip(recorded.specs, trace.response_ids, strict=False)
    )
    capped = build_workload(trace, RunConfig(max_output_tokens=5))
    assert {len(s.outputs) for s in capped.specs} == {5}
    free = build_workload(trace, RunConfig(outputs="free"))
    again = build_workload(trace, RunConfig(outputs="free"))
    for a, b, r in zip(free.specs, again.specs, trace.response_ids, strict=False):
        assert len(a.outputs) == len(r) and np.array_equal(a.outputs, b.outputs)
        assert not np.array_equal(a.outputs, r)
    explicit = {rid: [7, 8, 9] for rid in trace.request_id}
    given = build_workload(trace, RunConfig(), explicit)
    assert given.explicit and all(s.outputs.tolist() == [7, 8, 9] for s in given.specs)


def test_long_prompts_are_skipped_and_counted_or_refused():
    trace = synthetic_trace(4, turns=3, user_tokens=200, seed=3)
    config = RunConfig(max_model_len=450, num_blocks=100)
    workload = build_workload(trace, config)
    too_long = (trace["prompt_tokens"] >= 450).to_numpy()
    assert too_long.any() and not too_long.all()
    assert workload.skipped == np.flatnonzero(too_long).tolist()
    with pytest.raises(ConfigError, match=r"prompt\(s\) have max_model_len=450 tokens or more"):
        build_workload(trace, config.with_(long_prompts="error"))


def test_limit_keeps_whole_conversations():
    trace = synthetic_trace(6, turns=(1, 4), seed=4)
    limited = limit_trace(trace, 2)
    assert limited["conversation_id"].nunique() == 2
    first_two = trace["conversation_id"].unique()[:2]
    assert len(limited) == trace["conversation_id"].isin(first_two).sum()


def test_closed_loop_releases_next_turn_only_after_the_previous_one():
    trace = synthetic_trace(3, turns=3, seed=5)
    workload = build_workload(trace, RunConfig())
    arrivals = Arrivals(workload, "closed-loop", 2)
    assert arrivals.initial() == [0, 3]  # first turns of the first two conversations
    assert arrivals.after_finished([3]) == [4]
    assert arrivals.after_finished([0, 4]) == [1, 5]
    assert arrivals.after_finished([1]) == [2]
    assert arrivals.after_finished([2]) == [6]  # conversation 0 over: the client takes conv 2
    batch = Arrivals(workload, "batch", 1)
    assert batch.initial() == list(range(9)) and batch.after_finished([0]) == []


# --------------------------------------------------------------------------- replay engine
def run_replay(trace: pd.DataFrame, **changes) -> RunResult:
    from analysis.runs import run

    config = RunConfig(trace="synthetic", engine="replay", **{**SMALL, **changes})
    return run(trace, config, progress=False)


def comparable(result: RunResult) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Tables without wall-clock times; block events in a canonical order within each step
    (block ids left out: the decode fast path may hand out different, equivalent blocks)."""
    events = result.block_events.drop(columns=["time_s", "block_id"])
    events = events.sort_values(["step", "event", "block_hash", "request_index"])
    return (
        result.admissions.drop(columns=["time_s"]),
        result.requests.drop(columns=list(REQUEST_TIME_COLUMNS)),
        events.reset_index(drop=True),
    )


@pytest.mark.engine
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_identical_prompts_hit_all_but_the_last_block(block_size):
    length = 100
    trace = identical_requests(6, length, reply_tokens=4)
    result = run_replay(trace, block_size=block_size, mode="closed-loop", concurrency=1)
    full = (length - 1) // block_size * block_size
    assert result.requests["cached_tokens"].tolist() == [0] + [full] * 5
    from analysis.metrics import hitrates

    rates = hitrates.cumulative(result.admissions)["cumulative_rate"]
    expected = [(k - 1) * full / (k * length) for k in range(1, 7)]
    np.testing.assert_allclose(rates, expected)
    # vLLM's own per-step PrefixCacheStats (the exported counters' inputs) give the closed form
    exported = result.counters["exported"]
    assert exported["vllm:prefix_cache_hits"] == 5 * full
    assert exported["vllm:prefix_cache_queries"] == 6 * length


@pytest.mark.engine
def test_all_prefill_exceeds_first_prefill_only_under_preemption():
    trace = synthetic_trace(30, turns=(1, 4), user_tokens=(50, 300), reply_tokens=(20, 120), seed=6)
    roomy = run_replay(trace, mode="batch", num_blocks=20_000)
    assert roomy.summary["preemptions"] == 0
    assert roomy.summary["all_prefill"] == roomy.summary["first_prefill"]
    tight = run_replay(trace, mode="batch", num_blocks=140)
    assert tight.summary["preemptions"] > 0
    assert tight.summary["all_prefill"]["rate"] > tight.summary["first_prefill"]["rate"]
    assert tight.summary["recompute_share"] > 0
    for result in (roomy, tight):
        events = result.block_events
        hit_tokens = result.admissions["tokens_hit"].sum()
        assert (events["event"] == "hit").sum() * result.config.block_size == hit_tokens
        # vLLM's own PrefixCacheStats (summed per step) against our per-admission rows and
        # vLLM's Request.num_preemptions: three records of the same preemptions
        stats = result.counters["prefix_cache_stats"]
        readmissions = result.admissions[result.admissions["kind"] == "readmission"]
        assert stats["preempted_requests"] == len(readmissions)
        assert stats["preempted_queries"] == readmissions["tokens_queried"].sum()
        assert stats["preempted_hits"] == readmissions["tokens_hit"].sum()
        assert result.requests["preemptions"].sum() == stats["preempted_requests"]


@pytest.mark.engine
def test_teacher_forced_multi_turn_hits_at_least_free_running():
    trace = synthetic_trace(20, turns=(2, 5), user_tokens=(20, 80), reply_tokens=(40, 120), seed=7)
    forced = run_replay(trace, mode="closed-loop", concurrency=4, num_blocks=4000)
    free = run_replay(trace, mode="closed-loop", concurrency=4, num_blocks=4000, outputs="free")
    assert forced.summary["first_prefill"]["hits"] > free.summary["first_prefill"]["hits"]
    # teacher forcing: turn k+1 hits turn k's prompt and reply, all but the partial blocks
    later = forced.requests[forced.requests["turn_index"] > 0]
    assert (later["cached_tokens"] > 0).all()


@pytest.mark.engine
@pytest.mark.parametrize(
    "changes",
    [
        {"mode": "batch", "num_blocks": 140},
        {"mode": "closed-loop", "concurrency": 8, "num_blocks": 140},
        {
            "mode": "batch",
            "block_size": 8,
            "num_blocks": 300,
            "max_num_batched_tokens": 256,
            "max_num_seqs": 16,
        },
        {"mode": "batch", "max_model_len": 512, "num_blocks": 100},  # replies cut at 512
        {
            "mode": "closed-loop",
            "concurrency": 3,
            "num_blocks": 200,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 64,
        },
    ],
)
def test_decode_fast_path_changes_nothing(changes):
    trace = synthetic_trace(
        40, turns=(1, 6), user_tokens=(20, 300), reply_tokens=(5, 200), seed=3, shared_prefix=40
    )
    plain = run_replay(trace, fast_path=False, **changes)
    fast = run_replay(trace, fast_path=True, **changes)
    assert fast.manifest["engine"]["fast_path_parked_request_steps"] > 0
    for a, b in zip(comparable(plain), comparable(fast), strict=False):
        pd.testing.assert_frame_equal(a, b)


@pytest.mark.engine
def test_decode_fast_path_keeps_identical_requests_in_order():
    trace = identical_requests(30, 150, reply_tokens=90)
    for changes in ({"mode": "batch", "num_blocks": 200}, {"mode": "batch", "block_size": 8}):
        plain = run_replay(trace, fast_path=False, **changes)
        fast = run_replay(trace, fast_path=True, **changes)
        for a, b in zip(comparable(plain), comparable(fast), strict=False):
            pd.testing.assert_frame_equal(a, b)


@pytest.mark.engine
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.iloc[:0], "nothing to run: 0 requests, 0 with prompts"),
        (
            lambda t: t.assign(prompt_ids=[np.full(500, 7)] * len(t)),
            "nothing to run: 6 requests, 6",
        ),
        (lambda t: t.assign(prompt_ids=[p + 200_000 for p in t.prompt_ids]), "outside the model"),
        (lambda t: t.assign(prompt_ids=[p - 200_000 for p in t.prompt_ids]), "negative token ids"),
    ],
)
def test_a_trace_with_nothing_to_run_or_impossible_ids_is_refused(tmp_path, change, message):
    import pyarrow.parquet as pq

    from analysis.data.traces import trace_table
    from analysis.platform.errors import TraceError
    from analysis.runs.runner import run

    path = tmp_path / "bad.parquet"
    frame = change(synthetic_trace(3, turns=2, seed=12))
    pq.write_table(trace_table(frame.assign(prompt_tokens=frame.prompt_ids.map(len))), path)
    config = RunConfig(trace=str(path), engine="replay", **{**SMALL, "max_model_len": 450})
    with pytest.raises(TraceError, match=message) as caught:
        run(None, config, progress=False)
    assert str(caught.value).startswith(f"trace {path}: ")


@pytest.mark.engine
def test_skipped_prompts_are_reported_and_the_rest_runs():
    trace = synthetic_trace(6, turns=3, user_tokens=200, seed=8)
    result = run_replay(trace, max_model_len=450, num_blocks=200)
    too_long = trace["prompt_tokens"] >= 450
    assert result.summary["requests_skipped"] == int(too_long.sum())
    assert result.summary["requests_finished"] == int((~too_long).sum())
    assert set(result.summary["skipped_request_ids"]) == set(trace.loc[too_long, "request_id"])


@pytest.mark.engine
def test_result_round_trip_and_incomplete_folder(tmp_path):
    result = run_replay(synthetic_trace(4, seed=9), mode="batch")
    folder = result.write(tmp_path / result.config_id)
    assert is_complete(folder)
    again = RunResult.read(folder)
    assert again.config == result.config and again.summary == json.loads(json.dumps(result.summary))
    pd.testing.assert_frame_equal(again.admissions, result.admissions)
    assert again.block_events is None  # aggregated unless block_events="full"
    assert again.block_stats == result.block_stats
    assert not list(tmp_path.glob(".*partial*"))
    (folder / "manifest.json").unlink()
    assert not is_complete(folder)
    with pytest.raises(FileNotFoundError, match="no complete run"):
        RunResult.read(folder)


@pytest.mark.engine
def test_cli_runs_once_then_reuses_and_forces(tmp_path, capsys):
    from analysis.cli import main
    from analysis.data.traces import write_trace

    trace_path = tmp_path / "tiny.parquet"
    write_trace(trace_path, synthetic_trace(5, seed=10))
    argv = [
        "run",
        "--trace",
        str(trace_path),
        "--block-size",
        "16",
        "--num-blocks",
        "300",
        "--max-model-len",
        "2048",
        "--mode",
        "closed-loop",
        "--concurrency",
        "2",
        "--results-dir",
        str(tmp_path / "results"),
        "--no-progress",
    ]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "first-prefill hit rate" in first and "written:" in first
    folders = [p for p in (tmp_path / "results").iterdir() if not p.name.startswith(".")]
    assert len(folders) == 1 and is_complete(folders[0])
    assert folders[0].name.startswith("tiny-replay-b16-n300-cl2-")
    assert main(argv) == 0
    assert "already finished" in capsys.readouterr().out
    assert main([*argv, "--force"]) == 0
    assert "written:" in capsys.readouterr().out
    too_few = [("10" if value == "300" else value) for value in argv]
    assert main(too_few) == 2
    assert "--num-blocks >= 129" in capsys.readouterr().err


@pytest.mark.engine
def test_interrupted_run_leaves_no_complete_folder(tmp_path, monkeypatch):
    import analysis.engines.result as result_module

    result = run_replay(synthetic_trace(3, seed=11), mode="batch")

    def fail(path, obj):
        raise KeyboardInterrupt

    monkeypatch.setattr(result_module, "write_json", fail)
    with pytest.raises(KeyboardInterrupt):
        result.write(tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert not list(tmp_path.iterdir())


def test_a_trace_file_is_read_once_per_process_until_it_changes(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from analysis.data import traces
    from analysis.data.traces import trace_table
    from analysis.runs.runner import run

    reads = []
    real_load = traces.load_trace
    monkeypatch.setattr(traces, "load_trace", lambda path: reads.append(path) or real_load(path))
    path = tmp_path / "trace.parquet"

    def write(seed: int) -> None:
        frame = synthetic_trace(3, turns=2, seed=seed)
        pq.write_table(trace_table(frame.assign(prompt_tokens=frame.prompt_ids.map(len))), path)

    write(12)
    config = RunConfig(trace=str(path), engine="replay", **SMALL)
    first = run(None, config, progress=False)
    assert run(None, config.with_(num_blocks=SMALL["num_blocks"] + 8), progress=False)
    assert len(reads) == 1
    write(13)  # another trace at the same path: read again, and run as itself
    changed = run(None, config, progress=False)
    assert len(reads) == 2
    assert changed.manifest["trace"]["sha256"] != first.manifest["trace"]["sha256"]
