"""Engine order: a trace's requests in the order vLLM's scheduler first admitted them.

The bounds walk a trace in the order given. In trace order a conversation's turns follow one
another, so a block is reused by the very next request; the engine interleaves up to
`concurrency` conversations, and between two turns of one conversation come turns of the
others. A bound meant to sit beside an engine point must see the engine's order, or the curve
and the point describe two different reuse distances. The order comes from a run's admissions
table (one row per admission, in the order vLLM admitted them), so it is the scheduler's own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.platform.errors import BoundsError


def admission_order(admissions: pd.DataFrame, num_requests: int) -> np.ndarray:
    """Row positions of the trace, in the order of each request's first admission.

    Requests the run never admitted (prompts too long for `max_model_len`, skipped and counted
    by the run) are left out: the engine never saw them, so neither may the bound.
    """
    first = admissions[admissions["kind"] == "first"]
    order = first["request_index"].to_numpy(np.int64)
    if order.size and (order.min() < 0 or order.max() >= num_requests):
        raise BoundsError(
            f"the admissions name request {int(order.max())}, but the trace has {num_requests} "
            "requests: give the trace (and limit) the run replayed"
        )
    if np.unique(order).size != order.size:
        raise BoundsError("the admissions hold two first admissions of one request")
    return order


def in_engine_order(trace: pd.DataFrame, admissions: pd.DataFrame) -> pd.DataFrame:
    """The trace's rows reordered as the engine admitted them (`attrs` kept, index reset).

    `trace` is the frame the run replayed, limited as the run limited it: the admissions'
    `request_index` is a row of that frame.
    """
    order = admission_order(admissions, len(trace))
    ordered = trace.iloc[order].reset_index(drop=True)
    ordered.attrs = dict(trace.attrs)
    return ordered
