"""CPU offloading in `replay`: vLLM's OffloadingConnector driven without a model or bytes moved.

A prototype (issue 24): `run_offload` replays a workload through vLLM's scheduler with the
connector's scheduler half, and vLLM's own worker half over a worker that moves no bytes: its
transfers finish at once, or on a clock after their bytes crossed the host link. It does not
import vLLM until it runs.
"""

from analysis.engines.offload.driver import OffloadCounts, OffloadRun, run_offload

__all__ = ["OffloadCounts", "OffloadRun", "run_offload"]
