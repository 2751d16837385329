"""Statistics of one trace: prompt lengths, turns per conversation, the share that is history.

A module of its own because it reads a trace frame, saved or just built, and needs nothing of
how it was built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass
class TraceStats:
    """Shape of a trace: what prompts are made of, for figures and sanity checks."""

    per_request: pd.DataFrame  # + history_tokens, history_share
    per_conversation: pd.DataFrame  # conversation_id, turns, prompt_tokens, response_tokens
    by_turn: pd.DataFrame  # turn_index, requests, prompt tokens, history share (mean, median)
    summary: dict[str, float]


def trace_stats(frame: pd.DataFrame) -> TraceStats:
    """Prompt lengths, turns per conversation, and the share of each prompt that is history.

    A request's history is the previous turn's prompt and reply when that turn is the row
    before it in the same conversation (multi-turn traces); otherwise it has none.
    """
    columns = ["request_id", "conversation_id", "turn_index", "prompt_tokens", "response_tokens"]
    table = frame[columns].copy()
    previous = table.shift(1)
    follows = (previous["conversation_id"] == table["conversation_id"]) & (
        previous["turn_index"] == table["turn_index"] - 1
    )
    carried = previous["prompt_tokens"].fillna(0) + previous["response_tokens"].fillna(0)
    table["history_tokens"] = np.where(follows, carried, 0).astype(np.int64)
    table["history_share"] = table["history_tokens"] / table["prompt_tokens"].clip(lower=1)
    per_conversation = (
        table.groupby("conversation_id", sort=False)
        .agg(
            turns=("turn_index", "size"),
            prompt_tokens=("prompt_tokens", "sum"),
            response_tokens=("response_tokens", "sum"),
        )
        .reset_index()
    )
    by_turn = (
        table.groupby("turn_index")
        .agg(
            requests=("request_id", "size"),
            mean_prompt_tokens=("prompt_tokens", "mean"),
            mean_history_share=("history_share", "mean"),
            median_history_share=("history_share", "median"),
        )
        .reset_index()
    )
    prompt = table["prompt_tokens"].to_numpy(dtype=np.int64)
    total = int(prompt.sum())
    summary = {
        "requests": len(table),
        "conversations": len(per_conversation),
        "prompt_tokens": total,
        "response_tokens": int(table["response_tokens"].sum()),
        "history_tokens": int(table["history_tokens"].sum()),
        "history_share": float(table["history_tokens"].sum() / total) if total else 0.0,
        "prompt_tokens_median": float(np.median(prompt)) if prompt.size else 0.0,
        "prompt_tokens_p90": float(np.percentile(prompt, 90)) if prompt.size else 0.0,
        "prompt_tokens_p99": float(np.percentile(prompt, 99)) if prompt.size else 0.0,
        "prompt_tokens_max": int(prompt.max()) if prompt.size else 0,
        "turns_per_conversation_mean": float(per_conversation["turns"].mean())
        if len(per_conversation)
        else 0.0,
    }
    return TraceStats(table, per_conversation, by_turn, summary)


def shared_prefix_tokens(prompts: pd.DataFrame | Sequence[Sequence[int]]) -> int:
    """Tokens every prompt opens with: the longest prefix common to all of them (a trace frame's
    `prompt_ids`, or a list of id sequences). Under the Llama 3.2 template that is the system
    block and the first user header, which every request shares whatever its conversation."""
    sequences = list(prompts["prompt_ids"]) if isinstance(prompts, pd.DataFrame) else list(prompts)
    if not sequences:
        return 0
    common = np.asarray(sequences[0], dtype=np.int64)
    for sequence in sequences[1:]:
        other = np.asarray(sequence[: len(common)], dtype=np.int64)
        length = min(len(other), len(common))
        differs = np.flatnonzero(common[:length] != other[:length])
        common = common[: int(differs[0]) if differs.size else length]
        if not len(common):
            break
    return int(len(common))
