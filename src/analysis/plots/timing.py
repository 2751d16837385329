"""Figures of replay on a calibrated clock: against the real engine (notebook 17) and against
the real server (notebook 08)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter


def ttft_scatter_figure(per_request: pd.DataFrame, where: str) -> Figure:
    """Per request, TTFT predicted by replay on the clock against TTFT measured by the real
    engine, one panel per held-out workload, with the line of equality."""
    workloads = list(dict.fromkeys(per_request["workload"]))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 4.2), squeeze=False)
    for ax, name in zip(axes[0], workloads, strict=True):
        rows = per_request[per_request["workload"] == name]
        measured = rows["measured_ttft_s"] * 1e3
        predicted = rows["replayed_ttft_s"] * 1e3
        ax.scatter(measured, predicted, s=10, alpha=0.6)
        top = float(np.nanmax([measured.max(), predicted.max()])) * 1.05
        ax.plot([0, top], [0, top], "k--", lw=1, label="predicted = measured")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_xlabel("measured TTFT, real engine (ms)")
        ax.set_ylabel("predicted TTFT, replay on the clock (ms)")
        ax.set_title(f"{name} ({len(rows)} requests)", fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"TTFT per request, held out: replay's prediction against {where}")
    fig.tight_layout()
    return fig


def step_ratio_figure(ratios: pd.DataFrame, where: str) -> Figure:
    """The distribution of measured / modelled step time per run (1 = the profile's speed):
    how far each run's machine speed strayed from the one the profile was fitted to."""
    runs = list(dict.fromkeys(ratios["run"]))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    data = [ratios.loc[ratios["run"] == run, "ratio"].to_numpy() for run in runs]
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(np.arange(1, len(runs) + 1), runs, rotation=20, ha="right")
    ax.axhline(1.0, color="k", ls="--", lw=1, label="the profile's speed")
    ax.set_ylabel("step time: measured / modelled")
    ax.set_xlabel("run (calibration workloads, then held out)")
    ax.set_title(f"How each run's steps compare with the profile ({where})")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def timeline_figure(sides: dict[str, pd.DataFrame], seconds: float, title: str) -> Figure:
    """Requests as bars over the first `seconds` of a run, one panel per side (measured,
    predicted): arrival to first token (waiting and prefill), then first token to finish
    (decode)."""
    fig, axes = plt.subplots(len(sides), 1, figsize=(9, 2.4 * len(sides)), sharex=True)
    axes = np.atleast_1d(axes)
    for ax, (label, spans) in zip(axes, sides.items(), strict=True):
        rows = spans[spans["arrival_s"] <= seconds].sort_values("arrival_s")
        y = np.arange(len(rows))
        ax.barh(
            y,
            rows["first_token_s"] - rows["arrival_s"],
            left=rows["arrival_s"],
            height=0.8,
            color="#DD8452",
            label="arrival to first token",
        )
        ax.barh(
            y,
            rows["finish_s"] - rows["first_token_s"],
            left=rows["first_token_s"],
            height=0.8,
            color="#4C72B0",
            label="decode",
        )
        ax.set_ylabel(f"{label}\nrequests")
        ax.set_yticks([])
        ax.set_xlim(0, seconds)
    axes[0].legend(fontsize=8, loc="upper left")
    axes[-1].set_xlabel("time since the first arrival (s)")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def served_cells_figure(
    table: pd.DataFrame, repeats: pd.DataFrame, clock: str = "this machine's clock"
) -> Figure:
    """Predicted against measured, one point per cell, for median TTFT and mean TPOT: the
    measured point is the median of the repeats, its bar their range; filled: held out."""
    panels = {"p50_ttft": "median TTFT (s)", "mean_tpot": "mean TPOT (s per token)"}
    fig, axes = plt.subplots(1, len(panels), figsize=(10.5, 5))
    colors = {"cache": "#1f77b4", "no_cache": "#444444"}
    for ax, (statistic, label) in zip(axes, panels.items(), strict=True):
        rows = table[table["statistic"] == statistic]
        spread = (
            repeats[repeats["statistic"] == statistic]
            .groupby(["mode", "prefix_regime", "concurrency"])["measured"]
            .agg(["min", "max"])
        )
        for row in rows.itertuples(index=False):
            low, high = spread.loc[(row.mode, row.prefix_regime, row.concurrency)]
            held = row.family == "held out"
            ax.errorbar(
                row.measured_median_of_repeats,
                row.predicted,
                xerr=[
                    [row.measured_median_of_repeats - low],
                    [high - row.measured_median_of_repeats],
                ],
                fmt="o",
                color=colors.get(row.mode, "C2"),
                mfc=colors.get(row.mode, "C2") if held else "white",
                capsize=2,
            )
        both = pd.concat([rows["measured_median_of_repeats"], rows["predicted"]])
        line = np.array([both.min() * 0.8, both.max() * 1.25])
        ax.plot(line, line, "k:", lw=1)
        ax.fill_between(line, line * 0.9, line * 1.1, color="0.9", zorder=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            # plain numbers at 1, 2 and 5 of each decade: log-scale minor labels collide
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"measured {label}, real server\n(median of repeats; bar: their range)")
        ax.set_ylabel(f"predicted {label}\nreplay on the clock")
    handles = [
        plt.Line2D([], [], marker="o", ls="", color=colors["cache"], label="caching on"),
        plt.Line2D([], [], marker="o", ls="", color=colors["no_cache"], label="caching off"),
        plt.Line2D([], [], marker="o", ls="", color="0.5", mfc="white", label="fitted (1 client)"),
        plt.Line2D([], [], marker="o", ls="", color="0.5", label="held out"),
    ]
    axes[-1].legend(handles=handles, fontsize=8, loc="upper left")
    fig.suptitle(f"Replay on {clock} against the real server (dotted: equal; band: ±10 %)")
    fig.tight_layout()
    return fig


# The panels of the predicted curves: a statistic of the predicted cells, and its axis label.
CURVE_PANELS = {"p50_ttft": "median TTFT (s)", "throughput_req": "throughput (requests/s)"}
# ... and the pool's side: how much of the prompts the cache served.
HIT_RATE_PANEL = {"hit_rate": "prompt tokens served from the cache"}


def served_curves_figure(
    curves: pd.DataFrame, table: pd.DataFrame, panels: dict[str, str] | None = None
) -> Figure:
    """Predicted statistics (`panels`: median TTFT and throughput by default) against
    clients, caching on and off, one colour per workload (a shared prefix, or ShareGPT
    conversations); where the server ran, its measured medians (of repeats) as open markers
    and replay's prediction of those very requests as crosses (the lines may send more)."""
    panels = panels or CURVE_PANELS
    regimes = sorted(curves["prefix_regime"].unique(), key=_regime_order)
    colors = dict(
        zip(regimes, plt.get_cmap("viridis")(np.linspace(0.1, 0.8, len(regimes))), strict=True)
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.6), squeeze=False)
    for ax, (statistic, label) in zip(axes[0], panels.items(), strict=True):
        for regime in regimes:
            for mode in ("cache", "no_cache"):
                rows = curves[(curves["prefix_regime"] == regime) & (curves["mode"] == mode)]
                rows = rows.sort_values("concurrency")
                ax.plot(
                    rows["concurrency"],
                    rows[statistic],
                    "-" if mode == "cache" else "--",
                    color=colors[regime],
                    label=f"{_regime_words(regime)}, caching {'on' if mode == 'cache' else 'off'}",
                )
        measured = table[(table["statistic"] == statistic) & table["prefix_regime"].isin(regimes)]
        for row in measured.itertuples(index=False):
            color = colors[row.prefix_regime]
            marker = "s" if row.mode == "cache" else "o"
            ax.plot(
                row.concurrency, row.measured_median_of_repeats, marker, color=color, mfc="white"
            )
            ax.plot(row.concurrency, row.predicted, "x", color=color)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        if statistic == "hit_rate":
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.0%}"))
        else:
            _plain_log_axis(ax)
        ax.set_xlabel("closed-loop clients")
        where = "lines: replay on the clock" + ("; markers: server" if len(measured) else "")
        ax.set_ylabel(f"{label}\n{where}")
    title = "shared prefix" if all(str(r).isdigit() for r in regimes) else "workload"
    axes[0][0].legend(fontsize=7, title=title, title_fontsize=8)
    fig.suptitle(
        "Predicted by replay beyond what the server measured "
        "(open markers: the server; x: replay of the very requests it was sent)"
    )
    fig.tight_layout()
    return fig


def _plain_log_axis(ax: Axes) -> None:
    """A log y axis labelled in plain numbers; within one decade, its minor ticks too (else
    no label would show)."""
    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    low, high = ax.get_ylim()
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain if high / low < 10 else FuncFormatter(lambda *_: ""))


def _regime_order(regime: str) -> tuple[bool, int, str]:
    return (not str(regime).isdigit(), int(regime) if str(regime).isdigit() else 0, str(regime))


def _regime_words(regime: str) -> str:
    return f"{regime} tokens" if str(regime).isdigit() else "ShareGPT conversations"


def frontend_figure(breakdown: pd.DataFrame, per_request_s: float, where: str) -> Figure:
    """The server's front end per request against clients, one line per mode and prefix,
    beside the constant replay adds (measured at one client)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (mode, prefix), rows in breakdown.groupby(["mode", "prefix_regime"]):
        rows = rows.sort_values("concurrency")
        ax.plot(
            rows["concurrency"],
            rows["frontend_s"] * 1e3,
            "s-" if mode == "cache" else "o--",
            label=f"caching {'on' if mode == 'cache' else 'off'}, prefix {prefix}",
        )
    ax.axhline(per_request_s * 1e3, color="k", ls=":", label="replay's per-request term")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("closed-loop clients")
    ax.set_ylabel("front end per request (ms)\nclient TTFT less engine queue and prefill")
    ax.set_title(f"The server's front end under load ({where})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
