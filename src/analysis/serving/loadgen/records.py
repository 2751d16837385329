"""What a benchmark sends and what comes back: request specs, per-request results, their table.

The workloads make specs and the client turns them into results; both, and the statistics,
share these records, so they sit below all of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import pandas as pd

STATUSES = ("ok", "timeout", "error", "not_sent")


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: its prompt ids and how many tokens to generate."""

    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    group: str = ""  # prefix regime, or conversation id in a closed loop
    turn_index: int = 0
    warmup: bool = False  # sent alone before the measured phase, to populate the cache


@dataclass
class RequestResult:
    request_id: str
    group: str
    turn_index: int
    warmup: bool
    status: str
    sent_prompt_tokens: int
    prompt_tokens: int | None = None  # as counted by the server (usage)
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache (usage)
    output_tokens: int = 0
    start_s: float = math.nan  # seconds since the start of the run
    due_s: float = math.nan  # open loop, a conversation's first turn: when it was to start
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    chunks: int = 0
    error: str | None = None


def results_frame(results: Iterable[RequestResult]) -> pd.DataFrame:
    """Per-request table, one row per request, in the order given."""
    rows = [asdict(r) for r in results]
    columns = list(RequestResult.__dataclass_fields__)
    frame = pd.DataFrame(rows, columns=columns)
    frame = frame.astype(
        {
            "turn_index": "int32",
            "sent_prompt_tokens": "int32",
            "prompt_tokens": "Int64",
            "cached_tokens": "Int64",
        }
    )
    frame["tpot_s"] = time_per_output_token(frame)
    return frame


def time_per_output_token(frame: pd.DataFrame) -> pd.Series:
    """Seconds per generated token after the first, (e2e - TTFT) / (output tokens - 1): the
    decode speed a client sees (inter-token latency); NaN where fewer than 2 tokens came."""
    steps = frame["output_tokens"].astype(float) - 1.0
    tpot = (frame["e2e_s"].astype(float) - frame["ttft_s"].astype(float)) / steps
    return tpot.where(steps > 0)
