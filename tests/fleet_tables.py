"""Small fleet tables for the tests of the loss split (test_fleet) and of notebook 13's figures
(test_plots_fleet): the columns of `sweeps.fleet.fleet_table` they read."""

from __future__ import annotations

import pandas as pd

# One engine at 8 and 16 clients, and two routers at one replica (8 clients) and two (16).
ONE_ENGINE_AND_TWO_REPLICAS = [
    ("one-engine", 1, 8, "least-loaded", 0.78),
    ("one-engine", 1, 16, "least-loaded", 0.50),
    ("routers", 1, 8, "affinity", 0.78),
    ("routers", 1, 8, "round-robin", 0.78),
    ("routers", 2, 16, "affinity", 0.55),
    ("routers", 2, 16, "round-robin", 0.30),
]


def fleet_rows(points: list[tuple[str, int, int, str, float]]) -> pd.DataFrame:
    """A fleet table from (series, replicas, clients, router, delivered), 1,200 blocks in all,
    ideal 0.8, one LRU cache in the engine's order 0.6, the replicas' load even."""
    return pd.DataFrame(
        [
            {
                "series": series,
                "replicas": replicas,
                "concurrency": clients,
                "total_blocks": 1200,
                "router": router,
                "delivered": delivered,
                "ideal": 0.8,
                "pooled_lru": 0.79,
                "ideal_engine_order": 0.8,
                "pooled_lru_engine_order": 0.6,
                "running_mean": float(clients),
                "load_imbalance_mean": 1.0,
            }
            for series, replicas, clients, router, delivered in points
        ]
    )
