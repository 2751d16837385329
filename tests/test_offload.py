"""CPU offloading in replay: vLLM's OffloadingConnector driven without a model (issue 24)."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from analysis.engines.config import RunConfig
from analysis.engines.synthetic import synthetic_trace
from analysis.engines.vllm_args import config_model
from analysis.engines.workload import build_workload
from analysis.metrics import bounds
from analysis.platform.errors import ConfigError

pytestmark = pytest.mark.engine

BLOCK = 16
TRACE = synthetic_trace(12, turns=4, user_tokens=(20, 100), reply_tokens=(10, 40), seed=3)


def config_for(gpu_blocks: int) -> RunConfig:
    return RunConfig(block_size=BLOCK, num_blocks=gpu_blocks, max_model_len=512, concurrency=6)


def run_full(gpu_blocks: int, cpu_blocks: int, policy: str = "lru", prompt_only: bool = True):
    from analysis.engines.offload import run_offload

    config = config_for(gpu_blocks)
    return run_offload(
        build_workload(TRACE, config),
        config,
        config_model(config),
        cpu_blocks,
        policy,
        prompt_only=prompt_only,
    )


def run(gpu_blocks: int, cpu_blocks: int, policy: str = "lru", prompt_only: bool = True):
    return run_full(gpu_blocks, cpu_blocks, policy, prompt_only).counts


@pytest.fixture(scope="module")
def small_gpu_runs():
    """A GPU of 39 usable blocks under 6 clients: turns come back after their blocks left."""
    return {cpu: run_full(40, cpu) for cpu in (0, 200, 5000)}


@pytest.fixture(scope="module")
def small_gpu(small_gpu_runs):
    return {cpu: result.counts for cpu, result in small_gpu_runs.items()}


def test_the_recorder_sees_vllms_gpu_hits_and_one_first_admission_each(small_gpu_runs):
    for result in small_gpu_runs.values():
        assert result.first_prefill_gpu_hit_tokens == result.counts.gpu_hit_tokens
        first = result.admissions[result.admissions["kind"] == "first"]
        assert sorted(first["request_index"]) == list(range(len(TRACE)))
        ordered = bounds.in_engine_order(TRACE, result.admissions)
        assert len(ordered) == len(TRACE)


def test_no_cpu_is_plain_replay():
    """cpu_blocks=0 runs without the connector: the same first-prefill hits as `replay`."""
    from analysis.runs import run as run_engine

    config = config_for(40)
    plain = run_engine(TRACE, config, progress=False)
    first = plain.admissions[plain.admissions["kind"] == "first"]
    result = run_full(40, 0)
    assert result.counts.cpu_hit_tokens == result.counts.stored_blocks == 0
    assert result.counts.gpu_hit_tokens == int(first["tokens_hit"].sum())
    assert result.counts.preemptions == int(plain.requests["preemptions"].sum())


def test_counts_add_up_and_the_cpu_gives_hits(small_gpu):
    counts = small_gpu[200]
    assert counts.prompt_tokens == int(TRACE["prompt_tokens"].sum())
    assert counts.cpu_hit_tokens > counts.gpu_hit_tokens > 0
    assert counts.computed_prompt_tokens == (
        counts.prompt_tokens - counts.gpu_hit_tokens - counts.cpu_hit_tokens
    )
    # Loads also serve re-admissions after preemption, which the first-admission hits leave out.
    assert counts.loaded_blocks * BLOCK >= counts.cpu_hit_tokens
    assert counts.load_jobs > 0 and counts.store_jobs > 0
    assert 0 < counts.stored_never_loaded < counts.stored_blocks
    assert counts.evicted_blocks > 0 and counts.store_refusals == 0


def test_a_cpu_that_never_evicts_stores_each_distinct_prompt_block_once(small_gpu):
    counts = small_gpu[5000]
    distinct = bounds.index_trace(TRACE).block_keys(BLOCK).num_keys  # prompt blocks only
    assert counts.evicted_blocks == 0
    assert counts.stored_blocks == distinct  # write-through, prompt blocks (vLLM's default)
    assert counts.cpu_hit_tokens >= small_gpu[200].cpu_hit_tokens


def test_a_gpu_that_never_evicts_loads_nothing():
    counts = run(400, 200)
    ideal = bounds.ideal_bound(bounds.index_trace(TRACE, include_outputs=True), BLOCK).hit_tokens
    assert counts.gpu_hit_tokens == ideal
    assert counts.cpu_hit_tokens == counts.loaded_blocks == counts.preemptions == 0
    assert counts.stored_never_loaded == counts.stored_blocks > 0  # every store was wasted


def test_arc_runs_and_an_unknown_policy_is_named():
    assert run(40, 200, "arc").cpu_hit_tokens > 0
    with pytest.raises(ConfigError, match="eviction_policy='fifo'"):
        run(40, 200, "fifo")
    with pytest.raises(ConfigError, match="cpu_blocks=-1"):
        run(40, -1)


def test_offloading_in_seconds_without_a_clock_is_refused_in_one_line():
    from analysis.engines.offload import run_offload

    config = config_for(40).with_(think_time_s=0.5)
    with pytest.raises(ConfigError, match="in seconds needs a clock"):
        run_offload(build_workload(TRACE, config), config, config_model(config), 200)


# --------------------------------------------------------------------------- on a clock
def write_profile(path) -> str:
    coefficients = {"fixed": 0.004, "token": 2e-5, "new_request": 1e-3, "decode_context": 5e-4}
    path.write_text(json.dumps({"coefficients": coefficients, "admit_s": 2e-4, "loop_s": 1e-4}))
    return str(path)


def run_timed(config: RunConfig, cpu_blocks: int, bytes_per_s: float = 64e9):
    from analysis.engines.offload import run_offload

    workload = build_workload(TRACE, config)
    return run_offload(
        workload, config, config_model(config), cpu_blocks, host_link_bytes_per_s=bytes_per_s
    )


ARRIVALS = {
    "closed-loop": {},
    "poisson": {"mode": "poisson", "arrival_rate": 20.0},
    "think-time": {"think_time_s": 0.05},
}


@pytest.mark.parametrize("arrivals", list(ARRIVALS))
def test_no_cpu_on_a_clock_is_replay_on_the_same_clock_to_the_bit(tmp_path, arrivals):
    """The offloading loop on a clock charges, admits and idles as `replay` on a clock does:
    with no CPU tier, every request's times and every step's are the same floats."""
    from analysis.runs import run as run_engine

    config = config_for(40).with_(clock=write_profile(tmp_path / "p.json"), **ARRIVALS[arrivals])
    offload = run_timed(config, 0)
    replay = run_engine(TRACE, config.with_(engine="replay"), progress=False)
    for column in ("arrival_s", "first_token_s", "finish_s", "ttft_s"):
        assert offload.requests[column].tolist() == replay.requests[column].tolist(), column
    for column in ("tokens", "start_s", "wall_s"):
        assert offload.steps[column].tolist() == replay.steps[column].tolist(), column
    assert offload.link_seconds == {"load": 0.0, "store": 0.0}


def test_a_link_that_costs_nothing_changes_no_count_and_a_slow_one_makes_loads_wait(tmp_path):
    """In closed loop, a clock whose link is too fast to matter gives the count-only run's
    counts exactly; a slow link charges each loaded and stored block its bytes, and requests
    that hit the CPU wait for them."""
    from analysis.engines.offload.driver import cpu_block_bytes

    config = config_for(40).with_(clock=write_profile(tmp_path / "p.json"))
    free = run_timed(config, 200, bytes_per_s=1e30)
    # every count; the step count less the count-only loop's last step, which only reports
    # the final stores finished (on a clock the run ends with its last request)
    assert replace(free.counts, steps=0) == replace(run(40, 200), steps=0)
    slow = run_timed(config, 200, bytes_per_s=1e6)
    block = cpu_block_bytes(config, config_model(config))
    assert slow.link_seconds["load"] == pytest.approx(slow.counts.loaded_blocks * block / 1e6)
    assert slow.link_seconds["store"] == pytest.approx(slow.counts.stored_blocks * block / 1e6)
    assert slow.requests["ttft_s"].median() > 2 * free.requests["ttft_s"].median()
    assert (slow.requests["status"] == "finished").all()


def test_the_offload_table_reading_and_checks():
    from analysis.sweeps.offload import COLUMNS, offload_checks, offload_reading, offload_table

    table = offload_table(TRACE, gpu_blocks=40, clients=6, multiples=(0, 1, 4), max_model_len=512)
    assert list(table.columns) == COLUMNS and list(table["multiple"]) == [0, 1, 4]
    assert table.loc[0, "cpu_hit_rate"] == 0 and table.loc[2, "cpu_hit_rate"] > 0
    offload_checks(table).assert_all()
    reading = offload_reading(table)
    assert "stops helping" in reading and f"{100 * table.loc[2, 'total']:.1f} %" in reading
    # the 0x row's check can fail: a store without a connector is reported
    wrong = table.copy()
    wrong.attrs = table.attrs
    wrong.loc[0, "stored_blocks"] = 1
    failed = [c.claim for c in offload_checks(wrong).items if not c.holds]
    assert failed == ["0x (no connector): no block stored or loaded"]
    # the plateau the reading names can fail: a middle size 2 points above the largest
    bump = table.copy()
    bump.attrs = table.attrs
    bump.loc[1, "total"] = table.loc[2, "total"] + 0.005
    bump.loc[2, "total"] = table.loc[2, "total"] - 0.02
    bump = pd.concat([bump, bump.iloc[[2]].assign(multiple=8, total=table.loc[2, "total"])])
    bump.attrs = table.attrs
    failed = [c.claim for c in offload_checks(bump).items if not c.holds]
    assert any(f.startswith("from 1x on, every CPU size's total") for f in failed), failed


def test_the_offload_figure_shows_the_replies_stored_run():
    import matplotlib

    matplotlib.use("Agg")
    from analysis.plots.offload import hit_rate_by_tier_figure
    from analysis.sweeps.offload import offload_table

    table = offload_table(TRACE, gpu_blocks=40, clients=6, multiples=(0, 4), max_model_len=512)
    assert "replies_stored" in table.attrs
    fig = hit_rate_by_tier_figure(table)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert len(labels) == 3 and labels[-1].endswith("replies too")
    assert any("replies stored" in t.get_text() for t in fig.axes[0].get_legend().get_texts())


def test_the_offload_table_is_kept_and_read_back_whole(tmp_path, monkeypatch):
    from analysis.sweeps.offload import cached_offload_table

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    settings = dict(gpu_blocks=40, clients=6, multiples=(0, 4), max_model_len=512)
    table, path = cached_offload_table(TRACE, **settings)
    assert path.is_file() and path.parent == tmp_path / "data" / "results" / "offload"
    again, same = cached_offload_table(TRACE, **settings)
    assert same == path
    assert again.equals(table)
    assert again.attrs == table.attrs  # the multiples come back as int keys
    other, elsewhere = cached_offload_table(TRACE, **{**settings, "multiples": (0, 1)})
    assert elsewhere != path and list(other["multiple"]) == [0, 1]


@pytest.mark.parametrize("cut", ["json", "parquet"])
def test_a_cut_kept_offload_file_is_computed_again_with_a_note(tmp_path, monkeypatch, capsys, cut):
    """Row 15.5: the kept JSON cut at 300 bytes was a JSONDecodeError traceback out of
    notebook 16; now the loader says which file and computes the table again, whole."""
    from analysis.sweeps.offload import cached_offload_table

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    settings = dict(gpu_blocks=40, clients=6, multiples=(0, 4), max_model_len=512)
    table, path = cached_offload_table(TRACE, **settings)
    broken = path.with_suffix(f".{cut}")
    whole = broken.read_bytes()
    broken.write_bytes(whole[: min(300, len(whole) // 2)])
    capsys.readouterr()
    again, same = cached_offload_table(TRACE, **settings)
    assert f"{broken} cannot be read" in capsys.readouterr().err
    assert same == path and again.equals(table) and again.attrs == table.attrs
    assert broken.read_bytes() == whole if cut == "json" else len(broken.read_bytes()) > 300


def test_prefill_time_saved_is_tokens_over_the_rate():
    import pandas as pd

    from analysis.sweeps.offload import prefill_time_reading, prefill_time_saved

    table = pd.DataFrame(
        {
            "multiple": [2, 0, 1],
            "cpu_blocks": [80, 0, 40],
            "computed_prompt_tokens": [400, 1000, 700],
        }
    )
    saved = prefill_time_saved(table, 100.0)
    assert saved["tokens_saved"].tolist() == [0, 300, 600]
    assert saved["prefill_s_saved_derived"].tolist() == [0.0, 3.0, 6.0]
    assert saved["share_of_prefill_saved"].iloc[-1] == pytest.approx(0.6)
    reading = prefill_time_reading(saved, 100.0, "a test rate")
    assert "Derived, not measured" in reading and "600 tokens, 6.0 s (60.0 %)" in reading
    with pytest.raises(ValueError, match="prefill_tok_s=0"):
        prefill_time_saved(table, 0)


def test_a_setting_that_does_not_exist_is_named():
    from analysis.sweeps.offload import setting

    assert setting("large").gpu_blocks == 2800
    with pytest.raises(ValueError, match="setting='huge': choose one of default, large"):
        setting("huge")


def test_storing_replies_too_is_vllms_own_switch():
    """`prompt_only=False` turns vLLM's `offload_prompt_only` off: the connector then stores
    reply blocks as well, so it stores more, and the table reports that run."""
    from analysis.sweeps.offload import offload_reading, offload_table

    prompts, both = run(40, 5000), run(40, 5000, prompt_only=False)
    assert both.stored_blocks > prompts.stored_blocks
    table = offload_table(TRACE, gpu_blocks=40, clients=6, multiples=(0, 4), max_model_len=512)
    replies = table.attrs["replies_stored"]
    assert replies["multiple"] == 4 and replies["stored_blocks"] > table.loc[1, "stored_blocks"]
    assert "with replies stored too, the 4x run gives" in offload_reading(table)


def test_with_replies_stored_a_cpu_that_never_evicts_gives_the_ideal():
    """Every block vLLM computes, reply blocks included, goes to a CPU that keeps them all, so
    the two tiers together hit exactly what an infinite cache hits in the engine's order. It
    fails if the connector's scheduler half misses blocks allocated after a request's first
    step (the payload the replay engine skips without a connector)."""
    result = run_full(40, 5000, prompt_only=False)
    ordered = bounds.in_engine_order(TRACE, result.admissions)
    ideal = bounds.ideal_bound(bounds.index_trace(ordered, include_outputs=True), BLOCK)
    counts = result.counts
    assert counts.preemptions > 0 and counts.evicted_blocks == 0  # the GPU is what evicts
    assert counts.gpu_hit_tokens + counts.cpu_hit_tokens == ideal.hit_tokens
