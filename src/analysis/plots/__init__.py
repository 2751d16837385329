"""One figure style for the project, and saving figures under stable names with a caption.

Topic modules beside this one (`plots.capacity`, `plots.bounds`, ...) draw the figures of one
notebook each from result tables; this module holds what they share.

Every figure goes to `figures/<name>.png` and `.svg`, and its caption (one sentence) into the
table of `figures/README.md`, so the folder documents itself.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from analysis.platform.manifest import atomic_path, lock_beside
from analysis.platform.paths import figures_dir

# The words of design.md, one colour each, everywhere.
RATE_COLORS = {
    "all-prefill": "#d62728",
    "first-prefill": "#1f77b4",
    "exported": "#17becf",
    "ideal": "#2ca02c",
    "lru": "#ff7f0e",
    "optimal": "#9467bd",
    "token-level": "#8c564b",
}
TRACE_COLORS = {"single_turn": "#7f7f7f", "multi_turn": "#1f77b4"}
TRACE_LABELS = {"single_turn": "single-turn", "multi_turn": "multi-turn"}

README_HEADER = """# Figures

Written by the notebooks (`make report`; a study folder such as `cpu-study/` by `make study`, with
its executed notebooks); each PNG has an SVG twin. One line per figure:

| figure | what it shows |
| --- | --- |
"""


def use_style() -> None:
    """The project style: seaborn's whitegrid, readable sizes, deterministic SVG output."""
    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    plt.rcParams.update(
        {
            "figure.figsize": (7.5, 4.5),
            "figure.dpi": 100,
            "savefig.dpi": 150,
            "savefig.bbox": "tight",
            "axes.titlesize": 12,
            "axes.titleweight": "bold",
            "legend.frameon": False,
            "svg.hashsalt": "prefix-cache-lab",
            "svg.fonttype": "none",
        }
    )


def percent_axis(ax, axis: str = "y", decimals: int | None = None) -> None:
    """Show a 0-1 rate axis as percentages (decimals: None picks them from the axis range)."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(PercentFormatter(1.0, decimals=decimals))


def counts_behind(ax, x, counts, label: str, width=0.8) -> None:
    """Grey count bars on a right-hand axis, drawn behind the lines of `ax`."""
    twin = ax.twinx()
    twin.bar(x, counts, width=width, color="#cccccc", alpha=0.5, zorder=0)
    twin.set_ylabel(f"{label} (grey bars)")
    twin.grid(False)
    ax.set_zorder(twin.get_zorder() + 1)
    ax.patch.set_visible(False)


def save_figure(fig: Figure, name: str, caption: str, folder: Path | None = None) -> None:
    """Save `fig` as PNG and SVG under a stable name and record its caption in the README."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name):
        raise ValueError(f"figure name {name!r}: use lower-case letters, digits, '-' and '_'")
    for problem in nan_series(fig):
        warnings.warn(f"figure {name}: {problem}", RuntimeWarning, stacklevel=2)
    folder = Path(folder) if folder else figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for suffix, metadata in ((".png", {"Software": None}), (".svg", {"Date": None})):
        with atomic_path(folder / f"{name}{suffix}") as tmp:
            fig.savefig(tmp, format=suffix[1:], metadata=metadata)
    _record_caption(folder / "README.md", name, caption)


def nan_series(fig: Figure) -> list[str]:
    """One line per drawn series with NaN values: matplotlib leaves them out without a word,
    so a rate over nothing (a NaN) would silently be a gap in the figure."""
    problems = []
    for ax in fig.axes:
        series = [(line.get_label(), line.get_xydata()) for line in ax.get_lines()]
        series += [(c.get_label(), c.get_offsets()) for c in ax.collections]
        for number, (label, values) in enumerate(series):
            values = np.ma.filled(np.ma.asarray(values, dtype=float), 0.0)
            missing = int(np.isnan(values).any(axis=-1).sum()) if values.size else 0
            if missing:
                name = repr(label) if label and not label.startswith("_") else f"series {number}"
                problems.append(f"{name} has {missing} NaN point(s), left out of the drawing")
    return problems


def _record_caption(readme: Path, name: str, caption: str) -> None:
    """Read, change and write the caption table under a lock: notebooks run in parallel
    (`make report`) save figures into the same folder, and none may lose another's line."""
    with lock_beside(readme):
        rows = _read_captions(readme)
        rows[name] = " ".join(caption.split()).replace("|", "/")
        body = "".join(f"| [{n}]({n}.png) | {rows[n]} |\n" for n in sorted(rows))
        with atomic_path(readme) as tmp:
            tmp.write_text(README_HEADER + body)


def _read_captions(readme: Path) -> dict[str, str]:
    if not readme.exists():
        return {}
    pattern = re.compile(r"^\| \[([a-z0-9_-]+)\]\([^)]*\) \| (.*) \|$")
    return {m[1]: m[2] for line in readme.read_text().splitlines() if (m := pattern.match(line))}
