"""The order the test files run in: the slowest first.

`make test` runs pytest on pytest-xdist with `--dist loadfile`: each worker takes whole files,
the next one when it is free. Ordered by their number of tests (xdist's default), the files
with a few slow tests came last, and one worker idled while the other ran them: simulated on a
fresh run's times, 442 s against 418 s with the slowest first (`--no-loadscope-reorder` keeps
this order). Tests within a file keep theirs.
"""

from __future__ import annotations

# Seconds of test time per file in a fresh `make test` on a 2-core AMD EPYC, most first
# (130 s for test_serving down to 19 s for test_vllm_cli); every other file took less.
SLOWEST_FIRST = (
    "test_serving",
    "test_executors",
    "test_engines_vllm",
    "test_resume",
    "test_server_loss",
    "test_model_shapes",
    "test_fleet",
    "test_process_hygiene",
    "test_timing",
    "test_gpu_check",
    "test_capacity_plan",
    "test_hardware",
    "test_vllm_cli",
)


def pytest_collection_modifyitems(items) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))
