"""Replay on a clock against a server's cells (analysis.timing.served): the trace a cell
replays as, and the server's terms recovered from a server whose times are known."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from analysis.engines.clock import StepCostProfile
from analysis.metrics.server_clocks import decode_clocks, server_clocks
from analysis.platform.manifest import write_json
from analysis.serving import loadgen, replayable
from analysis.serving.bench_config import ServingBenchConfig
from analysis.serving.loadgen.workloads import shared_prefix
from analysis.timing import served

SETTINGS = {
    "model": "tiny-llama",
    "block_size": 32,
    "max_model_len": 2048,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 128,
}
PROFILE = StepCostProfile(
    coefficients={"fixed": 0.004, "token": 2e-5, "prefill_pair": 0.02, "sampled": 1e-4},
    admit_s=1e-4,
    loop_s=1e-5,
)


def sent_cells(repeats: int = 2) -> pd.DataFrame:
    """Synthetic cells as a server benchmark sends them (warm-up first), without measurements."""
    rows = []
    for mode in ("cache", "no_cache"):
        for clients in (1, 3):
            specs = loadgen.synthetic_prefix_workload(256, 9, output_tokens=6, salt=f"c{clients}")
            for repeat in range(repeats):
                for spec in specs:
                    rows.append(
                        {
                            "mode": mode,
                            "prefix_regime": "256",
                            "concurrency": clients,
                            "repeat": repeat,
                            "request_id": spec.request_id,
                            "warmup": spec.warmup,
                            "status": "ok",
                            "prompt_ids": list(spec.prompt_ids),
                            "max_tokens": spec.max_tokens,
                        }
                    )
    return pd.DataFrame(rows)


def measured_by(cells: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    """`cells` with the client's measurements taken from a replay (a server of known terms)."""
    keys = [*served.CELL_KEYS, "repeat", "request_id"]
    columns = ["start_s", "ttft_s", "e2e_s", "tpot_s", "output_tokens", "cached_tokens"]
    return cells.merge(truth[[*keys, *columns]], on=keys, validate="one_to_one")


def with_clocks(cells: pd.DataFrame, frontend_s: float, timed: int = 0) -> pd.DataFrame:
    """`cells` with the server's own clocks: per cell, an engine that queued nothing for 1 ms
    and spent the rest of the client's TTFT, less `frontend_s`, prefilling; the server timed
    `timed` requests fewer than the client measured."""
    frames = []
    for _, cell in cells.groupby(served.CELL_KEYS, sort=False):
        sent = cell[~cell["warmup"] & (cell["status"] == "ok")]
        count = len(sent) - timed
        clocks = {
            # vLLM's own TTFT starts 2 ms after the client's
            "time_to_first_token_seconds_sum": (sent["ttft_s"].mean() - 0.002) * count,
            "time_to_first_token_seconds_count": count,
            "request_queue_time_seconds_sum": 0.001 * count,
            "request_queue_time_seconds_count": count,
            "request_prefill_time_seconds_sum": (sent["ttft_s"].mean() - frontend_s - 0.001)
            * count,
            "request_prefill_time_seconds_count": count,
        }
        frames.append(cell.assign(**clocks))
    return pd.concat(frames, ignore_index=True)


def test_the_server_clocks_split_a_ttft_into_engine_and_front_end():
    cells = sent_cells().assign(ttft_s=0.05)
    clocks = server_clocks(with_clocks(cells, frontend_s=0.004))
    assert len(clocks) == 4 and clocks["timed_every_request"].all()
    assert clocks["client_ttft_s"].tolist() == pytest.approx([0.05] * 4)
    assert clocks["engine_queue_s"].tolist() == pytest.approx([0.001] * 4)
    assert clocks["engine_prefill_s"].tolist() == pytest.approx([0.045] * 4)
    assert clocks["frontend_s"].tolist() == pytest.approx([0.004] * 4)
    assert clocks["outside_s"].tolist() == pytest.approx([0.002] * 4)
    assert clocks["handover_s"].tolist() == pytest.approx([0.002] * 4)
    assert (clocks["requests_measured"] == 2 * 9).all()  # two repeats of 9 after the warm-up
    short = server_clocks(with_clocks(cells, frontend_s=0.004, timed=1))
    assert not short["timed_every_request"].any()
    # cells measured before the server's clocks were recorded: nothing to split
    assert server_clocks(cells).empty


def with_decode_clock(cells: pd.DataFrame, engine_tpot_s: float, timed: int = 0) -> pd.DataFrame:
    """`cells` with the engine core's time per output token: `engine_tpot_s` for every request
    it timed, `timed` fewer than the client measured."""
    frames = []
    for _, cell in cells.groupby(served.CELL_KEYS, sort=False):
        count = int((~cell["warmup"] & (cell["status"] == "ok")).sum()) - timed
        frames.append(
            cell.assign(
                request_time_per_output_token_seconds_sum=engine_tpot_s * count,
                request_time_per_output_token_seconds_count=count,
            )
        )
    return pd.concat(frames, ignore_index=True)


def test_the_engine_cores_clock_splits_a_tpot_into_clock_and_way_out():
    cells = sent_cells().assign(tpot_s=0.030, output_tokens=6)
    clocks = decode_clocks(with_decode_clock(cells, engine_tpot_s=0.026))
    assert len(clocks) == 4 and clocks["comparable"].all()
    assert clocks["engine_tpot_s"].tolist() == pytest.approx([0.026] * 4)
    assert clocks["frontend_tpot_s"].tolist() == pytest.approx([0.004] * 4)
    # replay 10 % above the engine core: the miss lies in the clock, not on the way out
    predicted = cells.assign(tpot_s=0.026 * 1.1)
    breakdown = served.tpot_breakdown(clocks, predicted)
    assert breakdown["engine_error"].tolist() == pytest.approx([0.1] * 4)
    reading = served.tpot_reading(breakdown)
    assert reading.count("26.0 ms by the engine core, +4.0 ms on the way out, replay +10%") == 4
    # a server that timed fewer requests, or a request of one token (vLLM counts it at 0 s per
    # token, the client not at all), leaves nothing comparable
    assert not decode_clocks(with_decode_clock(cells, 0.026, timed=1))["comparable"].any()
    one_token = with_decode_clock(cells.assign(output_tokens=1), 0.026)
    assert served.tpot_breakdown(decode_clocks(one_token), predicted)["engine_error"].isna().all()
    assert served.tpot_reading(served.tpot_breakdown(decode_clocks(one_token), predicted)) == ""
    # cells measured before the engine core's TPOT was recorded: nothing to split
    assert decode_clocks(cells).empty
    assert served.tpot_breakdown(decode_clocks(cells), predicted).empty


def test_cell_trace_sends_the_warm_up_alone_then_each_client_in_turn():
    cells = sent_cells(repeats=1)
    one = cells[(cells["mode"] == "cache") & (cells["concurrency"] == 3)]
    trace = served.cell_trace(one, 3)
    assert trace["conversation_id"].iloc[0].startswith("warmup/")
    assert trace["timestamp"].iloc[0] == 0.0
    measured = trace.iloc[1:]
    assert (measured["timestamp"] == served.MEASURED_AFTER_S).all()
    assert measured["conversation_id"].tolist()[:4] == ["client0", "client1", "client2", "client0"]
    assert measured.groupby("conversation_id")["turn_index"].apply(list).tolist() == [[0, 1, 2]] * 3
    assert (trace["response_ids"].map(len) == 6).all()


def test_the_clients_first_requests_reach_the_engine_one_front_end_turn_apart():
    cells = sent_cells(repeats=1)
    one = cells[(cells["mode"] == "no_cache") & (cells["concurrency"] == 3)]
    trace = served.cell_trace(one, 3, stagger_s=0.004).iloc[1:]
    first = trace[trace["turn_index"] == 0].set_index("conversation_id")["timestamp"]
    assert (first - served.MEASURED_AFTER_S).round(9).to_dict() == {
        "client0": 0.0,
        "client1": 0.004,
        "client2": 0.008,
    }
    assert (trace.loc[trace["turn_index"] > 0, "timestamp"] == served.MEASURED_AFTER_S).all()


@pytest.mark.engine
def test_a_staggered_first_request_is_prefilled_alone_and_the_others_join_the_next_step(tmp_path):
    cells = sent_cells(repeats=1)
    cell = cells[(cells["mode"] == "no_cache") & (cells["concurrency"] == 3)]
    apart = served.replay_cells(cell, SETTINGS, PROFILE, served.ServerTerms(0.001), tmp_path)
    together = served.replay_cells(cell, SETTINGS, PROFILE, served.ServerTerms(), tmp_path)
    wave = cell.loc[~cell["warmup"], "request_id"].tolist()[:3]
    ttft = apart.set_index("request_id").loc[wave, "ttft_s"]
    assert ttft.iloc[0] < ttft.iloc[1]  # alone in its prefill step
    assert ttft.iloc[1] == pytest.approx(ttft.iloc[2], abs=0.0011)  # one step, 1 ms apart
    # started at once, the three are prefilled in one step and reach their first token together
    assert together.set_index("request_id").loc[wave, "ttft_s"].nunique() == 1


@pytest.mark.engine
def test_the_server_terms_are_recovered_and_held_out_cells_predicted_exactly(tmp_path):
    cells = sent_cells()
    known = served.ServerTerms(frontend_s=0.012, step_s=0.003)
    truth = served.replay_cells(cells, SETTINGS, PROFILE, known, tmp_path)
    measured = measured_by(cells, truth)

    fitted = served.fit_terms(measured, SETTINGS, PROFILE, tmp_path)
    # exact, but for the driver's time of one loop: the fit replays without the think time,
    # so a request arrives at a step boundary instead of into an idle engine
    assert fitted.frontend_s == pytest.approx(known.frontend_s, abs=PROFILE.loop_s)
    assert fitted.step_s == pytest.approx(known.step_s, abs=1e-12)

    predicted = served.replay_cells(measured, SETTINGS, PROFILE, fitted, tmp_path)
    table = served.errors(served.matched(measured, predicted))
    assert table["error"].abs().max() < 2e-3
    assert (table["met_by"] == "the goal").all()
    assert served.reading(table, fitted, 1).endswith("; none misses.\n")
    assert set(table.loc[table["family"] == "held out", "concurrency"]) == {3}
    served.checks(measured, predicted, table).assert_all()
    # with three clients the requests queue: the held-out TTFT is not the one-client TTFT
    ttft = table[table["statistic"] == "p50_ttft"].set_index(["mode", "concurrency"])["predicted"]
    assert ttft[("cache", 3)] > ttft[("cache", 1)]


@pytest.mark.engine
def test_the_per_request_term_is_measured_by_the_server_clocks_where_they_ran(tmp_path):
    cells = sent_cells()
    known = served.ServerTerms(frontend_s=0.012, step_s=0.003)
    truth = served.replay_cells(cells, SETTINGS, PROFILE, known, tmp_path)
    # the server's clocks put 7 ms in its front end, where the client's TTFT against replay's
    # would fit 12 ms: the other 5 ms are the engine's, which its profile missed
    measured = with_clocks(measured_by(cells, truth), frontend_s=0.007)

    terms = served.fit_terms(measured, SETTINGS, PROFILE, tmp_path)
    assert terms.frontend_s == pytest.approx(0.007)
    assert terms.frontend_source == served.FRONTEND_MEASURED
    assert terms.step_s == pytest.approx(known.step_s, abs=1e-12)
    predicted = served.replay_cells(measured, SETTINGS, PROFILE, terms, tmp_path)
    breakdown = served.ttft_breakdown(server_clocks(measured), predicted, terms)
    # the missing 5 ms show as the engine's error, not the front end's, where one client
    # leaves the engine idle (with more, vLLM's clocks miss the wait for a running step)
    ones = breakdown["concurrency"] == 1
    assert (breakdown.loc[ones, "engine_error"] < -0.05).all()
    assert breakdown.loc[~ones, "engine_error"].isna().all()
    reading = served.engine_reading(breakdown)
    assert "7.0-7.0 ms per request" in reading
    assert reading.count("prefix 256 -") == 2  # both modes' one-client cells, negative
    # a server that timed fewer requests than the client measured leaves the term fitted
    fitted = served.fit_terms(
        with_clocks(measured_by(cells, truth), 0.007, timed=1), SETTINGS, PROFILE, tmp_path
    )
    assert fitted.frontend_source == served.FRONTEND_FITTED
    assert fitted.frontend_s == pytest.approx(known.frontend_s, abs=PROFILE.loop_s)


@pytest.mark.engine
def test_a_server_slower_than_predicted_is_named_as_a_miss(tmp_path):
    cells = sent_cells()
    known = served.ServerTerms(frontend_s=0.01, step_s=0.002)
    truth = served.replay_cells(cells, SETTINGS, PROFILE, known, tmp_path)
    measured = measured_by(cells, truth)
    slow = measured["concurrency"] == 3
    measured.loc[slow, "ttft_s"] *= 1.25  # held out: 25 % slower to the first token

    fitted = served.fit_terms(measured, SETTINGS, PROFILE, tmp_path)
    # fitted on the one-client cells only, which ran at the known speed
    assert fitted.frontend_s == pytest.approx(known.frontend_s, abs=PROFILE.loop_s)
    assert fitted.step_s == pytest.approx(known.step_s, abs=1e-12)
    predicted = served.replay_cells(measured, SETTINGS, PROFILE, fitted, tmp_path)
    table = served.errors(served.matched(measured, predicted))
    missed = table[table["met_by"] == "missed"]
    assert set(missed["statistic"]) == {"p50_ttft", "p90_ttft"}
    assert missed["error"].to_numpy() == pytest.approx(1 / 1.25 - 1, abs=2e-3)
    text = served.reading(table, fitted, 1)
    assert text.count("\n- ") == len(missed) and "p50_ttft" in text


def test_a_per_request_term_fitted_to_zero_is_said_to_leave_the_clients_in_lockstep():
    table = pd.DataFrame(
        [
            {"mode": "cache", "prefix_regime": "0", "concurrency": c, "family": family,
             "statistic": "mean_tpot", "predicted": 0.03, "measured_median_of_repeats": 0.07,
             "error": -0.57, "goal": 0.05, "server_repeat_spread": 0.02,
             "met_by": "missed" if c > 1 else "the goal"}
            for c, family in ((1, "fitted"), (4, "held out"))
        ]
    )  # fmt: skip
    zero = served.reading(table, served.ServerTerms(frontend_s=0.0, step_s=0.0019), 1)
    assert served.LOCKSTEP_WARNING in zero and "0.0 ms per request" in zero
    kept = served.reading(table, served.ServerTerms(frontend_s=0.0025, step_s=0.0), 1)
    assert served.LOCKSTEP_WARNING not in kept
    one_client = served.reading(table[table["concurrency"] == 1], served.ServerTerms(), 1)
    assert served.LOCKSTEP_WARNING not in one_client
    # an open loop's miss names its rate, not clients (its cap is not a number of clients)
    open_loop = table.assign(prefix_regime="poisson0.4", concurrency=6)
    text = served.reading(open_loop, served.ServerTerms(frontend_s=0.0025), 1)
    assert "ShareGPT conversations arriving at 0.4 per second, mean_tpot" in text
    assert "clients" not in text


@pytest.mark.engine
def test_replayed_cached_tokens_that_differ_from_the_server_fail_the_check(tmp_path):
    cells = sent_cells(repeats=1)
    truth = served.replay_cells(cells, SETTINGS, PROFILE, served.ServerTerms(), tmp_path)
    measured = measured_by(cells, truth)
    table = served.errors(served.matched(measured, truth))
    served.checks(measured, truth, table).assert_all()
    measured.loc[measured["mode"] == "no_cache", "cached_tokens"] = 32
    with pytest.raises(AssertionError, match="cached tokens"):
        served.checks(measured, truth, table).assert_all()


def test_cells_to_predict_reach_a_steady_state_at_every_client_count():
    config = ServingBenchConfig(prefixes=(0, 256), concurrency=(1,), requests=12, output_tokens=4)
    cells = replayable.synthetic_cells_to_predict(config, (0, 256), (1, 8, 64), waves=3)
    sizes = cells[~cells["warmup"]].groupby(served.CELL_KEYS).size()
    assert len(sizes) == 2 * 3 * 2  # prefixes x clients x modes
    for (_, _, clients), size in sizes.items():
        assert size == max(12, 3 * clients)
    assert (cells.groupby(served.CELL_KEYS)["warmup"].sum() == 1).all()
    assert set(cells["prompt_ids"].map(len)) == {24, 256 + 24}


@pytest.mark.engine
def test_cells_beyond_the_measured_ones_are_predicted_on_the_validated_clock(tmp_path):
    cells = sent_cells()
    known = served.ServerTerms(frontend_s=0.01, step_s=0.002)
    measured = measured_by(cells, served.replay_cells(cells, SETTINGS, PROFILE, known, tmp_path))
    predicted = served.replay_cells(measured, SETTINGS, PROFILE, known, tmp_path)
    pairs = served.matched(measured, predicted)
    table = served.errors(pairs)
    comparison = served.ServedComparison(
        PROFILE,
        known,
        predicted,
        served.per_repeat(pairs),
        table,
        served.checks(measured, predicted, table),
    )
    # the measured cells again: the curves pass through what the comparison predicted there
    curves = served.predict_cells(cells[cells["repeat"] == 0], SETTINGS, comparison)
    at_measured = table.pivot_table(index=served.CELL_KEYS, columns="statistic", values="predicted")
    for statistic in served.STATISTICS:
        assert curves.set_index(served.CELL_KEYS)[statistic].to_dict() == pytest.approx(
            at_measured[statistic].to_dict()
        )
    text = served.curves_reading(curves, table)
    on = curves[(curves["mode"] == "cache") & (curves["concurrency"] == 3)]["throughput_req"]
    assert f"{on.iloc[0]:.3g} requests/s" in text and "3 clients and a 256-token prefix" in text


def test_the_served_figures_plot_every_cell_with_labelled_axes():
    from analysis.plots import timing as timing_plots

    rows, repeats, curves = [], [], []
    for mode in ("cache", "no_cache"):
        for clients in (1, 4):
            for statistic in served.STATISTICS:
                cell = {"mode": mode, "prefix_regime": "256", "concurrency": clients}
                measured = 0.05 * clients if mode == "no_cache" else 0.02 * clients
                family = "fitted" if clients == 1 else "held out"
                rows.append(
                    {
                        **cell,
                        "family": family,
                        "statistic": statistic,
                        "measured_median_of_repeats": measured,
                        "predicted": measured * 1.1,
                    }
                )
                repeats += [
                    {**cell, "statistic": statistic, "measured": measured * f}
                    for f in (0.9, 1.0, 1.2)
                ]
        for clients in (1, 2, 4, 8):
            curves.append(
                {
                    "mode": mode,
                    "prefix_regime": "256",
                    "concurrency": clients,
                    **{s: 0.01 * clients for s in served.STATISTICS},
                }
            )
    table, repeats, curves = pd.DataFrame(rows), pd.DataFrame(repeats), pd.DataFrame(curves)
    scatter = timing_plots.served_cells_figure(table, repeats)
    lines = timing_plots.served_curves_figure(curves, table)
    for fig in (scatter, lines):
        for ax in fig.axes:
            assert ax.get_xlabel() and ax.get_ylabel()
    # one point (with its range) per cell and panel; one line per prefix and mode
    assert all(len(ax.containers) == 4 for ax in scatter.axes)
    assert len([line for line in lines.axes[0].lines if len(line.get_xdata()) == 4]) == 2


def conversation_cells() -> pd.DataFrame:
    """Two repeats of a closed loop of 2 clients over 4 conversations of 3 turns, each turn's
    prompt the previous one grown (as a chat's history grows)."""
    rows = []
    for mode in ("cache", "no_cache"):
        for repeat in range(2):
            for conversation in range(4):
                prompt = list(shared_prefix(96, "history", conversation))
                for turn in range(3):
                    prompt += loadgen.ordinary_ids(40, "turn", conversation, turn)
                    rows.append(
                        {
                            "mode": mode,
                            "prefix_regime": "sharegpt",
                            "concurrency": 2,
                            "repeat": repeat,
                            "request_id": f"c{conversation}/{turn}",
                            "conversation": f"c{conversation}",
                            "warmup": False,
                            "status": "ok",
                            "prompt_ids": list(prompt),
                            "max_tokens": 5,
                        }
                    )
    return pd.DataFrame(rows)


def test_a_conversation_cell_replays_as_a_closed_loop_of_its_conversations():
    cells = conversation_cells()
    one = cells[(cells["mode"] == "cache") & (cells["repeat"] == 0)]
    trace = served.conversation_trace(one)
    assert trace["conversation_id"].nunique() == 4
    assert trace.groupby("conversation_id")["turn_index"].apply(list).tolist() == [[0, 1, 2]] * 4


@pytest.mark.engine
def test_a_conversation_cells_two_clients_start_one_front_end_turn_apart(tmp_path):
    cells = conversation_cells()
    one = cells[(cells["mode"] == "no_cache") & (cells["repeat"] == 0)]
    terms = served.ServerTerms(frontend_s=0.004)
    replayed = served.replay_cells(one, SETTINGS, PROFILE, terms, tmp_path)
    first, second = replayed.sort_values("start_s")["start_s"].iloc[:2]
    assert (first, second) == (0.0, pytest.approx(0.004))


@pytest.mark.engine
def test_an_open_loop_cell_replays_on_the_clients_poisson_schedule(tmp_path):
    from analysis.engines.timed_arrivals import poisson_starts
    from analysis.platform.errors import WorkloadError

    cells = conversation_cells()
    both = cells[cells["mode"] == "cache"]
    # the client started 4 conversations at 3 per second, each repeat on its own schedule
    # (seeds 7 and 8), capped at 4 in flight
    open_loop = both.assign(concurrency=4, arrival_rate=3.0, arrival_seed=7 + both["repeat"])
    terms = served.ServerTerms(frontend_s=0.004)
    replayed = served.replay_cells(open_loop, SETTINGS, PROFILE, terms, tmp_path)
    for repeat, seed in ((0, 7), (1, 8)):
        ours = replayed[(replayed["repeat"] == repeat) & replayed["request_id"].str.endswith("/0")]
        expected = poisson_starts(4, 3.0, seed)
        assert ours["start_s"].tolist() == pytest.approx(expected.tolist())
        assert expected[-1] > 0.3  # spread out: a closed loop starts them all within 12 ms
    one = open_loop[open_loop["repeat"] == 0]
    # a cap below the conversations could have held one back, which replay cannot do
    with pytest.raises(WorkloadError, match="capped at 2 conversations in flight, of 4"):
        served.replay_cells(one.assign(concurrency=2), SETTINGS, PROFILE, terms, tmp_path)


@pytest.mark.engine
def test_another_workload_is_predicted_with_the_kept_profile_and_terms(tmp_path):
    from analysis.platform.errors import ConfigError
    from analysis.platform.manifest import write_json

    with pytest.raises(ConfigError, match="run notebook 08 first"):
        served.read_validated(tmp_path)
    known = served.ServerTerms(frontend_s=0.008, step_s=0.0015)
    write_json(tmp_path / "profile.json", PROFILE.to_dict())
    served.write_terms(tmp_path, known, ["run-a"])
    cells = conversation_cells()
    measured = measured_by(cells, served.replay_cells(cells, SETTINGS, PROFILE, known, tmp_path))
    # a later turn re-uses its conversation's history: the server's cached tokens, replayed
    later = measured[(measured["mode"] == "cache") & measured["request_id"].str.endswith("/2")]
    assert (later["cached_tokens"] > 0).all()

    held = served.held_out_against_server(measured, SETTINGS, tmp_path)
    assert held.terms == known
    assert (held.table["family"] == "held out").all()
    assert held.table["error"].abs().max() < 1e-9
    held.checks.assert_all()


def test_the_server_pool_in_blocks_comes_from_its_kv_bytes():
    from analysis.serving.study import kv_pool_blocks

    config = ServingBenchConfig(kv_cache_memory_bytes=1 << 29, block_size=32)
    settings = replayable.engine_settings(config)
    assert settings["num_blocks"] == kv_pool_blocks("prefill-llama", 32, 1 << 29)
    assert "num_blocks" not in replayable.engine_settings(
        ServingBenchConfig(kv_cache_memory_bytes=None, block_size=32)
    )


@pytest.mark.engine
def test_a_cell_replays_in_the_servers_pool(tmp_path):
    cells = sent_cells(repeats=1)
    cell = cells[(cells["mode"] == "no_cache") & (cells["concurrency"] == 3)]
    profile = tmp_path / "profile.json"
    from analysis.platform.manifest import write_json

    write_json(profile, PROFILE.to_dict())
    roomy = served.replay_cell(cell, SETTINGS, profile, served.ServerTerms())
    # 12 blocks (a 352-token context) hold one 280-token request (9 blocks) at a time: the
    # others wait their turn
    small = {**SETTINGS, "num_blocks": 12, "max_model_len": 352}
    tight = served.replay_cell(cell, small, profile, served.ServerTerms())
    assert tight["ttft_s"].median() > 1.5 * roomy["ttft_s"].median()


@pytest.mark.parametrize(
    "kept_as", ["it is now", "one workload short", "one term short", "fitted another way"]
)
def test_a_kept_server_profile_is_measured_again_when_its_workloads_or_terms_differ(
    tmp_path, monkeypatch, kept_as
):
    """A profile kept from a calibration with other workloads, terms or fit (an older
    version's) is not reused: its fit never saw what the calibration now measures and
    charges."""
    from analysis.engines.clock import TERMS
    from analysis.platform.manifest import write_json
    from analysis.timing.fit import METHODS, calibration_method
    from analysis.timing.workloads import calibration_workloads

    identity = {
        "machine": {"torch_threads": 1},
        "engine_settings": {"max_num_batched_tokens": 2048, "block_size": 32},
        "model": {"name": "tiny-llama"},
    }
    dropped = sorted(set(TERMS) - set(PROFILE.coefficients))
    if kept_as == "one term short":
        dropped = dropped[1:]
    method = "seconds" if kept_as == "fitted another way" else calibration_method("cpu")
    fit = {"dropped_terms": dropped, "method": METHODS[method]}
    kept = StepCostProfile(PROFILE.coefficients, PROFILE.admit_s, PROFILE.loop_s, identity, fit)
    write_json(tmp_path / "profile.json", kept.to_dict())
    names = [w.name for w in calibration_workloads("cpu")]
    if kept_as == "one workload short":
        names = names[:-1]
    pd.DataFrame({"run": names}).to_parquet(tmp_path / "steps.parquet")
    commands = []
    monkeypatch.setattr("subprocess.run", lambda command, **kwargs: commands.append(command))
    profile = served.calibrate_like_server(SETTINGS, tmp_path, 1, say=lambda line: None)
    assert profile.coefficients == PROFILE.coefficients
    assert len(commands) == (0 if kept_as == "it is now" else 1)


def test_the_profile_is_checked_on_its_own_decode_steps_by_batch_size(tmp_path):
    # a CPU's decodes: one request's step as slow as four's; the linear profile charges
    # 2.5 ms a token, so it under-charges the one and matches the four
    rows = [
        {"tokens": n, "sequences": n, "prefill_requests": 0, "wall_s": 0.030}
        for n in (1, 1, 1, 4, 4)
    ]
    rows.append({"tokens": 300, "sequences": 1, "prefill_requests": 1, "wall_s": 0.8})
    pd.DataFrame(rows).to_parquet(tmp_path / "steps.parquet")
    linear = StepCostProfile(coefficients={"fixed": 0.02, "token": 0.0025}, admit_s=0, loop_s=0)

    check = served.decode_check(tmp_path, linear, clients=[1, 4])
    assert check["sequences"].tolist() == [1, 4]  # the prefill step is not a decode
    assert check["steps"].tolist() == [3, 2]
    assert check["error"].tolist() == pytest.approx([-0.25, 0.0])
    reading = served.decode_reading(check)
    assert "one request at 22.5 ms against 30.0 ms measured (-25%, 3 steps)" in reading
    assert "the difference, +25 points at 4 requests" in reading
    assert served.decode_reading(check[check["sequences"] == 4]) == ""


def _conversations_trace(tmp_path, count: int = 5):
    """A small multi-turn trace on disk: `count` conversations of 3 turns, each turn's prompt
    the previous one grown, the first 96 tokens of every conversation its own."""
    rows = []
    for conversation in range(count):
        prompt = list(shared_prefix(96, "history", conversation))
        for turn in range(3):
            prompt = prompt + loadgen.ordinary_ids(40, "turn", conversation, turn)
            rows.append(
                {
                    "request_id": f"c{conversation}/{turn}",
                    "conversation_id": f"c{conversation}",
                    "turn_index": turn,
                    "prompt_ids": list(prompt),
                    "response_ids": [7] * 5,
                    "prompt_tokens": len(prompt),
                    "response_tokens": 5,
                    "timestamp": float("nan"),
                }
            )
    path = tmp_path / "multi_turn.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def conversations_config(trace) -> ServingBenchConfig:
    return ServingBenchConfig(
        workload="sharegpt",
        concurrency=(2,),
        requests=2,
        max_turns=2,
        output_tokens=3,
        trace_path=str(trace),
        arrival_rate=0.5,  # the measured open loop's: the predicted cells are closed loops
    )


def test_conversations_to_predict_are_the_benchmarks_cut_at_every_client_count(tmp_path):
    config = conversations_config(_conversations_trace(tmp_path))
    cells = replayable.sharegpt_cells_to_predict(config, [1, 4], 3)
    sizes = cells.groupby(served.CELL_KEYS).size()
    # 3 conversations, cut to the benchmark's 2 turns, in both modes at both client counts
    assert sizes.to_dict() == {
        (mode, "sharegpt", clients): 6 for mode in ("cache", "no_cache") for clients in (1, 4)
    }
    first = cells[(cells["mode"] == "cache") & (cells["concurrency"] == 1)]
    assert first["request_id"].tolist() == ["c0/0", "c0/1", "c1/0", "c1/1", "c2/0", "c2/1"]
    assert first["conversation"].tolist() == ["c0", "c0", "c1", "c1", "c2", "c2"]
    assert (cells["max_tokens"] == 3).all() and not cells["warmup"].any()
    assert "arrival_rate" not in cells.columns  # a closed loop, whatever the measured cell was
    every = replayable.sharegpt_cells_to_predict(config, [2], None)
    assert every["conversation"].nunique() == 5  # None: every conversation the cut keeps


def test_conversations_to_predict_refuse_what_cannot_be_predicted(tmp_path):
    config = conversations_config(_conversations_trace(tmp_path))
    with pytest.raises(ValueError, match=">= 1"):
        replayable.sharegpt_cells_to_predict(config, [1], 0)
    with pytest.raises(ValueError, match="workload='sharegpt'"):
        replayable.sharegpt_cells_to_predict(ServingBenchConfig(), [1], 3)


@pytest.mark.engine
def test_conversations_beyond_the_server_are_predicted_with_checks_that_hold(tmp_path):
    config = conversations_config(_conversations_trace(tmp_path))
    to_predict = replayable.sharegpt_cells_to_predict(config, [1, 3], None)
    terms = served.ServerTerms(0.01, 0.002)
    curves = served.predict_cells(
        to_predict, SETTINGS, SimpleNamespace(profile=PROFILE, terms=terms)
    )
    assert len(curves) == 4 and (curves["requests"] == 10).all()
    off = curves[curves["mode"] == "no_cache"]
    assert (off["hit_rate"] == 0).all()
    one = curves[(curves["mode"] == "cache") & (curves["concurrency"] == 1)].iloc[0]
    # each second turn hits its first turn's full blocks: 96 + 40 = 136 tokens -> 128
    assert one["hit_rate"] == pytest.approx(5 * 128 / (5 * (136 + 176)))
    checks = served.curve_checks(to_predict, curves, SETTINGS["block_size"])
    assert checks.table()["holds"].all()
    # the same prediction from the profile and terms a comparison kept (notebook 12's way)
    write_json(tmp_path / "profile.json", PROFILE.to_dict())
    served.write_terms(tmp_path, terms, ["a fitted run"])
    kept = served.predict_cells_validated_in(to_predict, SETTINGS, tmp_path)
    pd.testing.assert_frame_equal(kept, curves)
    # a hit rate the replay did not reach is caught
    wrong = curves.assign(hit_rate=curves["hit_rate"] * 0.5)
    assert not served.curve_checks(to_predict, wrong, SETTINGS["block_size"]).table()["holds"].all()


@pytest.mark.engine
def test_shared_prefixes_beyond_the_server_are_predicted_with_checks_that_hold():
    """One client's bound counts what its warm-up stored: every measured request hits the
    shared prefix's full blocks, the first one included."""
    config = ServingBenchConfig(prefixes=(0, 96), concurrency=(1,), requests=4, output_tokens=2)
    to_predict = replayable.synthetic_cells_to_predict(config, [64, 160], [1, 2], waves=3)
    curves = served.predict_cells(
        to_predict, SETTINGS, SimpleNamespace(profile=PROFILE, terms=served.ServerTerms(0.01, 0.0))
    )
    checks = served.curve_checks(to_predict, curves, SETTINGS["block_size"])
    assert checks.table()["holds"].all(), checks.table()
    one = curves[(curves["mode"] == "cache") & (curves["concurrency"] == 1)]
    suffix = config.suffix_tokens
    expected = {"64": 64 / (64 + suffix), "160": 160 / (160 + suffix)}
    assert dict(zip(one["prefix_regime"], one["hit_rate"], strict=True)) == pytest.approx(expected)


def _pool_curves(hits_at_most: float, preempted_at_most: float) -> pd.DataFrame:
    rows = []
    for clients, on_req, off_req, hits in (
        (1, 2.0, 1.5, 0.5),
        (16, 4.0, 2.0, 0.5),
        (64, 2.2, 2.0, hits_at_most),
    ):
        rows.append(
            {
                "mode": "cache",
                "prefix_regime": "sharegpt",
                "concurrency": clients,
                "throughput_req": on_req,
                "p50_ttft": 0.1 * clients,
                "hit_rate": hits,
                "preempted_share": preempted_at_most if clients == 64 else 0.0,
            }
        )
        rows.append(
            {
                "mode": "no_cache",
                "prefix_regime": "sharegpt",
                "concurrency": clients,
                "throughput_req": off_req,
                "p50_ttft": 0.2 * clients,
                "hit_rate": 0.0,
                "preempted_share": 0.0,
            }
        )
    return pd.DataFrame(rows)


def test_the_pool_reading_names_what_took_the_hits_from_the_numbers():
    evicted = served.pool_reading(_pool_curves(0.05, 0.0), 682, 32)
    assert "50% of the prompt tokens at 1 client and 5% at 64" in evicted
    assert "2.0x caching off's throughput at 16 clients" in evicted and "1.1x at 64" in evicted
    assert "lost to eviction" in evicted and "682 blocks of 32 tokens (21,824 tokens)" in evicted
    preempted = served.pool_reading(_pool_curves(0.05, 0.3), 682, 32)
    assert "30% of the requests preempted" in preempted and "requests are preempted" in preempted
    kept = served.pool_reading(_pool_curves(0.45, 0.0), 682, 32)
    assert "kept at least half of the reuse at 64 clients" in kept


def test_the_unmeasured_prefix_reading_quotes_only_the_prefixes_the_server_did_not_run():
    rows = [
        {"mode": mode, "prefix_regime": str(prefix), "concurrency": clients, "p50_ttft": ttft}
        for prefix in (0, 256, 512, 1024)
        for clients in (1, 4)
        for mode, ttft in (("cache", 0.05 * clients), ("no_cache", 0.0002 * prefix * clients))
    ]
    text = served.unmeasured_prefix_reading(pd.DataFrame(rows), [0, 1024])
    assert "measured prefixes of 0, 1024 tokens" in text
    assert "a 256-token prefix: median TTFT 0.05 s on against 0.0512 s off at 1 client" in text
    assert "0.2 s on against 0.205 s off at 4 clients (saving 2%)" in text
    assert "a 512-token prefix" in text and "a 1024-token prefix" not in text
    assert "Every predicted prefix" in served.unmeasured_prefix_reading(
        pd.DataFrame(rows), [0, 256, 512, 1024]
    )


def _closed_and_open_cells(statistics, **columns) -> pd.DataFrame:
    """A comparison table's rows for the server's ShareGPT cells: a closed loop of 4 clients
    and an open loop capped at 6, both modes; a column's value may differ by regime (a dict)."""
    return pd.DataFrame(
        [
            {
                "mode": mode,
                "prefix_regime": regime,
                "concurrency": clients,
                "statistic": statistic,
                **{k: v[regime] if isinstance(v, dict) else v for k, v in columns.items()},
            }
            for mode in ("cache", "no_cache")
            for regime, clients in (("sharegpt", 4), ("poisson0.53", 6))
            for statistic in statistics
        ]
    )


def test_the_curves_reading_of_conversations_leaves_the_open_loop_out():
    curves = _pool_curves(0.05, 0.0)
    errors = {"sharegpt": 0.03, "poisson0.53": 0.5}
    table = _closed_and_open_cells(["p50_ttft"], family="held out", error=errors)
    text = served.curves_reading(curves, table)
    assert "At 64 clients on the ShareGPT conversations" in text
    assert "up to 4 clients" in text and "p50_ttft +3%" in text and "+50%" not in text


def test_the_conversation_curves_plot_the_hit_rate_and_leave_other_workloads_out():
    from analysis.plots import timing as timing_plots

    curves = _pool_curves(0.05, 0.0)
    statistics = ["p50_ttft", "throughput_req", "hit_rate"]
    table = _closed_and_open_cells(statistics, measured_median_of_repeats=0.5, predicted=0.45)
    panels = {**timing_plots.CURVE_PANELS, **timing_plots.HIT_RATE_PANEL}
    fig = timing_plots.served_curves_figure(curves, table, panels)
    assert len(fig.axes) == 3
    for ax in fig.axes:
        assert ax.get_xlabel() == "closed-loop clients" and ax.get_ylabel()
        lines = [line for line in ax.lines if len(line.get_xdata()) == 3]
        markers = [line for line in ax.lines if len(line.get_xdata()) == 1]
        # both modes, each measured and predicted where the server ran; the open loop left out
        assert len(lines) == 2 and len(markers) == 4
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["ShareGPT conversations, caching on", "ShareGPT conversations, caching off"]


def test_hit_rates_set_the_servers_counters_beside_replay_and_an_ideal_cache():
    table = pd.DataFrame(
        [
            {"mode": "cache", "hit_rate": 0.03, "predicted_hit_rate": 0.48},
            {"mode": "no_cache", "hit_rate": float("nan"), "predicted_hit_rate": 0.48},
        ]
    )
    predicted = pd.DataFrame(
        [
            {"mode": "cache", "warmup": False, "cached_tokens": 32, "prompt_tokens": 1000},
            {"mode": "cache", "warmup": True, "cached_tokens": 900, "prompt_tokens": 1000},
            {"mode": "no_cache", "warmup": False, "cached_tokens": 0, "prompt_tokens": 1000},
        ]
    )
    rates = served.hit_rates(table, predicted)
    assert rates.loc["cache"].tolist() == [0.03, 0.032, 0.48]  # the warm-up left out
    assert rates.loc["no_cache", "server"] == 0.0 and rates.loc["no_cache", "replay"] == 0.0
    assert pd.isna(rates.loc["no_cache", "ideal_cache"])  # no cache, no ideal to reach


def _repeats(values: dict[tuple[str, str, int], list[float]], statistic: str = "p50_ttft"):
    """Per-repeat statistics as `per_repeat` gives them: (mode, prefix, clients) -> measured."""
    return pd.DataFrame(
        [
            {"mode": mode, "prefix_regime": prefix, "concurrency": clients, "repeat": repeat,
             "statistic": statistic, "measured": value, "predicted": value}
            for (mode, prefix, clients), measured in values.items()
            for repeat, value in enumerate(measured)
        ]
    )  # fmt: skip


def test_identical_work_is_how_far_two_servers_medians_lay_apart():
    repeats = _repeats(
        {
            ("cache", "0", 4): [1.0, 1.2, 1.1],  # median 1.1
            ("no_cache", "0", 4): [0.9, 1.0, 0.9],  # median 0.9: 0.2 apart over a mean of 1.0
            ("cache", "256", 4): [5.0, 5.0, 5.0],  # a shared prefix: not identical work
            ("no_cache", "256", 4): [9.0, 9.0, 9.0],
        }
    )
    identical = served.identical_work(repeats)
    assert identical[["concurrency", "statistic"]].values.tolist() == [[4, "p50_ttft"]]
    assert identical["apart"].iloc[0] == pytest.approx(0.2)
    held = pd.DataFrame(
        [
            {"mode": "cache", "prefix_regime": "256", "concurrency": 4, "family": "held out",
             "statistic": "p50_ttft", "error": error, "met_by": met_by}
            for error, met_by in ((-0.15, "missed"), (0.25, "missed"), (0.03, "the goal"))
        ]
    )  # fmt: skip
    reading = served.identical_work_reading(identical, held)
    assert "lay apart by up to 20% at 4 clients (p50_ttft), a measure" in reading
    assert "Of the 3 held-out statistics at those client counts, 2 lie" in reading
    assert "1 of the 2 misses among them" in reading
    one_server = served.identical_work(repeats[repeats["mode"] == "cache"])
    assert one_server.empty
    assert served.identical_work_reading(one_server, held).startswith("No cells here")


def test_the_cells_without_a_prefix_are_an_a_a_pair_only_when_sent_alike_and_uncached():
    cells = sent_cells(repeats=1)
    cells["prefix_regime"] = "0"
    cells["cached_tokens"] = 0
    assert served.identical_work_checks(cells).assert_all()["holds"].all()
    changed = cells.copy()
    first_on = changed.index[(changed["mode"] == "cache") & ~changed["warmup"]][0]
    changed.at[first_on, "prompt_ids"] = [*changed.at[first_on, "prompt_ids"], 7]
    with pytest.raises(AssertionError, match="sent to one server only"):
        served.identical_work_checks(changed).assert_all()
    hit = cells.copy()
    hit.loc[hit.index[~hit["warmup"]][0], "cached_tokens"] = 32
    with pytest.raises(AssertionError, match="served from a cache"):
        served.identical_work_checks(hit).assert_all()
    with pytest.raises(AssertionError, match="measured on both servers"):
        served.identical_work_checks(cells[cells["mode"] == "cache"]).assert_all()


def test_the_open_loops_lag_behind_its_schedule_is_read_from_each_first_turn():
    requests = pd.DataFrame(
        {
            "start_s": [0.001, 0.5, 0.262, 1.0, 0.0],
            "due_s": [0.0, np.nan, 0.25, np.nan, 0.002],  # the last started early: no lag
        }
    )
    reading = served.schedule_reading(requests)
    assert "the 3 conversations" in reading
    assert "a median of 1.0 ms and at most 12.0 ms" in reading
    assert served.schedule_reading(requests.drop(columns="due_s")) == ""
    assert served.schedule_reading(requests.assign(due_s=np.nan)) == ""


GPU_SERVED = "data/external/h200/2026-11-29"


@pytest.mark.engine
def test_a_recorded_gpu_comparison_replays_here_as_it_was_recorded():
    """The H200 server's cells, replayed on this machine from what `gpu-check --served` kept:
    the same predictions it wrote (replay is deterministic), every request's cached tokens the
    server's; a changed prediction is caught."""
    import json

    from analysis.platform.paths import repo_root

    folder = repo_root() / GPU_SERVED
    settings = json.loads((folder / "served" / "manifest.json").read_text())["engine_settings"]
    profile, terms = served.read_validated(folder / "calibration")
    again = served.compare_recorded(replayable.recorded_cells(folder), settings, profile, terms)
    again.checks.assert_all()
    recorded = pd.read_csv(folder / "served" / "errors.csv")
    served.same_errors(again.table, recorded).assert_all()
    moved = recorded.assign(predicted=recorded["predicted"] * (1 + 1e-6))
    table = served.same_errors(again.table, moved).table()
    assert table.loc[1, "measured"] == str(len(recorded)) and not table.loc[1, "holds"]
    reading = served.frontend_reading(again.breakdown, again.tpot, terms)
    top = again.breakdown["frontend_s"].max()
    assert f"it took {top * 1e3:.0f} ms" in reading


def test_recorded_runs_of_different_grids_are_refused(tmp_path):
    """Cells measured under two benchmark configurations cannot be replayed as one grid."""
    import json
    import shutil

    from analysis.platform.errors import WorkloadError
    from analysis.platform.paths import repo_root

    folder = tmp_path / "recorded"
    shutil.copytree(repo_root() / GPU_SERVED, folder)
    run = next(p for p in (folder / "serving").iterdir() if p.name.startswith("synthetic-"))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["suffix_tokens"] += 1
    (run / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(WorkloadError, match="not measured as one grid"):
        replayable.recorded_cells(folder)


@pytest.mark.parametrize(("cuda", "device"), [(False, "cpu"), (True, "cuda")])
def test_the_servers_engine_is_calibrated_where_this_machines_vllm_runs(monkeypatch, cuda, device):
    """Notebook 08 names no device: on a GPU machine its servers ran on the GPU, and the
    profile that times them must be measured there too (not on the CPU build's default)."""
    from analysis.platform import hardware

    seen = {}

    class Stop(Exception):
        pass

    def calibrate(settings, folder, threads, say, chosen):
        seen["device"] = chosen
        raise Stop

    monkeypatch.setattr(hardware, "machine", lambda: SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(served, "calibrate_like_server", calibrate)
    with pytest.raises(Stop):
        served.compare_with_server(pd.DataFrame(), SETTINGS, Path("unused"), 1)
    assert seen["device"] == device
