"""Workloads, the streaming client and the run statistics, without a vLLM server.

The client is exercised against a small aiohttp server on 127.0.0.1 that speaks the same
server-sent events as vLLM's `/v1/completions`; the real server is in tests/test_serving.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import numpy as np
import pandas as pd
import pytest

from analysis.cli import CommandError
from analysis.platform.errors import WorkloadError
from analysis.serving import loadgen
from analysis.serving.loadgen import RequestResult, RequestSpec

# ---------------------------------------------------------------------------- workloads


def test_synthetic_prefix_is_shared_token_for_token_and_suffixes_are_unique():
    specs = loadgen.synthetic_prefix_workload(512, 6, suffix_tokens=24, warmup_requests=1)
    assert len(specs) == 7
    assert [s.warmup for s in specs] == [True] + [False] * 6
    prefixes = {s.prompt_ids[:512] for s in specs}
    assert len(prefixes) == 1
    assert specs[0].prompt_ids[0] == loadgen.BOS_ID
    assert all(len(s.prompt_ids) == 536 for s in specs)
    # the first suffix token differs for every request, so no suffix block can be shared
    assert len({s.prompt_ids[512] for s in specs}) == 7
    assert len({s.request_id for s in specs}) == 7
    ids = np.array([t for s in specs for t in s.prompt_ids[1:]])
    assert ids.min() >= loadgen.ORDINARY_ID_RANGE[0] and ids.max() < loadgen.ORDINARY_ID_RANGE[1]


def test_synthetic_workload_is_deterministic_and_salt_or_length_changes_the_prefix():
    first = loadgen.synthetic_prefix_workload(1024, 2)
    assert first == loadgen.synthetic_prefix_workload(1024, 2)
    other_salt = loadgen.synthetic_prefix_workload(1024, 2, salt="c8")
    # beyond BOS, not even the first block is shared: a new run starts cold
    assert first[0].prompt_ids[1:32] != other_salt[0].prompt_ids[1:32]
    shorter = loadgen.synthetic_prefix_workload(512, 2)
    assert first[0].prompt_ids[1:32] != shorter[0].prompt_ids[1:32]


def test_zero_prefix_prompts_share_only_bos():
    specs = loadgen.synthetic_prefix_workload(0, 3, suffix_tokens=16)
    assert all(len(s.prompt_ids) == 16 and s.prompt_ids[0] == loadgen.BOS_ID for s in specs)
    assert len(specs) == 4 and len({s.prompt_ids[1] for s in specs}) == 4


def _prefix_of(spec, length=512):
    return spec.prompt_ids[:length]


def test_mixed_traffic_shares_the_prefix_in_exactly_the_eligible_share():
    specs = loadgen.synthetic_prefix_workload(512, 8, eligible_share=0.25)
    shared = _prefix_of(specs[0])  # the warm-up request stores the shared prefix
    measured = [s for s in specs if not s.warmup]
    uses = [_prefix_of(s) == shared for s in measured]
    assert sum(uses) == 2 and uses == [False, False, False, True] * 2  # spread evenly
    others = [_prefix_of(s) for s, u in zip(measured, uses, strict=True) if not u]
    assert len(set(others)) == 6  # each ineligible request has a prefix of its own
    assert all(len(s.prompt_ids) == 536 for s in specs)


def test_distinct_prefixes_cycle_and_churn_changes_the_prefix_every_n_requests():
    specs = loadgen.synthetic_prefix_workload(512, 6, distinct_prefixes=3)
    measured = [_prefix_of(s) for s in specs if not s.warmup]
    assert measured[:3] == measured[3:] and len(set(measured)) == 3
    assert measured[0] == _prefix_of(specs[0])  # the first one is the warmed prefix
    churned = loadgen.synthetic_prefix_workload(512, 6, churn_every=2)
    versions = [_prefix_of(s) for s in churned if not s.warmup]
    assert versions[0] == versions[1] != versions[2] == versions[3] != versions[4]
    assert len(set(versions)) == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prefix_tokens": -1, "num_requests": 1}, "prefix length"),
        ({"prefix_tokens": 8, "num_requests": 1, "suffix_tokens": 0}, "suffix length"),
        ({"prefix_tokens": 8, "num_requests": 0}, "num_requests"),
        ({"prefix_tokens": 8, "num_requests": 1, "eligible_share": 1.5}, "eligible_share"),
        ({"prefix_tokens": 8, "num_requests": 1, "distinct_prefixes": 0}, "distinct_prefixes"),
    ],
)
def test_bad_synthetic_parameters_give_one_line_errors(kwargs, message):
    with pytest.raises(loadgen.WorkloadError, match=message):
        loadgen.synthetic_prefix_workload(**kwargs)


def test_cacheable_tokens_follow_vllm_block_and_last_token_rules():
    assert loadgen.cacheable_tokens(2072, 2048, 32) == 2048
    assert loadgen.cacheable_tokens(2072, 2050, 32) == 2048  # partial block is not cached
    assert loadgen.cacheable_tokens(1000, 1000, 32) == 992  # the last token is recomputed
    assert loadgen.cacheable_tokens(64, 64, 32) == 32
    assert loadgen.cacheable_tokens(40, 0, 32) == 0
    assert loadgen.predicted_ttft_saving(2048, 24, 32) == pytest.approx(2048 / 2072)
    assert loadgen.predicted_ttft_saving(0, 24, 32) == 0.0


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.5, 1.0])
def test_prefix_sweep_prompts_share_exactly_the_fraction(fraction):
    prompts = loadgen.prefix_sweep_prompts(fraction, 5, 1000)
    assert all(len(p) == 1000 for p in prompts)
    shared = round(fraction * 1000)
    common = 0
    while common < 1000 and len({p[common] for p in prompts}) == 1:
        common += 1
    assert common == max(shared, 1)  # with nothing shared, only BOS is common


def test_prefix_sweep_rejects_a_fraction_outside_0_1():
    with pytest.raises(loadgen.WorkloadError, match="fraction"):
        loadgen.prefix_sweep_prompts(1.5, 2)


def _trace(rows):
    return pd.DataFrame(
        rows,
        columns=[
            "request_id",
            "conversation_id",
            "turn_index",
            "prompt_ids",
            "response_ids",
            "prompt_tokens",
            "response_tokens",
        ],
    )


def _conversation(cid, lengths, reply=5):
    rows, ids = [], [loadgen.BOS_ID]
    for turn, length in enumerate(lengths):
        prompt = (ids + list(range(1000, 1000 + length)))[:length]
        rows.append([f"{cid}/{turn}", cid, turn, prompt, [7] * reply, len(prompt), reply])
        ids = prompt + [7] * reply
    return rows


def test_sharegpt_workload_keeps_turn_order_and_counts_what_it_leaves_out():
    rows = (
        _conversation("a", [10, 20, 30, 40, 50])  # cut to max_turns
        + _conversation("b", [10])  # too short
        + _conversation("c", [10, 20, 5000])  # third turn too long
        + _conversation("d", [12, 24])
    )
    workload = loadgen.sharegpt_workload(
        _trace(rows), conversations=5, max_turns=4, output_tokens=3, max_model_len=4096
    )
    assert [c[0].group for c in workload.conversations] == ["a", "c", "d"]
    assert [s.turn_index for s in workload.conversations[0]] == [0, 1, 2, 3]
    assert all(s.max_tokens == 3 for c in workload.conversations for s in c)
    assert workload.skipped_turns == {
        "beyond_max_turns": 1,
        "short_conversation": 1,
        "too_long": 1,
    }
    assert workload.num_requests == 4 + 2 + 2


def test_sharegpt_workload_without_usable_conversation_is_a_clear_error(tmp_path):
    with pytest.raises(loadgen.WorkloadError, match="no conversation"):
        loadgen.sharegpt_workload(_trace(_conversation("a", [10])), min_turns=2)
    with pytest.raises(CommandError, match="not found"):
        loadgen.sharegpt_workload(tmp_path / "missing.parquet")


def test_sharegpt_workload_from_real_conversations_extends_each_prompt():
    from analysis.data.sharegpt import load_conversations
    from analysis.data.traces import TraceOptions, build_traces

    conversations, _ = load_conversations(max_conversations=40)
    trace = build_traces(conversations, TraceOptions(max_model_len=4096), progress=False).multi
    workload = loadgen.sharegpt_workload(trace, conversations=5, max_turns=3, output_tokens=8)
    assert len(workload.conversations) == 5
    for conversation in workload.conversations:
        assert [s.turn_index for s in conversation] == list(range(len(conversation)))
        for earlier, later in zip(conversation, conversation[1:], strict=False):
            # the next prompt starts with the whole previous prompt: the cacheable prefix
            assert later.prompt_ids[: len(earlier.prompt_ids)] == earlier.prompt_ids
        assert all(1 <= s.max_tokens <= 8 for s in conversation)
        assert conversation[0].prompt_ids[0] == loadgen.BOS_ID


# ---------------------------------------------------------------------------- statistics


def test_percentile_matches_numpy_and_ignores_missing_values():
    values = [0.3, 0.1, math.nan, 0.2, 0.9]
    assert loadgen.percentile(values, 95) == pytest.approx(np.percentile([0.1, 0.2, 0.3, 0.9], 95))
    assert loadgen.percentile([0.5], 50) == 0.5
    assert math.isnan(loadgen.percentile([], 50))
    assert math.isnan(loadgen.percentile([math.nan], 50))


def _result(i, status="ok", warmup=False, ttft=0.1, e2e=1.0, out=16):
    return RequestResult(
        request_id=f"r{i}",
        group="g",
        turn_index=0,
        warmup=warmup,
        status=status,
        sent_prompt_tokens=100,
        prompt_tokens=100,
        output_tokens=out if status == "ok" else 0,
        ttft_s=ttft if status == "ok" else math.nan,
        e2e_s=e2e,
    )


def test_summary_excludes_warmup_counts_statuses_and_reports_throughput():
    results = [
        _result(0, warmup=True, ttft=5.0, e2e=6.0),
        _result(1, ttft=0.1, e2e=1.0),
        _result(2, ttft=0.3, e2e=2.0),
        _result(3, status="timeout", e2e=9.0),
        _result(4, status="error"),
    ]
    summary = loadgen.summarize_requests(loadgen.results_frame(results), wall_s=2.0)
    assert summary["n_requests"] == 4 and summary["n_warmup"] == 1
    assert (summary["n_ok"], summary["n_timeout"], summary["n_error"]) == (2, 1, 1)
    assert summary["mean_ttft_s"] == pytest.approx(0.2)
    assert summary["p50_ttft_s"] == pytest.approx(0.2)
    assert summary["p95_ttft_s"] == pytest.approx(0.29)
    assert summary["mean_e2e_s"] == pytest.approx(1.5)
    assert summary["mean_ttft_incl_warmup_s"] == pytest.approx((5.0 + 0.1 + 0.3) / 3)
    assert summary["warmup_ttft_s"] == pytest.approx(5.0)
    assert summary["req_s"] == pytest.approx(1.0)  # 2 ok measured requests in 2 s
    assert summary["tok_s"] == pytest.approx(16.0)


# Lines as vLLM 0.32 writes them on /metrics (counters of two label sets, _created stamps).
METRICS = """\
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 4128.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.795240625376212e+09
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 2016.0
vllm:num_preemptions_total{engine="0",model_name="m"} 0.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 3.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.7
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.01
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.2
"""


def test_parse_prometheus_sums_label_sets_and_skips_created_stamps():
    counters = loadgen.parse_prometheus(METRICS)
    assert counters == {
        "vllm:prefix_cache_queries": 4128.0,
        "vllm:prefix_cache_hits": 2016.0,
        "vllm:num_preemptions": 0.0,
        "vllm:request_success": 3.0,
        # the server's clocks: a histogram's sum and count, not its buckets
        "vllm:time_to_first_token_seconds_count": 3.0,
        "vllm:time_to_first_token_seconds_sum": 0.7,
        "vllm:request_queue_time_seconds_sum": 0.01,
    }


def test_counter_deltas_and_hit_rate():
    before = {"vllm:prefix_cache_queries": 100.0, "vllm:prefix_cache_hits": 10.0}
    after = {
        "vllm:prefix_cache_queries": 300.0,
        "vllm:prefix_cache_hits": 160.0,
        "vllm:num_preemptions": 2.0,
    }
    deltas = loadgen.counter_deltas(before, after)
    assert deltas == {
        "vllm:prefix_cache_queries": 200.0,
        "vllm:prefix_cache_hits": 150.0,
        "vllm:num_preemptions": 2.0,
    }
    summary = loadgen.counter_summary(deltas)
    assert summary["hit_rate"] == pytest.approx(0.75)
    assert summary["num_preemptions"] == 2.0
    assert math.isnan(loadgen.counter_summary({})["hit_rate"])
    with pytest.raises(ValueError, match="went down"):
        loadgen.counter_deltas(after, before)


def test_parse_sse_line():
    assert loadgen.parse_sse_line(b"data: [DONE]\n") == "[DONE]"
    assert loadgen.parse_sse_line(b"\n") is None
    assert loadgen.parse_sse_line(b": keep-alive\n") is None
    assert loadgen.parse_sse_line(b'data: {"choices": []}\n') == {"choices": []}


# ---------------------------------------------------------------------------- the client


class FakeCompletions:
    """An aiohttp app with vLLM's streaming shape; `delay_s` before the first chunk."""

    def __init__(self, delay_s=0.0, fail=False, stall=False, truncate=False):
        self.delay_s, self.fail, self.stall, self.truncate = delay_s, fail, stall, truncate
        self.requests = []

    async def handle(self, request):
        from aiohttp import web

        body = await request.json()
        self.requests.append(body)
        if self.fail:
            return web.json_response({"error": "bad prompt"}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(self.delay_s)
        if self.stall:
            await asyncio.sleep(1.5)  # far beyond the client timeout below
        for i in range(body["max_tokens"]):
            chunk = {"choices": [{"index": 0, "text": f"t{i}"}], "usage": None}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if self.truncate:
            return response
        usage = {
            "prompt_tokens": len(body["prompt"]),
            "completion_tokens": body["max_tokens"],
            "prompt_tokens_details": {"cached_tokens": len(body["prompt"]) - 1},
        }
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


async def _serve(app_handler, coroutine_factory, *, health: bool = False):
    """A stand-in server for `coroutine_factory(url)`; `health`: it also answers /health."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/completions", app_handler)
    if health:
        app.router.add_get("/health", lambda request: web.Response(text="ok"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        return await coroutine_factory(f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


def _specs(n, warmup=0, max_tokens=3):
    return [
        RequestSpec(f"r{i}", (loadgen.BOS_ID, 1000 + i), max_tokens, "g", 0, i < warmup)
        for i in range(n)
    ]


def test_burst_sends_token_id_prompts_and_measures_ttft_before_e2e():
    fake = FakeCompletions(delay_s=0.05)
    results, timing = asyncio.run(
        _serve(
            fake.handle,
            lambda url: loadgen.run_burst(url, "m", _specs(5, warmup=1), 2, progress=False),
        )
    )
    assert [r.status for r in results] == ["ok"] * 5
    assert all(0.05 <= r.ttft_s <= r.e2e_s for r in results)
    assert all(r.output_tokens == 3 and r.prompt_tokens == 2 and r.chunks == 3 for r in results)
    assert all(r.cached_tokens == 1 for r in results)  # the server's per-request count
    frame = loadgen.results_frame(results)
    # TPOT: the time after the first token, per later token (3 tokens: 2 steps)
    expected = (frame.e2e_s - frame.ttft_s) / 2
    assert np.allclose(frame.tpot_s, expected) and (frame.tpot_s >= 0).all()
    body = fake.requests[0]
    assert body["prompt"] == [loadgen.BOS_ID, 1000] and body["stream"] is True
    assert body["ignore_eos"] is True and body["stream_options"] == {"include_usage": True}
    # the warm-up request finished before the measured phase began
    assert results[0].start_s + results[0].e2e_s <= timing.start_s + 1e-6
    assert all(r.start_s >= timing.start_s for r in results[1:])


def test_timeouts_and_server_errors_are_counted_not_raised():
    stalled = asyncio.run(
        _serve(
            FakeCompletions(stall=True).handle,
            lambda url: loadgen.run_burst(url, "m", _specs(3), 3, timeout_s=0.3, progress=False),
        )
    )[0]
    assert [r.status for r in stalled] == ["timeout"] * 3
    assert all("0.3 s" in r.error for r in stalled)
    failed = asyncio.run(
        _serve(
            FakeCompletions(fail=True).handle,
            lambda url: loadgen.run_burst(url, "m", _specs(2), 1, progress=False),
        )
    )[0]
    assert [r.status for r in failed] == ["error"] * 2
    assert "HTTP 400" in failed[0].error
    broken = asyncio.run(
        _serve(
            FakeCompletions(truncate=True).handle,
            lambda url: loadgen.run_burst(url, "m", _specs(1), 1, progress=False),
        )
    )[0]
    assert broken[0].status == "error" and "[DONE]" in broken[0].error


def test_nothing_listening_is_an_error_per_request():
    from analysis.serving import free_port

    results, _ = asyncio.run(
        loadgen.run_burst(f"http://127.0.0.1:{free_port()}", "m", _specs(2), 2, progress=False)
    )
    assert [r.status for r in results] == ["error", "error"]


def test_deadline_marks_unsent_requests():
    results, _ = asyncio.run(
        _serve(
            FakeCompletions(delay_s=0.2).handle,
            lambda url: loadgen.run_burst(url, "m", _specs(4), 1, deadline_s=0.1, progress=False),
        )
    )
    assert [r.status for r in results] == ["ok", "not_sent", "not_sent", "not_sent"]


async def _frozen(coroutine_factory):
    """A server that accepts connections and never answers (a SIGSTOPped vLLM, row 10.2)."""

    async def hang(reader, writer):
        await asyncio.sleep(3600)

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await coroutine_factory(f"http://127.0.0.1:{port}")
    finally:
        server.close()


def test_a_frozen_server_costs_one_timeout_not_one_per_request(monkeypatch):
    """Row 10.2: a frozen server took 4 min 16 s to report, one request timeout after another."""
    from analysis.serving.loadgen import client

    monkeypatch.setattr(client, "HEALTH_TIMEOUT_S", 0.2)
    started = time.perf_counter()
    burst, _ = asyncio.run(
        _frozen(
            lambda url: loadgen.run_burst(url, "m", _specs(6), 1, timeout_s=0.3, progress=False)
        )
    )
    conversations = [[RequestSpec(f"{c}/{t}", (1, t), 2, c, t) for t in range(3)] for c in "ab"]
    loop, _ = asyncio.run(
        _frozen(
            lambda url: loadgen.run_closed_loop(
                url, "m", conversations, 1, timeout_s=0.3, progress=False
            )
        )
    )
    for results in (burst, loop):
        assert [r.status for r in results] == ["timeout"] + ["not_sent"] * (len(results) - 1)
        assert all(r.error == client.FROZEN for r in results[1:])
    assert time.perf_counter() - started < 3  # two timeouts and two probes, not 12 timeouts


def test_a_slow_server_that_answers_health_keeps_its_requests():
    results, _ = asyncio.run(
        _serve(
            FakeCompletions(stall=True).handle,
            lambda url: loadgen.run_burst(url, "m", _specs(3), 1, timeout_s=0.3, progress=False),
            health=True,
        )
    )
    assert [r.status for r in results] == ["timeout"] * 3


def test_closed_loop_sends_a_turn_only_after_the_previous_one_finished():
    conversations = [
        [RequestSpec(f"{c}/{t}", (loadgen.BOS_ID, t), 2, c, t) for t in range(3)] for c in "abc"
    ]
    started = time.perf_counter()
    results, timing = asyncio.run(
        _serve(
            FakeCompletions(delay_s=0.05).handle,
            lambda url: loadgen.run_closed_loop(url, "m", conversations, 2, progress=False),
        )
    )
    elapsed = time.perf_counter() - started
    assert [r.request_id for r in results] == [s.request_id for c in conversations for s in c]
    assert all(r.status == "ok" for r in results)
    by_id = {r.request_id: r for r in results}
    for conversation in "abc":
        for turn in (1, 2):
            before = by_id[f"{conversation}/{turn - 1}"]
            assert by_id[f"{conversation}/{turn}"].start_s >= before.start_s + before.e2e_s
    # two clients: the third conversation starts only when a first one is done
    assert by_id["c/0"].start_s >= min(by_id["a/2"].start_s, by_id["b/2"].start_s)
    # the run's wall time covers every request and no more than the call took
    assert max(r.start_s + r.e2e_s for r in results) <= timing.wall_s <= elapsed


def test_open_loop_starts_each_conversation_on_its_schedule_whatever_the_server_does():
    conversations = [
        [RequestSpec(f"{c}/{t}", (loadgen.BOS_ID, t), 2, c, t) for t in range(2)] for c in "abc"
    ]
    # each turn takes 0.15 s: a closed loop of one client would start "b" only at 0.3 s
    starts = [0.0, 0.05, 0.4]
    results, _ = asyncio.run(
        _serve(
            FakeCompletions(delay_s=0.15).handle,
            lambda url: loadgen.run_open_loop(url, "m", conversations, starts, 3, progress=False),
        )
    )
    assert [r.request_id for r in results] == [s.request_id for c in conversations for s in c]
    assert all(r.status == "ok" for r in results)
    by_id = {r.request_id: r for r in results}
    for conversation, start in zip("abc", starts, strict=True):
        assert start <= by_id[f"{conversation}/0"].start_s < start + 0.1
        assert by_id[f"{conversation}/0"].due_s == start and math.isnan(
            by_id[f"{conversation}/1"].due_s
        )
        first = by_id[f"{conversation}/0"]
        assert by_id[f"{conversation}/1"].start_s >= first.start_s + first.e2e_s
    # a cap of one conversation in flight holds "b" back until "a" has finished
    results, _ = asyncio.run(
        _serve(
            FakeCompletions(delay_s=0.15).handle,
            lambda url: loadgen.run_open_loop(url, "m", conversations, starts, 1, progress=False),
        )
    )
    by_id = {r.request_id: r for r in results}
    assert by_id["b/0"].start_s >= by_id["a/1"].start_s + by_id["a/1"].e2e_s
    with pytest.raises(WorkloadError, match="2 start times for 3 conversations"):
        asyncio.run(loadgen.run_open_loop("http://x", "m", conversations, starts[:2], 1))


def test_an_arrival_rate_is_a_positive_rate_of_sharegpt_conversations():
    from analysis.serving import ServingBenchConfig
    from analysis.serving.bench_config import RunKey, run_id

    for rate in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="arrival_rate must be a positive number"):
            ServingBenchConfig(workload="sharegpt", arrival_rate=rate)
    with pytest.raises(ValueError, match="needs workload='sharegpt'"):
        ServingBenchConfig(arrival_rate=1.0)
    open_loop = ServingBenchConfig(workload="sharegpt", arrival_rate=0.5)
    assert open_loop.regimes() == ("poisson0.5",)
    key = RunKey("cache", "poisson0.5", 8)
    assert run_id(open_loop, "m", key).startswith("sharegpt-cache-poisson0.5-c8-")
    # closed loops keep the ids they had before open loops existed (cached runs are found)
    closed = ServingBenchConfig(workload="sharegpt")
    assert (
        run_id(closed, "m", RunKey("cache", "sharegpt", 8))
        == "sharegpt-cache-sharegpt-c8-92da67e980"
    )
    assert run_id(ServingBenchConfig(), "m", RunKey("cache", "512", 8)) == (
        "synthetic-cache-p512-c8-ea414c709f"
    )


def test_a_cancellation_hidden_in_a_failed_request_is_not_swallowed():
    import aiohttp

    from analysis.serving.loadgen.client import stream_completion

    class Session:  # a client library that reports a cancelled connect as a lost connection
        def post(self, *args, **kwargs):
            return self

        async def __aenter__(self):
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise aiohttp.ClientConnectionError("connection lost") from None

        async def __aexit__(self, *exc_info):
            return False

    async def run():
        await stream_completion(Session(), "http://x", "m", _specs(1)[0], timeout_s=5, t0=0)
        await asyncio.sleep(0.1)  # the rest of the run
        return "went on"

    async def interrupted():
        task = asyncio.create_task(run())
        await asyncio.sleep(0.05)
        task.cancel()  # Ctrl-C, as asyncio.run delivers it
        return await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(interrupted())
