"""The serving benchmark's tables: one row per run cell in seed 003's column order
(`summary_table`), the same cells for a reader with each statistic named for what it is
(`readable_table`), and caching on against off side by side (`compare_modes`).

A module of its own: pure pandas on loaded summaries, used by the benchmark, the notebooks
and the write-up without starting anything.
"""

from __future__ import annotations

import pandas as pd

from analysis.serving.intervals import Interval
from analysis.serving.stats import interval_label

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


# Statistics a reader sees, with how each is named in the readable table.
READABLE_STATISTICS = {
    "mean_ttft": "mean TTFT (s)",
    "p95_ttft": "p95 TTFT (s)",
    "mean_tpot": "mean TPOT (s)",
    "mean_e2e": "mean e2e (s)",
    "req_s": "requests/s",
    "mean_ttft_first_turn": "first turns, mean TTFT (s)",
    "mean_ttft_later_turns": "later turns, mean TTFT (s)",
}


def _with_interval(row: pd.Series, stat: str, digits: int) -> str:
    names = (
        ("req_s", "req_s_lo", "req_s_hi")
        if stat == "req_s"
        else (f"{stat}_s", f"{stat}_lo_s", f"{stat}_hi_s")
    )
    return Interval(*(row[name] for name in names)).text("", digits)


def readable_table(
    table: pd.DataFrame,
    statistics: tuple[str, ...] = ("mean_ttft", "p95_ttft", "mean_tpot", "req_s"),
    *,
    keys: tuple[str, ...] = ("mode", "prefix_regime", "concurrency"),
    digits: int = 3,
) -> pd.DataFrame:
    """The cells as a reader should see them: each statistic as the median of the repeats
    with its two-level bootstrap interval in brackets, the column named for what that interval
    is (`stats.interval_label`: a 95 % interval only with enough repeats); the mean
    TTFT of every repeat (an odd repeat is visible, and flagged in the notes); the clients
    configured next to the requests measured in flight."""
    repeats = int(table["repeats"].max()) if len(table) else 0
    out = table[list(keys)].copy()
    if "concurrency" in keys and "inflight_peak" in table:
        out["peak in flight"] = table["inflight_peak"].astype(int)
    for stat in statistics:
        of = f"median of {repeats} repeats" if repeats != 1 else "one repeat"
        name = f"{READABLE_STATISTICS[stat]}, {of} [{interval_label(repeats)}]"
        out[name] = [_with_interval(row, stat, digits) for _, row in table.iterrows()]
    if "mean_ttft_repeats" in table:
        out["mean TTFT per repeat (s)"] = [
            " / ".join(f"{v:.{digits}f}" for v in values) if isinstance(values, list) else "n/a"
            for values in table["mean_ttft_repeats"]
        ]
    out["notes"] = table["notes"]
    return out.reset_index(drop=True)


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
