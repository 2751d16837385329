"""Figures of notebook 07: what a trace allows a prefix cache to hit, with no engine in the way.

Each function takes the tables of `analysis.metrics.bounds` (plus a `trace` column naming the
trace of each row) and returns a figure; the notebook saves it with `plots.save_figure`.
Capacities are drawn in blocks on a log axis with tokens on a twin axis, rates as percent of
prompt tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, FixedLocator, LogLocator, NullFormatter, NullLocator

from analysis.plots import RATE_COLORS, TRACE_COLORS, TRACE_LABELS, percent_axis

# bounds' policy names -> the words (and colours) of RATE_COLORS
POLICY_WORDS = {"lru": "lru", "opt": "optimal"}
POLICY_LABELS = {"lru": "LRU", "opt": "optimal (Belady)"}
ENGINE_MARKERS = {"replay": "o", "vllm": "s"}
OTHER_COLOR = "#555555"


def trace_label(trace: str) -> str:
    return TRACE_LABELS.get(trace, trace)


def trace_color(trace: str) -> str:
    return TRACE_COLORS.get(trace, OTHER_COLOR)


def comparable_engine_points(
    points: pd.DataFrame | None,
    *,
    block_size: int,
    limit: int | None,
    include_outputs: bool,
    traces: Sequence[str] = ("single_turn", "multi_turn"),
) -> tuple[pd.DataFrame, str]:
    """The finished sweep points measured on the same sample, block size and outputs as the
    bounds, and one line saying how many were kept: an engine point from another sample would
    sit on the wrong curve without anything looking wrong."""
    columns = ["trace", "engine", "num_blocks", "first_prefill_rate", "all_prefill_rate"]
    if points is None or len(points) == 0:
        return pd.DataFrame(columns=columns), "no sweep points yet: run `make sweep` to add them"
    frame = points.copy()
    frame["trace"] = frame["trace"].map(lambda t: Path(str(t)).stem)
    keep = frame["trace"].isin(list(traces)) & (frame["block_size"] == block_size)
    keep &= frame["limit"].isna() if limit is None else frame["limit"] == limit
    if "outputs" in frame.columns:  # recorded replies are cached, free ones are not comparable
        keep &= (frame["outputs"] == "recorded") == include_outputs
    if "max_output_tokens" in frame.columns and include_outputs:
        keep &= frame["max_output_tokens"].isna()
    chosen = frame[keep].sort_values(["trace", "engine", "num_blocks"], kind="stable")
    others = len(frame) - len(chosen)
    note = f"{len(chosen)} sweep points overlaid"
    if others:
        note += f" ({others} others use another sample, block size or outputs setting)"
    return chosen.reset_index(drop=True), note


def engine_against_lru(
    engine: pd.DataFrame, indexes: Mapping[str, object], block_size: int
) -> pd.DataFrame:
    """Each engine point (`comparable_engine_points`) next to the LRU bound in trace order and
    the ideal at the same number of blocks: where the engine sits against the curves it is
    drawn on. `indexes` maps a trace name to its `bounds.index_trace` of the same sample."""
    from analysis.metrics import bounds

    frames = []
    for trace, group in engine.groupby("trace", sort=False):
        index = indexes[trace]
        capacities = group["num_blocks"].astype(np.int64).to_numpy()
        hit_blocks = bounds.lru_hit_blocks(index, block_size, capacities)
        frames.append(
            group[["trace", "engine", "num_blocks", "first_prefill_rate"]].assign(
                lru_rate=hit_blocks * block_size / index.total_prompt_tokens,
                ideal_rate=bounds.ideal_hit_rate(index, block_size),
            )
        )
    columns = ["trace", "engine", "num_blocks", "first_prefill_rate", "lru_rate", "ideal_rate"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def capacity_curves_figure(
    curves: pd.DataFrame,
    ideal: Mapping[str, float],
    block_size: int,
    engine: pd.DataFrame | None = None,
    *,
    titles: Mapping[str, str] | None = None,
) -> Figure:
    """One panel per trace (the keys of `ideal`): ideal as a line, optimal and LRU against
    capacity, and the engine's measured rates at its num_blocks when given.

    The y axis fits the bounds and the first-prefill points; an all-prefill rate far above
    them (preemptions counted as hits) is pinned to the top edge with its value written.
    """
    traces = list(ideal)
    fig, axes = plt.subplots(
        1, len(traces), figsize=(6.0 * len(traces) + 1.0, 4.6), squeeze=False, sharex=True
    )
    for ax, trace in zip(axes[0], traces, strict=True):
        rows = curves[curves["trace"] == trace]
        ax.axhline(
            ideal[trace], color=RATE_COLORS["ideal"], linestyle="--", label="ideal (infinite cache)"
        )
        for policy, width, alpha in (("opt", 4.5, 0.55), ("lru", 1.8, 1.0)):
            part = rows[rows["policy"].astype(str) == policy]
            if len(part):
                sns.lineplot(
                    data=part,
                    x="capacity",
                    y="hit_rate",
                    ax=ax,
                    color=RATE_COLORS[POLICY_WORDS[policy]],
                    label=POLICY_LABELS[policy],
                    linewidth=width,
                    alpha=alpha,
                    marker="o" if len(part) <= 12 else None,
                )
        points = engine[engine["trace"] == trace] if engine is not None else None
        top = _rate_ceiling(ideal[trace], points)
        if points is not None and len(points):
            _draw_engine(ax, points, top)
        ax.set_xscale("log")
        ax.set_ylim(0, top)
        percent_axis(ax)
        ax.set_xlabel(f"cache capacity (blocks of {block_size} tokens, log scale)")
        ax.set_ylabel("hit rate (% of prompt tokens)")
        ax.set_title((titles or {}).get(trace, trace_label(trace)))
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    for ax in axes[0]:  # after every panel is drawn: the shared x range is final
        _log_ticks(ax.xaxis, *ax.get_xlim())
        _token_twin(ax, block_size)
    fig.tight_layout()
    _figure_legend(fig, axes[0])
    return fig


def _rate_ceiling(ideal: float, points: pd.DataFrame | None) -> float:
    """Top of the rate axis: room above the ideal and every first-prefill point, and above the
    all-prefill points unless they would squash the bounds into the bottom of the panel."""
    top = ideal
    if points is not None and len(points):
        top = max(top, float(points["first_prefill_rate"].max()))
        inflated = float(points["all_prefill_rate"].max())
        if inflated <= 2 * top:
            top = max(top, inflated)
    return max(top, 1e-3) * 1.15


def _draw_engine(ax, rows: pd.DataFrame, top: float) -> None:
    """The engine's points at their num_blocks; all-prefill rates above `top` sit on the top
    edge as triangles with their value."""
    for engine_name, part in rows.groupby("engine", sort=True):
        marker = ENGINE_MARKERS.get(str(engine_name), "D")
        ax.scatter(
            part["num_blocks"],
            part["first_prefill_rate"],
            color=RATE_COLORS["first-prefill"],
            marker=marker,
            s=50,
            zorder=4,
            label=f"{engine_name}: first-prefill rate (measured)",
        )
        inside = part["all_prefill_rate"] <= top
        ax.scatter(
            part.loc[inside, "num_blocks"],
            part.loc[inside, "all_prefill_rate"],
            facecolors="none",
            edgecolors=RATE_COLORS["all-prefill"],
            marker=marker,
            s=50,
            linewidths=1.5,
            zorder=4,
            label=f"{engine_name}: all-prefill rate (measured)",
        )
        above = part[~inside]
        if len(above):
            ax.scatter(
                above["num_blocks"],
                np.full(len(above), top * 0.97),
                facecolors="none",
                edgecolors=RATE_COLORS["all-prefill"],
                marker="^",
                s=60,
                linewidths=1.5,
                zorder=4,
                clip_on=False,
                label="all-prefill rate off the scale (value written)",
            )
            above = above.sort_values("num_blocks")
            for k, (x, value) in enumerate(
                zip(above["num_blocks"], above["all_prefill_rate"], strict=True)
            ):
                # under its own triangle (beside it, the next triangle drew over it), staggered
                # downwards so that neighbouring values on the log axis do not overlap
                ax.annotate(
                    f"{value:.0%}",
                    (x, top * 0.97),
                    xytext=(0, -12 - 10 * (k % 3)),
                    textcoords="offset points",
                    ha="center",
                    va="top",
                    color=RATE_COLORS["all-prefill"],
                    fontsize="small",
                )


def _figure_legend(fig: Figure, axes: Sequence) -> None:
    """One legend under the panels, each label once."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    fig.legend(
        entries.values(),
        entries.keys(),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(3, len(entries)),
        fontsize="small",
    )


def _token_twin(ax, block_size: int) -> None:
    """Tokens on the top axis: the same capacity, times the block size."""
    twin = ax.secondary_xaxis("top", functions=(lambda b: b * block_size, lambda t: t / block_size))
    twin.set_xlabel("capacity (tokens)")
    low, high = ax.get_xlim()
    _log_ticks(twin.xaxis, low * block_size, high * block_size)


def _log_ticks(axis, low: float, high: float) -> None:
    """Labels 1, 2, 5 per decade on short log axes, one per decade on long ones, as 16k, 1M."""
    decades = np.log10(max(high, 1e-9) / max(low, 1e-9))
    subs = (1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(EngFormatter(sep=""))
    axis.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10))))
    axis.set_minor_formatter(NullFormatter())


def token_vs_block_figure(reuse: pd.DataFrame) -> Figure:
    """Infinite-cache hit rate against the granularity of reuse (1 token = a radix tree), and
    the share of token-level reuse that whole blocks keep."""
    frame = reuse[reuse["level"] == "block"].copy()
    frame["label"] = frame["trace"].map(trace_label)
    palette = {trace_label(t): trace_color(t) for t in frame["trace"].unique()}
    sizes = sorted(frame["block_size"].unique())
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.0, 4.4))
    for ax, column, ylabel in (
        (left, "hit_rate", "infinite-cache hit rate (% of prompt tokens)"),
        (right, "share_of_token_level", "kept of token-level reuse (%)"),
    ):
        sns.lineplot(
            data=frame, x="block_size", y=column, hue="label", palette=palette, marker="o", ax=ax
        )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{s}" for s in sizes])
        ax.set_xlabel("block size (tokens per block, log scale; 1 = token level, a radix tree)")
        ax.set_ylabel(ylabel)
        ax.legend(title=None)
    left.set_ylim(0, 1)
    percent_axis(left)
    low = float(frame["share_of_token_level"].min())
    right.set_ylim(min(0.8, np.floor(low * 20) / 20), 1.005)
    percent_axis(right)
    left.set_title("Reuse an infinite cache finds")
    right.set_title("What whole blocks keep of token-level reuse")
    fig.tight_layout()
    return fig


def reuse_distance_figure(distances: pd.DataFrame, block_size: int) -> Figure:
    """Cumulative share of reused blocks by how long ago they were last used: in distinct blocks
    (the LRU capacity that keeps a block is its stack distance + 1) and in requests."""
    frame = distances.copy()
    frame["label"] = frame["trace"].map(trace_label)
    frame["lru_capacity"] = frame["distinct_blocks_since"] + 1
    palette = {trace_label(t): trace_color(t) for t in frame["trace"].unique()}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.0, 4.4))
    sns.ecdfplot(
        data=frame, x="lru_capacity", hue="label", palette=palette, log_scale=True, ax=left
    )
    sns.ecdfplot(
        data=frame, x="requests_since", hue="label", palette=palette, log_scale=True, ax=right
    )
    left.set_xlabel(f"LRU capacity that keeps the block (blocks of {block_size} tokens, log)")
    right.set_xlabel("requests since the block was last used (log scale)")
    for ax in (left, right):
        ax.set_ylabel("reused blocks (cumulative %)")
        ax.set_ylim(0, 1.01)
        percent_axis(ax)
        legend = ax.get_legend()
        if legend is not None:
            legend.set_title(None)
    for ax in (left, right):
        _log_ticks(ax.xaxis, *ax.get_xlim())
    left.set_title("Reuse distance in blocks")
    right.set_title("Reuse distance in requests")
    fig.tight_layout()
    return fig


def bounds_summary(index, block_size: int, share: float = 0.9) -> dict[str, float | int]:
    """One row of the notebook's table: the ideal and how much LRU cache reaches `share` of it.

    An LRU cache of C blocks hits a block iff its stack distance is below C, so the capacity
    that keeps `share` of the ideal hits is that quantile of the distances, plus one.
    """
    from analysis.metrics import bounds

    ideal = bounds.ideal_bound(index, block_size)
    wanted = math.ceil(round(share * (ideal.hit_tokens // block_size), 9))
    needed = bounds.lru_capacity_for(index, block_size, wanted) or 0
    return {
        "requests": ideal.requests,
        "prompt_tokens": ideal.prompt_tokens,
        "ideal_%": 100 * ideal.hit_rate,
        f"lru_{round(100 * share)}%_blocks": needed,
        "later_turns_%": 100 * (ideal.multi_turn_hit_share or 0.0),
    }
