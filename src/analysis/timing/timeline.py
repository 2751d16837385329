"""A timed run as a timeline people can look at: Chrome's trace-event JSON, which Perfetto
(ui.perfetto.dev) and chrome://tracing open.

One track holds the engine's steps (each with what it scheduled); each request has a track of
its own with three spans: waiting (arrival to the start of the step that first admitted it),
prefill (to its first token) and decode (to its last).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.engines.result import RunResult
from analysis.engines.steps import FEATURES
from analysis.platform.errors import ConfigError

ENGINE_PID, REQUESTS_PID = 1, 2


def chrome_trace(result: RunResult) -> dict[str, Any]:
    """The trace-event document of a run that kept time (the real engine, replay on a clock)."""
    steps = result.steps
    if steps is None or steps["wall_s"].isna().all():
        raise ConfigError(
            f"run {result.config_id} kept no time: a timeline needs the vllm engine or replay "
            "with --clock"
        )
    events: list[dict[str, Any]] = [
        _name(ENGINE_PID, None, "process_name", f"engine ({result.config.engine})"),
        _name(ENGINE_PID, 0, "thread_name", "steps"),
        _name(REQUESTS_PID, None, "process_name", "requests"),
    ]
    timed = steps[steps["wall_s"].notna()]
    for row in timed.itertuples(index=False):
        events.append(
            {
                "name": f"step {row.step}",
                "ph": "X",
                "pid": ENGINE_PID,
                "tid": 0,
                "ts": _us(row.start_s),
                "dur": _us(row.wall_s),
                "args": {name: int(getattr(row, name)) for name in FEATURES if hasattr(row, name)},
            }
        )
    started = dict(zip(timed["step"], timed["start_s"], strict=True))
    for row in result.requests.itertuples(index=False):
        if row.status != "finished" or np.isnan(row.first_token_s):
            continue
        tid = int(row.request_index) + 1
        events.append(_name(REQUESTS_PID, tid, "thread_name", str(row.request_id)))
        admitted = started.get(row.first_admission_step, row.arrival_s)
        for name, begin, end in (
            ("waiting", row.arrival_s, admitted),
            ("prefill", admitted, row.first_token_s),
            ("decode", row.first_token_s, row.finish_s),
        ):
            if end > begin:
                events.append(
                    {
                        "name": name,
                        "ph": "X",
                        "pid": REQUESTS_PID,
                        "tid": tid,
                        "ts": _us(begin),
                        "dur": _us(end - begin),
                        "args": {
                            "prompt_tokens": int(row.prompt_tokens),
                            "cached_tokens": int(row.cached_tokens),
                            "output_tokens": int(row.output_tokens),
                        },
                    }
                )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"config_id": result.config_id, "engine": result.config.engine},
    }


def write_chrome_trace(result: RunResult, path: str | Path) -> Path:
    """Write the run's timeline (atomically) and return where."""
    from analysis.platform.manifest import write_json

    path = Path(path)
    write_json(path, chrome_trace(result))
    return path


def spans(per_request: pd.DataFrame, side: str) -> pd.DataFrame:
    """Per request, when it arrived, got its first token and finished, on one side
    (`measured` or `replayed`) of notebook 17's per-request table."""
    arrival = per_request[f"{side}_arrival_s"]
    return pd.DataFrame(
        {
            "request_id": per_request["request_id"],
            "arrival_s": arrival,
            "first_token_s": arrival + per_request[f"{side}_ttft_s"],
            "finish_s": per_request[f"{side}_finish_s"],
        }
    )


def _name(pid: int, tid: int | None, kind: str, name: str) -> dict[str, Any]:
    event: dict[str, Any] = {"name": kind, "ph": "M", "pid": pid, "args": {"name": name}}
    if tid is not None:
        event["tid"] = tid
    return event


def _us(seconds: float) -> float:
    return round(float(seconds) * 1e6, 3)
