"""Per-request hits in the terms a client sees: the OpenAI API's `cached_tokens`.

vLLM's chat and completion endpoints report `usage.prompt_tokens_details.cached_tokens`
(with `--enable-prompt-tokens-details`): the request's `num_cached_tokens`, which vLLM 0.32
sets once, from `PrefillStats` at the request's first admission (`Scheduler.schedule` skips
it after a preemption; `OutputProcessor` copies it into the response). That is exactly the
`cached_tokens` of a run's requests table (its first admission's hits), so a replay run
predicts, request by request, what a server would return for the same order of arrivals; the
real engine checks the equality on every run (`num_cached_tokens_mismatches`).

The table here is what a client-side tool compares with its own responses, and the CDFs say
how the hits are spread: a mean hit rate hides whether every request hits a little or a few
hit everything.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

KEY = ["request_id", "conversation_id", "turn_index"]
COLUMNS = [*KEY, "prompt_tokens", "cached_tokens", "cached_share"]


def cached_tokens_table(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per admitted request: prompt tokens, `cached_tokens`, and their ratio.

    Requests a run skipped (prompts too long) or never admitted have no response, so no
    `cached_tokens`; they are left out here and counted by the run's own summary.
    """
    admitted = requests[requests["cached_tokens"] >= 0]
    table = admitted[[*KEY, "prompt_tokens", "cached_tokens"]].reset_index(drop=True)
    table["cached_share"] = table["cached_tokens"] / table["prompt_tokens"]
    return table[COLUMNS]


def cached_share_cdf(table: pd.DataFrame, by: str | None = None) -> pd.DataFrame:
    """The empirical CDF of `cached_share`, per request, overall or per value of `by`.

    One row per distinct share in each group: the share of that group's requests whose cached
    share is at most it (`requests_at_or_below`).
    """
    groups = [("all", table)] if by is None else list(table.groupby(by, sort=True))
    frames = []
    for key, group in groups:
        shares = np.sort(group["cached_share"].to_numpy(float))
        values, counts = np.unique(shares, return_counts=True)
        frames.append(
            pd.DataFrame(
                {
                    "group": key,
                    "cached_share": values,
                    "requests_at_or_below": np.cumsum(counts) / shares.shape[0],
                    "requests": shares.shape[0],
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def per_turn(table: pd.DataFrame, last_turn: int = 8) -> pd.DataFrame:
    """Token-weighted cached share and the share of requests that hit at all, per turn.

    Turns beyond `last_turn` are pooled into one row (few conversations reach them)."""
    turn = table["turn_index"].clip(upper=last_turn)
    grouped = table.assign(turn=turn, hit=table["cached_tokens"] > 0).groupby("turn")
    frame = grouped.agg(
        requests=("cached_tokens", "size"),
        prompt_tokens=("prompt_tokens", "sum"),
        cached_tokens=("cached_tokens", "sum"),
        requests_hitting=("hit", "mean"),
    ).reset_index()
    frame["cached_share"] = frame["cached_tokens"] / frame["prompt_tokens"]
    frame["turn"] = frame["turn"].map(lambda t: f"{t}+" if t == last_turn else str(t))
    return frame


def compare_with_server(expected: pd.DataFrame, served: pd.DataFrame) -> pd.DataFrame:
    """`expected` (this table) beside what a server returned, per request id.

    `served` needs `request_id` and `cached_tokens` (what the server's usage said). Rows of
    either side without the other are kept, with the missing side empty, so a request lost on
    the way is seen, not dropped.
    """
    merged = expected[["request_id", "cached_tokens"]].merge(
        served[["request_id", "cached_tokens"]],
        on="request_id",
        how="outer",
        suffixes=("_expected", "_served"),
        indicator=True,
    )
    merged["where"] = merged.pop("_merge").map(
        {"both": "both", "left_only": "expected only", "right_only": "served only"}
    )
    merged["difference"] = merged["cached_tokens_served"] - merged["cached_tokens_expected"]
    return merged
