"""Figures of notebook 14: hit rate against KV memory, and how the hits spread over requests."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from analysis.plots import RATE_COLORS, percent_axis

CURVES = (  # (order, policy) -> how it is drawn
    (("engine", "opt"), {"color": RATE_COLORS["optimal"], "label": "Belady, engine order"}),
    (("engine", "lru"), {"color": RATE_COLORS["lru"], "label": "LRU, engine order"}),
    (
        ("trace", "lru"),
        {"color": RATE_COLORS["lru"], "linestyle": ":", "label": "LRU, trace order"},
    ),
)


def capacity_plan_axes(
    ax: plt.Axes,
    curves: pd.DataFrame,
    points: pd.DataFrame,
    ideal: float,
    bytes_per_block: int,
    target: tuple[float, int | None] | None = None,
) -> None:
    """One trace's curves and engine points on `ax`, blocks below and GiB on top.

    `target` is (rate, engine num_blocks or None): a horizontal line and, where the engine
    reached it, a marker on the engine's answer."""
    for (order, policy), style in CURVES:
        line = curves[(curves["order"] == order) & (curves["policy"] == policy)]
        line = line.sort_values("capacity")
        ax.plot(line["capacity"], line["hit_rate"], **style)
    ax.axhline(ideal, color=RATE_COLORS["ideal"], linestyle="--", label="ideal, engine order")
    engine = points.sort_values("num_blocks")
    ax.plot(
        engine["num_blocks"],
        engine["first_prefill"],
        "o",
        color=RATE_COLORS["first-prefill"],
        label="replay (vLLM's scheduler): first-prefill",
    )
    if target is not None:
        rate, blocks = target
        ax.axhline(rate, color="black", linewidth=0.8, alpha=0.6, label="target")
        if blocks is not None:
            ax.plot([blocks], [rate], "k*", markersize=12, label="engine's answer")
    ax.set_xscale("log")
    ax.set_xlabel("KV capacity (blocks; engine points: num_blocks)")
    ax.set_ylabel("first-prefill hit rate (tokens)")
    percent_axis(ax)
    ax.set_ylim(0, min(1.0, max(1.25 * ideal, 0.1)))  # a low ideal still fills the panel
    gib = 2**30 / bytes_per_block
    top = ax.secondary_xaxis("top", functions=(lambda b: b / gib, lambda g: g * gib))
    top.set_xlabel("KV memory (GiB)")


def capacity_plan_figure(
    panels: Mapping[str, dict], bytes_per_block: int, model_label: str
) -> Figure:
    """One panel per trace; `panels[title]` holds curves, points, ideal and target."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    for ax, (title, panel) in zip(axes[0], panels.items(), strict=True):
        capacity_plan_axes(
            ax,
            panel["curves"],
            panel["points"],
            panel["ideal"],
            panel.get("bytes_per_block", bytes_per_block),
            panel.get("target"),
        )
        ax.set_title(title)
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Hit rate against KV memory ({model_label})", fontweight="bold")
    fig.tight_layout()
    return fig


def cached_share_cdf_figure(cdf: pd.DataFrame, title: str) -> Figure:
    """The CDF of each request's cached share of its prompt, one line per group (turn)."""
    fig, ax = plt.subplots()
    for group, line in cdf.groupby("group", sort=False):
        requests = int(line["requests"].iloc[0])
        ax.step(
            line["cached_share"],
            line["requests_at_or_below"],
            where="post",
            label=f"{group} ({requests:,} requests)",
        )
    percent_axis(ax, "x")
    percent_axis(ax, "y")
    ax.set_xlabel("cached_tokens / prompt_tokens of a request")
    ax.set_ylabel("share of requests at or below")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig
