"""Figures of notebook 01: what the request traces are made of."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.plots import TRACE_COLORS, TRACE_LABELS, counts_behind, percent_axis


def prompt_length_figure(prompt_tokens: dict[str, pd.Series]) -> Figure:
    """Distribution of prompt lengths per trace, on a log axis (prompts span 10 to 8k tokens)."""
    fig, ax = plt.subplots()
    longest = max(int(s.max()) for s in prompt_tokens.values())
    shortest = min(int(s.min()) for s in prompt_tokens.values())
    bins = np.geomspace(max(shortest, 1) * 0.95, max(longest, 10) * 1.05, 60)
    for name, tokens in prompt_tokens.items():
        label = f"{TRACE_LABELS.get(name, name)} (median {int(tokens.median()):,})"
        ax.hist(
            tokens,
            bins=bins,
            histtype="step",
            linewidth=2,
            label=label,
            color=TRACE_COLORS.get(name),
        )
        ax.axvline(tokens.median(), color=TRACE_COLORS.get(name), linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("prompt length (tokens, log scale)")
    ax.set_ylabel("requests")
    ax.set_title("Multi-turn prompts are long because they carry the conversation")
    ax.legend()
    return fig


def history_share_figure(by_turn: pd.DataFrame, max_turn: int = 15) -> Figure:
    """Share of each multi-turn prompt that repeats earlier turns, by turn index."""
    table = by_turn[by_turn["turn_index"] < max_turn]
    fig, ax = plt.subplots()
    ax.plot(
        table["turn_index"] + 1,
        table["mean_history_share"],
        marker="o",
        color=TRACE_COLORS["multi_turn"],
        label="mean",
    )
    ax.plot(
        table["turn_index"] + 1,
        table["median_history_share"],
        marker="s",
        linestyle="--",
        color=TRACE_COLORS["multi_turn"],
        alpha=0.6,
        label="median",
    )
    percent_axis(ax)
    ax.set_ylim(0, 1)
    ax.set_xlabel("turn of the conversation (1 = first user message)")
    ax.set_ylabel("prompt tokens that are history")
    ax.set_title("From the second turn on, most of a prompt was seen before")
    ax.legend(loc="lower right")
    counts_behind(ax, table["turn_index"] + 1, table["requests"], "requests at this turn")
    return fig
