"""Figure of notebook 15: the ideal hit rate of the same conversations through each template."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.plots import TRACE_COLORS, percent_axis


def template_hit_rates_figure(table: pd.DataFrame, block_size: int) -> Figure:
    """Multi- and single-turn ideal hit rates per template, side by side."""
    fig, ax = plt.subplots()
    x = np.arange(len(table))
    width = 0.38
    for offset, (column, trace) in zip(
        (-width / 2, width / 2),
        (("multi_ideal", "multi_turn"), ("single_ideal", "single_turn")),
        strict=True,
    ):
        bars = ax.bar(
            x + offset,
            table[column],
            width,
            color=TRACE_COLORS[trace],
            label=trace.replace("_", "-"),
        )
        ax.bar_label(bars, labels=[f"{100 * v:.1f}%" for v in table[column]], fontsize=8)
    ax.set_xticks(x, table["template"])
    percent_axis(ax)
    ax.set_ylim(0, 1)
    ax.set_xlabel("chat template")
    ax.set_ylabel(f"ideal hit rate (tokens, {block_size}-token blocks)")
    ax.set_title(f"The same conversations through {len(table)} templates")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig
