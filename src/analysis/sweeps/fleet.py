"""The fleet grid's results as one table (notebook 13): a row per point, `metrics.fleet`'s."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.sweeps.grid import grid_points, is_done, resolve_trace, result_folder
from analysis.sweeps.results import ensure_grid


def fleet_table(name_or_path: str | Path = "fleet", *, run_missing: bool = True) -> pd.DataFrame:
    """One row per finished fleet point: its configuration, the hit-rate split against one
    cache, load imbalance and queueing (`analysis.metrics.fleet.fleet_row`)."""
    from analysis.data.traces import load_trace
    from analysis.engines import RunResult
    from analysis.engines.workload import limit_trace
    from analysis.metrics.fleet import fleet_row

    points = ensure_grid(name_or_path) if run_missing else grid_points(name_or_path)
    traces: dict[tuple[str, int | None], pd.DataFrame] = {}
    rows = []
    for point in points:
        folder = result_folder(point)
        if not is_done(point, folder):
            continue
        config = point.config
        key = (config.trace, config.limit)
        if key not in traces:
            traces[key] = limit_trace(load_trace(resolve_trace(config.trace)), config.limit)
        result = RunResult.read(folder)
        rows.append(
            {"point_id": point.point_id, "series": point.series, "trace": config.trace}
            | fleet_row(result, traces[key])
        )
    return pd.DataFrame(rows)


def _at(rows: pd.DataFrame, router: str, replicas: int) -> pd.Series:
    return rows[(rows["router"] == router) & (rows["replicas"] == replicas)].iloc[0]


def _pct(rate: float) -> str:
    return f"{100 * rate:.1f} %"


def routers_reading(table: pd.DataFrame) -> str:
    """The reading of the routers figure, every number from `table`."""
    rows = table[table["series"] == "routers"]
    most = int(rows["replicas"].max())
    last = rows[rows["replicas"] == most].sort_values("delivered", ascending=False)
    best, worst = last.iloc[0], last.iloc[-1]
    spread = _at(rows, "round-robin", most)
    kept = _at(rows, "affinity", most)
    text = [
        f"**Reading.** With the same {int(best['total_blocks']):,} blocks split over {most} "
        f"replicas, {best['router']} delivers {_pct(best['delivered'])} and {worst['router']} "
        f"{_pct(worst['delivered'])} (one infinite cache: {_pct(best['ideal'])}). "
        f"Round-robin sent {_pct(spread['turns_moved'])} of later turns to another replica "
        f"than their conversation's previous turn, so only {_pct(spread['routed_ideal'])} "
        f"stays reachable even with infinite replicas; session affinity moved "
        f"{_pct(kept['turns_moved'])} and keeps {_pct(kept['routed_ideal'])} reachable, of "
        f"which its replicas' smaller caches delivered {_pct(kept['engines_keep'])}, at a load "
        f"imbalance of {kept['load_imbalance_mean']:.2f} (max over mean running requests)."
    ]
    for replicas in sorted(rows.loc[rows["replicas"] > 1, "replicas"].unique()):
        plain, capped = _at(rows, "affinity", replicas), _at(rows, "affinity-cap1.25", replicas)
        text.append(
            f"At {replicas} replicas the bounded-load cap gives {_pct(capped['delivered'])} "
            f"with {int(capped['preemptions'])} preemptions against "
            f"{_pct(plain['delivered'])} with {int(plain['preemptions'])} unbounded."
        )
    collapsed = rows[(rows["router"] == "approx-prefix") & (rows["replicas"] > 1)]
    if len(collapsed) and (collapsed["load_imbalance_mean"] >= collapsed["replicas"] - 1e-9).all():
        text.append(
            "The approximate prefix router sent every request to one replica at every N > 1 "
            "(imbalance = N): every prompt opens with the same chat-template system block, so "
            "the replica it sent the first request to always holds the longest remembered "
            "prefix. The precise router reads what replicas actually cached: before any step "
            "ran, no replica holds anything, so the first requests spread by load and every "
            "replica then holds the shared block."
        )
    return " ".join(text)


def beta_reading(table: pd.DataFrame) -> str:
    """The reading of the trade-off figure, every number from `table`."""
    rows = table[table["series"] == "beta"].copy()
    rows["beta"] = rows["router"].str.removeprefix("prefix-load-beta").astype(float)
    rows = rows.sort_values("beta")
    low, high = rows.iloc[0], rows.iloc[-1]
    best = rows.loc[rows["delivered"].idxmax()]
    return (
        f"**Trade-off.** At {int(low['replicas'])} replicas, beta = {low['beta']:g} (prefix "
        f"only) delivers {_pct(low['delivered'])} at a load imbalance of "
        f"{low['load_imbalance_mean']:.2f}, and beta = {high['beta']:g} delivers "
        f"{_pct(high['delivered'])} at {high['load_imbalance_mean']:.2f}. The highest hit "
        f"rate, {_pct(best['delivered'])}, came at beta = {best['beta']:g}, with an imbalance "
        f"of {best['load_imbalance_mean']:.2f} and {int(best['preemptions'])} preemptions "
        f"({int(low['preemptions'])} at beta = {low['beta']:g}, {int(high['preemptions'])} at "
        f"beta = {high['beta']:g})"
        + (
            ": the best weight on load is neither none nor the most."
            if low["beta"] < best["beta"] < high["beta"]
            else "."
        )
    )


def fleet_checks(table: pd.DataFrame):
    """The claims notebook 13 makes, each measured on `table`."""
    from analysis.metrics.oracles import Checks

    checks = Checks()
    rows = table[table["series"] == "routers"]
    single = rows[rows["replicas"] == 1]
    checks.add(
        "one replica: every router delivers the same hit rate",
        1,
        int(single["delivered"].round(12).nunique()),
    )
    checks.add(
        "no run delivers more than its routed ideal",
        len(table),
        int((table["delivered"] <= table["routed_ideal"] + 1e-9).sum()),
    )
    checks.add(
        "no routed ideal exceeds the single-cache ideal",
        len(table),
        int((table["routed_ideal"] <= table["ideal"] + 1e-9).sum()),
    )
    spread = rows[rows["router"] == "round-robin"].sort_values("replicas")["routed_ideal"]
    checks.add(
        "round-robin's routed ideal falls as replicas grow",
        True,
        bool((spread.diff().dropna() < 0).all()),
    )
    kept = rows[rows["router"] == "affinity"]
    checks.add(
        "affinity keeps >= 99 % of the ideal reachable at every N",
        True,
        bool((kept["routed_ideal"] >= 0.99 * kept["ideal"]).all()),
    )
    return checks
