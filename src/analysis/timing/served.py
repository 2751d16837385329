"""Replay on this machine's clock against the real HTTP server, cell by cell.

A server does more than its engine, and two named terms hold the rest:
- `frontend_s` (s per request): the HTTP round trip, the hand-over to the engine process and
  back, the first streamed chunk. It is added to every request's TTFT and end-to-end time,
  it passes between a closed-loop client's reply and its next request (replay's think
  time), and it spaces the clients' first requests of a synthetic cell: clients that start
  together reach the engine one front-end turn apart, so the first is prefilled alone and
  the others join the next step (started at once in replay, all would share one prefill
  step, and every decode after it would keep that lockstep); a ShareGPT cell's clients start
  so too, and in a closed or an open loop the next requests of replies that finished in one
  step reach the engine so, the reply out of the engine first answered first
  (`RunConfig.start_stagger_s`);
- `step_s` (s per engine step, added to the profile's `fixed` term): a CPU server runs the
  model in a worker process of its own, so every step crosses from the engine core to the
  worker and back, and its outputs on to the front end, which streams them.
Both come from the one-client cells, where nothing queues and TTFT and TPOT are the engine's
own cost plus the server's: the calibration family. The per-step term is fitted there; the
per-request term is measured by the server's own clocks (`analysis.metrics.server_clocks`:
the client's TTFT less the engine core's queue and prefill), so that an error of the engine's
profile is not moved into it (fitted, it fell to 0 on a noisy machine, and the clients'
stagger with it). Every cell with more clients,
caching on and off, is held out. The step-cost profile itself is measured on the real
engine alone (`analysis.timing.calibration`), never on the server.

A cell's requests (`analysis.serving.replayable`) replay as the client sent them: for
synthetic cells the warm-up request alone, then each client's requests one after another
(request i to client i mod C); for ShareGPT cells, a closed loop of conversations, each turn
sent the per-request term after the previous reply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.engines.clock import StepCostProfile
from analysis.engines.config import POISSON, RunConfig
from analysis.metrics.oracles import Checks, brute_force_hits
from analysis.metrics.server_clocks import decode_clocks, server_clocks
from analysis.platform.errors import WorkloadError
from analysis.platform.manifest import write_json
from analysis.runs import run
from analysis.timing.held_out import GOALS

CELL_KEYS = ["mode", "prefix_regime", "concurrency"]
FITTED_CLIENTS = 1
# The measured requests start this long after the warm-up request was sent: long after it
# finished (checked), so the cache holds its prefix and the engine is idle, as on the server.
MEASURED_AFTER_S = 600.0
# The KV pool where the server's is not known (a GPU sizes it from free memory): larger than
# any cell here needs.
NUM_BLOCKS = 4096
# What a profile is measured with, as the server runs it (its pool only bounds what runs at
# once, which the calibration workloads never reach).
CALIBRATED_SETTINGS = (
    "model",
    "block_size",
    "max_model_len",
    "max_num_batched_tokens",
    "max_num_seqs",
)


# How the per-request term was found: by the server's own clocks, or fitted to the client's
# TTFT against replay's (cells measured before the server's clocks were recorded).
FRONTEND_MEASURED = "measured: the client's TTFT less the engine core's queue and prefill"
FRONTEND_FITTED = "fitted: the client's TTFT less replay's"


@dataclass(frozen=True)
class ServerTerms:
    """What the server adds to its engine, in seconds."""

    frontend_s: float = 0.0
    step_s: float = 0.0
    frontend_source: str = FRONTEND_FITTED

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(
            [
                (
                    "frontend_s",
                    self.frontend_s,
                    "s per request (HTTP, hand-over, first chunk)",
                    self.frontend_source,
                ),
                (
                    "step_s",
                    self.step_s,
                    "s per engine step (outputs handed to the front end)",
                    "fitted: the client's TPOT less replay's",
                ),
            ],
            columns=["term", "value", "unit", "how"],
        )


def with_server(profile: StepCostProfile, terms: ServerTerms) -> StepCostProfile:
    """The engine's profile with the server's cost per step in its `fixed` term."""
    coefficients = dict(profile.coefficients)
    coefficients["fixed"] = coefficients.get("fixed", 0.0) + terms.step_s
    return replace(profile, coefficients=coefficients)


def replayed_pool_blocks(settings: dict[str, Any]) -> int:
    """The KV pool replay gives a server: its own in blocks where its bytes are known, else
    NUM_BLOCKS (a GPU server sizes its pool from free memory at start-up)."""
    return int(settings.get("num_blocks", NUM_BLOCKS))


def cell_trace(requests: pd.DataFrame, concurrency: int, stagger_s: float = 0.0) -> pd.DataFrame:
    """One repeat of a cell as a replay trace with timestamps: the warm-up alone at 0, then
    each client's requests as one conversation whose turns all fall due at MEASURED_AFTER_S
    (so that each goes as soon as the think time after the client's previous reply has
    passed). Client k's first request comes `stagger_s` after client k - 1's: the clients
    start together, but the server's front end hands their requests to the engine one after
    another, so the first is scheduled alone and the others join the next step."""
    rows = []
    measured = requests[~requests["warmup"]].reset_index(drop=True)
    for row in requests[requests["warmup"]].itertuples(index=False):
        rows.append(_trace_row(row, f"warmup/{row.request_id}", 0, 0.0))
    for index, row in enumerate(measured.itertuples(index=False)):
        client, turn = index % concurrency, index // concurrency
        due = MEASURED_AFTER_S + (client * stagger_s if turn == 0 else 0.0)
        rows.append(_trace_row(row, f"client{client}", turn, due))
    return pd.DataFrame(rows)


def conversation_trace(requests: pd.DataFrame) -> pd.DataFrame:
    """One repeat of a ShareGPT cell as a replay trace: each conversation's turns in order
    (a closed loop of clients takes the next conversation when one ends)."""
    rows = []
    turns: dict[str, int] = {}
    for row in requests.itertuples(index=False):
        turn = turns.get(row.conversation, 0)
        turns[row.conversation] = turn + 1
        rows.append(_trace_row(row, row.conversation, turn, float("nan")))
    return pd.DataFrame(rows)


def _trace_row(row: Any, conversation: str, turn: int, timestamp: float) -> dict[str, Any]:
    # the reply: ordinary ids (never end-of-text), as long as the server was asked to stream
    reply = np.arange(1000, 1000 + int(row.max_tokens), dtype=np.int32)
    return {
        "request_id": row.request_id,
        "conversation_id": conversation,
        "turn_index": turn,
        "prompt_ids": np.asarray(row.prompt_ids, dtype=np.int32),
        "response_ids": reply,
        "timestamp": timestamp,
    }


def replay_cell(
    requests: pd.DataFrame,
    settings: dict[str, Any],
    profile_path: Path,
    terms: ServerTerms,
) -> pd.DataFrame:
    """One repeat of a cell replayed on the clock, as the client sees it: TTFT, end-to-end
    and start, with the server's per-request term."""
    cell = requests.iloc[0]
    conversations = "conversation" in requests.columns and requests["conversation"].notna().all()
    clients = int(cell["concurrency"])
    config = RunConfig(
        engine="replay",
        device="cpu",
        outputs="recorded",
        **_replay_arrivals(requests, conversations, terms),
        think_time_s=terms.frontend_s,
        prefix_caching=cell["mode"] == "cache",
        clock=str(profile_path),
        **{**settings, "num_blocks": replayed_pool_blocks(settings)},
    )
    trace = (
        conversation_trace(requests)
        if conversations
        else cell_trace(requests, clients, stagger_s=terms.frontend_s)
    )
    result = run(trace, config, progress=False)
    replayed = result.requests
    measured = _is_measured(replayed)
    if (replayed["status"] != "finished").any():
        raise AssertionError(f"replay of cell {dict(cell[CELL_KEYS])} did not finish every request")
    if replayed.loc[~measured, "finish_s"].max() >= MEASURED_AFTER_S:
        raise AssertionError("the warm-up had not finished when the measured requests started")
    decode_tokens = (replayed["output_tokens"] - 1).clip(lower=1)
    return pd.DataFrame(
        {
            **{key: cell[key] for key in CELL_KEYS},
            "repeat": cell["repeat"],
            "request_id": replayed["request_id"],
            "warmup": ~measured,
            "start_s": replayed["arrival_s"],
            "ttft_s": replayed["ttft_s"] + terms.frontend_s,
            "e2e_s": replayed["e2e_s"] + terms.frontend_s,
            "tpot_s": (replayed["finish_s"] - replayed["first_token_s"]) / decode_tokens,
            "output_tokens": replayed["output_tokens"],
            # vLLM leaves -1 where caching is off: nothing was served from the cache
            "cached_tokens": replayed["cached_tokens"].clip(lower=0),
            "prompt_tokens": replayed["prompt_tokens"],
            "preemptions": replayed["preemptions"],
        }
    )


def _replay_arrivals(
    requests: pd.DataFrame, conversations: bool, terms: ServerTerms
) -> dict[str, Any]:
    """How replay's requests arrive, as the cell's did: synthetic clients by the trace's
    times; ShareGPT conversations from a closed loop of clients (each started the per-request
    term after the one before), or open loop on the repeat's own Poisson schedule (the same
    rate and seed give the same start times)."""
    cell = requests.iloc[0]
    clients = int(cell["concurrency"])
    if not conversations:
        return {"mode": "timestamps", "concurrency": clients}  # the stagger is in the trace
    if not _open_loop(requests):
        return {"mode": "closed-loop", "concurrency": clients, "start_stagger_s": terms.frontend_s}
    if clients < requests["conversation"].nunique():
        raise WorkloadError(
            f"an open-loop cell capped at {clients} conversations in flight, of "
            f"{requests['conversation'].nunique()}: replay has no cap, measure it with a cap of "
            "every conversation"
        )
    return {
        "mode": "poisson",
        "concurrency": clients,
        "arrival_rate": float(cell["arrival_rate"]),
        "seed": int(cell["arrival_seed"]),
        "start_stagger_s": terms.frontend_s,  # later turns released together, as above
    }


def _is_measured(requests: pd.DataFrame) -> pd.Series:
    return ~requests["conversation_id"].str.startswith("warmup/")


def replay_cells(
    cells: pd.DataFrame,
    settings: dict[str, Any],
    profile: StepCostProfile,
    terms: ServerTerms,
    scratch: Path,
) -> pd.DataFrame:
    """Every repeat of every cell replayed on `profile` with the server's terms. The repeats
    of a cell send the same requests at the same times, so one replay stands for them all,
    except in an open loop, where each repeat has a schedule (a seed) of its own."""
    path = Path(scratch) / "profile-with-server.json"
    write_json(path, with_server(profile, terms).to_dict())
    frames = []
    for _, cell in cells.groupby(CELL_KEYS, sort=False):
        repeats = sorted(cell["repeat"].unique())
        if _open_loop(cell):
            frames += [
                replay_cell(cell[cell["repeat"] == r], settings, path, terms) for r in repeats
            ]
        else:
            once = replay_cell(cell[cell["repeat"] == repeats[0]], settings, path, terms)
            frames += [once.assign(repeat=r) for r in repeats]
    return pd.concat(frames, ignore_index=True)


def _open_loop(cell: pd.DataFrame) -> bool:
    return "arrival_rate" in cell.columns and bool(np.isfinite(cell["arrival_rate"]).all())


def matched(cells: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """Each measured request (every repeat, warm-ups left out) beside its prediction."""
    sent = cells[~cells["warmup"] & (cells["status"] == "ok")]
    columns = ["ttft_s", "e2e_s", "tpot_s", "start_s"]
    keys = [*CELL_KEYS, "repeat", "request_id"]
    return sent[[*keys, "output_tokens", *columns]].merge(
        predicted[[*keys, *columns]],
        on=keys,
        suffixes=("_measured", "_predicted"),
        validate="one_to_one",
    )


def fit_terms(
    cells: pd.DataFrame, settings: dict[str, Any], profile: StepCostProfile, scratch: Path
) -> ServerTerms:
    """The server's two terms from the one-client cells. Its cost per step is fitted: what
    the server's TPOT exceeds the engine's by (one step per token with one client). Its cost
    per request is measured where the server's own clocks were recorded (`server_clocks`:
    the median over the cells of the client's TTFT less the engine core's queue and prefill),
    so that an error of the engine's profile stays in the TTFT error instead of moving into
    this term; otherwise it is fitted, with the step term in the clock: what the client's
    TTFT exceeds replay's by. Medians over requests; a term is never negative."""
    ones = cells[cells["concurrency"] == FITTED_CLIENTS]
    engine_only = matched(ones, replay_cells(ones, settings, profile, ServerTerms(), scratch))
    decoding = engine_only[engine_only["output_tokens"] > 1]
    step = max(0.0, float((decoding["tpot_s_measured"] - decoding["tpot_s_predicted"]).median()))
    clocks = server_clocks(ones)
    if not clocks.empty and clocks["timed_every_request"].all():
        frontend = float(clocks["frontend_s"].median())
        return ServerTerms(max(0.0, frontend), step, FRONTEND_MEASURED)
    stepped = matched(
        ones, replay_cells(ones, settings, profile, ServerTerms(step_s=step), scratch)
    )
    frontend = float((stepped["ttft_s_measured"] - stepped["ttft_s_predicted"]).median())
    return ServerTerms(frontend_s=max(0.0, frontend), step_s=step)


def ttft_breakdown(
    clocks: pd.DataFrame, predicted: pd.DataFrame, terms: ServerTerms
) -> pd.DataFrame:
    """`server_clocks` beside replay: per cell, the mean TTFT replay predicts and, for the
    one-client cells, the engine's part of it (the prediction less the per-request term)
    against the engine core's queue and prefill (`engine_error`), so that a TTFT miss is
    seen to lie in the engine's clock or in the front end. With more clients the engine core
    does not count a request's wait for the step under way (see `server_clocks`), which
    replay does: no engine error is computed there."""
    if clocks.empty:
        return clocks
    sent = predicted[~predicted["warmup"]]
    mean = sent.groupby(CELL_KEYS, sort=False)["ttft_s"].mean().rename("predicted_ttft_s")
    table = clocks.merge(mean.reset_index(), on=CELL_KEYS, how="left")
    engine = table["engine_queue_s"] + table["engine_prefill_s"]
    error = (table["predicted_ttft_s"] - terms.frontend_s) / engine - 1.0
    table["engine_error"] = error.where(table["concurrency"] == FITTED_CLIENTS)
    return table


def frontend_reading(breakdown: pd.DataFrame, tpot: pd.DataFrame, terms: ServerTerms) -> str:
    """How the server's front end grew with clients, from `ttft_breakdown` and
    `tpot_breakdown` (every number from them): replay adds the one-client time to every
    request, whatever the clients."""
    top = breakdown.loc[breakdown["frontend_s"].idxmax()]
    ones = breakdown[breakdown["concurrency"] == FITTED_CLIENTS]["frontend_s"]
    key = tuple(top[CELL_KEYS])
    step = tpot.set_index(CELL_KEYS).loc[key, "engine_tpot_s"]
    return (
        f"By the server's own clocks, the time outside the engine core's queue and prefill "
        f"(HTTP, the hand-over to the engine core, the first chunk; above one client also the "
        f"wait for the step under way, which replay counts) took "
        f"{ones.min() * 1e3:.1f}-{ones.max() * 1e3:.1f} ms per request at one client, where "
        f"replay adds {terms.frontend_s * 1e3:.1f} ms to every request. At "
        f"{_cell_words(top['prefix_regime'], int(top['concurrency']))}, caching "
        f"{'on' if top['mode'] == 'cache' else 'off'}, it took {top['frontend_s'] * 1e3:.0f} ms: "
        f"{top['frontend_s'] / step:.1f} times that cell's engine time per output token (one "
        "step), more than the wait for one step under way. The front end queues when many "
        "clients stream at once, and replay's clock has no term for that queue yet."
    )


def engine_reading(breakdown: pd.DataFrame) -> str:
    """Where the one-client cells' TTFT error lies, from `ttft_breakdown` (every number from
    it): the engine's clock against the engine core's own, per cell."""
    ones = breakdown.dropna(subset=["engine_error"])
    if ones.empty:
        return ""
    cells = ", ".join(
        f"{row.mode} {_workload(row.prefix_regime)} {row.engine_error:+.0%}"
        for row in ones.itertuples(index=False)
    )
    return (
        f"By the server's own clocks, its front end took {ones['frontend_s'].min() * 1e3:.1f}-"
        f"{ones['frontend_s'].max() * 1e3:.1f} ms per request in the one-client cells, and "
        "replay's engine (the profile with the per-step term) against the engine core's time "
        f"from queued to the first token was: {cells}."
    )


def tpot_breakdown(clocks: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """`decode_clocks` beside replay: per cell, the mean TPOT replay predicts for the measured
    requests and its error against the engine core's own (`engine_error`), so that a TPOT miss
    is seen to lie in the clock (the profile and the per-step term) or on the way out to the
    client (`frontend_tpot_s`)."""
    if clocks.empty:
        return clocks
    sent = predicted[~predicted["warmup"]]
    mean = sent.groupby(CELL_KEYS, sort=False)["tpot_s"].mean().rename("predicted_tpot_s")
    table = clocks.merge(mean.reset_index(), on=CELL_KEYS, how="left")
    error = table["predicted_tpot_s"] / table["engine_tpot_s"] - 1.0
    table["engine_error"] = error.where(table["comparable"])
    return table


def schedule_reading(requests: pd.DataFrame) -> str:
    """How far behind its Poisson schedule an open loop's client started the conversations
    (each first turn's `start_s` against its `due_s`, every repeat of every cell): replay
    starts them on the schedule itself, so a client slowed by a busy machine shows here, not
    as an error of the clock. Empty for requests that do not record when they were due."""
    if "due_s" not in requests.columns:
        return ""
    first = requests[requests["due_s"].notna()]
    if first.empty:
        return ""
    lag = (first["start_s"] - first["due_s"]).clip(lower=0.0)
    return (
        f"The client started the {len(first)} conversations (every repeat of every cell) a median "
        f"of {lag.median() * 1e3:.1f} ms and at most {lag.max() * 1e3:.1f} ms after their "
        "Poisson times; replay starts them on the times themselves."
    )


def tpot_reading(breakdown: pd.DataFrame) -> str:
    """Where the TPOT error lies, from `tpot_breakdown` (every number from it): per cell, what
    the way out added per token, and replay against the engine core's own TPOT."""
    if breakdown.empty or breakdown["engine_error"].isna().all():
        return ""
    rows = breakdown.dropna(subset=["engine_error"])
    cells = "; ".join(
        f"{row.mode} {_cell_words(row.prefix_regime, row.concurrency)}: "
        f"{row.engine_tpot_s * 1e3:.1f} ms by the engine core, {row.frontend_tpot_s * 1e3:+.1f} "
        f"ms on the way out, replay {row.engine_error:+.0%} against the engine core"
        for row in rows.itertuples(index=False)
    )
    return (
        "Per output token, by the engine core's own clock (its first token to its last, as it "
        f"stamped them) against the client's and replay's: {cells}."
    )


def decode_check(folder: Path, profile: StepCostProfile, clients: Sequence[int]) -> pd.DataFrame:
    """The profile against its own calibration's decode-only steps (kept in `folder`) at
    the batch sizes the cells decode at: one per client (`fit.decode_steps_by_batch`)."""
    from analysis.timing.fit import decode_steps_by_batch

    table = decode_steps_by_batch(profile, pd.read_parquet(Path(folder) / "steps.parquet"))
    return table[table["sequences"].isin(list(clients))].reset_index(drop=True)


def decode_reading(check: pd.DataFrame, by_batch: bool = False) -> str:
    """What `decode_check` says about the held-out TPOT (every number from it): a per-step term
    fitted on one client's decodes carries the profile's error there into every batch size.
    `by_batch`: the profile has a `decode_batch_s` term, fitted to these very steps."""
    if check.empty or FITTED_CLIENTS not in set(check["sequences"]):
        return ""
    if by_batch:
        errors = ", ".join(
            f"{row.error:+.0%} at {int(row.sequences)}" for row in check.itertuples(index=False)
        )
        return (
            "The profile's decode-batch terms are fitted on its calibration's decode-only "
            "steps (one free term per small batch size, jointly with the others), so on those "
            f"steps its median error by requests decoded is in-sample: {errors}. A held-out "
            "TPOT miss lies elsewhere than in the shape of a decode's cost across batch sizes: "
            "read it beside the engine core's own TPOT above."
        )
    rows = check.set_index("sequences")
    one = rows.loc[FITTED_CLIENTS]
    others = rows.drop(FITTED_CLIENTS)
    parts = [
        f"of {batch} requests at {row.modelled_median_s * 1e3:.1f} ms against "
        f"{row.measured_median_s * 1e3:.1f} ms ({row.error:+.0%}, {int(row.steps)} steps)"
        for batch, row in others.iterrows()
    ]
    gaps = ", ".join(
        f"{(row.error - one.error) * 100:+.0f} points at {batch} requests"
        for batch, row in others.iterrows()
    )
    return (
        "On its own calibration steps, the profile models a decode of one request at "
        f"{one.modelled_median_s * 1e3:.1f} ms against {one.measured_median_s * 1e3:.1f} ms "
        f"measured ({one.error:+.0%}, {int(one.steps)} steps)"
        + (f", and {'; '.join(parts)}" if parts else "")
        + ". The per-step term, fitted on one client's decodes, makes up the first error and "
        "adds the same to every batch size"
        + (f": what the held-out TPOT can inherit is the difference, {gaps}." if gaps else ".")
    )


STATISTICS = {
    "p50_ttft": lambda t, side: t[f"ttft_s_{side}"].median(),
    "p90_ttft": lambda t, side: t[f"ttft_s_{side}"].quantile(0.9),
    "mean_tpot": lambda t, side: t.loc[t["output_tokens"] > 1, f"tpot_s_{side}"].mean(),
    "throughput_req": lambda t, side: (
        len(t) / ((t[f"start_s_{side}"] + t[f"e2e_s_{side}"]).max() - t[f"start_s_{side}"].min())
    ),
}


def per_repeat(pairs: pd.DataFrame) -> pd.DataFrame:
    """Each statistic per cell and repeat, measured and predicted (the prediction is the same
    for every repeat, which sent the same requests, but in an open loop, whose repeats each
    have a schedule of their own)."""
    rows = []
    for (*cell, repeat), table in pairs.groupby([*CELL_KEYS, "repeat"], sort=False):
        for name, statistic in STATISTICS.items():
            rows.append(
                {
                    **dict(zip(CELL_KEYS, cell, strict=True)),
                    "repeat": repeat,
                    "statistic": name,
                    "measured": float(statistic(table, "measured")),
                    "predicted": float(statistic(table, "predicted")),
                }
            )
    return pd.DataFrame(rows)


def errors(pairs: pd.DataFrame, fitted_clients: int | None = FITTED_CLIENTS) -> pd.DataFrame:
    """Per cell and statistic: the median over repeats of the measured value, the prediction,
    its relative error, the server's own spread (the repeat farthest from that median, in the
    same terms), the goal, and whether the error is within the goal or within that spread.
    Cells with `fitted_clients` clients are the fitted family (None: none is); the others
    are held out."""
    repeats = per_repeat(pairs)
    rows = []
    for (*cell, name), table in repeats.groupby([*CELL_KEYS, "statistic"], sort=False):
        measured = float(table["measured"].median())
        predicted = float(table["predicted"].median())  # the same in every repeat but open loops
        spread = float((table["measured"] / measured - 1.0).abs().max())
        error = predicted / measured - 1.0
        goal = GOALS[f"{name}_error"]
        met_by = (
            "the goal"
            if abs(error) <= goal
            else ("the server's own spread" if abs(error) <= spread else "missed")
        )
        rows.append(
            {
                **dict(zip(CELL_KEYS, cell, strict=True)),
                "family": "fitted" if cell[2] == fitted_clients else "held out",
                "statistic": name,
                "measured_median_of_repeats": measured,
                "predicted": predicted,
                "error": error,
                "server_repeat_spread": spread,
                "goal": goal,
                "met_by": met_by,
            }
        )
    return pd.DataFrame(rows)


# The synthetic grid's cells without a shared prefix send the same requests with caching on
# and off, and neither serves a token from the cache: the two servers do identical work.
NO_PREFIX = "0"


def identical_work(repeats: pd.DataFrame) -> pd.DataFrame:
    """What two servers measured for identical work (an A/A pair): per client count and
    statistic, the median over repeats of the caching-on and caching-off servers' cells
    without a shared prefix, and how far apart they are (their difference over their mean).
    Empty where the cells hold no such pair (conversations, open loops)."""
    pair = repeats[repeats["prefix_regime"].astype(str) == NO_PREFIX]
    medians = pair.groupby(["concurrency", "statistic", "mode"])["measured"].median().unstack()
    if not {"cache", "no_cache"} <= set(medians.columns):
        return pd.DataFrame(columns=["concurrency", "statistic", "cache", "no_cache", "apart"])
    medians = medians[["cache", "no_cache"]].dropna()
    medians["apart"] = (medians["cache"] - medians["no_cache"]).abs() / medians.mean(axis=1)
    return medians.reset_index().rename_axis(columns=None)


def identical_work_checks(cells: pd.DataFrame) -> Checks:
    """What makes the cells without a shared prefix an A/A pair: at every client count both
    servers were sent the same requests, in every repeat, and served none of their prompt
    tokens from the cache."""
    pair = cells[(cells["prefix_regime"].astype(str) == NO_PREFIX) & ~cells["warmup"]]
    keys = ["concurrency", "repeat", "request_id"]

    def sent(mode: str) -> set[tuple]:
        rows = pair[pair["mode"] == mode]
        return {(*key, tuple(ids)) for *key, ids in rows[[*keys, "prompt_ids"]].itertuples(False)}

    on, off = sent("cache"), sent("no_cache")
    result = Checks()
    result.add("cells without a prefix measured on both servers", True, bool(on) and bool(off))
    result.add("of those requests, sent to one server only (or differently)", 0, len(on ^ off))
    cached = pd.to_numeric(pair["cached_tokens"]).fillna(0)
    result.add("of their prompt tokens, served from a cache", 0, int(cached.sum()))
    return result


def identical_work_reading(identical: pd.DataFrame, table: pd.DataFrame) -> str:
    """The A/A pair in words beside replay's held-out errors at the same client counts: how
    far two measurements of the same work lay apart on this machine, and how many held-out
    errors (misses among them) were no larger. Every number from the two tables."""
    if identical.empty:
        return "No cells here measure identical work on both servers."
    held = table[table["family"] == "held out"].merge(
        identical[["concurrency", "statistic", "apart"]], on=["concurrency", "statistic"]
    )
    widest = identical.loc[identical.groupby("concurrency")["apart"].idxmax()]
    apart = " and ".join(
        f"{row.apart:.0%} at {int(row.concurrency)} client{'' if row.concurrency == 1 else 's'}"
        f" ({row.statistic})"
        for row in widest.itertuples(index=False)
    )
    inside = held[held["error"].abs() <= held["apart"]]
    missed = held[held["met_by"] == "missed"]
    missed_inside = missed[missed["error"].abs() <= missed["apart"]]
    return (
        "**Identical work, two servers.** Without a shared prefix, the caching-on and "
        "caching-off servers were sent the same requests and neither served a token from its "
        f"cache: their medians over repeats lay apart by up to {apart}, a measure of this "
        "machine's noise between two runs of one workload, beside the repeat-to-repeat spread "
        "within a run. "
        f"Of the {len(held)} held-out statistics at those client counts, {len(inside)} lie "
        "no farther from the measurement than the two servers lay from each other, "
        f"{len(missed_inside)} of the {len(missed)} misses among them. The verdicts above do "
        "not count this spread: it is measured on the cells without a prefix only."
    )


def calibrate_like_server(
    settings: dict[str, Any],
    folder: Path,
    torch_threads: int,
    say: Any = print,
    device: str = "cpu",
) -> StepCostProfile:
    """The engine's step-cost profile measured as the server runs it: the same model and
    limits, and the server's torch threads (its worker computes on the cores vLLM binds it
    to, one fewer than the machine's on a small CPU, where the offline engine uses them all),
    so in a process of its own. Kept in `folder`, and measured again only when the settings,
    the threads, the calibration workloads, the clock's terms or the way it is fitted differ."""
    import os
    import subprocess
    import sys

    from analysis.engines.clock import TERMS, load_profile
    from analysis.timing.fit import METHODS, calibration_method
    from analysis.timing.workloads import calibration_workloads

    path = Path(folder) / "profile.json"
    if path.is_file():
        kept = load_profile(path)
        settings_kept = kept.identity.get("engine_settings", {})
        steps = Path(folder) / "steps.parquet"
        measured = set(pd.read_parquet(steps, columns=["run"])["run"]) if steps.is_file() else ()
        if (
            kept.identity.get("machine", {}).get("torch_threads") == torch_threads
            and settings_kept.get("max_num_batched_tokens") == settings["max_num_batched_tokens"]
            and settings_kept.get("block_size") == settings["block_size"]
            and kept.identity.get("model", {}).get("name") == settings["model"]
            and measured == {w.name for w in calibration_workloads(device)}
            and set(kept.coefficients) | set(kept.fit.get("dropped_terms", ())) == set(TERMS)
            and kept.fit.get("method") == METHODS[calibration_method(device)]
        ):
            return kept
    command = [sys.executable, "-m", "analysis", "calibrate", "--device", device, "--no-validate"]
    for name in CALIBRATED_SETTINGS:
        command += [f"--{name.replace('_', '-')}", str(settings[name])]
    command += ["--out", str(folder)]
    say(f"calibrating the engine with {torch_threads} torch thread(s): {' '.join(command[1:])}")
    env = {**os.environ, "OMP_NUM_THREADS": str(torch_threads)}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return load_profile(path)


def checks(
    cells: pd.DataFrame,
    predicted: pd.DataFrame,
    table: pd.DataFrame,
    fitted_clients: int | None = FITTED_CLIENTS,
) -> Checks:
    """What holds whatever the machine's speed: replay served each measured request from
    cache exactly as many prompt tokens as the server reported; every cell was replayed and
    compared on every statistic; every cell the terms were not fitted on is held out."""
    pairs = cells[~cells["warmup"]].merge(
        predicted[[*CELL_KEYS, "repeat", "request_id", "cached_tokens"]],
        on=[*CELL_KEYS, "repeat", "request_id"],
        suffixes=("", "_replayed"),
    )
    differ = int((pairs["cached_tokens"] != pairs["cached_tokens_replayed"]).sum())
    cell_count = cells[CELL_KEYS].drop_duplicates().shape[0]
    compared = table.groupby(CELL_KEYS).size()
    held = table[table["family"] == "held out"]
    result = Checks()
    # counted as misses, not as requests: how many requests a cell sends depends on the speed
    result.add(
        "measured requests with no replayed twin",
        0,
        int((~cells["warmup"]).sum()) - len(pairs),
    )
    result.add(
        "requests whose replayed cached tokens differ from the server's (every repeat)",
        0,
        differ,
    )
    result.add(
        "cells compared on all four statistics",
        cell_count,
        int((compared == len(STATISTICS)).sum()),
    )
    result.add(
        "held-out cells: every cell the server's terms were not fitted on",
        int(
            cells.loc[cells["concurrency"] != fitted_clients, CELL_KEYS].drop_duplicates().shape[0]
        ),
        int(held[CELL_KEYS].drop_duplicates().shape[0]),
    )
    return result


def reading(
    table: pd.DataFrame,
    terms: ServerTerms,
    torch_threads: int | None,
    fitted_on: str = "the one-client cells",
) -> str:
    """The comparison in words, every number from the table: how many held-out statistics
    met the goal or the server's own spread, and each miss by name."""
    held = table[table["family"] == "held out"]
    goal = int((held["met_by"] == "the goal").sum())
    spread = int((held["met_by"] == "the server's own spread").sum())
    misses = held[held["met_by"] == "missed"]
    lines = [
        f"The server's terms, from {fitted_on}: {terms.frontend_s * 1e3:.1f} ms per request "
        f"({terms.frontend_source}) and {terms.step_s * 1e3:.1f} ms per step (fitted), on an "
        "engine profile measured "
        + (f"with {torch_threads} torch thread(s), " if torch_threads is not None else "")
        + "as the server runs. "
        f"Of {len(held)} held-out "
        f"statistics ({held[CELL_KEYS].drop_duplicates().shape[0]} cells x "
        f"{len(STATISTICS)}), {goal} {'is' if goal == 1 else 'are'} within the goal and "
        f"{spread} more within the server's own repeat-to-repeat spread; "
        + (f"{len(misses)} miss:" if len(misses) else "none misses."),
        "",
    ]
    for row in misses.itertuples(index=False):
        lines.append(
            f"- {row.mode}, {_cell_words(row.prefix_regime, row.concurrency)}, "
            f"{row.statistic}: predicted {row.predicted:.4g} against "
            f"{row.measured_median_of_repeats:.4g} measured ({row.error:+.0%}; goal "
            f"{row.goal:.0%}, spread {row.server_repeat_spread:.0%})"
        )
    if terms.frontend_s <= 0 and (held["concurrency"] > 1).any():
        lines += ["", LOCKSTEP_WARNING]
    return "\n".join(lines)


# Said under a comparison whose per-request term fitted to 0: the clients' stagger is that term.
LOCKSTEP_WARNING = (
    "The per-request term fitted to 0 ms (the one-client cells' TTFT left nothing to it once "
    "the per-step term was in), so replay hands the clients' first requests to the engine at "
    "the same instant: they share one prefill step and then decode in lockstep, where the "
    "server prefills the first request alone and the others in the next step. Read the "
    "several-client TPOT and TTFT errors above with that in mind: they measure this fit's "
    "missing stagger as much as the clock."
)


@dataclass
class ServedComparison:
    profile: StepCostProfile
    terms: ServerTerms
    predicted: pd.DataFrame  # per request, as the client would see it
    repeats: pd.DataFrame  # per cell, repeat and statistic: measured and predicted
    table: pd.DataFrame  # per cell and statistic: errors against the goal (errors())
    checks: Checks
    # per cell: TTFT by the server's clocks beside replay's (ttft_breakdown(); empty without)
    breakdown: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per cell: TPOT by the engine core's clock beside the client's and replay's
    # (tpot_breakdown(); empty where the cells lack that clock)
    tpot: pd.DataFrame = field(default_factory=pd.DataFrame)


def compare_with_server(
    cells: pd.DataFrame,
    settings: dict[str, Any],
    calibration: Path,
    torch_threads: int,
    say: Any = print,
    device: str | None = None,
) -> ServedComparison:
    """Calibrate the engine as the server runs it, fit the server's terms on the one-client
    cells, replay every cell and set it beside the server's measurements. The engine is
    calibrated on `device`, by default where this machine's vLLM runs its model (the GPU where
    one is visible: the servers ran there)."""
    import tempfile

    from analysis.platform.hardware import machine

    device = device or ("cuda" if machine().cuda else "cpu")
    profile = calibrate_like_server(settings, calibration, torch_threads, say, device)
    with tempfile.TemporaryDirectory() as scratch:
        terms = fit_terms(cells, settings, profile, Path(scratch))
        predicted = replay_cells(cells, settings, profile, terms, Path(scratch))
    fitted_on = cells.loc[cells["concurrency"] == FITTED_CLIENTS, "run_id"].unique().tolist()
    write_terms(calibration, terms, fitted_on)
    return _compared(cells, predicted, profile, terms, FITTED_CLIENTS)


def compare_recorded(
    cells: pd.DataFrame,
    settings: dict[str, Any],
    profile: StepCostProfile,
    terms: ServerTerms,
) -> ServedComparison:
    """A comparison another machine made, replayed again here on the profile and server terms
    it kept: replay is deterministic, so its errors are the ones that machine printed."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        predicted = replay_cells(cells, settings, profile, terms, Path(scratch))
    return _compared(cells, predicted, profile, terms, FITTED_CLIENTS)


def same_errors(again: pd.DataFrame, recorded: pd.DataFrame) -> Checks:
    """Replayed here against what the measuring machine wrote: the same cells and
    statistics, the same predictions (float rounding aside)."""
    keys = [*CELL_KEYS, "statistic"]
    pairs = again.merge(
        recorded.astype({"prefix_regime": str}), on=keys, suffixes=("", "_recorded")
    )
    differ = ~np.isclose(pairs["predicted"], pairs["predicted_recorded"], rtol=1e-9, atol=0)
    result = Checks()
    result.add("cells and statistics compared with the recorded ones", len(recorded), len(pairs))
    result.add("predictions that differ from the recorded ones", 0, int(differ.sum()))
    return result


def _compared(
    cells: pd.DataFrame,
    predicted: pd.DataFrame,
    profile: StepCostProfile,
    terms: ServerTerms,
    fitted_clients: int | None,
) -> ServedComparison:
    """Measured and replayed requests side by side: statistics per repeat, errors, checks."""
    pairs = matched(cells, predicted)
    table = errors(pairs, fitted_clients)
    return ServedComparison(
        profile,
        terms,
        predicted,
        per_repeat(pairs),
        table,
        checks(cells, predicted, table, fitted_clients),
        ttft_breakdown(server_clocks(cells), predicted, terms),
        tpot_breakdown(decode_clocks(cells), predicted),
    )


def predicted_statistics(predicted: pd.DataFrame) -> pd.DataFrame:
    """Per cell, each statistic of its predicted requests (warm-ups left out)."""
    times = ["ttft_s", "e2e_s", "tpot_s", "start_s"]
    requests = predicted[~predicted["warmup"]].rename(columns={c: f"{c}_predicted" for c in times})
    rows = []
    for cell, table in requests.groupby(CELL_KEYS, sort=False):
        rows.append(
            {
                **dict(zip(CELL_KEYS, cell, strict=True)),
                "requests": len(table),
                **{
                    name: float(statistic(table, "predicted"))
                    for name, statistic in STATISTICS.items()
                },
                # what the pool did: prompt tokens served from the cache at first admission,
                # and requests preempted at least once (their blocks freed, prefilled again)
                "hit_rate": float(table["cached_tokens"].sum() / table["prompt_tokens"].sum()),
                "preempted_share": float((table["preemptions"] > 0).mean()),
            }
        )
    return pd.DataFrame(rows)


def predict_cells(
    to_predict: pd.DataFrame, settings: dict[str, Any], comparison: ServedComparison
) -> pd.DataFrame:
    """Cells no server ran, on the clock and server terms that `comparison` validated."""
    return _predicted_cells(to_predict, settings, comparison.profile, comparison.terms)


def predict_cells_validated_in(
    to_predict: pd.DataFrame, settings: dict[str, Any], calibration: Path
) -> pd.DataFrame:
    """Cells no server ran, on the profile and server terms a comparison kept in
    `calibration` (notebook 12 reads notebook 10's predictions this way)."""
    profile, terms = read_validated(calibration)
    return _predicted_cells(to_predict, settings, profile, terms)


def _predicted_cells(
    to_predict: pd.DataFrame,
    settings: dict[str, Any],
    profile: StepCostProfile,
    terms: ServerTerms,
) -> pd.DataFrame:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        predicted = replay_cells(to_predict, settings, profile, terms, Path(scratch))
    return predicted_statistics(predicted)


def _workload(regime: str) -> str:
    regime = str(regime)
    if regime.isdigit():
        return f"prefix {regime}"
    if regime.startswith(POISSON):
        return f"ShareGPT conversations arriving at {regime.removeprefix(POISSON)} per second"
    return "ShareGPT conversations" if regime == "sharegpt" else f"{regime} conversations"


def _cell_words(regime: str, concurrency: int) -> str:
    """A cell in words: its workload and its clients (an open loop has no clients, only a cap
    on conversations in flight that replay checked never held one back)."""
    if str(regime).startswith(POISSON):
        return _workload(regime)
    return f"{_workload(regime)}, {concurrency} client{'' if concurrency == 1 else 's'}"


def calibration_folder(settings: dict[str, Any], torch_threads: int) -> Path:
    """Where the engine's profile measured as a server runs it, and the server's terms, are
    kept (notebook 08 writes them, notebook 10 reads them)."""
    from analysis.platform.paths import results_dir

    return results_dir() / "calibration" / f"server-{settings['model']}-t{torch_threads}"


def curves_reading(curves: pd.DataFrame, table: pd.DataFrame) -> str:
    """What the predicted curves say at the edge the server did not reach, beside the largest
    held-out error where it did (every number from the two tables; the server's cells of
    other workloads, such as an open loop, left out)."""
    most = int(curves["concurrency"].max())
    edge_regime = _edge_regime(curves["prefix_regime"])
    edge = curves[(curves["concurrency"] == most) & (curves["prefix_regime"] == edge_regime)]
    by_mode = edge.set_index("mode")
    on, off = by_mode.loc["cache"], by_mode.loc["no_cache"]
    ran = table[table["prefix_regime"].isin(curves["prefix_regime"].unique())]
    held = ran[ran["family"] == "held out"]
    worst = held.loc[held["error"].abs().groupby(held["statistic"]).idxmax()]
    errors_ = ", ".join(f"{r.statistic} {r.error:+.0%}" for r in worst.itertuples(index=False))
    measured_most = int(ran["concurrency"].max())
    return (
        f"At {most} clients {_regime_phrase(edge_regime)}, replay predicts caching on at "
        f"{on['throughput_req']:.3g} requests/s against {off['throughput_req']:.3g} off "
        f"({on['throughput_req'] / off['throughput_req']:.1f}x), with a median TTFT of "
        f"{on['p50_ttft']:.3g} s against {off['p50_ttft']:.3g} s. The server measured up to "
        f"{measured_most} clients; there the largest held-out errors were {errors_}: read the "
        "curves beyond it with those errors in mind, not as measurements."
    )


def curve_checks(to_predict: pd.DataFrame, curves: pd.DataFrame, block_size: int) -> Checks:
    """What holds of predicted cells whatever the clock: each predicted every request it
    sent; caching off served nothing from the cache; and one client, caching on (one request
    at a time, so the clock decides nothing), hit between what each conversation's own history
    gives and what an infinite cache gives (`_one_client_bounds`)."""
    sent = to_predict[~to_predict["warmup"]].groupby(CELL_KEYS, sort=False).size()
    got = curves.set_index(CELL_KEYS)["requests"]
    result = Checks()
    result.add("predicted cells with every request they sent", len(sent), int((got == sent).sum()))
    off = curves.loc[curves["mode"] == "no_cache", "hit_rate"]
    result.add(
        "caching off: prompt tokens served from the cache, any client count",
        0.0,
        float(off.max()) if len(off) else 0.0,
    )
    one = curves[(curves["mode"] == "cache") & (curves["concurrency"] == 1)]
    for row in one.itertuples(index=False):
        sent_one = to_predict[
            (to_predict["mode"] == "cache")
            & (to_predict["concurrency"] == 1)
            & (to_predict["prefix_regime"] == row.prefix_regime)
        ]
        low, high = _one_client_bounds(sent_one, block_size)
        result.add(
            f"one client, caching on ({_workload(row.prefix_regime)}):"
            " each conversation's own history hit <= replay's hit rate <= an infinite cache's",
            f"[{low:.4f}, {high:.4f}]",
            round(float(row.hit_rate), 4),
            holds=low - 1e-9 <= row.hit_rate <= high + 1e-9,
        )
    return result


def hit_rates(table: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """Per mode, the share of prompt tokens served from the cache: by the server's counters,
    by replay of the same requests, and by an ideal cache of these prompts (the table's
    `predicted_hit_rate`; caching off has none)."""
    requests = predicted[~predicted["warmup"]]
    replayed = (
        requests.groupby("mode")["cached_tokens"].sum()
        / requests.groupby("mode")["prompt_tokens"].sum()
    )
    rows = table.set_index("mode")
    ideal = rows["predicted_hit_rate"].where(rows.index == "cache")
    return pd.DataFrame(
        {"server": rows["hit_rate"].fillna(0.0), "replay": replayed, "ideal_cache": ideal}
    ).rename_axis("mode")


def _one_client_bounds(sent: pd.DataFrame, block_size: int) -> tuple[float, float]:
    """Hit rates of the measured requests that bound one client's, whose requests (warm-ups
    first, which store what they prompt) go one at a time in `sent`'s order: at least each
    conversation's hits on its own earlier turns (still in a pool that holds one
    conversation), at most an infinite cache's (hits across conversations too, which LRU may
    have evicted)."""
    prompts = sent["prompt_ids"]
    measured = ~sent["warmup"].to_numpy(dtype=bool)
    total = prompts[measured].map(len).sum()
    groups = sent["conversation"] if "conversation" in sent.columns else pd.Series(0, sent.index)
    own = sum(
        brute_force_hits(p, block_size)[measured[groups.to_numpy() == g]].sum()
        for g, p in prompts.groupby(groups, sort=False)
    )
    infinite = brute_force_hits(prompts, block_size)[measured].sum()
    return float(own / total), float(infinite / total)


def _edge_regime(regimes: pd.Series) -> str:
    """The longest shared prefix, or the one workload that is not a prefix length."""
    named = sorted({str(r) for r in regimes if not str(r).isdigit()})
    if named:
        if len(named) > 1:
            raise ValueError(f"curves of one workload at a time, got {named}")
        return named[0]
    return str(max(regimes, key=int))


def _regime_phrase(regime: str) -> str:
    if str(regime).isdigit():
        return f"and a {regime}-token prefix"
    return f"on the {_workload(regime)}"


def unmeasured_prefix_reading(curves: pd.DataFrame, measured: Sequence[int]) -> str:
    """What replay predicts caching saves at the shared prefixes the server did not measure,
    per client count (every number from `curves`: median TTFT on and off, and their ratio)."""
    predicted = sorted({int(r) for r in curves["prefix_regime"]} - {int(m) for m in measured})
    if not predicted:
        return "Every predicted prefix was measured by the server too: nothing to add here."
    ttft = curves.pivot_table(
        index=["prefix_regime", "concurrency"], columns="mode", values="p50_ttft"
    )
    parts = []
    for prefix in predicted:
        cells = ttft.loc[str(prefix)].sort_index()
        each = "; ".join(
            f"{on:.3g} s on against {off:.3g} s off at {c} client{'' if c == 1 else 's'} "
            f"(saving {1 - on / off:.0%})"
            for c, on, off in zip(cells.index, cells["cache"], cells["no_cache"], strict=True)
        )
        parts.append(f"a {prefix}-token prefix: median TTFT {each}")
    shown = ", ".join(map(str, sorted(int(m) for m in measured)))
    return (
        f"The server measured prefixes of {shown} tokens. Replay, on the clock and server terms "
        "notebook 08 validated against it, predicts " + "; and ".join(parts) + ". These are "
        "predictions without an interval: notebook 08's held-out cells show how far replay "
        "has landed from this server."
    )


def pool_reading(curves: pd.DataFrame, pool_blocks: int, block_size: int) -> str:
    """What the KV pool did to caching's gain as clients grow, from the predicted cells of one
    workload: the share of prompt tokens the cache served, the requests preempted, and the
    throughput ratio of caching on to off (every number from `curves`)."""
    on = curves[curves["mode"] == "cache"].set_index("concurrency").sort_index()
    off = curves[curves["mode"] == "no_cache"].set_index("concurrency").sort_index()
    gain = on["throughput_req"] / off["throughput_req"]
    fewest, most, best = int(on.index.min()), int(on.index.max()), int(gain.idxmax())
    first, last = on.loc[fewest], on.loc[most]
    text = (
        f"Caching on, replay's cache served {first['hit_rate']:.0%} of the prompt tokens at "
        f"{fewest} client{'' if fewest == 1 else 's'} and {last['hit_rate']:.0%} at {most}, with "
        f"{last['preempted_share']:.0%} of the requests preempted there. Caching on delivers "
        f"{gain.max():.1f}x caching off's throughput at {best} clients (its largest gain) and "
        f"{gain.loc[most]:.1f}x at {most}. "
    )
    pool = f"{pool_blocks:,} blocks of {block_size} tokens ({pool_blocks * block_size:,} tokens)"
    if last["hit_rate"] >= 0.5 * first["hit_rate"]:
        return text + f"The pool of {pool} kept at least half of the reuse at {most} clients."
    if last["preempted_share"] > 0:
        return text + (
            f"The pool of {pool} is too small for {most} clients: requests are preempted and "
            "their blocks freed, so conversations lose their cached history between turns."
        )
    return text + (
        f"Nothing was preempted, so the hits were lost to eviction: with {most} conversations "
        f"in flight, the pool of {pool} evicts a conversation's blocks (least recently used "
        "first) before its next turn is scheduled."
    )


TERMS_FILE = "server-terms.json"


def write_terms(folder: Path, terms: ServerTerms, fitted_on: list[str]) -> Path:
    """The fitted server terms beside the profile they were fitted with, for other workloads
    on the same server to be predicted with (notebook 10's conversations)."""
    path = Path(folder) / TERMS_FILE
    write_json(
        path,
        {
            "frontend_s": terms.frontend_s,
            "step_s": terms.step_s,
            "frontend_source": terms.frontend_source,
            "fitted_on": fitted_on,
        },
    )
    return path


def read_validated(folder: Path) -> tuple[StepCostProfile, ServerTerms]:
    """The profile and server terms a comparison kept in `folder`, or a one-line error saying
    which notebook fits them."""
    import json

    from analysis.engines.clock import load_profile
    from analysis.platform.errors import ConfigError

    path = Path(folder) / TERMS_FILE
    if not path.is_file():
        raise ConfigError(
            f"no server terms in {folder}: run notebook 08 first (it calibrates the engine as the "
            "server runs it and fits the server's terms on its one-client cells)"
        )
    data = json.loads(path.read_text())
    terms = ServerTerms(
        float(data["frontend_s"]),
        float(data["step_s"]),
        data.get("frontend_source", FRONTEND_FITTED),
    )
    return load_profile(Path(folder) / "profile.json"), terms


def held_out_against_server(
    cells: pd.DataFrame, settings: dict[str, Any], calibration: Path
) -> ServedComparison:
    """Cells of another workload on the same server, predicted with the profile and terms a
    comparison kept in `calibration` (nothing fitted on them: every cell is held out)."""
    import tempfile

    profile, terms = read_validated(calibration)
    with tempfile.TemporaryDirectory() as scratch:
        predicted = replay_cells(cells, settings, profile, terms, Path(scratch))
    return _compared(cells, predicted, profile, terms, fitted_clients=None)
