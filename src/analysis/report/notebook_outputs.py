"""What a committed notebook printed, read back from its .ipynb JSON (nothing is executed).

`Outputs` holds the text outputs of one notebook (streams, text/markdown, text/plain) and finds
a cell by what it prints: a line's wording (`match`), a table's column names (`table`), a
pandas Series' keys (`series`). A printed table is read by column position, so column names
and values may hold spaces ("mean TTFT (s), median of 3 repeats [95 % interval]",
"0.038 [0.038-0.038]"). `Stat` is one printed statistic with its interval, read from either
form the serving notebooks print (one column per bound, or `value [low-high]`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from analysis.platform.errors import AnalysisError
from analysis.serving.intervals import Interval, compare

Row = dict[str, str]

# The serving tables' statistics as `analysis.serving.tables.readable_table` names them.
READABLE = {
    "mean_ttft": "mean TTFT (s)",
    "p95_ttft": "p95 TTFT (s)",
    "mean_tpot": "mean TPOT (s)",
    "req_s": "requests/s",
}
_STAT = re.compile(r"^(n/a|\d[\d.,]*)(?: \[(\d[\d.,]*)-(\d[\d.,]*)\])?$")


class SourceError(AnalysisError):
    """A notebook output that a generated text reads is missing or has changed its form."""


@dataclass(frozen=True)
class Source:
    """One cell of one committed notebook (`cell`: the 0-based index in the .ipynb)."""

    path: str
    cell: int

    def __str__(self) -> str:
        return f"`{self.path}` cell {self.cell}"


@dataclass(frozen=True)
class Stat:
    """A statistic as printed, with its 95 % interval as printed ("" when none)."""

    value: str
    low: str = ""
    high: str = ""

    def text(self, unit: str = " s") -> str:
        bounds = f" [{self.low}-{self.high}]" if self.low else ""
        return f"{self.value}{unit}{bounds}"

    @property
    def number(self) -> float:
        return float(self.value.replace(",", ""))

    @property
    def interval(self) -> Interval:
        bounds = (float(self.low), float(self.high)) if self.low else (math.nan, math.nan)
        return Interval(math.nan if self.value == "n/a" else self.number, *bounds)

    def overlaps(self, other: Stat) -> bool:
        """Whether the two intervals overlap (values without an interval always do)."""
        return compare(self.interval, other.interval) == "not distinguishable"


class Outputs:
    """The text outputs of one committed notebook, in cell order."""

    def __init__(self, root: Path, path: str) -> None:
        self.path = path
        file = root / path
        if not file.is_file():
            raise SourceError(f"{path} is missing: a generated text reads its outputs")
        cells = json.loads(file.read_text(encoding="utf-8"))["cells"]
        self.texts: list[tuple[int, str]] = []
        for index, cell in enumerate(cells):
            for output in cell.get("outputs", []):
                text = _output_text(output)
                if text:
                    self.texts.append((index, text))

    def missing(self, what: str) -> SourceError:
        return SourceError(
            f"no output of {self.path} has {what}: re-run the notebook, or update "
            "analysis.report.readme_sections to its new output"
        )

    def match(self, pattern: str) -> tuple[re.Match[str], Source]:
        """The first output matching `pattern` (a regular expression, `^` at line starts)."""
        compiled = re.compile(pattern, re.MULTILINE)
        for index, text in self.texts:
            found = compiled.search(text)
            if found:
                return found, Source(self.path, index)
        raise self.missing(f"a line matching {pattern!r}")

    def table(self, *columns: str) -> tuple[list[Row], Source]:
        """The first printed table whose header names all `columns` (see `column`)."""
        for index, text in self.texts:
            rows = parse_table(text, columns)
            if rows:
                return rows, Source(self.path, index)
        raise self.missing(f"a table with columns {', '.join(columns)}")

    def series(self, *keys: str) -> tuple[Row, Source]:
        """The first printed pandas Series or one-column frame (`name  value` lines) holding all
        `keys`."""
        for index, text in self.texts:
            pairs = [line.split() for line in text.splitlines()]
            values = {p[0]: p[1] for p in pairs if len(p) == 2}
            if all(key in values for key in keys):
                return values, Source(self.path, index)
        raise self.missing(f"a series with {', '.join(keys)}")


def _output_text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    data = output.get("data", {})
    for kind in ("text/markdown", "text/plain"):
        if kind in data:
            return "".join(data[kind])
    return ""


def named(name: str, column: str) -> bool:
    """A header `name` answers to `column` when equal, or when it starts with `column` and a
    comma ("mean TTFT (s), median of 3 repeats [95 % interval]" answers to "mean TTFT (s)")."""
    return name == column or name.startswith(column + ",")


def column(row: Row, name: str) -> str:
    """The value of the column that answers to `name` (see `named`)."""
    for key, value in row.items():
        if named(key, name):
            return value
    raise SourceError(f"no column {name!r} among {list(row)}")


def has(row: Row, name: str) -> bool:
    return any(named(key, name) for key in row)


def parse_table(text: str, columns: Sequence[str]) -> list[Row]:
    """Rows of a table printed by pandas (`to_string`, right-aligned) whose header answers to
    every name in `columns`; [] if there is none. The rows end at a blank line or at the first
    line that does not fit the columns (text printed after the table)."""
    lines = text.splitlines()
    for at, line in enumerate(lines):
        if not line.strip() or not all(c in line for c in columns) or at + 1 >= len(lines):
            continue
        body = [lines[at + 1]]
        names = _names([line, *body])
        if not all(any(named(n, c) for n in names) for c in columns):
            continue
        for row in lines[at + 2 :]:
            if not row.strip() or _names([line, *body, row]) != names:
                break
            body.append(row)
        spans = _column_spans([line, *body])
        return [
            {n: row[a:b].strip() for n, (a, b) in zip(names, spans, strict=True)} for row in body
        ]
    return []


def _names(lines: list[str]) -> list[str]:
    return [lines[0][a:b].strip() for a, b in _column_spans(lines)]


def _column_spans(lines: list[str]) -> list[tuple[int, int]]:
    """Columns as (start, end) character ranges: the runs between character positions that are
    blank on every line, where a run with no header text (the left part of a wide value) or no
    value on any row (a header word over blank padding) belongs to the run on its right."""
    width = max(len(line) for line in lines)
    padded = [line.ljust(width) for line in lines]
    blank = [all(line[j] == " " for line in padded) for j in range(width)]
    runs, j = [], 0
    while j < width:
        if blank[j]:
            j += 1
            continue
        k = j
        while k < width and not blank[k]:
            k += 1
        runs.append((j, k))
        j = k
    merged, start = [], None
    for index, (a, b) in enumerate(runs):
        first = a if start is None else start
        header_empty = not padded[0][a:b].strip()
        rows_empty = all(not line[a:b].strip() for line in padded[1:])
        if (header_empty or rows_empty) and index < len(runs) - 1:
            start = first
            continue
        merged.append((first, b))
        start = None
    # Values are right-aligned: a column reaches back to the end of the one before it.
    return [
        (merged[i - 1][1] if i else 0, b if i < len(merged) - 1 else width)
        for i, (_, b) in enumerate(merged)
    ]


def statistic(row: Row, name: str) -> Stat:
    """Statistic `name` (mean_ttft, p95_ttft, mean_tpot, req_s) of a serving table's row: the
    `value [low-high]` column `readable_table` prints, else the numeric columns (`mean_ttft_s`,
    `mean_ttft_lo_s`, `mean_ttft_hi_s`; `req_s`, `req_s_lo`, `req_s_hi`)."""
    if has(row, READABLE[name]):
        printed = column(row, READABLE[name])
        found = _STAT.match(printed)
        if not found:
            raise SourceError(f"{READABLE[name]}: cannot read {printed!r}")
        value, low, high = found.groups()
        return Stat(value, low or "", high or "")
    keys = ("req_s", "req_s_lo", "req_s_hi") if name == "req_s" else (
        f"{name}_s", f"{name}_lo_s", f"{name}_hi_s"
    )  # fmt: skip
    if keys[0] not in row:
        raise SourceError(f"no column for {name} among {list(row)}")
    return Stat(row[keys[0]], row.get(keys[1], ""), row.get(keys[2], ""))


def statistic_label(row: Row, name: str) -> str:
    """What the printed statistic is, in the notebook's words where its header says it."""
    for key in row:
        if named(key, READABLE[name]) and key != READABLE[name]:
            return key[len(READABLE[name]) + 1 :].strip()
    return "95 % interval"
