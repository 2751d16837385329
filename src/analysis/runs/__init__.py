"""Runs: one configuration through one engine, summarised and stored under data/results/.

`run(trace, config) -> RunResult` is the project's one entry point over both engines: it builds
the workload, drives the engine, turns what the recorder saw into tables, adds the headline
numbers (`analysis.metrics.hitrates.summarize`) and the manifest. `run_and_write` also stores the
result in its folder, `data/results/<config id>/`, and reuses a complete one.
"""

from __future__ import annotations

from analysis.runs.runner import config_id_for, run, run_and_write

__all__ = ["config_id_for", "run", "run_and_write"]
