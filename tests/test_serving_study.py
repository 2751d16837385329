"""The serving study's parameter sets and the thrash case's sizing (no server: the real
server's pool is checked against `kv_pool_blocks` in test_serving.py)."""

from __future__ import annotations

import math

import pytest

from analysis import cli
from analysis.platform.paths import figures_dir, repo_root
from analysis.serving import study


def test_the_cpu_study_set_samples_at_decision_grade():
    p = study.params("cpu-study")
    assert p.min_requests * p.repeats >= 32  # measured requests per cell, at the least
    assert {16, 32} <= set(p.concurrency) and p.thrash
    # several waves of requests at the highest concurrency: a steady state, not one burst
    assert p.min_requests >= 3 * max(p.concurrency)
    # the same servers as the default set: its cached runs are shared with notebooks 10-12
    assert p.bench().server_config("m", "cache") == study.params("cpu").bench().server_config(
        "m", "cache"
    )
    assert not study.params("cpu").thrash


def test_an_unknown_parameter_set_is_a_one_line_error(capsys):
    with pytest.raises(ValueError, match="cpu-study"):
        study.params("cpu-large")
    assert cli.main(["report", "--profile", "cpu-large"]) == 2
    err = capsys.readouterr().err.strip()
    assert "profile must be one of" in err and "\n" not in err


@pytest.mark.parametrize(("capacity", "prefix"), [(682, 1024), (341, 1024), (682, 256), (40, 1000)])
def test_thrash_prefixes_need_twice_the_pool(capacity, prefix):
    p = study.params("cpu")
    k = study.thrash_prefixes(capacity, p, prefix)
    blocks = math.ceil(prefix / p.block_size)
    assert k * blocks >= 2 * capacity > (k - 1) * blocks


def test_a_study_keeps_its_figures_apart(monkeypatch):
    monkeypatch.delenv("PREFIX_CACHE_LAB_FIGURES", raising=False)
    assert figures_dir() == repo_root() / "figures"
    monkeypatch.setenv("PREFIX_CACHE_LAB_FIGURES", "figures/cpu-study")
    assert figures_dir() == repo_root() / "figures" / "cpu-study"


def test_the_write_up_quotes_a_measured_thrash_case_once():
    from analysis.serving import writeup as w

    thrash = "thrash: 43 distinct prefixes (2x the pool), round robin"
    facts = w.Facts(study.params("cpu-study"))
    facts.patterns = {"one shared prefix": 0.977, thrash: 0.012}
    facts.pattern_ttft = {
        "one shared prefix": w.Interval(0.07, 0.06, 0.08),
        thrash: w.Interval(0.70, 0.69, 0.71),
    }
    facts.ttft[("no_cache", 1024, 1)] = w.Interval(0.69, 0.68, 0.70)
    text = w.decision_markdown(facts)
    assert text.count(thrash) == 1 and "0.700 s [0.690-0.710]" in text
    claims = w.claims_table(facts).set_index("claim")
    assert claims.loc[f"003 anti-pattern: {thrash}", "verdict"] == (
        "thrashes: almost nothing reused"
    )
    assert "as slow as caching off" in text
    # thrash measured faster than caching off is said so, not called a total loss
    facts.ttft[("no_cache", 1024, 1)] = w.Interval(0.80, 0.79, 0.81)
    assert "a little faster than caching off" in w.decision_markdown(facts)
    assert "thrash" not in w.decision_markdown(w.Facts(study.params("cpu"))).split("Caveats")[0]


def test_the_open_loop_runs_at_a_share_of_the_closed_loops_caching_off_rate():
    import pandas as pd

    from analysis.serving.calibrate import Calibration

    chosen = study.Plan(Calibration(1000.0, 0.05, 0.03, 32), 6, 40.0, 60.0, "conversations")
    closed_loop = pd.DataFrame(
        [
            {"mode": "cache", "req_s": 5.0, "requests_per_repeat": 24},
            {"mode": "no_cache", "req_s": 2.0, "requests_per_repeat": 24},
        ]
    )
    # caching off finished 2 requests/s of conversations of 4 turns: 0.5 conversations/s
    rate = study.open_loop_rate(closed_loop, chosen)
    assert rate == pytest.approx(study.OPEN_LOOP_LOAD * 0.5)
    config = study.sharegpt_open_loop_config(study.params("cpu"), chosen, rate)
    assert config.arrival_rate == rate and config.workload == "sharegpt"
    assert config.concurrency == (6,) and config.requests == 6  # a cap that never binds
    assert config.regimes() == (f"poisson{rate:g}",)


def test_a_notebooks_conversations_to_predict_read_as_a_count():
    assert study.conversations_to_predict(None) == study.PREDICTED_CONVERSATIONS
    assert study.conversations_to_predict("all") is None  # every conversation of the trace
    assert study.conversations_to_predict(12) == 12
    for bad in (0, -3, "some", 2.5, True):
        with pytest.raises(ValueError, match="predicted_conversations"):
            study.conversations_to_predict(bad)


def test_the_check_at_many_clients_runs_only_where_the_parameter_set_asks():
    assert study.params("cpu").check_clients is None
    assert study.params("cpu-study").check_clients == 64
    # no check asked: nothing is measured (no server is even asked for)
    assert study.sharegpt_check_section(None, study.params("cpu")) is None
    config = study.sharegpt_check_config(study.params("cpu", check_clients=32), 32)
    assert config.workload == "sharegpt" and config.concurrency == (32,)
    assert config.requests == study.CHECK_CONVERSATIONS and config.arrival_rate is None
    assert config.request_timeout_s == study.CHECK_REQUEST_TIMEOUT_S
    # the same server flags as the notebook's other sections: the same pair serves it
    closed = study.params("cpu").bench(workload="sharegpt")
    assert config.server_config("m", "cache") == closed.server_config("m", "cache")


def test_the_study_pool_has_as_many_blocks_in_float32_as_in_bf16(monkeypatch, tmp_path):
    """An AVX2 CPU runs the study's model in float32: with the pool's bytes fixed it had half
    the blocks, and notebook 10's replayed one-client hit rate came out 0.4774 against 0.477,
    a difference nbval reports. The bytes follow the KV dtype; the blocks do not. (The small
    local model, built in both dtypes under a root of its own.)"""
    from analysis.serving import replayable

    monkeypatch.setenv("PREFIX_CACHE_LAB_ROOT", str(tmp_path))
    blocks, pool_bytes = {}, {}
    for dtype in ("bfloat16", "float32"):
        monkeypatch.setenv("PREFIX_CACHE_LAB_DTYPE", dtype)
        p = study.params("cpu", model="tiny-llama")
        pool_bytes[dtype] = p.bench().kv_cache_memory_bytes
        blocks[dtype] = replayable.engine_settings(p.bench())["num_blocks"]
        assert study.engine_config(p).kv_cache_memory_bytes == pool_bytes[dtype]  # notebook 11
    fixed = p.kv_cache_memory_bytes
    assert pool_bytes == {"bfloat16": fixed, "float32": 2 * fixed}
    assert blocks["bfloat16"] == blocks["float32"] > 0
    # what the pool's bytes alone gave a float32 model before
    assert study.kv_pool_blocks("tiny-llama", p.block_size, fixed) == blocks["float32"] // 2


def test_the_gpu_sets_servers_share_one_gpu_and_run_as_the_profiled_engine():
    """Both servers run at once (a `ServerPair`), so their memory shares must fit one GPU; and
    they run as the engine that measures the step-cost profile (eager, one schedule per step),
    which is what the served calibration replays them with. The flags are vLLM's own names."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from analysis.engines.vllm_args import SHARED_SETTINGS

    p = study.params("gpu")
    assert 2 * p.gpu_memory_utilization <= 1.0
    for mode in ("cache", "no_cache"):
        flags = p.bench().server_config(p.model, mode).flags()
        assert flags[flags.index("--gpu-memory-utilization") + 1] == str(p.gpu_memory_utilization)
        assert ("--enforce-eager" in flags) is SHARED_SETTINGS["enforce_eager"]
        assert ("--no-async-scheduling" in flags) is (SHARED_SETTINGS["async_scheduling"] is False)
    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    parsed = parser.parse_args(["--enforce-eager", "--no-async-scheduling"])
    assert (parsed.enforce_eager, parsed.async_scheduling) == (True, False)
    # the CPU sets pass no extra flag: their servers (and cached runs) are as they were
    assert study.params("cpu").bench().server_extra_args == ()
