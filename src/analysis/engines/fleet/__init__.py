"""A fleet: N replay engines, each vLLM's own `Scheduler` and `KVCacheManager`, behind a router.

The replicas advance in lockstep (one vLLM step each per fleet step, `driver`), or on a clock
each at its own pace (`clocked`: a discrete-event loop of arrivals and replica steps). A request is
routed when it arrives, from what a real router sees then (`routers`): each replica's waiting
and running requests and KV usage, and for the prefix routers either the router's own memory
of what it sent where (approximate) or the blocks each replica holds, read from vLLM's own KV
cache events (`kv_index`, precise). One recorder watches every replica; a run's tables are
those of a single run with a `replica` column. `analysis.runs.run` runs a fleet for
`RunConfig(engine="fleet", replicas=N, router=...)`; `num_blocks` is per replica.
"""

from __future__ import annotations

from analysis.engines.fleet.routers import ROUTER_CLASSES, Arrival, Router, make_router

__all__ = ["ROUTER_CLASSES", "Arrival", "Router", "make_router"]
