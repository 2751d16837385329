"""The serving benchmark's tables: one row per run cell in seed 003's column order
(`summary_table`), and caching on against off side by side (`compare_modes`).

A module of its own: pure pandas on loaded summaries, used by the benchmark, the notebooks
and the write-up without starting anything.
"""

from __future__ import annotations

import pandas as pd

SUMMARY_COLUMNS = (
    "mode",
    "prefix_regime",
    "concurrency",
    "mean_ttft_s",
    "p95_ttft_s",
    "mean_e2e_s",
    "p95_e2e_s",
    "req_s",
    "tok_s",
    "notes",
)


def summary_table(summaries: pd.DataFrame) -> pd.DataFrame:
    """Seed 003's columns first (mode, prefix_regime, concurrency, mean/p95 TTFT and e2e,
    req/s, tok/s, notes), then p50s, warm-up, counters and the predicted saving."""
    if summaries.empty:
        return summaries
    first = [c for c in SUMMARY_COLUMNS if c in summaries.columns]
    extra = [
        "mean_ttft_lo_s",
        "mean_ttft_hi_s",
        "p95_ttft_lo_s",
        "p95_ttft_hi_s",
        "mean_tpot_s",
        "mean_tpot_lo_s",
        "mean_tpot_hi_s",
        "p95_tpot_s",
        "req_s_lo",
        "req_s_hi",
        "repeats",
        "p50_ttft_s",
        "p50_e2e_s",
        "mean_ttft_incl_warmup_s",
        "warmup_ttft_s",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "hit_rate",
        "num_preemptions",
        "predicted_saving",
        "n_ok",
        "n_timeout",
        "n_error",
        "workload",
        "run_id",
    ]
    rest = [c for c in summaries.columns if c not in first and c not in extra]
    ordered = first + [c for c in extra if c in summaries.columns] + rest
    table = summaries[ordered].copy()
    table["_p"] = pd.to_numeric(table["prefix_regime"], errors="coerce")
    table = table.sort_values(["_p", "prefix_regime", "concurrency", "mode"], kind="stable")
    return table.drop(columns="_p").reset_index(drop=True)


def compare_modes(table: pd.DataFrame) -> pd.DataFrame:
    """Caching on against off per (prefix regime, concurrency): TTFT ratio off/on, measured
    TTFT saving 1 - on/off next to the predicted P/(P+S), and the throughput ratio."""
    columns = ["prefix_regime", "concurrency"]
    on = table[table["mode"] == "cache"].set_index(columns)
    off = table[table["mode"] == "no_cache"].set_index(columns)
    both = on.index.intersection(off.index)
    out = pd.DataFrame(index=both)
    out["ttft_no_cache_s"] = off.loc[both, "mean_ttft_s"]
    out["ttft_cache_s"] = on.loc[both, "mean_ttft_s"]
    out["ttft_ratio"] = out["ttft_no_cache_s"] / out["ttft_cache_s"]
    out["measured_saving"] = 1.0 - out["ttft_cache_s"] / out["ttft_no_cache_s"]
    out["predicted_saving"] = on.loc[both, "predicted_saving"]
    out["p95_ttft_no_cache_s"] = off.loc[both, "p95_ttft_s"]
    out["p95_ttft_cache_s"] = on.loc[both, "p95_ttft_s"]
    out["req_s_no_cache"] = off.loc[both, "req_s"]
    out["req_s_cache"] = on.loc[both, "req_s"]
    out["throughput_ratio"] = out["req_s_cache"] / out["req_s_no_cache"]
    out["hit_rate_cache"] = on.loc[both, "hit_rate"]
    if "mean_tpot_s" in table.columns:
        out["tpot_no_cache_s"] = off.loc[both, "mean_tpot_s"]
        out["tpot_cache_s"] = on.loc[both, "mean_tpot_s"]
    return out.reset_index()
