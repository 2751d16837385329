"""Figure of notebook 16: hit rate by tier (GPU, CPU) against the CPU memory given to offloading."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.plots import percent_axis

GPU_COLOR, CPU_COLOR = "#4C72B0", "#DD8452"


def hit_rate_by_tier_figure(table: pd.DataFrame) -> Figure:
    """Stacked bars (GPU hits, CPU hits) per CPU multiple, with the two-level bounds (LRU: total
    and GPU tier; Belady's MIN on the GPU over LRU: total) as lines at the same sizes; where the
    table holds it (`attrs["replies_stored"]`), a last hatched bar for the largest CPU run again
    with reply blocks stored too, beside its LRU bound."""
    rows = table.sort_values("multiple")
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar(x, rows["gpu_hit_rate"], color=GPU_COLOR, label="replay: GPU hits")
    ax.bar(
        x,
        rows["cpu_hit_rate"],
        bottom=rows["gpu_hit_rate"],
        color=CPU_COLOR,
        label="replay: CPU hits (loaded)",
    )
    ax.plot(
        x, rows["bound_total"], "k--", marker="o", label="bound: both tiers (LRU, write-through)"
    )
    ax.plot(x, rows["bound_gpu"], color=GPU_COLOR, ls=":", marker="s", label="bound: GPU tier")
    if "bound_opt_total" in rows:
        ax.plot(
            x,
            rows["bound_opt_total"],
            color="0.45",
            ls="-.",
            marker="^",
            label="bound: both tiers, Belady's MIN on the GPU",
        )
    labels = [
        f"{int(m)}x\n{int(c):,}" for m, c in zip(rows["multiple"], rows["cpu_blocks"], strict=True)
    ]
    replies = table.attrs.get("replies_stored")
    if replies:  # the largest CPU again with reply blocks stored too (vLLM's default: prompts)
        top = rows[rows["multiple"] == replies["multiple"]].iloc[0]
        at = len(rows)
        ax.bar(at, replies["gpu_hit_rate"], color=GPU_COLOR, hatch="//", edgecolor="white")
        ax.bar(
            at,
            replies["cpu_hit_rate"],
            bottom=replies["gpu_hit_rate"],
            color=CPU_COLOR,
            hatch="//",
            edgecolor="white",
            label="replay, replies stored too (hatched)",
        )
        ax.plot([at], [top["bound_total"]], "k", marker="o", ls="none")
        labels.append(f"{int(top['multiple'])}x\n{int(top['cpu_blocks']):,}\nreplies too")
        x = np.arange(len(labels))
    gpu = table.attrs.get("gpu_blocks")
    ax.set_xticks(x, labels)
    ax.set_xlabel(
        f"CPU memory: multiple of the GPU's {gpu:,} blocks / CPU blocks" if gpu else "CPU blocks"
    )
    ax.set_ylabel("first-prefill hit rate (share of prompt tokens)")
    percent_axis(ax)
    ax.set_ylim(0, 1)
    ax.set_title("Prefix hits by tier under vLLM's CPU offloading")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig
