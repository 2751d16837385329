"""Figures of notebook 04: hit rates, preemptions and recompute against the number of blocks.

Each function takes rows of `analysis.sweeps.collect` (one per finished point, with
`ideal_rate` from `sweeps.with_ideal`) and returns a figure with one panel per trace.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from analysis.plots import RATE_COLORS, TRACE_LABELS, percent_axis

TRACE_ORDER = ("single_turn", "multi_turn")
BLOCK_STYLES = {16: "-", 32: "--", 8: ":", 64: "-.", 128: (0, (1, 3))}


def _panels(points: pd.DataFrame, height: float = 4.4) -> tuple[Figure, dict]:
    traces = [t for t in TRACE_ORDER if t in set(points["trace"])]
    fig, axes = plt.subplots(
        1, len(traces), figsize=(6.2 * len(traces), height), sharey=True, squeeze=False
    )
    return fig, dict(zip(traces, axes[0], strict=True))


def _blocks_axis(ax, block_size_note: str = "") -> None:
    ax.set_xscale("log")
    ax.set_xlabel(f"number of KV blocks (log scale){block_size_note}")


def hit_rates_figure(points: pd.DataFrame) -> Figure:
    """All-prefill, first-prefill and ideal rates against the number of blocks, per trace."""
    fig, panels = _panels(points)
    for trace, ax in panels.items():
        rows = points[points["trace"] == trace]
        for block_size, group in rows.groupby("block_size"):
            group = group.sort_values("num_blocks")
            style = BLOCK_STYLES.get(block_size, "-")
            suffix = f", block {block_size}"
            ax.plot(
                group["num_blocks"],
                group["all_prefill_rate"],
                linestyle=style,
                marker="o",
                color=RATE_COLORS["all-prefill"],
                label=f"all-prefill{suffix}",
            )
            ax.plot(
                group["num_blocks"],
                group["first_prefill_rate"],
                linestyle=style,
                marker="s",
                color=RATE_COLORS["first-prefill"],
                label=f"first-prefill (exported){suffix}",
            )
            ax.plot(
                group["num_blocks"],
                group["ideal_rate"],
                linestyle=style,
                color=RATE_COLORS["ideal"],
                label=f"ideal (infinite cache){suffix}",
            )
        _blocks_axis(ax)
        percent_axis(ax)
        ax.set_ylim(0, 1)
        ax.set_title(TRACE_LABELS.get(trace, trace))
    first = next(iter(panels.values()))
    first.set_ylabel("prefix cache hit rate (tokens)")
    first.legend(fontsize=8, loc="upper right")
    fig.suptitle("Few blocks inflate the all-prefill rate; the first-prefill rate tells the truth")
    fig.tight_layout()
    return fig


def preemption_figure(points: pd.DataFrame) -> Figure:
    """Preemptions and recompute share against the number of blocks, on the same x axis."""
    fig, panels = _panels(points)
    for trace, ax in panels.items():
        rows = points[points["trace"] == trace]
        twin = ax.twinx()
        for block_size, group in rows.groupby("block_size"):
            group = group.sort_values("num_blocks")
            style = BLOCK_STYLES.get(block_size, "-")
            ax.plot(
                group["num_blocks"],
                group["preemptions"],
                linestyle=style,
                marker="o",
                color="#444444",
                label=f"preemptions, block {block_size}",
            )
            twin.plot(
                group["num_blocks"],
                group["recompute_share"],
                linestyle=style,
                marker="^",
                color=RATE_COLORS["all-prefill"],
                label=f"recompute share, block {block_size}",
            )
        _blocks_axis(ax)
        ax.set_ylabel("preemptions (count)")
        percent_axis(twin)
        twin.set_ylim(0, 1)
        twin.set_ylabel("recompute share of prefilled tokens", color=RATE_COLORS["all-prefill"])
        twin.grid(False)
        ax.set_title(TRACE_LABELS.get(trace, trace))
        lines = ax.get_legend_handles_labels()
        twin_lines = twin.get_legend_handles_labels()
        ax.legend(lines[0] + twin_lines[0], lines[1] + twin_lines[1], fontsize=8, loc="upper right")
    fig.suptitle("Memory pressure means preemption, and preemption means prefilling again")
    fig.tight_layout()
    return fig


def hit_decomposition_figure(points: pd.DataFrame, block_size: int) -> Figure:
    """Hit tokens split into first admissions and re-admissions after preemption."""
    rows = points[points["block_size"] == block_size]
    fig, panels = _panels(rows)
    for trace, ax in panels.items():
        group = rows[rows["trace"] == trace].sort_values("num_blocks")
        labels = [f"{n:,}" for n in group["num_blocks"]]
        first = group["first_prefill_hits"] / group["all_prefill_queries"]
        again = (group["all_prefill_hits"] - group["first_prefill_hits"]) / group[
            "all_prefill_queries"
        ]
        ax.bar(labels, first, color=RATE_COLORS["first-prefill"], label="hits at first admission")
        ax.bar(
            labels,
            again,
            bottom=first,
            color=RATE_COLORS["all-prefill"],
            label="hits at re-admission after preemption",
        )
        ax.set_xlabel(f"number of KV blocks (block size {block_size})")
        ax.tick_params(axis="x", rotation=45)
        percent_axis(ax)
        ax.set_title(TRACE_LABELS.get(trace, trace))
    first_ax = next(iter(panels.values()))
    first_ax.set_ylabel("hit tokens / all queried tokens")
    first_ax.legend(fontsize=8, loc="upper right")
    fig.suptitle("Where the all-prefill hits come from")
    fig.tight_layout()
    return fig
