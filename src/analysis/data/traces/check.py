"""The one consistency check of a trace frame, shared by every stage that takes a trace.

`load_trace` runs it on every file it reads (run, bounds, plan, sweep sizing, the load
generator) and `engines.workload.build_workload` on a frame handed over in memory, so that a
trace one stage refuses no other stage takes. It refuses what would otherwise be read silently
wrong: repeated request ids (a conversation replayed twice), a conversation's turns out of
order (the engines and bounds take them in row order), and token counts that disagree with the
token ids (the engines use the ids, grid sizing the counts).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.platform.errors import TraceError

REBUILD = "rebuild the trace (python -m analysis traces)"
COUNTED = (("prompt_tokens", "prompt_ids"), ("response_tokens", "response_ids"))


def check_trace(frame: pd.DataFrame, source: str | None = None) -> None:
    """Refuse, in one line naming the first bad request, a trace that would run wrong."""
    prefix = f"trace {source}: " if source else ""
    for check in (_repeated_ids, _turns_out_of_order, _counts_against_ids):
        problem = check(frame)
        if problem:
            raise TraceError(f"{prefix}{problem}; {REBUILD}")


def _repeated_ids(frame: pd.DataFrame) -> str | None:
    ids = frame["request_id"].astype(str)
    repeated = ids[ids.duplicated()]
    if not len(repeated):
        return None
    first = repeated.iloc[0]
    return (
        f"request id {first!r} appears {int((ids == first).sum())} times "
        f"({repeated.nunique()} repeated ids): give each request its own id"
    )


def _turns_out_of_order(frame: pd.DataFrame) -> str | None:
    turns = frame["turn_index"].to_numpy()
    previous = frame.groupby(frame["conversation_id"].astype(str), sort=False)["turn_index"].shift()
    backwards = previous.notna().to_numpy() & (turns <= previous.fillna(-1).to_numpy())
    if not backwards.any():
        return None
    row = frame.iloc[int(np.argmax(backwards))]
    return (
        f"conversation {str(row['conversation_id'])!r}: turn {int(row['turn_index'])} comes "
        "after a turn with the same or a higher index: sort the trace by conversation and "
        "turn_index"
    )


def _counts_against_ids(frame: pd.DataFrame) -> str | None:
    """A count column that disagrees with its ids (a null list is left to the null check)."""
    for counts, ids in COUNTED:
        if counts not in frame.columns or ids not in frame.columns:
            continue
        lengths = frame[ids].map(lambda v: -1 if v is None else len(v)).to_numpy(np.int64)
        stated = frame[counts].to_numpy()
        wrong = (lengths >= 0) & (stated != lengths)
        if wrong.any():
            at = int(np.argmax(wrong))
            return (
                f"request {str(frame['request_id'].iloc[at])!r} has {counts} "
                f"{stated[at]} but {lengths[at]} {ids} ({int(wrong.sum())} requests disagree)"
            )
    return None
