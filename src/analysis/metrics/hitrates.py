"""Every hit rate of the project, in one place, all in tokens.

They are computed from a run's tables (`analysis.engines.RunResult`): `admissions` has one row
per admission from vLLM's waiting queue, with `tokens_queried` (the request's tokens at that
moment: the prompt at a first admission; prompt + tokens generated so far at a re-admission
after preemption) and `tokens_hit` (tokens found in the prefix cache: whole blocks, and never
the last token, so at most floor((tokens_queried - 1) / block_size) * block_size). Chunked
prefill continuations never query the cache, so they add no rows.

The ideal rate (an infinite cache of the same block size) lives in `analysis.metrics.bounds`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.engines.blockstats import BlockStats, describe_counts, reuse_gaps

if TYPE_CHECKING:
    from analysis.engines.result import RunResult

VLLM_LOG_WINDOW = 1000  # CachingMetrics(max_recent_requests=1000) in vLLM's logging logger


@dataclass(frozen=True)
class Rate:
    hits: int
    queries: int

    @property
    def rate(self) -> float:
        return self.hits / self.queries if self.queries else math.nan

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "rate": self.rate}


def _rate(frame: pd.DataFrame) -> Rate:
    return Rate(int(frame["tokens_hit"].sum()), int(frame["tokens_queried"].sum()))


def _first(admissions: pd.DataFrame) -> pd.DataFrame:
    return admissions[admissions["kind"] == "first"]


def first_prefill(admissions: pd.DataFrame) -> Rate:
    """Hit tokens / prompt tokens over each request's first admission only.

    This is what vLLM exports (`vllm:prefix_cache_hits / vllm:prefix_cache_queries`) since
    PR #25787: re-admissions after preemption are left out, so memory pressure cannot
    inflate it. It is the seeds' "correct hit rate (first prefill only)", in tokens.
    """
    return _rate(_first(admissions))


def prompts_hitting(admissions: pd.DataFrame, tokens: int) -> int:
    """Requests whose first admission hit at least `tokens` tokens. A hit runs from the
    prompt's start, so `tokens` = the block size counts the prompts that hit their first block,
    and `tokens` = the tokens all prompts share plus a few counts those that also share the
    opening of the question with an earlier prompt."""
    return int((_first(admissions)["tokens_hit"] >= tokens).sum())


def first_step_sharing(admissions: pd.DataFrame) -> tuple[int, int]:
    """Requests admitted in a run's first step, and how many of them hit. The cache is empty
    before that step, so every such hit is on a block another request stored in the same step:
    vLLM registers a block's hash when it schedules the block, before computing it."""
    first = admissions[admissions["step"] == admissions["step"].min()]
    return len(first), int((first["tokens_hit"] > 0).sum())


def all_prefill(admissions: pd.DataFrame) -> Rate:
    """Hit tokens / queried tokens over every admission, re-admissions after preemption included.

    A preempted request is recomputed from scratch and usually finds its own blocks still
    cached, so each re-admission adds a large hit: this is the inflated rate the seed documents
    saw (vLLM V1 before PR #25787). Equal to first_prefill when nothing is preempted; usually
    above it under preemption, but not always: a re-admission can hit a smaller share than the
    first admission did (the shared prefix it hit, and its own blocks, were evicted while it
    waited), and when such re-admissions dominate, all-prefill falls below first-prefill
    (tests/test_hitrates.py builds one such run with vLLM's scheduler).
    """
    return _rate(admissions)


def exported(counters: dict[str, Any]) -> Rate:
    """`vllm:prefix_cache_hits / vllm:prefix_cache_queries` as the engine exported them."""
    values = counters["exported"]
    return Rate(int(values["vllm:prefix_cache_hits"]), int(values["vllm:prefix_cache_queries"]))


def check_exported_is_first_prefill(admissions: pd.DataFrame, counters: dict[str, Any]) -> Rate:
    """On this vLLM the exported rate is the first-prefill rate, token for token: assert it."""
    ours, theirs = first_prefill(admissions), exported(counters)
    if ours != theirs:
        raise AssertionError(f"exported {theirs} differs from first-prefill {ours}")
    return theirs


def windowed(admissions: pd.DataFrame, window: int = VLLM_LOG_WINDOW) -> pd.DataFrame:
    """The "Prefix cache hit rate" vLLM logs: hits / queries over the last ~`window` requests.

    Reproduces `CachingMetrics.observe`: each step's first admissions form one entry (steps
    without first admissions add none); the oldest entries are dropped while more than
    `window` requests remain and more than one entry is left. One row per step with first
    admissions: that step's requests, queries, hits, and the window's rate after it.
    """
    per_step = (
        _first(admissions)
        .groupby("step", sort=True)
        .agg(
            requests=("tokens_hit", "size"),
            queries=("tokens_queried", "sum"),
            hits=("tokens_hit", "sum"),
        )
        .reset_index()
    )
    entries: deque[tuple[int, int, int]] = deque()
    total_requests = total_queries = total_hits = 0
    rates = np.empty(len(per_step))
    for position, (requests, queries, hits) in enumerate(
        zip(per_step["requests"], per_step["queries"], per_step["hits"], strict=False)
    ):
        entries.append((requests, queries, hits))
        total_requests += requests
        total_queries += queries
        total_hits += hits
        while len(entries) > 1 and total_requests > window:
            old_requests, old_queries, old_hits = entries.popleft()
            total_requests -= old_requests
            total_queries -= old_queries
            total_hits -= old_hits
        rates[position] = total_hits / total_queries if total_queries else 0.0
    per_step["window_rate"] = rates
    return per_step


def cumulative(admissions: pd.DataFrame) -> pd.DataFrame:
    """Running first-prefill rate after each first admission, in admission order.

    With fewer than 1000 requests this is also what vLLM logs. n identical prompts of L
    tokens at block size B give hits 0, h, h, ... with h = floor((L-1)/B)*B, so the rate
    after k requests is (k-1)*h / (k*L), below seed 002's exact (k-1)/k, which is the
    block-counted metric of vLLM before PR #18003 (`legacy_cumulative`).
    """
    first = _first(admissions)
    hits = first["tokens_hit"].cumsum().to_numpy()
    queries = first["tokens_queried"].cumsum().to_numpy()
    return pd.DataFrame(
        {
            "request_id": first["request_id"].to_numpy(),
            "step": first["step"].to_numpy(),
            "tokens_hit": first["tokens_hit"].to_numpy(),
            "tokens_queried": first["tokens_queried"].to_numpy(),
            "cumulative_rate": np.divide(
                hits, queries, out=np.zeros(len(first)), where=queries > 0
            ),
        }
    )


def legacy_block_counts(admissions: pd.DataFrame, block_size: int) -> pd.DataFrame:
    """Each admission as vLLM V1 counted it before PR #18003 (May 2025): in whole blocks.

    `KVCacheManager.get_computed_blocks` then did `queries += len(block_hashes)` and
    `hits += len(computed_blocks)` for every admission from the waiting queue (re-admissions
    included). `block_hashes` holds full blocks only, so a partial last block never entered the
    denominator; when the request filled its last block exactly, that block's hash was popped
    first (its last token must be recomputed), so it left the denominator too. Adds
    `blocks_queried` and `blocks_hit` to a copy of `admissions`.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    frame = admissions.copy()
    tokens = frame["tokens_queried"].to_numpy(dtype=np.int64)
    full = tokens // block_size
    frame["blocks_queried"] = full - (tokens % block_size == 0) * (full > 0)
    frame["blocks_hit"] = frame["tokens_hit"].to_numpy(dtype=np.int64) // block_size
    return frame


def legacy_block_rate(admissions: pd.DataFrame, block_size: int) -> Rate:
    """The pre-PR-#18003 V1 hit rate (blocks, every admission) over a run's admissions."""
    counted = legacy_block_counts(admissions, block_size)
    return Rate(int(counted["blocks_hit"].sum()), int(counted["blocks_queried"].sum()))


def legacy_cumulative(admissions: pd.DataFrame, block_size: int) -> pd.DataFrame:
    """Running pre-PR-#18003 rate after each admission, in admission order: what that vLLM
    logged as "Prefix cache hit rate" while fewer than 1000 requests had run."""
    counted = legacy_block_counts(admissions, block_size)
    hits = counted["blocks_hit"].cumsum().to_numpy()
    queries = counted["blocks_queried"].cumsum().to_numpy()
    counted["cumulative_rate"] = np.divide(
        hits, queries, out=np.zeros(len(counted)), where=queries > 0
    )
    return counted[["request_id", "step", "blocks_hit", "blocks_queried", "cumulative_rate"]]


def _grouped(admissions: pd.DataFrame, key: str) -> pd.DataFrame:
    grouped = (
        _first(admissions)
        .groupby(key, sort=True)
        .agg(
            requests=("tokens_hit", "size"),
            queries=("tokens_queried", "sum"),
            hits=("tokens_hit", "sum"),
        )
    )
    grouped["rate"] = grouped["hits"] / grouped["queries"]
    return grouped.reset_index()


def per_turn(admissions: pd.DataFrame) -> pd.DataFrame:
    """First-prefill hits / prompt tokens of all requests with the same turn index."""
    return _grouped(admissions, "turn_index")


def per_conversation(admissions: pd.DataFrame) -> pd.DataFrame:
    """First-prefill hits / prompt tokens summed over each conversation's turns."""
    return _grouped(admissions, "conversation_id")


def recompute_share(admissions: pd.DataFrame) -> float:
    """Tokens prefilled again because of preemption / all tokens prefilled.

    Prefilled tokens of an admission = tokens_queried - tokens_hit (what the engine computes,
    over however many chunks). The numerator sums them over re-admissions; the denominator
    over every admission. 0 when nothing is preempted.
    """
    computed = admissions["tokens_queried"] - admissions["tokens_hit"]
    total = int(computed.sum())
    if total == 0:
        return 0.0
    return int(computed[admissions["kind"] == "readmission"].sum()) / total


def block_reuse(block_events: pd.DataFrame | BlockStats) -> dict[str, Any]:
    """Seed 001's "Task 2" block statistics from the block events or their aggregates.

    - blocks_hit: distinct block hashes hit at least once ("cache blocks used");
    - hits_per_block_mean / _max: hits of those blocks;
    - total_hits: every hit (sum of hit tokens / block size);
    - repeat_hits: hits beyond each block's first (the seeds' "total block reuses");
    - same_step_hits: hits 0 steps after the block's store or previous hit (a reuse gap of 0);
    - reuse gaps: for every hit, steps (and, from full events only, seconds) since the
      previous store or hit of the same hash: min, mean, max and quantiles.

    The same numbers from a `BlockStats` (what a result keeps by default) as from the events.
    """
    if block_events is None:
        raise ValueError(
            "this result kept its block events as aggregates: pass result.block_stats "
            '(or run it with block_events="full")'
        )
    events = block_events if isinstance(block_events, pd.DataFrame) else None
    stats = block_events if events is None else BlockStats.from_events(events)
    per_block = stats.hits_per_block
    blocks_hit = int(per_block.sum())
    total_hits = int(stats.events["hit"])
    mean = float(np.dot(per_block.index.to_numpy(np.float64), per_block.to_numpy(np.float64)))
    return {
        "blocks_stored": int(stats.events["stored"]),
        "blocks_evicted": int(stats.events["evicted"]),
        "blocks_hit": blocks_hit,
        "total_hits": total_hits,
        "hits_per_block_mean": mean / blocks_hit if blocks_hit else 0.0,
        "hits_per_block_max": int(per_block.index.max()) if blocks_hit else 0,
        "repeat_hits": total_hits - blocks_hit,
        # hits in the same scheduler step as the block's store or previous hit
        "same_step_hits": int(stats.reuse_gap_steps.get(0, 0)),
        "reuse_gap_steps": describe_counts(stats.reuse_gap_steps),
        "reuse_gap_seconds": None if events is None else _describe(reuse_gaps(events)[1]),
    }


def _blocks(result: RunResult) -> dict[str, Any]:
    """`block_reuse` from the result's aggregates, with the seconds gaps its events give."""
    blocks = block_reuse(result.block_stats)
    if result.block_events is not None:
        blocks["reuse_gap_seconds"] = _describe(reuse_gaps(result.block_events)[1])
    return blocks


def _describe(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"count": 0}
    quantiles = np.quantile(values, [0.1, 0.5, 0.9, 0.99])
    return {
        "count": int(values.size),
        "min": float(values.min()),
        "mean": float(values.mean()),
        "max": float(values.max()),
        "p10": float(quantiles[0]),
        "p50": float(quantiles[1]),
        "p90": float(quantiles[2]),
        "p99": float(quantiles[3]),
    }


def summarize(result: RunResult) -> dict[str, Any]:
    """The headline numbers of one run (written as summary.json)."""
    admissions, requests = result.admissions, result.requests
    exported_rate = check_exported_is_first_prefill(admissions, result.counters)
    window = windowed(admissions)
    logged = result.counters.get("logged_window_hit_rate")
    if (
        logged is not None
        and len(window)
        and not math.isclose(logged, window["window_rate"].iloc[-1], rel_tol=1e-9, abs_tol=1e-12)
    ):
        raise AssertionError(f"windowed rate {window['window_rate'].iloc[-1]} != vLLM's {logged}")
    status = requests["status"].value_counts()
    return {
        "config_id": result.config_id,
        "requests_finished": int(status.get("finished", 0)),
        "requests_skipped": int(status.get("skipped", 0)),
        "requests_unfinished": int(status.get("unfinished", 0)),
        "skipped_request_ids": requests.loc[requests["status"] == "skipped", "request_id"].tolist(),
        "first_admissions": int((admissions["kind"] == "first").sum()),
        "readmissions": int((admissions["kind"] == "readmission").sum()),
        "preemptions": int(requests["preemptions"].sum()),
        "first_prefill": first_prefill(admissions).to_dict(),
        "all_prefill": all_prefill(admissions).to_dict(),
        "exported": exported_rate.to_dict(),
        "logged_window_rate_final": float(window["window_rate"].iloc[-1]) if len(window) else None,
        "recompute_share": recompute_share(admissions),
        "blocks": _blocks(result),
        "prompt_tokens": int(requests.loc[requests["status"] == "finished", "prompt_tokens"].sum()),
        "output_tokens": int(requests["output_tokens"].sum()),
    }
