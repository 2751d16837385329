"""README.md's generated sections: numbers read from the committed notebooks' outputs.

A section sits between `<!-- generated:NAME begin -->` and `<!-- generated:NAME end -->` in
README.md. `update` rewrites every such block from the outputs stored in the executed notebooks
(`notebooks/*.ipynb`, `figures/cpu-study/*.ipynb`), parsed from their JSON; nothing is
re-executed. Each block's text comes from `analysis.report.readme_sections`, which copies each
number as the notebook printed it and names the notebook and cell it read. A cell is found by
what it prints (a table's column names, a line's wording), not by its index, so a notebook may
gain or lose cells; when the wording is gone, `SourceError` names the notebook and what was
looked for.

`python -m analysis readme` rewrites the blocks; `--check` only reports the stale ones.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from analysis.platform.paths import repo_root
from analysis.report import readme_sections as sections
from analysis.report.notebook_outputs import SourceError, parse_table
from analysis.report.readme_sections import pct

__all__ = [
    "SECTIONS",
    "Block",
    "SourceError",
    "blocks",
    "parse_table",
    "pct",
    "readme_path",
    "render",
    "strip_generated",
    "update",
    "wrap",
]

README = "README.md"
MARKER = re.compile(r"<!-- generated:(?P<name>[a-z0-9-]+) (?P<end>begin|end) -->")
WIDTH = 96  # README.md's line width; table rows are never wrapped

# -- the blocks ---------------------------------------------------------------------------------

SECTIONS: dict[str, Callable[[Path], str]] = {
    "hit-rates": sections.hit_rates,
    "report-scale": sections.report_scale,
    "report-overhead": sections.report_overhead,
    "study-scale": sections.study_scale,
    "study-table": sections.study_table,
    "study-findings": sections.study_findings,
    "test-times": sections.test_times,
    "test-times-avx2": sections.test_times_avx2,
    "coverage": sections.test_coverage,
    "report-times": sections.report_times,
    "report-times-avx2": sections.report_times_avx2,
    "gpu-served": sections.gpu_served,
}


@dataclass(frozen=True)
class Block:
    name: str
    start: int  # index just after the begin marker's line
    end: int  # index of the end marker
    text: str


def blocks(markdown: str) -> list[Block]:
    """The generated blocks of a markdown text, in order; a marker without its pair, a nested
    or repeated block is an error naming it."""
    found, open_name, open_at = [], None, 0
    for marker in MARKER.finditer(markdown):
        name, end = marker["name"], marker["end"] == "end"
        if not end:
            if open_name is not None:
                raise SourceError(f"README block {name!r} begins inside {open_name!r}")
            open_name, open_at = name, markdown.find("\n", marker.end()) + 1
        else:
            if open_name != name:
                raise SourceError(f"README block end {name!r} without its begin marker")
            start = marker.start()
            found.append(Block(name, open_at, start, markdown[open_at:start]))
            open_name = None
    if open_name is not None:
        raise SourceError(f"README block {open_name!r} has no end marker")
    names = [b.name for b in found]
    if len(set(names)) != len(names):
        raise SourceError(f"README blocks repeat a name: {names}")
    return found


def render(name: str, root: Path | None = None) -> str:
    """The block's content as the generator writes it (ends with a newline)."""
    if name not in SECTIONS:
        raise SourceError(f"README block {name!r} is unknown; known: {', '.join(SECTIONS)}")
    return wrap(SECTIONS[name](root or repo_root())).rstrip("\n") + "\n"


def wrap(markdown: str, width: int = WIDTH) -> str:
    """Paragraphs and list items wrapped at `width` (continuations indented under the item's
    text); table rows, blank lines and short lines as they are."""
    lines = []
    for line in markdown.split("\n"):
        if len(line) <= width or line.lstrip().startswith("|"):
            lines.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        hanging = indent + ("  " if line.lstrip().startswith("- ") else "")
        lines += textwrap.wrap(
            line, width, subsequent_indent=hanging, break_long_words=False,
            break_on_hyphens=False,
        )  # fmt: skip
    return "\n".join(lines)


def update(markdown: str, root: Path | None = None) -> tuple[str, list[str]]:
    """The markdown with every generated block rewritten, and the names of those that changed."""
    root = root or repo_root()
    changed, pieces, at = [], [], 0
    for block in blocks(markdown):
        text = render(block.name, root)
        if text != block.text:
            changed.append(block.name)
        pieces += [markdown[at : block.start], text]
        at = block.end
    pieces.append(markdown[at:])
    return "".join(pieces), changed


def strip_generated(markdown: str) -> str:
    """The markdown without the generated blocks' content (the markers stay)."""
    pieces, at = [], 0
    for block in blocks(markdown):
        pieces.append(markdown[at : block.start])
        at = block.end
    pieces.append(markdown[at:])
    return "".join(pieces)


def readme_path(root: Path | None = None) -> Path:
    return (root or repo_root()) / README
