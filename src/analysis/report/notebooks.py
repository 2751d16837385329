"""Re-execute the notebooks with papermill and turn them into an HTML report.

The committed notebooks are executed in place with their default parameters, so that what is
committed is what `make report` produced and what nbval re-checks in CI. Sweep points run the
per-configuration notebook into `reports/runs/` instead (the committed one is never
overwritten by a sweep point).
"""

from __future__ import annotations

import html
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.platform.errors import ResultError
from analysis.platform.paths import figures_dir, repo_root, reports_dir

if TYPE_CHECKING:
    from analysis.sweeps.grid import Point

NOTEBOOKS_DIR = "notebooks"
# The per-configuration notebook: executed by the sweep, once per grid point.
RUN_CONFIG_NOTEBOOK = "03-run-config.ipynb"


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
) -> Executed:
    """Run one notebook with papermill (in place unless `output` is given), from its folder."""
    import papermill

    notebook = Path(notebook)
    output = Path(output) if output else notebook
    output.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    papermill.execute_notebook(
        str(notebook),
        str(output),
        parameters=parameters or {},
        cwd=str(notebook.parent),
        progress_bar=progress,
        kernel_name="python3",
    )
    return Executed(notebook, output, time.perf_counter() - started)


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
    """Run one point through `notebooks/03-run-config.ipynb` (papermill, parameters injected);
    the executed copy goes to reports/runs/<grid>/<point>.ipynb, renamed there only when the
    whole notebook ran (papermill writes as it goes: a failed or killed point leaves no copy
    that `make sweep` would take as done)."""
    output = reports_dir() / "runs" / Path(grid).stem / f"{point.point_id}.ipynb"
    partial = output.with_name(f".{output.stem}.partial.ipynb")
    parameters = {"run_config": point.config.to_dict(), "force": force}  # every field
    try:
        execute(notebooks_dir() / RUN_CONFIG_NOTEBOOK, partial, parameters, progress=False)
    except Exception as exc:  # papermill's PapermillExecutionError: the kernel's own error
        if not hasattr(exc, "ename"):
            raise
        raise ResultError(
            f"point {point.point_id} failed: {exc.ename}: {exc.evalue} (notebook 03, cell "
            f"{exc.exec_count}; the executed copy is {partial})"
        ) from None
    os.replace(partial, output)
    return output
