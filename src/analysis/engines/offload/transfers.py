"""The worker underneath vLLM's OffloadingConnector, which moves no bytes: when it reports a
transfer finished.

In steps (no clock), every transfer is reported finished at the worker's next poll: the best
case for offloading. On a clock, each one crosses a `HostLink`: it takes its blocks' bytes at
the link's bandwidth, one transfer at a time in each direction (loads host to GPU, stores GPU
to host), and is reported at the first poll after it ends; a load keeps its request waiting
until then, as vLLM's scheduler does (`WAITING_FOR_REMOTE_KVS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# PCIe 5.0 x16, as NVIDIA publishes it for the H100 and H200: 128 GB/s both ways together,
# 64 GB/s each way. A published peak: a real copy gets less, so loads are charged at best.
PCIE5_X16_BYTES_PER_S = 64e9


@dataclass
class HostLink:
    """The GPU-host link a CPU tier's blocks cross, on a clock (`now`, `wait_until`)."""

    bytes_per_s: float
    block_bytes: int  # one CPU block, as vLLM sizes it
    now: Callable[[], float]
    wait_until: Callable[[float], None]
    busy_until: dict[str, float] = field(default_factory=lambda: {"load": 0.0, "store": 0.0})
    seconds: dict[str, float] = field(default_factory=lambda: {"load": 0.0, "store": 0.0})

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0:
            raise ValueError(f"bytes_per_s={self.bytes_per_s}: give the link's bandwidth above 0")

    def finish_time(self, direction: str, blocks: int) -> float:
        """When a transfer of `blocks` CPU blocks submitted now ends, behind the ones before it."""
        duration = blocks * self.block_bytes / self.bytes_per_s
        start = max(self.now(), self.busy_until[direction])
        self.busy_until[direction] = start + duration
        self.seconds[direction] += duration
        return start + duration


def worker_half(vllm_config: Any, kv_cache_config: Any, link: HostLink | None = None) -> Any:
    """vLLM's OffloadingConnector in its worker role, over a worker that moves no bytes: it
    reports a transfer finished at its next poll (`link` None) or once `link` has carried it."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector,
    )
    from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult

    class StubWorker(OffloadingWorker):
        def __init__(self) -> None:
            self.ends: dict[int, float] = {}  # job id -> when it ends (0: at the next poll)

        def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
            self.ends[job_id] = self._end("store", dst_spec)
            return True

        def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
            self.ends[job_id] = self._end("load", src_spec)
            return True

        def _end(self, direction: str, cpu_spec: Any) -> float:
            if link is None:
                return 0.0
            return link.finish_time(direction, len(cpu_spec.block_ids))

        def get_finished(self) -> list[Any]:
            now = 0.0 if link is None else link.now()
            done = [job for job, end in self.ends.items() if end <= now]
            for job in done:
                del self.ends[job]
            return [TransferResult(job_id=job, success=True) for job in done]

        def wait(self, job_ids: set[int]) -> None:
            """Block until these jobs have ended (the clock moves to the last one's end); they
            are reported at the next poll, as vLLM's are."""
            if link is not None:
                ends = [self.ends[job] for job in job_ids if job in self.ends]
                if ends:
                    link.wait_until(max(ends))

    connector = OffloadingConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
    connector.connector_worker.worker = StubWorker()
    return connector
