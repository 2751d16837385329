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


def _compare(a: float, b: float) -> str:
    """How `a` stands to `b` in words (rates to a tenth of a percentage point, as printed)."""
    a, b = round(100 * a, 1), round(100 * b, 1)
    return "equal to" if a == b else "above" if a > b else "below"


def sessionless_reading(table: pd.DataFrame, series: str = "mooncake") -> str:
    """The reading of the Mooncake figure (a trace without session ids), every number from
    `table`."""
    rows = table[table["series"] == series]
    most = int(rows["replicas"].max())
    one = rows[rows["replicas"] == 1].iloc[0]
    last = rows[rows["replicas"] == most].sort_values("delivered", ascending=False)
    best, worst = last.iloc[0], last.iloc[-1]
    spread, hashed = _at(rows, "round-robin", most), _at(rows, "affinity", most)
    precise = _at(rows, "precise-prefix", most)
    standing = _compare(hashed["routed_ideal"], spread["routed_ideal"])
    skipped = (
        f" ({int(one['skipped']):,} of them longer than the {int(one['max_model_len']):,}-token "
        "context, skipped and counted)"
        if one["skipped"]
        else ""
    )
    return (
        f"**Mooncake.** On the first {int(one['requests']):,} requests of Mooncake's "
        f"conversation trace{skipped}, one infinite cache reuses {_pct(one['ideal'])} of prompt "
        f"tokens and one replica of {int(one['total_blocks']):,} blocks delivers "
        f"{_pct(one['delivered'])}. Split over {most} replicas, {best['router']} delivers "
        f"{_pct(best['delivered'])} and {worst['router']} {_pct(worst['delivered'])}. The trace "
        "has no session ids, so affinity hashes every request on its own: its routed ideal, "
        f"{_pct(hashed['routed_ideal'])}, is {standing} "
        f"round-robin's, {_pct(spread['routed_ideal'])}. The precise prefix router finds shared "
        f"prefixes from the replicas' KV events instead: its routed ideal is "
        f"{_pct(precise['routed_ideal'])} and it delivers {_pct(precise['delivered'])}, at a load "
        f"imbalance of {precise['load_imbalance_mean']:.2f}." + _collapse_sentence(rows)
    )


def _collapse_sentence(rows: pd.DataFrame) -> str:
    """What the approximate prefix router did when it sent every request to one replica."""
    collapsed = rows[(rows["router"] == "approx-prefix") & (rows["replicas"] > 1)]
    if (
        not len(collapsed)
        or (collapsed["load_imbalance_mean"] < collapsed["replicas"] - 1e-9).any()
    ):
        return ""
    most = collapsed.loc[collapsed["replicas"].idxmax()]
    return (
        " As on ShareGPT, the approximate prefix router sent every request to one replica at "
        f"every N > 1 (imbalance = N) and delivered {_pct(most['delivered'])} at "
        f"{int(most['replicas'])} replicas."
    )


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


def fleet_checks(table: pd.DataFrame, sessionless: pd.DataFrame | None = None):
    """The claims notebook 13 makes, each measured on `table` (and on the `sessionless`
    Mooncake table, when given: the checks that do not need sessions)."""
    from analysis.metrics.oracles import Checks

    checks = Checks()
    _bound_checks(checks, table, "routers", "")
    if sessionless is not None:
        _bound_checks(checks, sessionless, "mooncake", "Mooncake: ")
    rows = table[table["series"] == "routers"]
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


def _bound_checks(checks, table: pd.DataFrame, series: str, label: str) -> None:
    """What holds on any trace: one replica is one engine whatever the router, and no run
    beats its routed ideal, nor a routed ideal the single-cache ideal."""
    single = table[(table["series"] == series) & (table["replicas"] == 1)]
    checks.add(
        f"{label}one replica: every router delivers the same hit rate",
        1,
        int(single["delivered"].round(12).nunique()),
    )
    checks.add(
        f"{label}no run delivers more than its routed ideal",
        len(table),
        int((table["delivered"] <= table["routed_ideal"] + 1e-9).sum()),
    )
    checks.add(
        f"{label}no routed ideal exceeds the single-cache ideal",
        len(table),
        int((table["routed_ideal"] <= table["ideal"] + 1e-9).sum()),
    )
