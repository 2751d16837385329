"""Replay on a clock against a server's cells (analysis.timing.served): the trace a cell
replays as, and the server's terms recovered from a server whose times are known."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.engines.clock import StepCostProfile
from analysis.serving import loadgen
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
    keys = [*served.CELL_KEYS, "request_id"]
    columns = ["start_s", "ttft_s", "e2e_s", "tpot_s", "output_tokens", "cached_tokens"]
    return cells.merge(truth[[*keys, *columns]], on=keys, validate="many_to_one")


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
    assert set(table.loc[table["family"] == "held out", "concurrency"]) == {3}
    served.checks(measured, predicted, table).assert_all()
    # with three clients the requests queue: the held-out TTFT is not the one-client TTFT
    ttft = table[table["statistic"] == "p50_ttft"].set_index(["mode", "concurrency"])["predicted"]
    assert ttft[("cache", 3)] > ttft[("cache", 1)]


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
