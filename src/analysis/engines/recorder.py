"""One recorder for both engines: it watches vLLM's own `Scheduler` and keeps what it counted.

It wraps methods of one scheduler instance (never the classes), at the points where vLLM
itself does the accounting:

- `KVCacheManager.record_prefix_cache_stats(request, num_hits)`: called once per admission
  from the waiting queue, after allocation succeeded; vLLM adds it to `PrefixCacheStats`
  (first admissions to queries/hits, re-admissions after preemption to preempted_*). The
  recorder keeps one row per call with the same numbers, so the per-admission sums equal
  vLLM's stats by construction; `check_against_engine_stats` asserts it at the end.
- `Scheduler.make_stats`: the per-step `PrefixCacheStats` vLLM hands to its stat loggers
  (the exported counters come from these); summed, including the hidden preempted_* fields,
  and fed to vLLM's own `CachingMetrics` (the logged "Prefix cache hit rate" window).
- `Scheduler._preempt_request`: one row per preemption.
- `BlockPool.cache_full_blocks` (stored), `BlockPool.touch` (hit: a cached block taken by an
  admission), `BlockPool._maybe_evict_cached_block` (evicted: a cached block reused for new
  content). Events are kept in flat arrays, not per-event objects.

Steps are vLLM's own counter (`Scheduler.current_step`, one per `schedule()` call); the
driver announces each step with `mark_step` before running it.

A fleet attaches one recorder to each replica's scheduler (`attach(scheduler, replica)`):
replicas step one after the other, so the rows stay in order, and each admission, preemption
and block event keeps the replica it happened on (the frames get a `replica` column).
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

STORED, HIT, EVICTED = 0, 1, 2
EVENT_KINDS = {STORED: "stored", HIT: "hit", EVICTED: "evicted"}
HASH_HEX_BYTES = 8  # block hashes are written as the hex of their first 8 bytes (64 bits)
STAT_FIELDS = (
    "requests",
    "queries",
    "hits",
    "preempted_requests",
    "preempted_queries",
    "preempted_hits",
)


@dataclass
class EngineStats:
    """`PrefixCacheStats` summed over every step of a run (tokens, except *requests)."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def add(self, stats: Any) -> None:
        for name in STAT_FIELDS:
            setattr(self, name, getattr(self, name) + int(getattr(stats, name)))

    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in STAT_FIELDS}


@dataclass
class Recorder:
    """Per-admission rows, per-request facts and block events of one run."""

    num_requests: int
    block_size: int
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.ids: dict[str, int] = {}  # vLLM request id -> workload index
        self.stats = EngineStats()
        # one entry per admission
        self.adm_request = array("i")
        self.adm_readmission = array("b")
        self.adm_queried = array("q")
        self.adm_hit = array("q")
        self.adm_step = array("i")
        self.adm_replica = array("h")
        # one entry per preemption
        self.pre_request = array("i")
        self.pre_step = array("i")
        self.pre_replica = array("h")
        # block events
        self.ev_step = array("i")
        self.ev_kind = array("b")
        self.ev_block = array("i")
        self.ev_request = array("i")
        self.ev_key: list[bytes] = []
        self.ev_replica = array("h")
        self._pending_hits = 0  # hit events not yet given their admitting request
        # step -> seconds since start (index = step number; step 0 is before the first)
        self.step_seconds = array("d", [0.0])
        # per request
        n = self.num_requests
        self.submit_step = np.full(n, -1, dtype=np.int64)
        self.submit_seconds = np.full(n, np.nan)
        self.arrival_seconds = np.full(n, np.nan)  # timed arrivals: when it reached the engine
        self.first_token_step = np.full(n, -1, dtype=np.int64)
        self.first_token_seconds = np.full(n, np.nan)
        self.finish_step = np.full(n, -1, dtype=np.int64)
        self.finish_seconds = np.full(n, np.nan)
        self.output_tokens = np.zeros(n, dtype=np.int64)
        self.finish_reason: list[str | None] = [None] * n
        self.replica_of = np.full(n, -1, dtype=np.int16)  # a fleet's routing decisions
        self.fleet = False  # set by a fleet driver: the frames get a `replica` column
        self.scheduler: Any = None
        self.caching_metrics: Any = None
        self.step = 0  # the step being run (set by the driver before each step)
        self.clock: Any = None  # replay on a clock: its `now()`; None: the wall clock

    # ----------------------------------------------------------------- attaching to vLLM
    def attach(self, scheduler: Any, replica: int = 0) -> None:
        """Wrap the accounting points of this scheduler instance (replica `replica` of a fleet)."""
        self.scheduler = scheduler
        manager = scheduler.kv_cache_manager
        pool = manager.block_pool
        ids = self.ids

        def step_of() -> int:
            return self.step

        record_stats = manager.record_prefix_cache_stats
        lookup_enabled = manager.prefix_cache_lookup_enabled

        def record_prefix_cache_stats(request: Any, num_hits: int) -> None:
            record_stats(request, num_hits)
            if not manager.log_stats or not lookup_enabled(request):
                return
            index = ids[request.request_id]
            self.adm_request.append(index)
            self.adm_readmission.append(1 if request.num_preemptions > 0 else 0)
            self.adm_queried.append(request.num_tokens)
            self.adm_hit.append(num_hits)
            self.adm_step.append(step_of())
            self.adm_replica.append(replica)
            if self._pending_hits:
                events = self.ev_request
                for position in range(len(events) - self._pending_hits, len(events)):
                    events[position] = index
                self._pending_hits = 0

        manager.record_prefix_cache_stats = record_prefix_cache_stats

        from vllm.v1.metrics.stats import CachingMetrics

        # what vLLM's logging stat logger feeds the same per-step stats into (one for a fleet)
        if self.caching_metrics is None:
            self.caching_metrics = CachingMetrics()
        make_stats = scheduler.make_stats

        def make_stats_and_sum(*args: Any, **kwargs: Any) -> Any:
            stats = make_stats(*args, **kwargs)
            if stats is not None and stats.prefix_cache_stats is not None:
                self.stats.add(stats.prefix_cache_stats)
                self.caching_metrics.observe(stats.prefix_cache_stats)
            return stats

        scheduler.make_stats = make_stats_and_sum

        preempt = scheduler._preempt_request

        def preempt_and_record(request: Any, *args: Any, **kwargs: Any) -> Any:
            self.pre_request.append(ids[request.request_id])
            self.pre_step.append(step_of())
            self.pre_replica.append(replica)
            return preempt(request, *args, **kwargs)

        scheduler._preempt_request = preempt_and_record

        ev_step, ev_kind, ev_block = self.ev_step, self.ev_kind, self.ev_block
        ev_request, ev_key, ev_replica = self.ev_request, self.ev_key, self.ev_replica
        cache_full_blocks = pool.cache_full_blocks

        def cache_full_blocks_and_record(
            request: Any,
            blocks: Any,
            num_cached_blocks: int,
            num_full_blocks: int,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            result = cache_full_blocks(
                request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs
            )
            step = self.step
            index = ids[request.request_id]
            for block in blocks[num_cached_blocks:num_full_blocks]:
                key = block._block_hash
                if key is None or block.is_null:
                    continue
                ev_step.append(step)
                ev_kind.append(STORED)
                ev_block.append(block.block_id)
                ev_request.append(index)
                ev_key.append(key)
                ev_replica.append(replica)
            return result

        pool.cache_full_blocks = cache_full_blocks_and_record

        touch = pool.touch

        def touch_and_record(blocks: Any) -> Any:
            step = self.step
            for block in blocks:
                key = block._block_hash
                if block.is_null or key is None:
                    continue
                ev_step.append(step)
                ev_kind.append(HIT)
                ev_block.append(block.block_id)
                ev_request.append(-1)
                ev_key.append(key)
                ev_replica.append(replica)
                self._pending_hits += 1
            return touch(blocks)

        pool.touch = touch_and_record

        maybe_evict = pool._maybe_evict_cached_block

        def evict_and_record(block: Any) -> bool:
            key = block._block_hash
            evicted = maybe_evict(block)
            if evicted and key is not None:
                ev_step.append(self.step)
                ev_kind.append(EVICTED)
                ev_block.append(block.block_id)
                ev_request.append(-1)
                ev_key.append(key)
                ev_replica.append(replica)
            return evicted

        pool._maybe_evict_cached_block = evict_and_record

    # ----------------------------------------------------------------- driver callbacks
    def start_clock(self) -> None:
        """Times are seconds since this call (the driver calls it before the first request)."""
        self.started = time.perf_counter()

    def now(self) -> float:
        if self.clock is not None:
            return self.clock()
        return time.perf_counter() - self.started

    def arrival_times(self) -> np.ndarray:
        """When each request arrived: its timed arrival, or (untimed) when it was submitted."""
        return np.where(np.isnan(self.arrival_seconds), self.submit_seconds, self.arrival_seconds)

    def mark_step(self, step: int, seconds: float) -> None:
        """`step` starts now, at `seconds` (steps must be marked in order)."""
        self.step = step
        times = self.step_seconds
        while len(times) < step:
            times.append(times[-1])
        if len(times) == step:
            times.append(seconds)
        else:
            times[step] = seconds

    def submitted(self, index: int, step: int) -> None:
        self.submit_step[index] = step
        self.submit_seconds[index] = self.now()

    def first_token(self, index: int, step: int) -> None:
        if self.first_token_step[index] < 0:
            self.first_token_step[index] = step
            self.first_token_seconds[index] = self.now()

    def finished(self, index: int, step: int, reason: str | None, output_tokens: int) -> None:
        self.finish_step[index] = step
        self.finish_seconds[index] = self.now()
        self.finish_reason[index] = reason
        self.output_tokens[index] = output_tokens

    # ----------------------------------------------------------------- tables
    def admissions_frame(self) -> pd.DataFrame:
        step = np.frombuffer(self.adm_step, dtype=np.int32).astype(np.int64)
        return pd.DataFrame(
            {
                "request_index": np.frombuffer(self.adm_request, dtype=np.int32),
                "readmission": np.frombuffer(self.adm_readmission, dtype=np.int8).astype(bool),
                "tokens_queried": np.frombuffer(self.adm_queried, dtype=np.int64),
                "tokens_hit": np.frombuffer(self.adm_hit, dtype=np.int64),
                "step": step,
                "time_s": self._seconds_of(step),
                **self._replica_column(self.adm_replica),
            }
        )

    def preemptions_frame(self) -> pd.DataFrame:
        step = np.frombuffer(self.pre_step, dtype=np.int32).astype(np.int64)
        return pd.DataFrame(
            {
                "request_index": np.frombuffer(self.pre_request, dtype=np.int32),
                "step": step,
                **self._replica_column(self.pre_replica),
            }
        )

    def block_events_frame(self) -> pd.DataFrame:
        step = np.frombuffer(self.ev_step, dtype=np.int32).astype(np.int64)
        kinds = np.frombuffer(self.ev_kind, dtype=np.int8)
        return pd.DataFrame(
            {
                "step": step,
                "time_s": self._seconds_of(step),
                "event": pd.Categorical.from_codes(kinds, categories=list(EVENT_KINDS.values())),
                "block_hash": _hex_prefixes(self.ev_key, HASH_HEX_BYTES),
                "block_id": np.frombuffer(self.ev_block, dtype=np.int32),
                "request_index": np.frombuffer(self.ev_request, dtype=np.int32),
                **self._replica_column(self.ev_replica),
            }
        )

    def _replica_column(self, values: array) -> dict[str, np.ndarray]:
        """{"replica": ...} for a fleet's frames; nothing for a single engine's."""
        if not self.fleet:
            return {}
        return {"replica": np.frombuffer(values, dtype=np.int16).astype(np.int16)}

    def _seconds_of(self, steps: np.ndarray) -> np.ndarray:
        times = np.frombuffer(self.step_seconds, dtype=np.float64)
        if steps.size == 0:
            return np.zeros(0)
        return times[np.clip(steps, 0, times.shape[0] - 1)]

    def check_against_engine_stats(self) -> dict[str, int]:
        """Per-admission sums must equal vLLM's own PrefixCacheStats; returns the sums."""
        readmission = np.frombuffer(self.adm_readmission, dtype=np.int8).astype(bool)
        queried = np.frombuffer(self.adm_queried, dtype=np.int64)
        hit = np.frombuffer(self.adm_hit, dtype=np.int64)
        sums = {
            "requests": int((~readmission).sum()),
            "queries": int(queried[~readmission].sum()),
            "hits": int(hit[~readmission].sum()),
            "preempted_requests": int(readmission.sum()),
            "preempted_queries": int(queried[readmission].sum()),
            "preempted_hits": int(hit[readmission].sum()),
        }
        engine = self.stats.to_dict()
        if sums != engine:
            raise AssertionError(f"per-admission sums {sums} differ from vLLM's stats {engine}")
        hit_events = int((np.frombuffer(self.ev_kind, dtype=np.int8) == HIT).sum())
        if hit_events * self.block_size != int(hit.sum()):
            raise AssertionError(
                f"{hit_events} hit block events x block size {self.block_size} != "
                f"{int(hit.sum())} hit tokens"
            )
        return sums


def _hex_prefixes(keys: list[bytes], size: int) -> pd.Categorical:
    """Hex of each key's first `size` bytes, as a categorical (hashes repeat across events).

    Hex is made once per distinct prefix: the prefixes are read as big-endian integers,
    whose order is the order of their hex, so categories and codes are those
    `pd.Categorical(hex_strings)` gives."""
    if not keys:
        return pd.Categorical([])
    joined = b"".join([key[:size] for key in keys])
    if size != 8 or len(joined) != 8 * len(keys):  # pragma: no cover - short keys
        text = joined.hex()
        width = 2 * size
        return pd.Categorical([text[i : i + width] for i in range(0, len(text), width)])
    distinct, codes = np.unique(np.frombuffer(joined, dtype=">u8"), return_inverse=True)
    categories = [f"{value:016x}" for value in distinct.tolist()]
    return pd.Categorical.from_codes(codes.astype(np.int64), categories=categories)
