"""Notebook 04's reading of its capacity sweep, every number taken from the points it is given."""

from __future__ import annotations

import pandas as pd


def fewest_blocks_row(points: pd.DataFrame, trace: str, block_size: int) -> pd.Series:
    """The point of `trace` with the fewest blocks at `block_size`: where preemption is worst."""
    rows = points[(points["trace"] == trace) & (points["block_size"] == block_size)]
    if rows.empty:
        raise ValueError(f"no {trace} point at block size {block_size} in the capacity series")
    return rows.loc[rows["num_blocks"].idxmin()]


def _side(rate: float, ideal: float) -> str:
    return "above" if rate > ideal else "below"


def curves_reading(points: pd.DataFrame, block_size: int) -> str:
    """Why all-prefill leaves first-prefill behind with few blocks, told with the sweep's own
    fewest-blocks points; the direction of each comparison is read from the numbers."""
    single = fewest_blocks_row(points, "single_turn", block_size)
    multi = fewest_blocks_row(points, "multi_turn", block_size)
    clients = int(multi["concurrency"])
    return (
        "**What the curves say.** With few blocks, requests are preempted (their blocks freed) "
        "and re-admitted later; a re-admission queries the whole prompt plus what was generated, "
        "and hits the blocks it had just computed, which are still in the free queue. The "
        "all-prefill rate counts those hits. "
        f"For *single-turn* traffic, at {int(single['num_blocks']):,} blocks of {block_size} "
        f"tokens, all-prefill is {single['all_prefill_rate']:.1%}, "
        f"{_side(single['all_prefill_rate'], single['ideal_rate'])} the traffic's ideal of "
        f"{single['ideal_rate']:.1%}: re-admission hits are counted again and again. "
        f"For *multi-turn* traffic, at {int(multi['num_blocks']):,} blocks, all-prefill is "
        f"{multi['all_prefill_rate']:.1%}, {_side(multi['all_prefill_rate'], multi['ideal_rate'])}"
        f" its ideal of {multi['ideal_rate']:.1%}: with {clients} conversations in flight each "
        "conversation's history is evicted before its next turn, and re-admission hits (a "
        "request's own fresh blocks) do not make up for the history hits lost. What holds for "
        "both is that all-prefill exceeds first-prefill wherever requests are preempted "
        f"(multi-turn: {multi['first_prefill_rate']:.1%} first-prefill against "
        f"{multi['all_prefill_rate']:.1%} all-prefill; single-turn: "
        f"{single['first_prefill_rate']:.1%} against {single['all_prefill_rate']:.1%}). The "
        "first-prefill rate counts each request once, at its first admission, and never exceeds "
        "the ideal. As blocks grow, preemptions vanish and the two rates meet. The checks table "
        "at the end holds each of these directions."
    )
