"""Executors: how a sweep runs its points, on one machine (`local`) or on a Ray cluster (`ray`).

Both run exactly the points whose result is not complete (unless forced), show one progress
bar for the whole sweep, and write each result folder atomically, from this process only:

- `local`: one point after the other, in this process; with `workers` N > 1, on N processes
  of this machine (spawned, so that each starts vLLM clean), which hand each result back to
  this process to write. Each worker's torch gets its share of the cores (a real CPU engine
  with every core's threads beside another ran 5x slower each); real-engine points go first,
  the longest. On 2 cores, the default sweep's five real-engine points took 44 s on two
  workers of one thread each, against 55-58 s one after another with both cores' threads.
- `ray`: one Ray task per point on the cluster at `RAY_ADDRESS`, or on a Ray instance started
  here (`workers` CPUs; stopped at the end). A replay point asks for one CPU, a real-engine
  GPU point for one GPU. A task whose worker dies (killed, out of memory, node lost) is run
  again by Ray (`max_retries`); finished tasks are collected with `ray.wait` as they end.
  The task returns the `RunResult` (its tables are a few MB: block events are aggregated)
  and this process writes it, so a retried task never leaves a second writer behind and the
  nodes need no shared file system for results; they do need the package and the traces.

Ray is optional (`pip install '.[ray]'`, `make setup EXTRAS=ray`); asking for it without it
installed is a one-line error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.platform.errors import GridError
from analysis.sweeps.grid import Point, is_done, result_folder

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

EXECUTORS = ("local", "ray")
MAX_RETRIES = 3  # times Ray runs a point again after losing its worker
RAY_INSTALL = "pip install '.[ray]' or make setup EXTRAS=ray (pinned in requirements/ray.lock)"


class ExecutorError(GridError):
    """An executor that cannot run; one line saying what to do."""


@dataclass
class SweepRun:
    """What one call of `run_points` did."""

    executor: str
    ran: list[Point] = field(default_factory=list)  # in the order they finished
    skipped: list[Point] = field(default_factory=list)  # complete before the call
    # (points sharing a result folder with an earlier point are in neither list)
    seconds: float = 0.0
    workers: int | None = None


def run_points(
    points: Sequence[Point],
    executor: str = "local",
    *,
    force: bool = False,
    workers: int | None = None,
    results: Path | None = None,
    progress: bool = True,
    on_done: Callable[[Point], None] | None = None,
) -> SweepRun:
    """Run every point of `points` whose result is missing (all of them with `force`), each
    result folder once (points of several series may share one).

    `workers`: `local`'s processes (default: 1, this process), or the CPUs of the Ray instance
    started here (default: all; ignored with an existing cluster, `RAY_ADDRESS`). `results`:
    the folder of result folders (default data/results). `on_done(point)` is called after
    each point's result is written."""
    from analysis.platform.progress import bar as tqdm

    if executor not in EXECUTORS:
        raise ExecutorError(f"executor {executor!r} is not one of {', '.join(EXECUTORS)}")
    if workers is not None and workers < 1:
        raise ExecutorError(f"workers must be a positive integer (got {workers})")
    if executor == "ray":
        import_ray()  # fail before anything runs

    def folder(point: Point) -> Path:
        return result_folder(point, results)

    distinct: dict[Path, Point] = {}  # series may share a point (the same result folder)
    for point in points:
        distinct.setdefault(folder(point), point)
    todo = [p for f, p in distinct.items() if force or not is_done(p, f)]
    report = SweepRun(
        executor, skipped=[p for p in distinct.values() if p not in todo], workers=workers
    )
    bar = tqdm(
        total=len(distinct),
        initial=len(report.skipped),
        desc=f"sweep ({executor})",
        unit="point",
        disable=not progress,
    )

    def finished(point: Point) -> None:
        report.ran.append(point)
        bar.update(1)
        bar.set_postfix_str(point.point_id, refresh=False)
        if on_done is not None:
            on_done(point)

    started = time.perf_counter()
    try:
        if executor == "local":
            from analysis.runs import run_and_write

            # real-engine points first: the longest, and a GPU's run here one at a time
            engine = [p for p in todo if p.config.engine == "vllm"]
            ordered = engine + [p for p in todo if p.config.engine != "vllm"]
            if (workers or 1) > 1 and len(todo) > 1 and not any(map(needs_gpu, engine)):
                _run_in_processes(ordered, workers, folder, finished)
            else:
                for point in ordered:
                    run_and_write(point.config, folder(point).parent, force=force, progress=False)
                    finished(point)
        elif todo:
            _run_on_ray(todo, workers, folder, finished)
    finally:
        report.seconds = time.perf_counter() - started
        bar.close()
    return report


def import_ray() -> Any:
    """The `ray` module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ExecutorError(
            f"--executor ray needs Ray, which is not installed: {RAY_INSTALL}"
        ) from None
    return ray


def needs_gpu(point: Point) -> bool:
    return point.config.engine == "vllm" and point.config.device == "cuda"


def compute_point(config: dict[str, Any]) -> Any:
    """Run one point (a Ray task body): its RunResult, less what its folder will not keep."""
    from analysis.engines import RunConfig
    from analysis.runs import run

    result = run(None, RunConfig.from_fields(config), progress=False)
    return result.without_block_events()


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """`workers` processes of this machine, spawned (each starts vLLM clean), each with its
    share of the cores for torch's threads, each killed by the kernel when this process dies: a
    SIGKILLed or SIGTERMed sweep leaves no worker behind (orphans blocked for good writing
    their result to a pipe no one reads).

    The kernel's parent-death signal fires when the thread that started a worker ends: the
    thread that submits (no `max_tasks_per_child`, so the pool's own thread starts none).
    Use the pool in a `with` block, which waits for every worker: that thread outlives them."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from analysis.platform.hardware import usable_cores

    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=start_worker,
        initargs=(os.getpid(), max(1, usable_cores() // workers)),
    )


def start_worker(parent_pid: int, threads: int = 1) -> None:
    """A sweep worker leaves Ctrl-C to the sweep, which ends its workers itself: a worker
    interrupted inside the pool's queue handling can die holding the queue's lock, and the
    pool then waits on it for ever (a Ctrl-C to the whole process group hung a sweep so)."""
    import signal

    import torch

    from analysis.platform.processes import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid)
    torch.set_num_threads(threads)


def end_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and end the workers now, rather than wait for their points
    (Python 3.14's `kill_workers`; before it, the pool's own process table). SIGKILL: a worker
    holds nothing that outlives it (its result is discarded), and vLLM's imports can leave
    SIGTERM caught."""
    workers = list((getattr(pool, "_processes", None) or {}).values())  # shutdown forgets them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.kill()


def _run_in_processes(
    todo: list[Point],
    workers: int,
    folder: Callable[[Point], Path],
    finished: Callable[[Point], None],
) -> None:
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    with worker_pool(min(workers, len(todo))) as pool:
        futures = {pool.submit(compute_point, p.config.to_dict()): p for p in todo}
        try:
            for future in as_completed(futures):
                point = futures[future]
                try:
                    result = future.result()
                except BrokenProcessPool as exc:
                    raise ExecutorError(
                        f"a sweep worker process died (killed, or out of memory) while "
                        f"{point.point_id} or another point ran; run the sweep again to resume"
                    ) from exc
                _write(folder(point), point, result)
                finished(point)
        except BaseException as exc:  # interrupted or failed: drop the rest, end the running
            end_workers(pool)
            if isinstance(exc.__context__, KeyboardInterrupt):
                # Ctrl-C inside `as_completed`'s lock: the lock's own error hides it
                raise KeyboardInterrupt from None
            raise


def _run_on_ray(
    todo: list[Point],
    workers: int | None,
    folder: Callable[[Point], Path],
    finished: Callable[[Point], None],
) -> None:
    ray = import_ray()
    started_here = _connect(ray, workers)
    task = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)(compute_point)
    pending: dict[Any, Point] = {}
    try:
        for point in todo:
            options = {"num_cpus": 1, "num_gpus": 1 if needs_gpu(point) else 0}
            pending[task.options(**options).remote(point.config.to_dict())] = point
        while pending:
            # a timeout, so that Ctrl-C is seen between points, not only when one ends
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in done:
                point = pending.pop(ref)
                _write(folder(point), point, _get(ray, ref, point))
                finished(point)
    finally:
        for ref in pending:  # interrupted or failed: stop what is still queued or running
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()


def _connect(ray: Any, workers: int | None) -> bool:
    """Join the cluster at RAY_ADDRESS, or start a local instance; True if started here."""
    if ray.is_initialized():
        return False
    from analysis.platform.paths import repo_root

    quiet = {"log_to_driver": False, "configure_logging": False}
    address = os.environ.get("RAY_ADDRESS")
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            # Workers find the traces and write nothing; they see the same repository root.
            env = {"PREFIX_CACHE_LAB_ROOT": str(repo_root())}
            ray.init(
                num_cpus=workers or os.cpu_count() or 1,
                include_dashboard=False,
                runtime_env={"env_vars": env},
                **quiet,
            )
    except Exception as exc:  # Ray raises plain exceptions for a cluster it cannot reach
        where = f"the Ray cluster at RAY_ADDRESS={address}" if address else "a local Ray instance"
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ExecutorError(
            f"could not start or reach {where}: {message} (try again, or use --executor local)"
        ) from exc
    return True


def _get(ray: Any, ref: Any, point: Point) -> Any:
    """The task's result; a failed point, or a worker lost after every retry, is one line."""
    from ray.exceptions import RayError, RayTaskError

    try:
        return ray.get(ref)
    except RayTaskError as exc:
        cause = getattr(exc, "cause", None) or exc
        raise ExecutorError(f"point {point.point_id} failed on Ray: {cause}") from exc
    except RayError as exc:  # worker crashed, out of memory, node died: after the retries
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ExecutorError(
            f"point {point.point_id}: Ray lost it {MAX_RETRIES + 1} times "
            f"({type(exc).__name__}: {first}); see `ray status` and the Ray logs"
        ) from exc


def _write(folder: Path, point: Point, result: Any) -> None:
    """Write a point's result here, the one writer of its folder (atomically, manifest last)."""
    if result.config_id != folder.name:
        raise ExecutorError(
            f"point {point.point_id}: the worker's trace differs from this process's "
            f"({result.config_id} != {folder.name}); give every node the same data/traces"
        )
    result.write(folder)
