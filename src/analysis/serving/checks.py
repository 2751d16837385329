"""The checks tables of the serving notebooks (08, 10, 11, 12): the claims that do not depend
on the machine's speed, each against an oracle computed from the workload alone, so that a
loaded machine cannot fail them and a wrong count or a broken write-up does.

- notebook 08 (`synthetic_checks`): caching off reuses nothing; caching on hits exactly the
  shared prefix's full blocks of every measured request; both modes served the same requests;
  every cell is a steady state with its clients in flight and nothing failed.
- notebook 10 (`conversation_checks`): the same conversations in both modes; caching off reuses
  nothing; the server's hit rate is the free-running ideal of these prompts; nothing failed.
- notebook 11 (`sweep_checks`): caching off reuses nothing in any timed batch or round; caching
  on hits exactly the shared full blocks of every prompt after the first in each batch; the
  realized hit rate never falls as the shared fraction grows; the token trie never matches
  fewer tokens than block hashing on the same prompts.
- notebook 12 (`decision_checks`): the decision's inputs are all there, and every cell measured
  while the machine's speed changed is quoted with its flag (the per-cell lines and the PM
  sentence).

Seconds and ratios are never checked here: they are shown with their intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from analysis.metrics.oracles import Checks


def shared_block_tokens(shared: int, prompt: int, block_size: int) -> int:
    """Tokens a prompt can hit when its first `shared` tokens are cached: the full blocks inside
    the shared part, never the prompt's last token (vLLM recomputes it)."""
    return (min(shared, prompt - 1) // block_size) * block_size


def _failed(table: pd.DataFrame) -> int:
    columns = [c for c in ("n_timeout", "n_error", "n_not_sent") if c in table]
    return int(table[columns].to_numpy().sum()) if columns else 0


def synthetic_checks(table: pd.DataFrame, suffix_tokens: int, block_size: int) -> Checks:
    """Notebook 08's cells (one row per mode x prefix x concurrency, the benchmark's summary
    columns)."""
    checks = Checks()
    off = table[table["mode"] == "no_cache"]
    on = table[table["mode"] == "cache"]
    checks.add(
        "caching off: no prompt token served from the cache in any cell",
        0,
        int(off["prefix_cache_hits"].fillna(0).sum() + off["prompt_tokens_cached"].fillna(0).sum()),
    )
    exact = 0
    for row in on.itertuples():
        prefix = int(row.prefix_regime)
        prompt = prefix + suffix_tokens
        expected = row.n_ok * shared_block_tokens(prefix, prompt, block_size)
        exact += int(
            row.prefix_cache_hits == expected and row.prefix_cache_queries == row.n_ok * prompt
        )
    checks.add(
        "caching on: hits = the shared prefix's full blocks of every measured request "
        f"(cells, of {len(on)})",
        len(on),
        exact,
    )
    keys = ["prefix_regime", "concurrency"]
    pairs = on.merge(off, on=keys, suffixes=("_on", "_off"))
    same = (pairs["n_ok_on"] == pairs["n_ok_off"]) & (
        pairs["prompt_tokens_on"] == pairs["prompt_tokens_off"]
    )
    checks.add(
        "the same requests in both modes: requests and prompt tokens equal per cell "
        f"(pairs, of {len(on)})",
        len(on),
        int(same.sum()),
    )
    steady = (~table["burst"].astype(bool)) & (table["inflight_peak"] == table["concurrency"])
    checks.add(
        "every cell a steady state with its clients in flight (cells)",
        len(table),
        int(steady.sum()),
    )
    checks.add("no request timed out, failed or went unsent", 0, _failed(table))
    return checks


def conversation_checks(table: pd.DataFrame, requests: pd.DataFrame) -> Checks:
    """Notebook 10's ShareGPT cells and their per-request rows (with a `mode` column)."""
    checks = Checks()
    measured = requests[~requests["warmup"].astype(bool)]
    on = measured[measured["mode"] == "cache"]
    off = measured[measured["mode"] == "no_cache"]
    # how many requests ran depends on the calibration (the machine's speed): only whether
    # the two modes' request ids are the same is printed
    checks.add(
        "the same requests in both modes (request ids)",
        True,
        sorted(map(str, on["request_id"].unique())) == sorted(map(str, off["request_id"].unique())),
    )
    checks.add(
        "caching off: no prompt token served from the cache",
        0,
        int(pd.to_numeric(off["cached_tokens"], errors="coerce").fillna(0).sum()),
    )
    cache_row = table[table["mode"] == "cache"].iloc[0]
    # the rate depends on how many conversations the calibration chose: only the match prints
    checks.add(
        "server's hit rate = the free-running ideal of these prompts (3 decimals)",
        True,
        round(float(cache_row["predicted_hit_rate"]), 3) == round(float(cache_row["hit_rate"]), 3),
    )
    checks.add("no request timed out, failed or went unsent", 0, _failed(table))
    return checks


def sweep_checks(
    raw: pd.DataFrame,
    *,
    num_prompts: int,
    input_len: int,
    block_size: int,
    lookups: Sequence[dict[str, Any]] = (),
) -> Checks:
    """Notebook 11's raw rows (`run_prefix_sweep`: one row per timed batch or long-prefill
    round) and, optionally, the lookup timings' rows (`prefix_match.compare_lookup_costs`)."""
    checks = Checks()
    off = raw[raw["mode"] == "no_cache"]
    checks.add(
        "caching off: no prompt token served from the cache (batches and rounds)",
        0,
        int(off["cached_tokens"].sum()),
    )
    sweep = raw[(raw["experiment"] == "sweep") & (raw["mode"] == "cache")]
    expected = (num_prompts - 1) * sweep["shared_tokens"].map(
        lambda shared: shared_block_tokens(int(shared), input_len, block_size)
    )
    # counted per fraction: how many timed batches ran depends on the machine's speed
    exact = (sweep["cached_tokens"] == expected).groupby(sweep["fraction"]).all()
    checks.add(
        "caching on: in every timed batch each prompt after the first hits the shared full "
        f"blocks (fractions, of {len(exact)})",
        len(exact),
        int(exact.sum()),
    )
    realized = sweep.groupby("fraction")["hit_rate"].median().sort_index()
    checks.add(
        "the realized hit rate never falls as the shared fraction grows",
        True,
        bool(realized.is_monotonic_increasing),
    )
    by_kind = {row["kind"]: row for row in lookups}
    if {"radix", "blockhash"} <= set(by_kind):
        checks.add(
            "token trie matches at least the tokens block hashing matches (same prompts)",
            True,
            by_kind["radix"]["matched_tokens"] >= by_kind["blockhash"]["matched_tokens"],
        )
    return checks


def anti_pattern_checks(patterns: pd.DataFrame, suffix_tokens: int, block_size: int) -> Checks:
    """Notebook 08's anti-patterns (caching on, one client): each prefix the warm-up did not send
    misses once per repeat and every other request hits its prefix's full blocks; the thrash
    case, which LRU evicts, has no `new_prefixes` and is left out."""
    checks = Checks()
    rows = patterns[patterns["new_prefixes"].notna()]
    exact = 0
    for row in rows.itertuples():
        prefix = int(row.prefix_regime)
        hitting = row.n_ok - int(row.new_prefixes) * int(row.repeats)
        full = shared_block_tokens(prefix, prefix + suffix_tokens, block_size)
        exact += int(row.prefix_cache_hits == hitting * full)
    checks.add(
        "anti-patterns: each new prefix misses once per repeat, every other request hits its "
        f"prefix's full blocks (patterns, of {len(rows)})",
        len(rows),
        exact,
    )
    checks.add("anti-patterns: no request timed out, failed or went unsent", 0, _failed(patterns))
    return checks


def decision_checks(facts: Any, markdown: str) -> Checks:
    """Notebook 12: the write-up's inputs (`writeup.Facts`) and the write-up itself
    (`writeup.decision_markdown`)."""
    from analysis.serving import writeup

    s = facts.study
    checks = Checks()
    wanted = [
        (mode, prefix, c)
        for mode in ("cache", "no_cache")
        for prefix in s.prefixes
        for c in s.concurrency
    ]
    checks.add(
        "every synthetic cell measured (mode x prefix x clients)",
        len(wanted),
        sum(key in facts.ttft for key in wanted),
    )
    checks.add("the ShareGPT cells of both modes", 2, len(facts.sharegpt))
    checks.add(
        "a mixed-traffic run per eligible share", len(s.eligible_shares), len(facts.dilution)
    )
    checks.add("seed 004's sweep has fractions", True, not facts.sweep.empty)
    lines = markdown.split("\n")
    flagged = quoted = 0
    low_c, high_c = min(s.concurrency), max(s.concurrency)
    for prefix in sorted(p for p in s.prefixes if p > 0):
        for c in sorted({low_c, high_c}):
            if not writeup.flagged_modes(facts, prefix, c):
                continue
            flagged += 1
            clients = writeup.clients_text(facts, "cache", prefix, c)
            start = f"- {prefix}-token shared prefix, {clients}:"
            line = next((x for x in lines if x.startswith(start)), "")
            notes = [facts.speed_notes.get((m, prefix, c), "") for m in ("cache", "no_cache")]
            quoted += int(all(note in line for note in notes))
    # how many cells are flagged depends on the machine's load: only whether all carry it prints
    checks.add(
        "every flagged cell of the write-up is quoted with its flag", True, flagged == quoted
    )
    conversation = [x for x in lines if x.startswith(("- Real multi-turn", "- TTFT "))]
    checks.add(
        "the conversation lines carry the ShareGPT cells' flag (or none is flagged)",
        True,
        all("flagged" in x for x in conversation) if writeup.sharegpt_flag(facts) else True,
    )
    pm = lines[-1] if lines else ""
    longest = max(s.prefixes)
    unflagged = [c for c in s.concurrency if not writeup.flagged_modes(facts, longest, c)]
    checks.add(
        "the PM sentence quotes an unflagged cell, or its flag",
        True,
        "flagged" in pm
        or any(f"{writeup.clients_text(facts, 'cache', longest, c)})" in pm for c in unflagged),
    )
    return checks
