"""Request traces from conversations: the token ids an engine replays, turn by turn.

What a trace is and how it is built (templates, the `max_model_len` policies, timestamps) is
told in `build`. The package holds one module per step: `options` (what shapes a build and what
it yields), `build` (conversations to ids), `storage` (Parquet, the manifest, the JSONL export),
`sets` (a build's files replaced together, under a lock), `ensure` (build only when no identical
build is on disk), `check` (the one consistency check every stage that takes a trace shares)
and `stats` (the shape of a trace).
"""

from analysis.data.traces.build import build_traces
from analysis.data.traces.check import check_trace
from analysis.data.traces.ensure import ensure_traces
from analysis.data.traces.options import TRACE_COLUMNS, TraceOptions
from analysis.data.traces.stats import shared_prefix_tokens, trace_stats
from analysis.data.traces.storage import (
    export_jsonl,
    limit_trace,
    load_manifest,
    load_trace,
    save_traces,
    trace_schema,
    trace_table,
    write_trace,
)
from analysis.platform.errors import TraceError

__all__ = [
    "TRACE_COLUMNS",
    "TraceError",
    "TraceOptions",
    "build_traces",
    "check_trace",
    "ensure_traces",
    "export_jsonl",
    "limit_trace",
    "load_manifest",
    "load_trace",
    "save_traces",
    "shared_prefix_tokens",
    "trace_schema",
    "trace_stats",
    "trace_table",
    "write_trace",
]
