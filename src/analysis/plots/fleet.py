"""Figures of notebook 13: what the router does to a fleet's hit rate and load."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from analysis.plots import percent_axis

ROUTER_ORDER = (
    "round-robin",
    "least-loaded",
    "affinity",
    "affinity-cap1.25",
    "approx-prefix",
    "precise-prefix",
    "prefix-load-beta0.5",
)


ROUTER_STYLES = dict(
    zip(ROUTER_ORDER, zip(plt.get_cmap("tab10").colors, "osD^vPX", strict=False), strict=False)
)


def routers_by_replicas_figure(table: pd.DataFrame, series: str = "routers") -> Figure:
    """Hit rate and load imbalance against the number of replicas, one line per router, for
    the grid's `series`."""
    rows = table[table["series"] == series]
    fig, (rate_ax, load_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    routers = [r for r in ROUTER_ORDER if r in set(rows["router"])]
    routers += sorted(set(rows["router"]) - set(routers))
    for router in routers:
        line = rows[rows["router"] == router].sort_values("replicas")
        color, marker = ROUTER_STYLES.get(router, (None, "o"))
        style = {"color": color, "marker": marker, "label": router}
        rate_ax.plot(line["replicas"], line["delivered"], **style)
        load_ax.plot(line["replicas"], line["load_imbalance_mean"], **style)
    ideal = rows.groupby("replicas")["ideal"].first()
    rate_ax.plot(ideal.index, ideal.to_numpy(), "k--", label="one infinite cache (ideal)")
    for ax in (rate_ax, load_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(rows["replicas"].unique()))
        ax.get_xaxis().set_major_formatter(plt.ScalarFormatter())
        ax.set_xlabel("replicas (equal total KV blocks)")
    percent_axis(rate_ax)
    top = max(float(ideal.max()), float(rows["delivered"].max()))
    rate_ax.set_ylim(0, min(1.0, 1.25 * top))  # a trace with little reuse still reads
    rate_ax.set_ylabel("first-prefill hit rate (tokens)")
    rate_ax.set_title("Hit rate by router as the same memory is split")
    load_ax.set_ylabel("load imbalance: max / mean running requests")
    load_ax.set_title("Load imbalance by router (mean over steps)")
    rate_ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def beta_tradeoff_figure(table: pd.DataFrame) -> Figure:
    """The cache-aware trade-off: hit rate against load imbalance as beta moves."""
    rows = table[table["series"] == "beta"].copy()
    rows["beta"] = rows["router"].str.removeprefix("prefix-load-beta").astype(float)
    rows = rows.sort_values("beta")
    fig, ax = plt.subplots()
    ax.plot(rows["load_imbalance_mean"], rows["delivered"], marker="o", color="#4C72B0")
    # betas that gave the same run share one label
    for (load, rate), same in rows.groupby(["load_imbalance_mean", "delivered"], sort=False):
        betas = ", ".join(f"{b:g}" for b in same["beta"])
        ax.annotate(
            f"beta {betas}", (load, rate), textcoords="offset points", xytext=(6, 4), fontsize=8
        )
    percent_axis(ax)
    replicas = int(rows["replicas"].iloc[0]) if len(rows) else 0
    ax.set_xlabel("load imbalance: max / mean running requests (mean over steps)")
    ax.set_ylabel("first-prefill hit rate (tokens)")
    ax.set_title(f"Prefix share minus beta x load share, {replicas} replicas")
    fig.tight_layout()
    return fig
