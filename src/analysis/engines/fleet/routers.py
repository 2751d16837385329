"""Routers: which replica an arriving request goes to. One class each, one decision method.

A router sees what a real one sees at arrival time, through `ReplicaView`: each replica's
requests in flight (running + waiting) and KV usage, and, for `precise-prefix` and
`prefix-load`, how many leading blocks of the request the replica holds according to vLLM's
KV cache events. The request is an `Arrival`: its conversation id and vLLM's block hashes of
its prompt. Ties go to the less loaded replica, then to the lower index, so every run is
deterministic. Adding a router is one class here plus its name in
`analysis.engines.config.ROUTERS`.

Sources of the policies: session affinity is consistent hashing (Karger et al. 1997) with
the bounded-load variant of Mirrokni, Thorup and Zadimoghaddam (2018); `approx-prefix` is
llm-d's approximate prefix scorer on its own (a router-side LRU of the block hashes it sent to
each pod): llm-d sums it, weighted, with load scorers (queue depth, KV-cache utilisation), which
this router leaves out, so it has no load term beyond breaking ties; `precise-prefix` is
llm-d's precise scorer and Dynamo's KV router (an index fed by vLLM's `BlockStored` /
`BlockRemoved` events); `prefix-load` is the cache-aware trade-off of
SGLang's router and vLLM's production stack, written as one score: prefix share minus beta
times load.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from analysis.engines.config import router_spec

VIRTUAL_NODES = 64  # points per replica on the consistent-hash ring


@dataclass(frozen=True)
class Arrival:
    """A request as the router sees it when it arrives."""

    conversation_id: str
    block_hashes: Sequence[Any]  # vLLM's hashes of the prompt's full blocks, in order


class ReplicaView(Protocol):
    """What a router may read of one replica."""

    index: int

    def load(self) -> int:
        """Requests in flight: running + waiting."""

    def kv_usage(self) -> float:
        """Share of the replica's KV blocks in use (vLLM's own figure)."""

    def cached_prefix_blocks(self, block_hashes: Sequence[Any]) -> int:
        """Leading blocks of `block_hashes` the replica holds, from its KV cache events."""


class Router:
    """Picks a replica for each arrival; `reads_kv_events` asks the fleet for vLLM's events."""

    name: ClassVar[str]
    reads_kv_events: ClassVar[bool] = False

    def __init__(self, replicas: int, num_blocks: int, parameter: float | None = None) -> None:
        self.replicas = replicas
        self.num_blocks = num_blocks
        self.parameter = parameter

    def choose(self, arrival: Arrival, replicas: Sequence[ReplicaView]) -> int:
        raise NotImplementedError


def least_loaded(candidates: Sequence[ReplicaView]) -> int:
    """The replica with the fewest requests in flight, then the lowest KV usage, then index."""
    return min(candidates, key=lambda r: (r.load(), r.kv_usage(), r.index)).index


class RoundRobin(Router):
    name = "round-robin"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next = 0

    def choose(self, arrival: Arrival, replicas: Sequence[ReplicaView]) -> int:
        choice = self._next % self.replicas
        self._next += 1
        return choice


class LeastLoaded(Router):
    name = "least-loaded"

    def choose(self, arrival: Arrival, replicas: Sequence[ReplicaView]) -> int:
        return least_loaded(replicas)


class SessionAffinity(Router):
    """Consistent hash of the conversation id; with a load cap c, a replica already holding
    ceil(c x mean load) requests passes the request to the next one on the ring."""

    name = "affinity"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        points = sorted(
            (_ring_point(f"replica-{k}-{v}"), k)
            for k in range(self.replicas)
            for v in range(VIRTUAL_NODES)
        )
        self._positions = [p for p, _ in points]
        self._owners = [k for _, k in points]

    def choose(self, arrival: Arrival, replicas: Sequence[ReplicaView]) -> int:
        start = bisect.bisect(self._positions, _ring_point(arrival.conversation_id))
        walk = self._ring_walk(start)
        if self.parameter is None:
            return next(walk)
        total = sum(r.load() for r in replicas) + 1  # the arrival counts
        cap = math.ceil(self.parameter * total / self.replicas)
        for k in walk:
            if replicas[k].load() < cap:
                return k
        return least_loaded(replicas)  # pragma: no cover - the cap admits the least loaded

    def _ring_walk(self, start: int):
        seen: set[int] = set()
        owners = self._owners
        for offset in range(len(owners)):
            k = owners[(start + offset) % len(owners)]
            if k not in seen:
                seen.add(k)
                yield k


def _ring_point(key: str) -> int:
    """A stable position on the ring (sha256, never Python's salted hash)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


class ApproximatePrefix(Router):
    """The longest prefix of the request among the blocks this router sent to each replica
    (an LRU of as many hashes as the replica has blocks); it never sees evictions."""

    name = "approx-prefix"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sent: list[OrderedDict[Any, None]] = [OrderedDict() for _ in range(self.replicas)]

    def choose(self, arrival: Arrival, replicas: Sequence[ReplicaView]) -> int:
        scores = [_leading(arrival.block_hashes, sent) for sent in self._sent]
        best = max(scores)
        choice = least_loaded([r for r in replicas if scores[r.index] == best])
        self._remember(choice, arrival.block_hashes)
        return choice

    def _remember(self, replica: int, block_hashes: Sequence[Any]) -> None:
        sent = self._sent[replica]
        for key in block_hashes:
            sent[key] = None
            sent.move_to_end(key)
        while len(sent) > self.num_blocks:
            sent.popitem(last=False)


def _leading(block_hashes: Sequence[Any], held: Any) -> int:
    count = 0
    for key in block_hashes:
        if key not in held:
            break
        count += 1
    return count


class PrecisePrefix(Router):
    """The replica holding the longest prefix of the request, by vLLM's KV cache events."""

    name = "precise-prefix"
    reads_kv_events = True

    def choose(self, arrival: Arrival, replicas: Sequence[ReplicaView]) -> int:
        scores = [r.cached_prefix_blocks(arrival.block_hashes) for r in replicas]
        best = max(scores)
        return least_loaded([r for r in replicas if scores[r.index] == best])


class PrefixLoad(Router):
    """Highest (cached prefix share - beta x load share): the prefix share is the request's
    leading blocks the replica holds over its blocks, the load share the replica's requests in
    flight over the busiest replica's. beta = 0 is precise-prefix; a large beta, least-loaded."""

    name = "prefix-load"
    reads_kv_events = True

    def choose(self, arrival: Arrival, replicas: Sequence[ReplicaView]) -> int:
        beta = 1.0 if self.parameter is None else self.parameter
        blocks = max(1, len(arrival.block_hashes))
        busiest = max(1, max(r.load() for r in replicas))
        scores = [
            r.cached_prefix_blocks(arrival.block_hashes) / blocks - beta * r.load() / busiest
            for r in replicas
        ]
        best = max(scores)
        return least_loaded([r for r in replicas if scores[r.index] == best])


ROUTER_CLASSES: dict[str, type[Router]] = {
    cls.name: cls
    for cls in (
        RoundRobin,
        LeastLoaded,
        SessionAffinity,
        ApproximatePrefix,
        PrecisePrefix,
        PrefixLoad,
    )
}


def make_router(spec: str, replicas: int, num_blocks: int) -> Router:
    """The router a spec such as "affinity-cap1.25" names (checked by `config.router_spec`)."""
    name, parameter = router_spec(spec)
    return ROUTER_CLASSES[name](replicas, num_blocks, parameter)
