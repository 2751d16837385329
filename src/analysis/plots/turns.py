"""Figures of notebook 05: where multi-turn reuse comes from, and what erodes it."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.plots import RATE_COLORS, TRACE_COLORS, TRACE_LABELS, counts_behind, percent_axis


def rate_by_turn_figure(
    per_turn: pd.DataFrame, history: pd.DataFrame, max_turn: int = 15
) -> Figure:
    """Measured first-prefill rate by turn against the share of the prompt that is history."""
    rows = per_turn[per_turn["turn_index"] < max_turn]
    hist = history[history["turn_index"] < max_turn]
    fig, ax = plt.subplots()
    ax.plot(
        hist["turn_index"] + 1,
        hist["mean_history_share"],
        color="#999999",
        marker="o",
        label="history share of the prompt (upper bound)",
    )
    ax.plot(
        rows["turn_index"] + 1,
        rows["rate"],
        color=RATE_COLORS["first-prefill"],
        marker="s",
        label="measured first-prefill hit rate",
    )
    percent_axis(ax)
    ax.set_ylim(0, 1)
    ax.set_xlabel("turn of the conversation (1 = first user message)")
    ax.set_ylabel("share of prompt tokens")
    ax.set_title("Every turn after the first hits nearly all of its history")
    ax.legend(loc="lower right")
    return fig


def _ecdf_per_trace(ax, samples: dict[str, np.ndarray], unit: str) -> None:
    """One empirical CDF per trace, in the trace's colour, its sample size in the label."""
    for trace, values in samples.items():
        if len(values) == 0:
            continue
        values = np.sort(values)
        ax.step(
            values,
            np.arange(1, len(values) + 1) / len(values),
            where="post",
            color=TRACE_COLORS.get(trace),
            linewidth=2,
            label=f"{TRACE_LABELS.get(trace, trace)} ({len(values):,} {unit})",
        )


def per_request_figure(shares: dict[str, np.ndarray]) -> Figure:
    """Distribution (ECDF) of each request's hit share at its first admission."""
    fig, ax = plt.subplots()
    _ecdf_per_trace(ax, shares, "requests")
    percent_axis(ax, "x")
    percent_axis(ax, "y")
    ax.set_xlabel("share of the request's prompt tokens that hit")
    ax.set_ylabel("share of requests at or below (ECDF)")
    ax.set_title("Most single-turn requests hit nothing; most later turns hit most")
    ax.legend(loc="lower right")
    return fig


def reuse_gap_figure(gaps: dict[str, np.ndarray]) -> Figure:
    """Distribution of engine steps between a block's use and its next hit."""
    fig, ax = plt.subplots()
    _ecdf_per_trace(ax, gaps, "block hits")
    ax.set_xscale("log")
    percent_axis(ax)
    ax.set_xlabel("reuse gap (engine steps since the block was stored or last hit, log scale)")
    ax.set_ylabel("share of block hits at or below (ECDF)")
    ax.set_title("How long a block waits for its next hit")
    ax.legend(loc="lower right")
    return fig


def concurrency_figure(rows: pd.DataFrame) -> Figure:
    """First-prefill rate, ideal and preemptions against closed-loop concurrency."""
    rows = rows.sort_values("concurrency")
    fig, ax = plt.subplots()
    ax.plot(
        rows["concurrency"],
        rows["first_prefill_rate"],
        marker="s",
        color=RATE_COLORS["first-prefill"],
        label="first-prefill hit rate",
    )
    ax.plot(
        rows["concurrency"],
        rows["ideal_rate"],
        color=RATE_COLORS["ideal"],
        label="ideal (infinite cache)",
    )
    ax.set_xscale("log", base=2)
    percent_axis(ax)
    ax.set_ylim(0, 1)
    blocks = int(rows["num_blocks"].iloc[0])
    block_size = int(rows["block_size"].iloc[0])
    ax.set_xlabel(
        f"conversations in flight (closed-loop clients, log scale); "
        f"{blocks:,} blocks of {block_size} tokens"
    )
    ax.set_ylabel("multi-turn hit rate (tokens)")
    ax.set_title("Interleaved conversations evict each other's history")
    counts_behind(
        ax, rows["concurrency"], rows["preemptions"], "preemptions", width=rows["concurrency"] * 0.3
    )
    ax.legend(loc="lower left")
    return fig
