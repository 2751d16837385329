"""Workloads, an async streaming client and the statistics of a serving benchmark.

Everything here speaks token ids: prompts are sent to vLLM's OpenAI-compatible
`/v1/completions` as lists of ids, so a "shared prefix" is shared token for token and the
server's prefix cache sees exactly the prefix we meant. Nothing here starts a server (that is
`analysis.serving`), and nothing here imports vllm or torch.

Per request we record TTFT (the arrival of the first streamed chunk that carries a token),
end-to-end latency, prompt and output tokens and a status:

    ok        the stream ended with `[DONE]`
    timeout   the request passed its time limit (the connection is closed, so vLLM aborts it)
    error     an HTTP error, a broken stream, or an error event from the server
    not_sent  the run's deadline passed, or the server froze (no answer to a request nor to
              /health), before the request could be sent

Timeouts and errors are counted and reported, never fatal.
"""

from __future__ import annotations

from analysis.platform.errors import WorkloadError
from analysis.serving.loadgen.client import (
    parse_sse_line,
    run_burst,
    run_closed_loop,
    run_open_loop,
)
from analysis.serving.loadgen.prometheus import (
    SERVER_GAUGES,
    counter_deltas,
    counter_summary,
    parse_prometheus,
)
from analysis.serving.loadgen.records import RequestResult, RequestSpec, results_frame
from analysis.serving.loadgen.request_stats import percentile, summarize_requests
from analysis.serving.loadgen.workloads import (
    BOS_ID,
    ORDINARY_ID_RANGE,
    ShareGPTWorkload,
    cacheable_tokens,
    new_prefixes,
    ordinary_ids,
    predicted_ttft_saving,
    prefix_sweep_prompts,
    sharegpt_workload,
    synthetic_prefix_workload,
)

__all__ = [
    "BOS_ID",
    "ORDINARY_ID_RANGE",
    "RequestResult",
    "RequestSpec",
    "SERVER_GAUGES",
    "ShareGPTWorkload",
    "WorkloadError",
    "cacheable_tokens",
    "counter_deltas",
    "counter_summary",
    "ordinary_ids",
    "parse_prometheus",
    "parse_sse_line",
    "percentile",
    "predicted_ttft_saving",
    "prefix_sweep_prompts",
    "results_frame",
    "run_burst",
    "run_closed_loop",
    "run_open_loop",
    "sharegpt_workload",
    "summarize_requests",
    "new_prefixes",
    "synthetic_prefix_workload",
]
