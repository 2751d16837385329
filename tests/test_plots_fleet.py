"""Notebook 13's figures drawn from small fleet tables: what each line and label stands for."""

from __future__ import annotations

import matplotlib
import pandas as pd
from fleet_tables import ONE_ENGINE_AND_TWO_REPLICAS, fleet_rows

from analysis.plots import fleet as fleet_plots

matplotlib.use("Agg")


TABLE = fleet_rows(ONE_ENGINE_AND_TWO_REPLICAS).assign(
    load_imbalance_mean=[1.0, 1.0, 1.0, 1.0, 1.4, 1.0]
)


def lines(ax) -> dict[str, list[float]]:
    return {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}


def test_a_line_per_router_in_router_order_and_one_engine_at_the_same_clients():
    fig = fleet_plots.routers_by_replicas_figure(TABLE)
    rate, load = fig.axes
    drawn = lines(rate)
    assert list(drawn) == [
        "round-robin",
        "affinity",
        "one infinite cache (ideal)",
        "one engine, all the blocks, same clients",
    ]
    assert drawn["affinity"] == [0.78, 0.55]
    # one engine with all 1,200 blocks at each fleet's clients: 8 at one replica, 16 at two
    assert drawn["one engine, all the blocks, same clients"] == [0.78, 0.50]
    assert lines(load)["affinity"] == [1.0, 1.4]
    assert rate.get_ylabel() == "first-prefill hit rate (tokens)"
    assert load.get_ylabel() == "load imbalance: max / mean running requests"


def test_one_engine_is_drawn_only_at_the_clients_it_ran():
    table = TABLE[TABLE["series"] == "routers"]  # no run of one engine at 16 clients
    drawn = lines(fleet_plots.routers_by_replicas_figure(table).axes[0])
    assert drawn["one engine, all the blocks, same clients"] == [0.78]  # one replica only
    table = table[table["replicas"] > 1]  # and none at all
    drawn = lines(fleet_plots.routers_by_replicas_figure(table).axes[0])
    assert "one engine, all the blocks, same clients" not in drawn


def test_betas_that_gave_the_same_run_share_one_label():
    table = fleet_rows(
        [
            ("beta", 4, 32, "prefix-load-beta0", 0.70),
            ("beta", 4, 32, "prefix-load-beta0.5", 0.60),
            ("beta", 4, 32, "prefix-load-beta1", 0.60),
        ]
    ).assign(load_imbalance_mean=[2.0, 1.2, 1.2])
    ax = fleet_plots.beta_tradeoff_figure(table).axes[0]
    assert sorted(t.get_text() for t in ax.texts) == ["beta 0", "beta 0.5, 1"]
    assert ax.get_title() == "Prefix share minus beta x load share, 4 replicas"


def test_load_and_splitting_apart_start_every_router_at_one_engine():
    table = pd.concat(
        [
            TABLE[TABLE["series"] == "one-engine"],
            fleet_rows(
                [
                    ("clients32", 1, 32, "round-robin", 0.40),
                    ("clients32", 2, 32, "round-robin", 0.35),
                    ("clients32", 2, 32, "affinity", 0.45),
                ]
            ),
        ]
    )
    load, split = fleet_plots.load_apart_figure(table).axes
    assert lines(load)["one engine (replay)"] == [0.78, 0.50]
    assert lines(load)["one LRU cache, in the engine's admission order"] == [0.6, 0.6]
    drawn = lines(split)
    assert drawn["round-robin"] == [0.40, 0.35] and drawn["affinity"] == [0.40, 0.45]
    assert split.get_xlabel() == "replicas (32 clients, 1,200 blocks in all)"


def test_routers_in_time_show_milliseconds_and_goodput_per_router():
    table = pd.DataFrame(
        {
            "router": ["affinity", "round-robin"],
            "ttft_p50_s": [0.020, 0.200],
            "ttft_p90_s": [0.040, 0.900],
            "hit_rate": [0.7, 0.3],
            "goodput_req_s": [12.0, 3.0],
        }
    )
    left, right = fleet_plots.routers_in_time_figure(table, slo_ttft_s=0.05).axes
    heights = [round(bar.get_height(), 6) for bar in left.patches]
    assert heights == [200.0, 20.0, 900.0, 40.0]  # ROUTER_ORDER: round-robin first
    assert [t.get_text() for t in left.get_xticklabels()] == ["round-robin", "affinity"]
    assert right.get_ylabel() == "goodput (requests/s within TTFT 50 ms)"
