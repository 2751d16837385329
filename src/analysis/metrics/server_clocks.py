"""Where a served request's time to first token went, by the server's own clocks.

vLLM keeps, per request, Prometheus histograms whose sums and counts are counters on its
`/metrics`: from the front end's arrival to the first token (`time_to_first_token_seconds`),
and in the engine core, from queued to scheduled (`request_queue_time_seconds`) and from
scheduled to the first token (`request_prefill_time_seconds`). A benchmark cell keeps their
deltas over its measured requests; set beside the client's TTFT they split it into HTTP,
hand-over, queue and prefill, measured rather than fitted. The engine core takes new requests
only between steps and starts its queue clock then, so a busy engine's wait for the step
under way falls in the hand-over.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pandas as pd

# vLLM's histogram names, without the `vllm:` prefix.
SERVER_TIMERS = (
    "time_to_first_token_seconds",
    "request_queue_time_seconds",
    "request_prefill_time_seconds",
)
# A cell's columns: each timer summed over its measured requests, and how many it timed.
SERVER_CLOCK_COLUMNS = tuple(
    f"{timer}_{part}" for timer in SERVER_TIMERS for part in ("sum", "count")
)
# The engine core's time per output token, per request: from its first token to its last as
# the engine core stamped them, over the tokens after the first (vLLM's
# `request_time_per_output_token_seconds`, recorded since cells kept it; older cells lack it).
DECODE_TIMER = "request_time_per_output_token_seconds"
DECODE_CLOCK_COLUMNS = (f"{DECODE_TIMER}_sum", f"{DECODE_TIMER}_count")
# Every clock a benchmark cell records.
RECORDED_CLOCK_COLUMNS = SERVER_CLOCK_COLUMNS + DECODE_CLOCK_COLUMNS
CELL_KEYS = ("mode", "prefix_regime", "concurrency")


def _timed_cells(
    cells: pd.DataFrame, columns: Sequence[str], keys: Sequence[str]
) -> Iterator[tuple[dict[str, Any], pd.Series, pd.DataFrame]]:
    """Each cell's keys, its clocks (the cell's sums and counts, on every row) and its
    measured requests; none where the cells lack `columns` (measured before those clocks
    were recorded)."""
    if not set(columns) <= set(cells.columns) or cells[list(columns)].isna().any().any():
        return
    for cell, table in cells.groupby(list(keys), sort=False):
        sent = table[~table["warmup"] & (table["status"] == "ok")]
        yield dict(zip(keys, cell, strict=True)), table.iloc[0], sent


def _mean(clock: pd.Series, timer: str) -> float:
    """A timer's mean over the requests it timed."""
    count = clock[f"{timer}_count"]
    return float(clock[f"{timer}_sum"] / count) if count else float("nan")


def server_clocks(cells: pd.DataFrame, keys: Sequence[str] = CELL_KEYS) -> pd.DataFrame:
    """Per cell, where a measured request's time to first token went, by the server's own
    clocks (means over the measured requests of every repeat):
    - `outside_s`: the client's TTFT less vLLM's own (from the front end's arrival), the HTTP
      request and the first chunk's way back;
    - `handover_s`: vLLM's TTFT less the engine core's queue and prefill: the request's way
      to the engine core and the first token's way back, and, where the engine is busy,
      the wait for the step under way (the engine core takes new requests between steps,
      and only then starts its queue clock);
    - `engine_queue_s`, `engine_prefill_s`: queued to scheduled, scheduled to first token;
    - `frontend_s`: the client's TTFT less the engine core's queue and prefill (outside and
      hand-over): with one client, whose engine is idle, the server's cost per request.
    `timed_every_request`: the server timed as many requests as the client measured
    (otherwise the means are over different requests). Empty where the cells were measured
    before these clocks were recorded."""
    rows = []
    for cell, clock, sent in _timed_cells(cells, SERVER_CLOCK_COLUMNS, keys):
        client = float(sent["ttft_s"].mean())
        server = _mean(clock, "time_to_first_token_seconds")
        queue = _mean(clock, "request_queue_time_seconds")
        prefill = _mean(clock, "request_prefill_time_seconds")
        rows.append(
            {
                **cell,
                "requests_measured": len(sent),
                "timed_every_request": all(
                    int(clock[f"{timer}_count"]) == len(sent)
                    for timer in ("request_queue_time_seconds", "request_prefill_time_seconds")
                ),
                "client_ttft_s": client,
                "outside_s": client - server,
                "handover_s": server - queue - prefill,
                "engine_queue_s": queue,
                "engine_prefill_s": prefill,
                "frontend_s": client - queue - prefill,
            }
        )
    return pd.DataFrame(rows)


def decode_clocks(cells: pd.DataFrame, keys: Sequence[str] = CELL_KEYS) -> pd.DataFrame:
    """Per cell, the mean time per output token by the engine core's own clock beside the
    client's (means over the measured requests of every repeat):
    - `client_tpot_s`: as the client saw the tokens stream;
    - `engine_tpot_s`: as the engine core stamped them, so without the front end, the HTTP
      stream and the client;
    - `frontend_tpot_s`: the difference, what the way out adds per token.
    `comparable`: the server timed every measured request and each streamed more than one
    token (vLLM counts a one-token request at 0 s per token, the client not at all). Empty
    where the cells were measured before this clock was recorded."""
    rows = []
    for cell, clock, sent in _timed_cells(cells, DECODE_CLOCK_COLUMNS, keys):
        client = float(sent["tpot_s"].mean())
        engine = _mean(clock, DECODE_TIMER)
        rows.append(
            {
                **cell,
                "requests_measured": len(sent),
                "comparable": int(clock[f"{DECODE_TIMER}_count"]) == len(sent)
                and bool((sent["output_tokens"] > 1).all()),
                "client_tpot_s": client,
                "engine_tpot_s": engine,
                "frontend_tpot_s": client - engine,
            }
        )
    return pd.DataFrame(rows)
