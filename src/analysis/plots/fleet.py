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
    same_load = _one_engine_at_same_load(table, rows)
    if len(same_load):
        rate_ax.plot(
            same_load.index,
            same_load.to_numpy(),
            color="0.4",
            ls="-.",
            marker="o",
            mfc="white",
            label="one engine, all the blocks, same clients",
        )
    for ax in (rate_ax, load_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(rows["replicas"].unique()))
        ax.get_xaxis().set_major_formatter(plt.ScalarFormatter())
        ax.set_xlabel("replicas (equal total KV blocks; the clients grow with them)")
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


def _one_engine_at_same_load(table: pd.DataFrame, rows: pd.DataFrame) -> pd.Series:
    """By replicas: the hit rate of one engine with the fleet's total blocks at the fleet's
    number of clients, where the grid ran it (empty otherwise)."""
    single = table[table["replicas"] == 1].drop_duplicates(["total_blocks", "concurrency"])
    points = rows[["replicas", "total_blocks", "concurrency"]].drop_duplicates()
    matched = points.merge(single[["total_blocks", "concurrency", "delivered"]], how="inner")
    return matched.set_index("replicas")["delivered"].sort_index()


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


def load_apart_figure(
    table: pd.DataFrame, one_engine: str = "one-engine", constant: str = "clients32"
) -> Figure:
    """Load and splitting moved one at a time, at the same total blocks: one engine as its
    clients grow (left), then N replicas at a fixed number of clients, one line per router
    (right). Where the clients scale with N, the two move together."""
    engine = table[table["series"] == one_engine].sort_values("concurrency")
    fixed = table[table["series"] == constant]
    fig, (load_ax, split_ax) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    total = int(engine["total_blocks"].iloc[0]) if len(engine) else 0
    load_ax.plot(
        engine["concurrency"],
        engine["delivered"],
        "o-",
        color="#4C72B0",
        label="one engine (replay)",
    )
    load_ax.plot(
        engine["concurrency"],
        engine["pooled_lru_engine_order"],
        "s:",
        color="#55A868",
        label="one LRU cache, in the engine's admission order",
    )
    load_ax.plot(engine["concurrency"], engine["ideal"], "k--", label="one infinite cache (ideal)")
    load_ax.set_xscale("log", base=2)
    load_ax.set_xticks(sorted(engine["concurrency"].unique()))
    load_ax.get_xaxis().set_major_formatter(plt.ScalarFormatter())
    load_ax.set_xlabel(f"closed-loop clients (one engine, {total:,} blocks)")
    load_ax.set_ylabel("first-prefill hit rate (% of prompt tokens)")
    load_ax.set_title("Load alone: one cache, more clients")
    load_ax.legend(fontsize=8, loc="lower left")

    clients = int(fixed["concurrency"].iloc[0]) if len(fixed) else 0
    single = fixed[fixed["replicas"] == 1].head(1)  # every router's line starts at one engine
    routers = [r for r in ROUTER_ORDER if r in set(fixed["router"])]
    for router in routers:
        line = fixed[(fixed["router"] == router) & (fixed["replicas"] > 1)]
        line = pd.concat([single, line]).sort_values("replicas")
        color, marker = ROUTER_STYLES.get(router, (None, "o"))
        split_ax.plot(line["replicas"], line["delivered"], color=color, marker=marker, label=router)
    ideal = float(fixed["ideal"].iloc[0]) if len(fixed) else float("nan")
    split_ax.axhline(ideal, color="k", ls="--", label="one infinite cache (ideal)")
    split_ax.set_xscale("log", base=2)
    split_ax.set_xticks(sorted(fixed["replicas"].unique()))
    split_ax.get_xaxis().set_major_formatter(plt.ScalarFormatter())
    split_ax.set_xlabel(f"replicas ({clients} clients, {total:,} blocks in all)")
    split_ax.set_title("Splitting alone: the same clients, more replicas")
    split_ax.legend(fontsize=8, loc="lower left")
    percent_axis(load_ax)
    load_ax.set_ylim(0, 1.0)
    fig.tight_layout()
    return fig


def routers_in_time_figure(table: pd.DataFrame, slo_ttft_s: float) -> Figure:
    """Left: each router's median and p90 TTFT (log scale: a collapsed router is seconds where
    the others are milliseconds). Right: its first-prefill hit rate against its goodput."""
    rows = table.set_index("router").loc[[r for r in ROUTER_ORDER if r in set(table["router"])]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    positions = range(len(rows))
    left.bar([p - 0.2 for p in positions], rows["ttft_p50_s"] * 1e3, width=0.4, label="median")
    left.bar([p + 0.2 for p in positions], rows["ttft_p90_s"] * 1e3, width=0.4, label="p90")
    left.axhline(slo_ttft_s * 1e3, color="0.3", linestyle="--", linewidth=1, label="TTFT target")
    left.set_yscale("log")
    left.set_xticks(list(positions), rows.index, rotation=30, ha="right")
    left.set_ylabel("TTFT (ms, log scale)")
    left.set_title("Time to first token by router")
    left.legend()
    for router, row in rows.iterrows():
        color, marker = ROUTER_STYLES[router]
        right.scatter(
            row["hit_rate"], row["goodput_req_s"], color=color, marker=marker, s=60, label=router
        )
    right.set_ylim(bottom=0)
    right.legend(fontsize=8, loc="lower right")  # routers on one point overlap: see the table
    percent_axis(right, axis="x")
    right.set_xlabel("first-prefill hit rate (tokens)")
    right.set_ylabel(f"goodput (requests/s within TTFT {slo_ttft_s * 1e3:.0f} ms)")
    right.set_title("What the reuse buys")
    fig.tight_layout()
    return fig
