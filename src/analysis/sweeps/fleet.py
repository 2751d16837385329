"""The fleet grid's results as one table (notebook 13): a row per point, `metrics.fleet`'s."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.platform.errors import GridError
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
            # a fleet of one is one run for every router (`config_digest`): the router
            # is the point's own, not that of the point whose run it shares
            | {"router": config.router}
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
        f"{_pct(worst['delivered'])} (one infinite cache in trace order: "
        f"{_pct(best['ideal'])}{_same_load(table, best)}). "
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


def _same_load(table: pd.DataFrame, point: pd.Series) -> str:
    """ ", one engine at the same clients: X %" when the grid ran that engine, else nothing."""
    try:
        single = one_engine(table, int(point["total_blocks"]), int(point["concurrency"]))
    except GridError:
        return ""
    return f"; one engine with them all at the same {int(point['concurrency'])} clients: " + (
        _pct(single["delivered"])
    )


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
    _headline_checks(checks, table, sessionless)
    return checks


KV_EVENT_ROUTERS = ("precise-prefix", "prefix-load")  # the routers that read vLLM's KV events


def _headline_checks(checks, table: pd.DataFrame, sessionless: pd.DataFrame | None) -> None:
    """The readings notebook 13 states in its prose: load against splitting, the routers'
    ranking at constant load, approx-prefix's collapse, the load cap, the best beta, and on
    Mooncake, the part routing takes."""
    alone = table[table["series"] == "one-engine"]
    checks.add(
        "one engine delivers no more than the ideal in its own admission order",
        len(alone),
        int((alone["delivered"] <= alone["ideal_engine_order"] + 1e-9).sum()),
    )
    split = loss_split(table, "routers").iloc[-1]
    checks.add(
        f"{split['replicas']} replicas, {split['clients']} clients: the load costs more than "
        "splitting",
        True,
        bool(split["load_pts"] > split["splitting_pts"]),
    )
    constant = loss_split(table, "clients32")
    constant = constant[constant["replicas"] > 1]
    checks.add(
        f"{constant['clients'].iloc[0]} clients: splitting costs more at "
        f"{constant['replicas'].max()} replicas than at {constant['replicas'].min()}",
        True,
        bool(constant["splitting_pts"].iloc[-1] > constant["splitting_pts"].iloc[0]),
    )
    checks.add(
        f"{constant['clients'].iloc[0]} clients: a router reading KV events is best at every N > 1",
        True,
        bool(constant["best_router"].str.startswith(KV_EVENT_ROUTERS).all()),
    )
    rows = table[(table["series"] == "routers") & (table["replicas"] > 1)]
    checks.add(
        "approx-prefix sends every request to one replica at every N > 1",
        True,
        _collapsed(rows),
    )
    plain = rows[rows["router"] == "affinity"].set_index("replicas")["load_imbalance_mean"]
    capped = rows[rows["router"] == "affinity-cap1.25"].set_index("replicas")
    checks.add(
        "the load cap lowers affinity's load imbalance at every N > 1",
        True,
        bool((capped["load_imbalance_mean"] < plain.loc[capped.index]).all()),
    )
    beta = table[table["series"] == "beta"]
    if len(beta):
        betas = beta["router"].str.removeprefix("prefix-load-beta").astype(float)
        best = betas.loc[beta["delivered"].idxmax()]
        checks.add(
            "the best beta lies strictly between none and the most",
            True,
            bool(betas.min() < best < betas.max()),
        )
    if sessionless is not None:
        moon = sessionless[(sessionless["series"] == "mooncake") & (sessionless["replicas"] > 1)]
        checks.add(
            "Mooncake: approx-prefix sends every request to one replica at every N > 1",
            True,
            _collapsed(moon),
        )
        moon_split = loss_split(sessionless, "mooncake")
        moon_split = moon_split[moon_split["replicas"] > 1]
        checks.add(
            "Mooncake: a router reading KV events is best at every N > 1",
            True,
            bool(moon_split["best_router"].str.startswith(KV_EVENT_ROUTERS).all()),
        )
        last = moon_split.iloc[-1]
        checks.add(
            f"Mooncake, {last['replicas']} replicas: routing costs more than load or splitting",
            True,
            bool(last["routing_max_pts"] > max(last["load_pts"], last["splitting_pts"])),
        )


def _collapsed(rows: pd.DataFrame) -> bool:
    """approx-prefix's load imbalance equals N at every N of `rows` (one replica ran all)."""
    approx = rows[rows["router"] == "approx-prefix"]
    return bool(len(approx)) and bool(
        (approx["load_imbalance_mean"] >= approx["replicas"] - 1e-9).all()
    )


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


# --- load, splitting and routing taken apart ----------------------------------------------------


def one_engine(table: pd.DataFrame, total_blocks: int, clients: int) -> pd.Series:
    """The run of one engine with `total_blocks` at `clients` closed-loop clients: the
    single-cache reference of every fleet point with the same memory and load. A fleet of one
    routes nothing, so any router's run stands for it."""
    rows = table[
        (table["replicas"] == 1)
        & (table["total_blocks"] == total_blocks)
        & (table["concurrency"] == clients)
    ]
    if rows.empty:
        raise GridError(
            f"no run of one engine with {total_blocks} blocks at {clients} clients: add it to "
            "the grid (the `one-engine` series of configs/fleet.toml)"
        )
    return rows.iloc[0]


def loss_split(table: pd.DataFrame, series: str = "routers") -> pd.DataFrame:
    """Where each fleet point of `series` loses hit rate, in percentage points of prompt tokens,
    one row per (replicas, clients); the parts add up to the trace-order ideal minus a run's:

    - load: one infinite cache in trace order (conversations one at a time) minus one engine
      with the same total blocks at the same clients (`one_engine`): what the load costs a
      single cache, before anything is split;
    - splitting: that engine minus the best router of the point (the highest delivered rate
      among the routers run there): what N caches lose against one that no router tried gets
      back (negative: the fleet delivered more than one engine);
    - routing: the best router minus each other (`routing_losses`; here its largest, and whose).

    Beside them: one LRU cache of the total blocks in trace order (what the memory alone
    costs, with conversations one at a time), one engine's references in its own admission
    order (`metrics.fleet`), and the requests running at once, mean over steps.
    """
    rows = table[table["series"] == series]
    out = []
    for (replicas, clients, total), point in rows.groupby(
        ["replicas", "concurrency", "total_blocks"], sort=True
    ):
        single = one_engine(table, int(total), int(clients))
        ranked = point.sort_values(["delivered", "router"], ascending=[False, True])
        best, worst = ranked.iloc[0], ranked.iloc[-1]
        alone = "any (one replica)"  # a fleet of one routes nothing
        out.append(
            {
                "replicas": int(replicas),
                "clients": int(clients),
                "total_blocks": int(total),
                "ideal_%": 100 * best["ideal"],
                "lru_%": 100 * best["pooled_lru"],
                "one_engine_ideal_%": 100 * single["ideal_engine_order"],
                "one_engine_lru_%": 100 * single["pooled_lru_engine_order"],
                "one_engine_%": 100 * single["delivered"],
                "one_engine_running": single["running_mean"],
                "best_router": best["router"] if replicas > 1 else alone,
                "best_%": 100 * best["delivered"],
                "best_running": best["running_mean"],
                "load_pts": 100 * (best["ideal"] - single["delivered"]),
                "splitting_pts": 100 * (single["delivered"] - best["delivered"]),
                "routing_max_pts": 100 * (best["delivered"] - worst["delivered"]),
                "worst_router": worst["router"] if replicas > 1 else alone,
            }
        )
    return pd.DataFrame(out)


def routing_losses(table: pd.DataFrame, series: str = "routers") -> pd.DataFrame:
    """Percentage points each router delivers below the best router of its point, one row per
    (replicas, clients) of `series`, one column per router."""
    rows = table[table["series"] == series].copy()
    key = ["replicas", "concurrency"]
    rows["best"] = rows.groupby(key)["delivered"].transform("max")
    rows["behind_pts"] = 100 * (rows["best"] - rows["delivered"])
    wide = rows.pivot_table(index=key, columns="router", values="behind_pts", sort=True)
    wide.columns.name = None
    return wide.rename_axis(index={"concurrency": "clients"}).reset_index()


def _points(value: float) -> str:
    return f"{value:.1f} points"


def _splitting_words(row: pd.Series) -> str:
    """Splitting's part in words: a cost, or the points the fleet delivered above one engine."""
    if round(row["splitting_pts"], 1) < 0:
        return f"splitting gains {_points(-row['splitting_pts'])}"
    return f"splitting costs {_points(row['splitting_pts'])}"


def split_reading(split: pd.DataFrame, constant: pd.DataFrame | None = None) -> str:
    """The reading of the split tables: `split` where the clients scale with N, `constant`
    where they do not (both `loss_split`), every number from them."""
    text = ["**Where the loss comes from.**"]
    for _, row in split[split["replicas"] > 1].iterrows():
        text.append(
            f"At {row['replicas']} replicas and {row['clients']} clients, one engine with all "
            f"{row['total_blocks']:,} blocks delivers {row['one_engine_%']:.1f} % against the "
            f"trace-order ideal's {row['ideal_%']:.1f} %: the load costs "
            f"{_points(row['load_pts'])}; {_splitting_words(row)} ({row['best_router']}, "
            f"{row['best_%']:.1f} %); routing costs up to {_points(row['routing_max_pts'])} "
            f"({row['worst_router']})."
        )
    last = split.iloc[-1]
    text.append(
        f"Of the load's {_points(last['load_pts'])} there, "
        f"{_points(last['ideal_%'] - last['lru_%'])} would be lost with conversations one at a "
        f"time: one LRU cache of the same blocks in trace order hits {last['lru_%']:.1f} %."
    )
    text.append(_largest_part(last))
    spread = constant[constant["replicas"] > 1] if constant is not None else constant
    if spread is not None and len(spread):
        one = spread.iloc[0]
        parts = ", ".join(
            f"{r['splitting_pts']:.1f} at {r['replicas']} ({r['best_router']})"
            for _, r in spread.iterrows()
        )
        text.append(
            f"At a constant {one['clients']} clients one engine delivers "
            f"{one['one_engine_%']:.1f} %, and splitting alone, best router, costs {parts} "
            "points."
        )
    return " ".join(text)


def _largest_part(row: pd.Series) -> str:
    """Which part loses the most at one point, and, when it is the load, why."""
    parts = {
        "the load": row["load_pts"],
        "splitting": row["splitting_pts"],
        "routing": row["routing_max_pts"],
    }
    largest = max(parts, key=parts.get)
    text = f"At {row['replicas']} replicas the largest part is {largest}'s"
    if largest != "the load":
        return text + "."
    return text + (
        f": one engine at {row['clients']} clients runs {row['one_engine_running']:.1f} "
        "requests at once (mean over steps), and even one LRU cache of its blocks, in its "
        f"admission order, would hit only {row['one_engine_lru_%']:.1f} %; the fleet behind "
        f"{row['best_router']} runs {row['best_running']:.1f} at once in all, the rest waiting "
        "in its replicas' queues, where a request holds no blocks."
    )
