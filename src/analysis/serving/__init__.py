"""Serving benchmarks on a real vLLM OpenAI-compatible server, and seed 004's offline sweep.

Results are cached under `data/results/serving/<run id>/`. Importing the package imports
neither vllm nor torch. Its modules:
- `model_names`: `--model` resolved to a folder or hub name, the served name, the model's id.
- `server`: `VllmServer`, a `vllm serve` process group started, checked and always stopped.
- `bench_config`: `ServingBenchConfig`, `RunKey` and the run id that names a run's folder.
- `bench_run`: one run on a running server (requests, counters, gauges) and its repeats.
- `benchmark`: `run_serving_bench` (caching on vs off, every cell) and `ServerPair`.
- `kept_servers`: servers kept for several notebooks, found by a kernel through the environment.
- `storage`: run folders written (manifest last) and read back as tables.
- `calibrate`: one request's cost on a server, and the requests that fit a budget.
- `tables`: the summary table, its readable form, and caching on against off side by side.
- `prefix_sweep`: seed 004's sweep on the in-process engine, and its tables.
- `loadgen`: workloads (token ids) and the async streaming client that sends them.
- `intervals`: a value with its interval, and `compare`, the one rule for "differs".
- `stats`: statistics per repeat, then across repeats (median, two-level bootstrap), the
  odd repeat, requests in flight; and the tests of the hit-rate model.
- `study`: the serving study of notebooks 08, 10, 11 and 12 (configs, sizing, runs).
- `writeup`: seed 003's decision write-up and claim table from the measured results.
- `checks`: the checks tables of notebooks 08, 10, 11 and 12 (claims independent of speed).
- `replayable`: what a cell sent beside what the server measured, and the server's engine
  settings and threads, for replay on a clock to time (`analysis.timing.served`).
- `gpu_check`: `gpu-check`, the real CUDA engine against `replay`, and the GPU timing.

This file only re-exports the names callers use as `serving.X`.
"""

from analysis.serving.bench_config import RunKey, ServingBenchConfig, run_id
from analysis.serving.bench_run import execute_run, warm_server
from analysis.serving.benchmark import ServerPair, run_serving_bench
from analysis.serving.calibrate import Calibration, calibration, plan_requests
from analysis.serving.model_names import BUILTIN_MODELS, resolve_model
from analysis.serving.prefix_sweep import (
    PrefixSweepConfig,
    long_prefill_table,
    ratio_interval,
    run_prefix_sweep,
    sweep_table,
)
from analysis.serving.server import (
    GIB,
    MODES,
    ServerConfig,
    ServerStartError,
    VllmServer,
    free_port,
    server_command,
    stop_all_servers,
    terminate_group,
)
from analysis.serving.storage import is_finished, load_gauges, load_requests, load_summaries
from analysis.serving.tables import (
    SUMMARY_COLUMNS,
    compare_modes,
    readable_table,
    summary_table,
)

__all__ = [
    "BUILTIN_MODELS",
    "GIB",
    "MODES",
    "SUMMARY_COLUMNS",
    "Calibration",
    "PrefixSweepConfig",
    "RunKey",
    "ServerConfig",
    "ServerPair",
    "ServerStartError",
    "ServingBenchConfig",
    "VllmServer",
    "calibration",
    "compare_modes",
    "execute_run",
    "free_port",
    "is_finished",
    "load_gauges",
    "load_requests",
    "load_summaries",
    "long_prefill_table",
    "plan_requests",
    "ratio_interval",
    "readable_table",
    "resolve_model",
    "run_id",
    "run_prefix_sweep",
    "run_serving_bench",
    "server_command",
    "stop_all_servers",
    "summary_table",
    "sweep_table",
    "terminate_group",
    "warm_server",
]
