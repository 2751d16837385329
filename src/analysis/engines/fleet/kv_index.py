"""What a precise router knows of one replica: the block hashes its KV cache events announced.

vLLM publishes a `KVEventBatch` at the end of every step (`Scheduler.update_from_output`),
through the scheduler's `kv_event_publisher`. A fleet replica's publisher is a `KvEventIndex`:
instead of sending the batch over ZMQ to a router process (llm-d, Dynamo), it applies it to
the set of hashes the router would hold. It keeps vLLM's event semantics, not the block pool's
truth: vLLM announces a hash once when it is first cached and removes it when any block
holding it is evicted, so after an eviction of one of two copies the index misses a hash the
replica still holds, as a real router's index would.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


class KvEventIndex:
    """vLLM's `EventPublisher` interface (`publish`, `shutdown`), kept as a set of hashes."""

    def __init__(self) -> None:
        self.hashes: set[Any] = set()
        self.stored_events = 0
        self.removed_events = 0

    def publish(self, batch: Any) -> None:
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        for event in batch.events:
            if isinstance(event, BlockStored):
                self.hashes.update(event.block_hashes)
                self.stored_events += 1
            elif isinstance(event, BlockRemoved):
                self.hashes.difference_update(event.block_hashes)
                self.removed_events += 1
            elif isinstance(event, AllBlocksCleared):
                self.hashes.clear()

    def shutdown(self) -> None:
        pass

    def publish_pending(self, kv_cache_manager: Any) -> None:
        """Publish events queued outside `update_from_output` (by the decode fast path in a
        step vLLM did not schedule), so the index is current when the next request arrives."""
        events = kv_cache_manager.take_events()
        if events:
            from vllm.distributed.kv_events import KVEventBatch

            self.publish(KVEventBatch(ts=time.time(), events=events))

    def leading_blocks(self, block_hashes: Sequence[Any]) -> int:
        """How many leading hashes of a request the index holds."""
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

        count = 0
        for key in block_hashes:
            if maybe_convert_block_hash(key) not in self.hashes:
                break
            count += 1
        return count
