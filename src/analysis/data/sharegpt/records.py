"""The tolerant record scanner: a ShareGPT file's bytes to (record, end offset) pairs, one
record at a time, through damage and truncation.

A module of its own because framing (JSON array or JSON Lines, cut-off tails, malformed spans,
exact byte counts) is independent of what a record means; the package docstring says which
bytes count as truncated, skipped or malformed.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from analysis.data.sharegpt.conversations import LoadReport
from analysis.platform.errors import ShareGPTSourceError

_SEPARATORS = re.compile(r"[\s,]*")
_SEPARATOR_CHARS = " \t\r\n,"
_NUMBER_END = re.compile(r"\.\d*|\.?\d*[eE][-+]?")  # what follows "-1" in a cut "-1.", "-1.5e-"
_ESCAPE_END = re.compile(r"u[0-9a-fA-F]{0,4}")  # the decoder points past the backslash
_RECORD_START = re.compile(r'\{\s*"(?:id|conversations|messages)"\s*:')
_JSON_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_DECODER = json.JSONDecoder(strict=False)  # raw control characters in strings are kept


def _read_bytes(path: Path) -> bytes:
    if not path.exists():
        raise ShareGPTSourceError(f"ShareGPT file not found: {path}")
    if not path.is_file():
        raise ShareGPTSourceError(f"not a file: {path}")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ShareGPTSourceError(f"cannot read {path}: {exc.strerror or exc}") from None


def _decode_utf8(data: bytes) -> str:
    """Text whose bad bytes survive as lone surrogates, so byte counts stay exact."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    return data.decode("utf-8", "surrogateescape")


def _byte_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


_MALFORMED = object()  # stands for a span of bytes that is not a JSON record


def _array_records(text: str, pos: int, report: LoadReport) -> Iterator[tuple[Any, int]]:
    """(record, end offset) for each element of a JSON array, robust to damage and truncation.

    Where an element does not decode, everything up to the next record start is one
    malformed_json record; only a '{' followed by an "id"/"conversations"/"messages" key counts
    as a record start, so that a message object inside a broken record is not taken for one.
    """
    size = len(text)
    while True:
        pos = _SEPARATORS.match(text, pos).end()
        if pos >= size:  # the array was never closed
            report.truncated = True
            return
        if text[pos] == "]":
            rest = text[pos + 1 :].strip()
            if rest:  # bytes after the closing bracket
                report.bytes_skipped += _byte_len(rest)
                yield _MALFORMED, size
            return
        try:
            record, end = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as error:
            found = _RECORD_START.search(text, pos + 1)
            if found is None:
                yield from _array_tail(text, pos, error, report)
                return
            report.bytes_skipped += _byte_len(text[pos : found.start()].rstrip(_SEPARATOR_CHARS))
            yield _MALFORMED, found.start()
            pos = found.start()
            continue
        yield record, end
        pos = end


def _array_tail(
    text: str, pos: int, error: json.JSONDecodeError, report: LoadReport
) -> Iterator[tuple[Any, int]]:
    """The end of an array that does not decode: a cut-off record, or garbage."""
    if _cut_off(text, error):
        report.truncated = True
        report.bytes_unparsed_tail = _byte_len(text[pos:])
        return
    garbage = text[pos:].rstrip()
    garbage = garbage[:-1] if garbage.endswith("]") else garbage
    report.bytes_skipped += _byte_len(garbage.rstrip(_SEPARATOR_CHARS))
    yield _MALFORMED, len(text)


def _content_end(text: str) -> int:
    """len(text.rstrip()), without copying a text of a hundred megabytes."""
    end = len(text)
    while end and text[end - 1].isspace():
        end -= 1
    return end


def _cut_off(text: str, error: json.JSONDecodeError) -> bool:
    """Whether the decoder failed only because the text ran out (a truncated record).

    The decoder reports some cuts before the end: inside a string, a number ("-1.", "2e"),
    a literal ("tru") or a \\u escape ("\\u00").
    """
    end = _content_end(text)
    if error.pos >= end or error.msg.startswith("Unterminated string"):
        return True
    rest = text[error.pos : end]
    return (
        any(literal.startswith(rest) for literal in _JSON_LITERALS)
        or _NUMBER_END.fullmatch(rest) is not None
        or (error.msg.startswith("Invalid \\u") and _ESCAPE_END.fullmatch(rest) is not None)
    )


def _jsonl_records(text: str, pos: int, report: LoadReport) -> Iterator[tuple[Any, int]]:
    """(record, end offset) for each non-blank line; a bad line is one malformed_json record."""
    size = len(text)
    while pos < size:
        newline = text.find("\n", pos)
        end = size if newline < 0 else newline
        line = text[pos:end]
        next_pos = end + 1
        if not line.strip():
            pos = next_pos
            continue
        try:
            record, used = _DECODER.raw_decode(line, len(line) - len(line.lstrip()))
            if line[used:].strip():
                raise json.JSONDecodeError("Extra data", line, used)
        except json.JSONDecodeError as error:
            if newline < 0 and error.msg != "Extra data" and _cut_off(line, error):
                report.truncated = True
                report.bytes_unparsed_tail = _byte_len(line)
                return
            report.bytes_skipped += _byte_len(line.strip())
            yield _MALFORMED, end
        else:
            yield record, end
        pos = next_pos
