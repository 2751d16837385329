"""A fleet run against one cache: what routing leaves reachable, what the engines deliver.

Three hit rates frame the fleet's first-prefill hit rate, all token-weighted over the same
trace (replies count as cached when they are decoded as recorded, as in `sweeps.results`):

- `ideal`: one infinite cache shared by every request (the trace's reuse);
- `pooled_lru`: one LRU cache of the fleet's total blocks (replicas x blocks each): what the
  fleet's memory could hold if it were one cache;
- `routed_ideal`: an infinite cache per replica, each seeing only the requests the run routed
  to it: what the routing left reachable. Round-robin over N replicas scatters a conversation's
  turns and loses reuse here; session affinity keeps it.

`delivered / routed_ideal` is then what the engines' finite caches and interleaving kept of
what the routing allowed. All three bounds walk the trace in trace order: a conversation's
turns follow one another, as with one client.

Two more walk the trace in the order the run's engines admitted the requests
(`bounds.in_engine_order`; a fleet's replicas merged by step): `ideal_engine_order` and
`pooled_lru_engine_order`. On a run of one engine they are the single-cache references at that
run's load, where its clients interleave their conversations (notebook 14 explains why a bound
beside an engine point must see the engine's order).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.engines.result import RunResult
from analysis.metrics import bounds
from analysis.metrics.hitrates import first_prefill


@dataclass(frozen=True)
class FleetSplit:
    """The fleet's delivered hit rate beside the bounds that frame it (module doc)."""

    ideal: float
    pooled_lru: float
    routed_ideal: float
    delivered: float

    @property
    def routing_keeps(self) -> float:
        """Share of the single-cache ideal that the routing left reachable."""
        return self.routed_ideal / self.ideal if self.ideal else float("nan")

    @property
    def engines_keep(self) -> float:
        """Share of the reachable reuse that the engines delivered."""
        return self.delivered / self.routed_ideal if self.routed_ideal else float("nan")

    def to_dict(self) -> dict[str, float]:
        return {
            **asdict(self),
            "routing_keeps": self.routing_keeps,
            "engines_keep": self.engines_keep,
        }


def hit_rate_split(result: RunResult, trace: pd.DataFrame) -> FleetSplit:
    """The split of one fleet run over `trace` (the frame the run read, its limit applied);
    the bounds count the requests the engines ran (prompts too long for the model are not)."""
    config = result.config
    include_outputs = config.outputs == "recorded" and config.max_output_tokens is None
    ran = result.requests.loc[result.requests["status"] != "skipped", "request_id"]
    trace = trace[trace["request_id"].isin(ran)]
    index = bounds.index_trace(trace, include_outputs=include_outputs)
    total_blocks = config.replicas * (config.num_blocks - 1)  # vLLM's null block holds nothing
    pooled = bounds.lru_hit_blocks(index, config.block_size, [total_blocks])[0]
    prompt_tokens = index.total_prompt_tokens
    return FleetSplit(
        ideal=bounds.ideal_hit_rate(index, config.block_size),
        pooled_lru=float(pooled * config.block_size / prompt_tokens),
        routed_ideal=routed_ideal(
            result.requests, trace, config.block_size, include_outputs, prompt_tokens
        ),
        delivered=first_prefill(result.admissions).rate,
    )


@dataclass(frozen=True)
class EngineOrderBounds:
    """One cache's references in the order a run admitted its requests (module doc)."""

    ideal_engine_order: float
    pooled_lru_engine_order: float


def engine_order_bounds(result: RunResult, trace: pd.DataFrame) -> EngineOrderBounds:
    """The ideal and one LRU cache of the run's total blocks, over `trace` (the frame the run
    read, its limit applied) reordered as the run admitted it: what one cache could keep of the
    interleaving that the run's clients produced, rather than of conversations one at a time."""
    config = result.config
    include_outputs = config.outputs == "recorded" and config.max_output_tokens is None
    ordered = bounds.in_engine_order(trace, result.admissions)
    index = bounds.index_trace(ordered, include_outputs=include_outputs)
    total_blocks = config.replicas * (config.num_blocks - 1)  # vLLM's null block holds nothing
    pooled = bounds.lru_hit_blocks(index, config.block_size, [total_blocks])[0]
    return EngineOrderBounds(
        ideal_engine_order=bounds.ideal_hit_rate(index, config.block_size),
        pooled_lru_engine_order=float(pooled * config.block_size / index.total_prompt_tokens),
    )


def routed_ideal(
    requests: pd.DataFrame,
    trace: pd.DataFrame,
    block_size: int,
    include_outputs: bool,
    prompt_tokens: int,
) -> float:
    """Infinite-cache hit rate when each replica's cache sees only the requests routed to it."""
    replica_of = requests.set_index("request_id")["replica"]
    routed = trace.assign(replica=trace["request_id"].map(replica_of).to_numpy())
    hit_tokens = 0
    for _, part in routed.groupby("replica", sort=True):
        ideal = bounds.ideal_bound(
            part.drop(columns="replica"), block_size, include_outputs=include_outputs
        )
        hit_tokens += ideal.hit_tokens
    return hit_tokens / prompt_tokens if prompt_tokens else float("nan")


def queueing_steps(requests: pd.DataFrame) -> pd.DataFrame:
    """Per admitted request: steps from arrival to its first admission, and its turn."""
    admitted = requests[requests["first_admission_step"] >= 0]
    return pd.DataFrame(
        {
            "request_id": admitted["request_id"].to_numpy(),
            "turn_index": admitted["turn_index"].to_numpy(),
            "replica": admitted["replica"].to_numpy(),
            "queue_steps": (admitted["first_admission_step"] - admitted["submit_step"]).to_numpy(),
        }
    )


def turns_moved(requests: pd.DataFrame) -> float:
    """Share of later turns routed to another replica than their conversation's previous turn."""
    routed = requests[requests["replica"] >= 0].sort_values(["conversation_id", "turn_index"])
    previous = routed.groupby("conversation_id")["replica"].shift()
    later = previous.notna()
    if not later.any():
        return float("nan")
    return float((routed.loc[later, "replica"] != previous[later]).mean())


def running_mean(engine: dict[str, Any]) -> float:
    """Requests running at once in the whole fleet, mean over steps: what holds KV blocks (a
    waiting request holds none), so a fleet whose queues hold requests back runs fewer."""
    per_replica = engine.get("mean_running_per_replica")
    return float(sum(per_replica)) if per_replica else float("nan")


def fleet_row(result: RunResult, trace: pd.DataFrame) -> dict[str, Any]:
    """One row per fleet run: its configuration, the split, load balance and queueing."""
    config = result.config
    engine = result.manifest.get("engine", {}) if result.manifest else {}
    queue = queueing_steps(result.requests)
    later = queue["turn_index"] > 0
    return {
        "replicas": config.replicas,
        "router": config.router,
        "num_blocks": config.num_blocks,
        "total_blocks": config.replicas * config.num_blocks,
        "concurrency": config.concurrency,
        "max_model_len": config.max_model_len,
        "requests": len(result.requests),
        "skipped": int((result.requests["status"] == "skipped").sum()),
        **hit_rate_split(result, trace).to_dict(),
        **asdict(engine_order_bounds(result, trace)),
        "turns_moved": turns_moved(result.requests),
        "preemptions": int(result.requests["preemptions"].sum()),
        "load_imbalance_mean": engine.get("load_imbalance_mean"),
        "running_mean": running_mean(engine),
        "queue_steps_mean": float(queue["queue_steps"].mean()),
        "queue_steps_p95": float(np.percentile(queue["queue_steps"], 95)),
        "queue_steps_first_turn_mean": float(queue.loc[~later, "queue_steps"].mean()),
        "queue_steps_later_turns_mean": float(queue.loc[later, "queue_steps"].mean()),
    }
