"""Re-execute the notebooks with papermill and turn them into an HTML report.

The committed notebooks are re-executed with their default parameters, so that what is
committed is what `make report` produced and what nbval re-checks in CI. papermill writes its
output as it goes, so every run writes a copy beside its target and renames it into place only
when the last cell ran: an interrupted, killed or failed run leaves the committed notebook as it
was. Sweep points run the per-configuration notebook into `reports/runs/` instead (the
committed one is never overwritten by a sweep point).
"""

from __future__ import annotations

import html
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from analysis.platform.errors import NotebookError, ResultError
from analysis.platform.manifest import process_alive
from analysis.platform.paths import figures_dir, from_root, repo_root, reports_dir
from analysis.report.kernels import kernel_log_path, papermill_kernel_arguments

if TYPE_CHECKING:
    from analysis.sweeps.grid import Point

NOTEBOOKS_DIR = "notebooks"
# The per-configuration notebook: executed by the sweep, once per grid point.
RUN_CONFIG_NOTEBOOK = "03-run-config.ipynb"
# After a Ctrl-C, papermill shuts the kernel down and closes its channels before the run ends;
# under a loaded machine that once did not end for over a minute. It gets this long: then the
# kernel is killed and the run ends as a Ctrl-C ends it.
INTERRUPT_GRACE_S = 20.0


@dataclass(frozen=True)
class Executed:
    notebook: Path
    output: Path
    seconds: float


def notebooks_dir() -> Path:
    return repo_root() / NOTEBOOKS_DIR


def report_notebooks() -> list[Path]:
    """The committed notebooks in reading order (the sweep notebook runs per grid point)."""
    return sorted(p for p in notebooks_dir().glob("[0-9][0-9]-*.ipynb"))


def execute(
    notebook: Path,
    output: Path | None = None,
    parameters: dict | None = None,
    progress: bool = True,
    stopped: threading.Event | None = None,
) -> Executed:
    """Run one notebook with papermill into `output` (default: in place), from its folder;
    `output` changes only when every cell ran. A cell's error or a dead kernel is a
    NotebookError (one line); the executed copy up to there is kept under reports/failed/.

    `stopped`: set by whoever stops the run from another thread (`stop_kernels`); the kernel's
    death that follows is then that stop, a KeyboardInterrupt, and nothing is kept."""
    import papermill

    notebook = Path(notebook)
    output = Path(output) if output else notebook
    output.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    logging.getLogger("papermill").addFilter(not_said_again)  # once: the same function
    with partial_copy(output) as partial, interrupt_within(INTERRUPT_GRACE_S, partial):
        try:
            papermill.execute_notebook(
                str(notebook),
                str(partial),
                parameters=parameters or {},
                cwd=str(notebook.parent),
                progress_bar=progress,
                kernel_name="python3",
                **papermill_kernel_arguments(),
            )
            record_paths(partial, notebook, output)
        except Exception as exc:
            if stopped is not None and stopped.is_set():
                raise KeyboardInterrupt from None
            reason = stop_reason(exc)
            if reason is None:
                raise
            kept = failed_copy(output)
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(partial, kept)
            raise NotebookError(notebook.name, f"{reason}; the executed copy is {kept}") from None
    return Executed(notebook, output, time.perf_counter() - started)


@contextmanager
def partial_copy(output: Path) -> Iterator[Path]:
    """A path beside `output` for papermill to write as it goes, renamed to `output` when the
    block succeeds and removed otherwise (a SIGKILLed run's copy: by the next run)."""
    remove_dead_partials(output)
    partial = output.with_name(f".{output.stem}.partial-{os.getpid()}.ipynb")
    try:
        yield partial
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)


@contextmanager
def interrupt_within(grace_s: float, partial: Path) -> Iterator[None]:
    """A Ctrl-C in the block raises KeyboardInterrupt, as always, and also starts a clock: if
    the run is still in the block `grace_s` later (papermill's kernel shutdown stuck), its
    kernels are killed (`stop_kernels`), `partial` is removed, and the process exits 130 with
    the line a Ctrl-C prints. Only in the main thread, and not where SIGINT is ignored (a sweep
    worker leaves Ctrl-C to its sweep)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        yield
        return
    left = threading.Event()

    def on_interrupt(signum: int, frame: object) -> None:
        clock = threading.Thread(
            target=end_after, args=(grace_s, left, partial), name="interrupt-grace", daemon=True
        )
        clock.start()
        signal.signal(signal.SIGINT, previous)  # a second Ctrl-C is an ordinary one
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        left.set()
        if signal.getsignal(signal.SIGINT) is on_interrupt:
            signal.signal(signal.SIGINT, previous)


def end_after(grace_s: float, left: threading.Event, partial: Path) -> None:
    """The clock `interrupt_within` starts: unless the run `left` the block within `grace_s`,
    end the process whatever it is doing."""
    if left.wait(grace_s):
        return
    stop_kernels()
    partial.unlink(missing_ok=True)
    end_interrupted(grace_s)


def end_interrupted(grace_s: float) -> NoReturn:
    """End this process now, as a Ctrl-C ends it, after its kernels did not stop in time."""
    print(
        f"interrupted: the kernel did not stop within {grace_s:g} s and was killed; "
        "nothing partial was kept",
        file=sys.stderr,
        flush=True,
    )
    os._exit(130)


def stop_kernels() -> None:
    """Kill the kernels this process started (its children running ipykernel), and wait until
    they are gone: an `execute` running one, in any thread, then ends. Only the kernels: what a
    kernel started ends with it by its own tie (a server's guard, a worker's death signal), and
    the servers this process keeps have guards of their own, which killing them here would cut."""
    import psutil

    kernels = []
    for child in psutil.Process().children():
        with suppress(psutil.Error):
            if any("ipykernel" in part for part in child.cmdline()):
                kernels.append(child)
    for kernel in kernels:
        with suppress(psutil.NoSuchProcess):
            kernel.kill()
    psutil.wait_procs(kernels, timeout=5)


def remove_dead_partials(output: Path) -> None:
    """The partial copies of `output` left by runs whose process no longer exists."""
    for stale in output.parent.glob(f".{output.stem}.partial-*.ipynb"):
        pid = stale.name.removesuffix(".ipynb").rpartition("-")[2]
        if pid.isdigit() and not process_alive(int(pid)):
            stale.unlink(missing_ok=True)


def record_paths(executed: Path, notebook: Path, output: Path) -> None:
    """papermill records the paths it was given: name the notebook and where it ends up (not
    the partial copy), from the repository root (no machine's folders in a committed one)."""
    import nbformat

    executed_nb = nbformat.read(executed, as_version=4)
    recorded = executed_nb.metadata.get("papermill", {})
    recorded["input_path"] = from_root(notebook)
    recorded["output_path"] = from_root(output)
    nbformat.write(executed_nb, executed)


def failed_copy(output: Path) -> Path:
    """Where a failed run's executed copy is kept, up to its error: under reports/failed/,
    away from the notebooks (and from what `make sweep` takes as done)."""
    return reports_dir() / "failed" / output.name


def not_said_again(record: logging.LogRecord) -> bool:
    """Drop papermill's log line for a dead kernel: the NotebookError says it, with the why."""
    return not record.getMessage().startswith("Kernel died")


def stop_reason(exc: Exception) -> str | None:
    """Why a notebook stopped, on one line: a cell's error (papermill's), or a dead kernel;
    None for anything else (not the notebook's doing)."""
    from nbclient.exceptions import DeadKernelError

    if isinstance(exc, DeadKernelError):
        return (
            "its kernel died (killed from outside: most likely the system ran out of memory; "
            "check free memory, or `dmesg` for the OOM killer, and run it again; the kernel's "
            f"own log: {kernel_log_path()})"
        )
    if hasattr(exc, "ename"):  # papermill's PapermillExecutionError: the kernel's own error
        value = " ".join(str(exc.evalue).split())
        return f"{exc.ename}: {value} (cell {exc.exec_count})"
    return None


# What progress bars leave in a notebook's stderr when no terminal shows them.
PROGRESS_NOISE = ("IProgress not found", "TqdmWarning", "\r")


def progress_noise(notebook: Path) -> list[str]:
    """The stderr outputs of an executed notebook that are progress-bar noise (first 80 chars)."""
    import json

    cells = json.loads(Path(notebook).read_text()).get("cells", [])
    found = []
    for cell in cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") != "stream" or out.get("name") != "stderr":
                continue
            text = "".join(out.get("text", []))
            if any(mark in text for mark in PROGRESS_NOISE):
                found.append(text.strip()[:80])
    return found


def to_html(notebooks: list[Path], out_dir: Path | None = None) -> Path:
    """Export executed notebooks to HTML and write an index page that links them and the figures."""
    from nbconvert import HTMLExporter

    out_dir = Path(out_dir) if out_dir else reports_dir() / "html"
    out_dir.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter()
    links = []
    for notebook in notebooks:
        body, _ = exporter.from_filename(str(notebook))
        target = out_dir / f"{notebook.stem}.html"
        target.write_text(body, encoding="utf-8")
        links.append(f'<li><a href="{target.name}">{html.escape(notebook.stem)}</a></li>')
    figures = sorted(figures_dir().glob("*.png"))
    thumbs = "".join(
        f'<figure><a href="{p.resolve().as_uri()}"><img src="{p.resolve().as_uri()}" '
        f'width="360"></a><figcaption>{html.escape(p.stem)}</figcaption></figure>'
        for p in figures
    )
    index = out_dir / "index.html"
    index.write_text(
        "<!doctype html><meta charset='utf-8'><title>Prefix Cache Lab report</title>"
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}"
        "figure{display:inline-block;margin:8px}</style>"
        f"<h1>Prefix Cache Lab report</h1><h2>Notebooks</h2><ul>{''.join(links)}</ul>"
        f"<h2>Figures</h2>{thumbs}",
        encoding="utf-8",
    )
    return index


def run_point_notebook(point: Point, grid: str | Path, *, force: bool = False) -> Path:
    """Run one point through `notebooks/03-run-config.ipynb` (papermill, the point's whole
    config injected); the executed copy goes to reports/runs/<grid>/<point>.ipynb only when the
    whole notebook ran (a failed or killed point leaves no copy that `make sweep` would take
    as done)."""
    output = reports_dir() / "runs" / Path(grid).stem / f"{point.point_id}.ipynb"
    parameters = {"run_config": point.config.to_dict(), "force": force}  # every field
    try:
        execute(notebooks_dir() / RUN_CONFIG_NOTEBOOK, output, parameters, progress=False)
    except NotebookError as exc:
        raise ResultError(f"point {point.point_id} failed: {exc.reason}") from None
    return output
