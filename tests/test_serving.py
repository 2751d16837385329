"""Server lifecycle, benchmark bookkeeping, and the real vLLM server and engine end to end.

Fast tests use a stand-in server (a small Python HTTP server that leaves a SIGTERM-proof
grandchild in its process group) to check start, readiness, failure reports and that the
whole group always goes away. Tests marked `engine` start the real `vllm serve` or
`vllm.LLM` with the tiny random-weight Llama; each server start costs 20-50 s on 2 cores.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import psutil
import pytest

from analysis import serving
from analysis.engines.timed_arrivals import poisson_starts
from analysis.metrics.server_clocks import RECORDED_CLOCK_COLUMNS, decode_clocks, server_clocks
from analysis.platform.errors import ConfigError
from analysis.serving import (
    RunKey,
    ServerConfig,
    ServerStartError,
    VllmServer,
    kept_servers,
    loadgen,
    replayable,
    study,
)
from analysis.serving import server as serving_server
from analysis.serving.bench_run import synthetic_specs

FAKE_SERVER = textwrap.dedent(
    """\
    import argparse, json, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int)
    parser.add_argument("--served-model-name")
    parser.add_argument("--fake-mode", default="ok")
    args, _ = parser.parse_known_args()
    print("stand-in server starting", flush=True)
    # A grandchild in the same process group that ignores SIGTERM: only SIGKILL ends it.
    subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    if args.fake_mode == "exit":
        print("RuntimeError: stand-in failure for the test", flush=True)
        sys.exit(3)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if args.fake_mode == "never-ready":
                self.send_response(503)
                self.end_headers()
                return
            bodies = {
                "/health": b"",
                "/v1/models": json.dumps({"data": [{"id": args.served_model_name}]}).encode(),
                "/metrics": b'vllm:prefix_cache_queries_total{engine="0"} 5.0\\n',
            }
            body = bodies.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def do_POST(self):  # a completion that streams one chunk every 50 ms for a minute
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunk = json.dumps({"choices": [{"index": 0, "text": "x"}]})
            for _ in range(1200):
                self.wfile.write(f"data: {chunk}\\n\\n".encode())
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"data: [DONE]\\n\\n")

        def log_message(self, *args):
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
    """
)


@pytest.fixture
def fake_launcher(tmp_path, monkeypatch):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    monkeypatch.setattr(
        serving_server, "server_launcher", lambda model: [sys.executable, str(script)]
    )
    return script


def _fake_config(**kwargs) -> ServerConfig:
    return ServerConfig(model="tiny-llama", stop_grace_s=0.5, startup_timeout_s=60, **kwargs)


def _alive(pgid: int) -> list[int]:
    return serving_server._group_members(pgid)


# ---------------------------------------------------------------------------- fast: lifecycle


def test_server_flags_differ_only_in_the_caching_flag():
    on = ServerConfig(model="tiny-llama", prefix_caching=True).flags()
    off = ServerConfig(model="tiny-llama", prefix_caching=False).flags()
    assert [a for a in on if a not in off] == ["--enable-prefix-caching"]
    assert [a for a in off if a not in on] == ["--no-enable-prefix-caching"]
    assert on[on.index("--host") + 1] == "127.0.0.1"
    assert on[on.index("--block-size") + 1] == "32"
    assert "--kv-cache-memory-bytes" in on and "--enforce-eager" in on


def test_launcher_runs_the_real_server_entry_point():
    command = serving.server_command(ServerConfig(model="tiny-llama"), 1234)
    assert command[-2:] == ["--port", "1234"]
    if command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
        assert command[0] == sys.executable and command[3:5] == ["--model", "tiny-llama"]
    else:
        assert command[1:3] == ["serve", "tiny-llama"]


def test_free_port_can_be_bound():
    port = serving.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_stand_in_server_starts_and_its_whole_group_is_killed(fake_launcher, tmp_path):
    started = time.perf_counter()
    with VllmServer(_fake_config(), tmp_path / "server.log") as server:
        ready = time.perf_counter()
        pgid = server.pgid
        # the start-up time is measured from launch to ready, inside what we timed around it
        assert 0 < server.startup_s <= ready - started
        assert len(_alive(pgid)) == 2  # the server and its SIGTERM-proof child
        assert server.counters() == {"vllm:prefix_cache_queries": 5.0}
    assert _alive(pgid) == []
    server.stop()  # a second stop is harmless


def _bench_for_fake(**changes) -> serving.ServingBenchConfig:
    return serving.ServingBenchConfig(model="tiny-llama", startup_timeout_s=60, **changes)


def test_a_kept_server_is_found_by_its_exact_flags_and_outlives_a_pair(fake_launcher, tmp_path):
    bench = _bench_for_fake()
    model = serving.resolve_model("tiny-llama")
    quick = dataclasses.replace(bench.server_config(model, "cache"), stop_grace_s=0.5)
    with VllmServer(quick, tmp_path / "kept.log") as server:
        assert kept_servers.lookup(server.config) is None  # nothing published
        published_entry = kept_servers.entry(server)
        with kept_servers.published([server]) as registry:
            # a process started inside the block (a notebook's kernel) finds it
            child = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "from analysis.serving import kept_servers as k, ServingBenchConfig as B, "
                    "resolve_model as r\n"
                    "found = k.lookup(B(model='tiny-llama', startup_timeout_s=60)"
                    ".server_config(r('tiny-llama'), 'cache'))\n"
                    "print(found.base_url if found else None)",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            assert child.stdout.strip() == server.base_url
            # a pair attaches to it instead of starting one (its own stop grace does not make
            # it another server), and lets it be when it stops
            said: list[str] = []
            with serving.ServerPair(root=tmp_path, log=said.append) as pair:
                (attached,) = pair.get(bench, model, ["cache"]).values()
                assert attached.base_url == server.base_url and attached.pid is None
            assert any("using the kept vLLM server (cache)" in line for line in said)
            assert _alive(server.pgid) and serving_server._http(f"{server.base_url}/health")[0]
            # any other flag, or the other mode, is not this server
            assert (
                kept_servers.lookup(_bench_for_fake(block_size=16).server_config(model, "cache"))
                is None
            )
            assert kept_servers.lookup(bench.server_config(model, "no_cache")) is None
        assert not registry.exists() and kept_servers.ENV not in os.environ
        assert kept_servers.lookup(server.config) is None
    with kept_servers.published([]) as registry:  # a kept server that is gone is not used
        registry.write_text(json.dumps([published_entry]))
        assert kept_servers.lookup(server.config) is None


def test_a_pair_launched_early_waits_for_those_servers_once(fake_launcher, tmp_path, monkeypatch):
    monkeypatch.setattr(serving.benchmark, "warm_server", lambda server, config: None)
    bench = _bench_for_fake()
    model = serving.resolve_model("tiny-llama")
    said: list[str] = []
    with serving.ServerPair(root=tmp_path, log=said.append) as pair:
        pair.launch(bench, model, serving.MODES)
        launched = dict(pair.servers)
        # started, not waited for: no start-up time yet
        assert sorted(launched) == sorted(serving.MODES)
        assert all(math.isnan(server.startup_s) for server in launched.values())
        ready = pair.get(bench, model, serving.MODES)
        assert ready == launched  # the same processes, now ready
        assert all(server.startup_s > 0 for server in ready.values())
        assert pair.get(bench, model, serving.MODES) == launched  # nothing waits twice
        groups = [server.pgid for server in ready.values()]
        for server in ready.values():  # their SIGTERM-proof children: no need to wait long
            server.config = dataclasses.replace(server.config, stop_grace_s=0.5)
    assert sum("starting vLLM server" in line for line in said) == 2
    assert sum("ready in" in line for line in said) == 2
    assert all(_alive(group) == [] for group in groups)


def test_a_stopped_or_unlaunched_server_cannot_be_kept(fake_launcher):
    with pytest.raises(ValueError, match="only a server this process launched"):
        kept_servers.entry(VllmServer(_fake_config()))


def test_an_error_inside_the_block_still_stops_the_server(fake_launcher):
    with pytest.raises(ZeroDivisionError), VllmServer(_fake_config()) as server:
        pgid = server.pgid
        _ = 1 / 0
    assert _alive(pgid) == []
    assert serving_server._LIVE == {}


def test_a_server_that_exits_during_start_up_reports_its_log_tail(fake_launcher):
    config = _fake_config(extra_args=("--fake-mode", "exit"))
    server = VllmServer(config)
    with pytest.raises(ServerStartError) as caught:
        server.start()
    message = str(caught.value)
    first_line = message.splitlines()[0]
    assert "exited with status 3 during start-up" in first_line
    assert "RuntimeError: stand-in failure for the test" in first_line
    assert "stand-in server starting" in message  # the tail of the log
    assert _alive(server.pgid) == []  # the orphan-prone grandchild too


def test_a_server_that_never_gets_ready_times_out_and_is_stopped(fake_launcher):
    config = ServerConfig(
        model="tiny-llama",
        stop_grace_s=0.5,
        startup_timeout_s=3,
        extra_args=("--fake-mode", "never-ready"),
    )
    server = VllmServer(config)
    with pytest.raises(ServerStartError, match="was not ready after 3 s"):
        server.start()
    assert _alive(server.pgid) == []


PARENT = textwrap.dedent(
    """\
    import sys, time
    from analysis import serving
    {patch}
    config = serving.ServerConfig(model={model!r}, stop_grace_s={grace})
    with serving.VllmServer(config) as server:
        print(server.pgid, flush=True)
        {work}
    """
)


def _start_parent(tmp_path, *, patch="", model="tiny-llama", grace=0.5, work="time.sleep(600)"):
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(patch=patch, model=model, grace=grace, work=work))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )


def _read_pgid(parent: subprocess.Popen) -> int:
    line = parent.stdout.readline()
    if not line:
        raise AssertionError(f"the parent died before the server was ready: {parent.stderr.read()}")
    return int(line)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_parent_ends_the_server_group(fake_launcher, tmp_path, signum):
    launcher = f"lambda model: [sys.executable, {str(fake_launcher)!r}]"
    patch = f"from analysis.serving import server; server.server_launcher = {launcher}"
    parent = _start_parent(tmp_path, patch=patch)
    try:
        pgid = _read_pgid(parent)
        assert len(_alive(pgid)) == 2
        parent.send_signal(signum)
        parent.wait(timeout=30)
        assert _alive(pgid) == []
        assert parent.returncode != 0
    finally:
        parent.kill()
        parent.wait()


# ---------------------------------------------------------------------------- fast: bookkeeping


def test_config_rejects_what_cannot_run():
    with pytest.raises(ValueError, match="workload"):
        serving.ServingBenchConfig(workload="poisson")
    with pytest.raises(ValueError, match="modes"):
        serving.ServingBenchConfig(modes=("cache", "half"))
    with pytest.raises(ValueError, match="max_model_len"):
        serving.ServingBenchConfig(prefixes=(4096,), max_model_len=4096)
    with pytest.raises(ValueError, match="fractions"):
        serving.PrefixSweepConfig(fractions=(1.2,))


def test_run_ids_are_stable_and_change_with_what_shapes_a_run(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    config = serving.ServingBenchConfig()
    key = RunKey("cache", "2048", 8)
    first = serving.run_id(config, str(model), key)
    assert first.startswith("synthetic-cache-p2048-c8-")
    assert first == serving.run_id(config, str(model), key)
    # the swept lists do not change a run's id: a bigger sweep reuses finished runs
    wider = serving.ServingBenchConfig(prefixes=(0, 2048), concurrency=(1, 8, 16))
    assert serving.run_id(wider, str(model), key) == first
    others = {
        serving.run_id(config, str(model), RunKey("no_cache", "2048", 8)),
        serving.run_id(config, str(model), RunKey("cache", "1024", 8)),
        serving.run_id(config, str(model), RunKey("cache", "2048", 1)),
        serving.run_id(serving.ServingBenchConfig(output_tokens=8), str(model), key),
        serving.run_id(config, str(model), key, workload_hash="abc"),
        serving.run_id(serving.ServingBenchConfig(requests_per_client=3), str(model), key),
    }
    (model / "config.json").write_text('{"hidden_size": 16}')
    others.add(serving.run_id(config, str(model), key))
    assert first not in others and len(others) == 7


def test_run_ids_of_runs_cached_before_are_found_again():
    # a run's id is how its cached folder is found: a new field left at its default must not
    # move the ids of closed loops, open loops or ShareGPT cells measured before it existed
    pinned = {
        (serving.ServingBenchConfig(), RunKey("cache", "1024", 4)): (
            "synthetic-cache-p1024-c4-a1d4ee6423"
        ),
        (
            serving.ServingBenchConfig(workload="sharegpt", arrival_rate=0.5, concurrency=(6,)),
            RunKey("cache", "poisson0.5", 6),
        ): "sharegpt-cache-poisson0.5-c6-414bb1eb9c",
        (
            serving.ServingBenchConfig(workload="sharegpt", concurrency=(4,)),
            RunKey("no_cache", "sharegpt", 4),
        ): "sharegpt-no_cache-sharegpt-c4-11b80b1283",
    }
    for (config, key), expected in pinned.items():
        assert serving.run_id(config, "prefill-llama", key) == expected


def _summary(mode, regime, concurrency, ttft, req_s):
    return {
        "workload": "synthetic",
        "mode": mode,
        "prefix_regime": regime,
        "concurrency": concurrency,
        "mean_ttft_s": ttft,
        "p95_ttft_s": ttft * 1.5,
        "mean_e2e_s": ttft + 1,
        "p95_e2e_s": ttft + 2,
        "req_s": req_s,
        "tok_s": req_s * 16,
        "notes": "",
        "hit_rate": 0.9 if mode == "cache" else float("nan"),
        "predicted_saving": 0.5,
    }


def test_summaries_of_finished_runs_only_and_mode_comparison(tmp_path):
    for name, summary in {
        "a": _summary("cache", "2048", 1, 0.1, 2.0),
        "b": _summary("no_cache", "2048", 1, 1.0, 0.5),
        "c": _summary("cache", "512", 1, 0.2, 1.0),
        "d": _summary("no_cache", "512", 1, 0.4, 1.0),
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
        (tmp_path / name / "manifest.json").write_text("{}")
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "summary.json").write_text(
        json.dumps(_summary("cache", "0", 1, 9, 9))
    )
    table = serving.summary_table(serving.load_summaries(root=tmp_path))
    assert list(table.columns[:10]) == list(serving.SUMMARY_COLUMNS)
    assert list(zip(table.prefix_regime, table["mode"], strict=True)) == [
        ("512", "cache"),
        ("512", "no_cache"),
        ("2048", "cache"),
        ("2048", "no_cache"),
    ]
    comparison = serving.compare_modes(table).set_index("prefix_regime")
    assert comparison.loc["2048", "ttft_ratio"] == pytest.approx(10.0)
    assert comparison.loc["2048", "measured_saving"] == pytest.approx(0.9)
    assert comparison.loc["512", "ttft_ratio"] == pytest.approx(2.0)
    assert comparison.loc["2048", "throughput_ratio"] == pytest.approx(4.0)


def test_sweep_table_puts_modes_side_by_side_with_realized_hit_rates():
    sweep = pd.DataFrame(
        {
            "mode": ["cache", "no_cache", "cache", "no_cache", "cache", "no_cache"],
            "experiment": ["sweep"] * 6,
            "fraction": [0.0, 0.0, 1.0, 1.0, 1.0, 1.0],
            "req_s": [1.0, 1.0, 4.0, 1.0, 6.0, 1.0],
            "hit_rate": [0.0, 0.0, 0.8, 0.0, 0.9, 0.0],
        }
    )
    wide = serving.sweep_table(sweep).set_index("fraction")
    assert wide.loc[1.0, "cache"] == 5.0 and wide.loc[1.0, "speedup"] == 5.0
    assert wide.loc[1.0, "cache_hit_rate"] == pytest.approx(0.85)
    assert wide.loc[1.0, "cache_lo"] >= 4.0 and wide.loc[1.0, "cache_hi"] <= 6.0
    assert wide.loc[0.0, "no_cache_hit_rate"] == 0.0 and wide.loc[1.0, "batches"] == 2
    ratio, low, high = serving.ratio_interval([2.0, 2.0], [1.0, 1.0])
    assert (ratio, low, high) == (2.0, 2.0, 2.0)


def test_long_prefill_table_has_one_row_per_mode_and_round():
    rows = pd.DataFrame(
        {
            "mode": ["cache"] * 4,
            "experiment": ["long_prefill"] * 4,
            "output_len": [2, 2, 8, 8],
            "round": [1, 2, 1, 2],
            "req_s": [1.0, 40.0, 0.9, 10.0],
        }
    )
    table = serving.long_prefill_table(rows)
    assert table.loc["cache-round2", 2] == 40.0 and list(table.columns) == [2, 8]
    assert serving.long_prefill_table(rows.assign(experiment="sweep")).empty


def test_calibration_scales_requests_and_timeouts_with_the_measured_speed():
    slow = serving.Calibration(
        prefill_tok_s=1000.0, fixed_s=0.05, decode_step_s=0.05, probe_tokens=1024
    )
    fast = serving.Calibration(
        prefill_tok_s=10000.0, fixed_s=0.05, decode_step_s=0.05, probe_tokens=1024
    )
    cells = [(2048, 4, 1), (24, 4, 1)]
    assert serving.plan_requests(fast, cells, 60.0) > serving.plan_requests(slow, cells, 60.0)
    assert serving.plan_requests(slow, cells, 0.0) == 8  # the minimum, never zero
    assert serving.plan_requests(fast, cells, 1e6) == 32  # the maximum
    assert slow.timeout_s(2048, 4, 8) > fast.timeout_s(2048, 4, 8) >= 30.0


def test_requests_per_client_floor_each_cell_not_the_whole_grid():
    cal = serving.Calibration(
        prefill_tok_s=1000.0, fixed_s=0.05, decode_step_s=0.05, probe_tokens=1024
    )
    one, four = (1048, 4, 1), (1048, 4, 4)
    # the 4-client cell's floor of 12 spends the budget; the 1-client cell stays at the minimum
    floor_only = 3 * 12 * cal.request_s(*four) + 3 * 4 * cal.request_s(*one)
    chosen = serving.plan_requests(
        cal, [one, four], floor_only, repeats=3, minimum=4, maximum=32, per_client=3
    )
    assert chosen == 4
    more = serving.plan_requests(
        cal, [one, four], 4 * floor_only, repeats=3, minimum=4, maximum=32, per_client=3
    )
    assert 4 < more <= 32
    config = serving.ServingBenchConfig(requests=chosen, requests_per_client=3)
    assert [config.requests_at(c) for c in (1, 2, 4, 8)] == [4, 6, 12, 24]
    assert serving.ServingBenchConfig(requests=5).requests_at(8) == 5
    sent = synthetic_specs(dataclasses.replace(config, prefixes=(256,)), RunKey("cache", "256", 4))
    assert sum(not spec.warmup for spec in sent) == 12
    with pytest.raises(ValueError, match="requests_per_client"):
        serving.ServingBenchConfig(requests_per_client=-1)


def test_server_flags_carry_the_load_format_and_per_request_cached_tokens():
    flags = ServerConfig(model="tiny-llama", load_format="dummy").flags()
    assert flags[flags.index("--load-format") + 1] == "dummy"
    assert "--enable-prompt-tokens-details" in flags
    assert "--load-format" not in ServerConfig(model="tiny-llama").flags()


def test_last_error_line_is_found_in_a_traceback_tail():
    tail = (
        "Traceback (most recent call last):\n  File x\nOSError: [Errno 98] Address already in use"
    )
    assert serving_server._last_error(tail) == "OSError: [Errno 98] Address already in use"
    assert serving_server._last_error("INFO: all fine") == ""


def test_a_server_does_not_inherit_the_in_process_engines_settings(tmp_path):
    environ = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1", "PATH": "/bin"}
    env = serving_server.server_environment(str(tmp_path), environ)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    assert env["OMP_NUM_THREADS"] == "1" and env["PATH"] == "/bin"  # the rest as it was
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["HF_HUB_OFFLINE"] == "1"  # a local model
    assert environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the caller's own is untouched


def test_bound_cores_are_read_from_the_servers_log():
    log = (
        "(EngineCore pid=9) INFO [ompmultiprocessing.py:184] OpenMP thread binding info: \n"
        "\tVLLM_CPU_OMP_THREADS_BIND='auto', auto_setup=True, skip_setup=False\n"
        "\tlocal_world_size=1, reserve_cpu_num=1\n"
        "\tlocal_rank=0, core ids=[0, 2]\n"
        "\treserved_cpus=[1]\n"
    )
    assert serving_server.bound_cores(log) == [0, 2]
    assert serving_server.bound_cores("Reducing Torch threads from 2 to 1") is None


# ---------------------------------------------------------------------------- real vLLM


@pytest.fixture(scope="module")
def tiny_model() -> str:
    return serving.resolve_model("tiny-llama")


def _small_sharegpt_trace():
    from analysis.data.sharegpt import load_conversations
    from analysis.data.traces import TraceOptions, build_traces

    conversations, _ = load_conversations(max_conversations=60)
    options = TraceOptions(max_model_len=2048, min_turns=2)
    return build_traces(conversations, options, progress=False).multi


@pytest.mark.engine
def test_real_server_measures_ttft_counts_hits_and_caches_results(
    tiny_model, tmp_path, monkeypatch
):
    config = serving.ServingBenchConfig(
        model=tiny_model,
        prefixes=(512,),
        concurrency=(2,),
        requests=3,
        modes=("cache",),
        output_tokens=4,
        max_model_len=2048,
        kv_cache_memory_bytes=256 << 20,
    )
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # as the Makefile exports it
    with VllmServer(config.server_config(tiny_model, "cache"), tmp_path / "server.log") as server:
        pgid = server.pgid
        # the model computes on the cores a plain `vllm serve` binds it to, those the served
        # clock is calibrated with (one fewer than the machine has on a small CPU)
        assert len(server.model_cores() or []) == replayable.server_torch_threads()
        table = serving.run_serving_bench(config, root=tmp_path, progress=False, server=server)
        row = table.iloc[0]
        assert (row["mode"], row["prefix_regime"], row["concurrency"]) == ("cache", "512", 2)
        assert row["n_ok"] == 3 and row["n_timeout"] == 0 and row["n_error"] == 0
        # the warm-up request missed; every measured one hit the whole 512-token prefix
        assert row["warmup_prefix_cache_queries"] == 536 and row["warmup_prefix_cache_hits"] == 0
        assert row["prefix_cache_queries"] == 3 * 536 and row["prefix_cache_hits"] == 3 * 512
        assert row["hit_rate"] == pytest.approx(row["predicted_saving"])
        requests = serving.load_requests([row["run_id"]], root=tmp_path)
        assert (requests.sent_prompt_tokens == requests.prompt_tokens).all()
        assert (requests.output_tokens == 4).all()
        assert ((requests.ttft_s > 0) & (requests.ttft_s <= requests.e2e_s)).all()
        # the server's per-request count of cached prompt tokens: 0 for the warm-up, the
        # whole prefix for every measured request
        assert requests.loc[requests.warmup, "cached_tokens"].tolist() == [0]
        assert (requests.loc[~requests.warmup, "cached_tokens"] == 512).all()
        gauges = serving.load_gauges([row["run_id"]], root=tmp_path)
        assert len(gauges) >= 1 and gauges["kv_cache_usage_perc"].between(0, 1).all()
        # the server's own clocks timed the warm-up apart from the 3 measured requests, and
        # split the client's TTFT: HTTP outside vLLM, hand-over, the engine core's prefill
        assert row["warmup_time_to_first_token_seconds_count"] == 1
        assert row["request_prefill_time_seconds_count"] == 3
        cell = requests.assign(
            mode="cache",
            prefix_regime="512",
            concurrency=2,
            **{name: row[name] for name in RECORDED_CLOCK_COLUMNS},
        )
        clocks = server_clocks(cell).iloc[0]
        assert clocks["timed_every_request"]
        assert 0 < clocks["engine_prefill_s"] < clocks["client_ttft_s"]
        assert clocks["outside_s"] > 0 and clocks["handover_s"] > 0
        # and its time per output token, by the engine core's stamps: the 3 measured requests
        # only, each with 3 tokens after the first, less than the client's whole request
        assert row["request_time_per_output_token_seconds_count"] == 3
        decode = decode_clocks(cell).iloc[0]
        assert decode["comparable"] and decode["requests_measured"] == 3
        assert 0 < decode["engine_tpot_s"] < requests.loc[~requests.warmup, "e2e_s"].min()
        assert decode["client_tpot_s"] > 0
        capacity = server.kv_capacity_blocks()  # vLLM needs room for one max-length request
        assert capacity is not None and capacity * 32 >= config.max_model_len
        # the thrash case sizes its prefix set from this, without a server
        assert study.kv_pool_blocks(tiny_model, config.block_size, 256 << 20) == capacity

        # ShareGPT conversations from the real data, closed loop: later turns hit the earlier
        trace = _small_sharegpt_trace()
        workload = loadgen.sharegpt_workload(
            trace, conversations=3, max_turns=3, output_tokens=4, max_model_len=2048
        )
        sharegpt = serving.ServingBenchConfig(
            **{**config.__dict__, "workload": "sharegpt", "requests": 3, "max_turns": 3}
        )
        frame, summary = serving.execute_run(
            server, sharegpt, RunKey("cache", "sharegpt", 2), workload, progress=False
        )
        assert summary["n_ok"] == workload.num_requests and summary["n_error"] == 0
        assert summary["prefix_cache_queries"] == sum(
            len(s.prompt_ids) for c in workload.conversations for s in c
        )
        assert (
            summary["prefix_cache_hits"]
            >= summary["predicted_hit_rate"] * summary["prefix_cache_queries"] - 1e-6
        )
        assert 0 < summary["predicted_hit_rate"] <= 1  # two-sided: a prediction forced to 0 fails
        assert summary["prefix_cache_hits"] > 0
        assert frame.groupby("group")["turn_index"].apply(list).tolist() == [[0, 1, 2]] * 3

        # the same conversations open loop: each starts on replay's own Poisson schedule
        open_loop = serving.ServingBenchConfig(**{**sharegpt.__dict__, "arrival_rate": 4.0})
        frame, summary = serving.execute_run(
            server, open_loop, RunKey("cache", "poisson4", 3), workload, progress=False
        )
        assert summary["n_ok"] == workload.num_requests and summary["arrival_rate"] == 4.0
        first_turns = frame[frame["turn_index"] == 0]
        schedule = poisson_starts(3, 4.0, open_loop.seed)
        # each was due on the seed's schedule and started no earlier (how much later is up to
        # a busy machine: the fake server's test bounds the lag of the client itself)
        assert first_turns["due_s"].to_numpy() == pytest.approx(schedule)
        assert (first_turns["start_s"] >= first_turns["due_s"] - 1e-3).all()
        assert frame.loc[frame["turn_index"] > 0, "due_s"].isna().all()
        assert frame.groupby("group")["turn_index"].apply(list).tolist() == [[0, 1, 2]] * 3
        assert summary["prefix_cache_hits"] > 0

        # client timeouts are counted, not fatal, and the server keeps serving
        hurried = serving.ServingBenchConfig(**{**config.__dict__, "request_timeout_s": 0.001})
        _, summary = serving.execute_run(server, hurried, RunKey("cache", "512", 2), progress=False)
        assert summary["n_timeout"] == 3 and "3 timeout" in summary["notes"]
        _, summary = serving.execute_run(server, config, RunKey("cache", "512", 2), progress=False)
        assert summary["n_ok"] == 3

        # kept for several notebooks: a pair inside the block measures on this server and
        # leaves it running (nbval's notebooks 08 and 10 share a pair this way)
        other = serving.ServingBenchConfig(**{**config.__dict__, "prefixes": (256,)})
        with kept_servers.published([server]), serving.ServerPair(root=tmp_path) as pair:
            kept = serving.run_serving_bench(other, root=tmp_path, progress=False, servers=pair)
            assert pair.servers["cache"].port == server.port and pair.servers["cache"].pid is None
        assert kept.iloc[0]["n_ok"] == 3 and kept.iloc[0]["prefix_cache_hits"] == 3 * 256
        assert _alive(pgid) and serving_server._http(f"{server.base_url}/health")[0] == 200
    assert _alive(pgid) == []

    # finished runs are read back, no server is started
    def refuse(self):
        raise AssertionError("a cached run started a server")

    monkeypatch.setattr(VllmServer, "launch", refuse)
    again = serving.run_serving_bench(config, root=tmp_path, progress=False)
    pd.testing.assert_frame_equal(again, table)


def test_interrupting_the_client_leaves_no_server_process(fake_launcher, tmp_path):
    """Ctrl-C while a burst streams: the client ends with KeyboardInterrupt and the server's
    whole process group with it. The stand-in server streams each completion for a minute
    (its grandchild ignores SIGTERM, as vLLM's imports can leave it caught); that a real
    `vllm serve` and its engine core end with their group is shown end to end in
    test_process_hygiene. One asyncio.run, so the signal never falls between two event loops,
    where bursts sent again and again once hung this test past its bound in two CI runs."""
    launcher = f"lambda model: [sys.executable, {str(fake_launcher)!r}]"
    patch = f"from analysis.serving import server; server.server_launcher = {launcher}"
    work = (
        "import asyncio; from analysis.serving import loadgen\n"
        "    specs = loadgen.synthetic_prefix_workload(64, 64, output_tokens=64)\n"
        "    asyncio.run(loadgen.run_burst(server.base_url, server.model_name, specs, 8))"
    )
    parent = _start_parent(tmp_path, patch=patch, work=work)
    try:
        pgid = _read_pgid(parent)
        assert len(_alive(pgid)) == 2  # the stand-in server and its grandchild
        time.sleep(2.0)  # requests in flight
        parent.send_signal(signal.SIGINT)
        parent.wait(timeout=60)  # a bound on a hang, not on speed
        assert _alive(pgid) == []
        stderr = parent.stderr.read().decode(errors="replace")
        assert parent.returncode != 0, f"the parent ended normally; its stderr: {stderr[-3000:]}"
        assert "KeyboardInterrupt" in stderr
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.engine
def test_busy_port_gives_a_clear_error_with_the_log_tail(tiny_model):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        server = VllmServer(ServerConfig(model=tiny_model, port=port))
        with pytest.raises(ServerStartError) as caught:
            server.start()
    first_line = str(caught.value).splitlines()[0]
    assert "Address already in use" in first_line and f"port {port}" in first_line
    assert len(str(caught.value).splitlines()) > 5  # the log's last lines follow
    assert _alive(server.pgid) == []


@pytest.mark.engine
def test_bad_model_path_is_refused_before_a_server_starts(tmp_path):
    missing = tmp_path / "no-such-model"
    server = VllmServer(ServerConfig(model=str(missing)))
    with pytest.raises(ConfigError) as caught:
        server.start()
    assert str(missing) in str(caught.value) and "\n" not in str(caught.value)
    assert server.pgid is None  # nothing was launched


@pytest.mark.engine
def test_offline_prefix_sweep_hits_only_with_caching_on(tiny_model, tmp_path):
    config = serving.PrefixSweepConfig(
        model=tiny_model,
        fractions=(0.0, 1.0),
        num_prompts=3,
        input_len=256,
        output_len=4,
        max_model_len=512,
        kv_cache_memory_bytes=64 << 20,
        max_num_batched_tokens=256,  # one prompt per step: later prompts find earlier blocks
        long_input_len=256,
        long_prompts=2,
        long_output_lens=(2,),
        long_rounds=2,
        repeats=2,
    )
    raw = serving.run_prefix_sweep(config, root=tmp_path, progress=False)
    sweep = raw[raw.experiment == "sweep"]
    cached = sweep.groupby(["mode", "fraction"])["cached_tokens"].max()
    assert cached[("cache", 0.0)] == 0
    assert cached[("cache", 1.0)] == 2 * 224  # 2 later prompts x 7 full blocks (last recomputed)
    assert cached[("no_cache", 0.0)] == 0 and cached[("no_cache", 1.0)] == 0
    # both engines ran at once, their batches alternated in mirrored order: on, off, off, on
    order = sweep.sort_values("order")[["fraction", "repeat", "mode"]].values.tolist()
    assert order == [
        [fraction, repeat, mode]
        for fraction in (0.0, 1.0)
        for repeat, modes in enumerate((("cache", "no_cache"), ("no_cache", "cache")))
        for mode in modes
    ]
    assert (sweep.req_s > 0).all() and (sweep.num_prompts == 3).all()
    assert len(list(Path(tmp_path).glob("prefix-sweep-*/manifest.json"))) == 2
    # long prefill: round 1 is cold, round 2 finds both unique prompts (7 full blocks each)
    long = raw[raw.experiment == "long_prefill"].set_index(["mode", "round"])["cached_tokens"]
    assert long[("cache", 1)] == 0 and long[("cache", 2)] == 2 * 224
    assert long[("no_cache", 1)] == 0 and long[("no_cache", 2)] == 0
    assert serving.long_prefill_table(raw).shape == (4, 1)


class _FakeEngine:
    """Stands in for `vllm.LLM` in the sweep's bookkeeping: every request a token, no hit."""

    def __init__(self, started: list[str], mode: str) -> None:
        started.append(mode)

    def reset_prefix_cache(self) -> None:
        pass

    def generate(self, prompts, params, use_tqdm=False):
        token = SimpleNamespace(token_ids=[1])
        return [SimpleNamespace(num_cached_tokens=0, outputs=[token]) for _ in prompts]


@pytest.mark.parametrize(
    ("interleaved", "measured"), [(True, ["cache", "no_cache"]), (False, ["no_cache"])]
)
def test_an_interleaved_sweep_measures_every_mode_again_with_a_missing_one(
    tmp_path, monkeypatch, interleaved, measured
):
    """A mode kept from an earlier run cannot pair its batches with a new run's: interleaved,
    both are measured again; one after the other, only the missing mode."""
    from analysis.serving import prefix_sweep

    started: list[str] = []
    monkeypatch.setattr(
        prefix_sweep, "_engine", lambda config, model, mode: _FakeEngine(started, mode)
    )
    config = serving.PrefixSweepConfig(
        model="tiny-llama", fractions=(0.0,), num_prompts=2, input_len=64, output_len=1,
        interleaved=interleaved,
    )  # fmt: skip
    serving.run_prefix_sweep(config, root=tmp_path, progress=False)
    assert started == ["cache", "no_cache"]
    model = serving.resolve_model("tiny-llama")
    (tmp_path / prefix_sweep.sweep_run_id(config, model, "no_cache") / "manifest.json").unlink()
    started.clear()
    again = serving.run_prefix_sweep(config, root=tmp_path, progress=False)
    assert started == measured
    assert sorted(again["mode"].unique()) == ["cache", "no_cache"]


def test_engines_sized_by_a_share_of_gpu_memory_do_not_interleave():
    assert serving.PrefixSweepConfig().interleaves
    assert not serving.PrefixSweepConfig(gpu_memory_utilization=0.85).interleaves
    assert not serving.PrefixSweepConfig(interleaved=False).interleaves


def test_group_members_sees_only_live_processes():
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    try:
        assert serving_server._group_members(child.pid) == [child.pid]
        serving.terminate_group(child.pid, child, grace_s=5)
        assert serving_server._group_members(child.pid) == []
        assert not psutil.pid_exists(child.pid) or child.poll() is not None
    finally:
        child.kill()
        child.wait()


def test_on_a_gpu_the_served_clock_counts_torchs_threads(monkeypatch):
    """vLLM binds a worker to CPU cores only on its CPU platform; on a GPU the model computes
    there, and the calibration's thread count is torch's own (the CPU's binding rule is not
    asked: on a GPU build it has nothing to bind)."""
    import torch
    from vllm.platforms import current_platform

    from analysis.serving import replayable

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    assert replayable.server_torch_threads() == torch.get_num_threads()
