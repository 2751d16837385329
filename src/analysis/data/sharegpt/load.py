"""Loading conversations: a source's file scanned record by record, every record kept or
dropped, and counted in the report.

A module of its own because it is the one step that joins the others (sources, the record
scanner, the judgement of one record) and owns the counting and the progress bar.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from analysis.data.sharegpt.conversations import (
    Conversation,
    LoadReport,
    _count_roles,
    _examine,
    _UniqueIds,
)
from analysis.data.sharegpt.records import (
    _MALFORMED,
    _SEPARATORS,
    _array_records,
    _decode_utf8,
    _jsonl_records,
    _read_bytes,
)
from analysis.data.sharegpt.sources import resolve_source
from analysis.platform.errors import ShareGPTSourceError
from analysis.platform.manifest import gc_paused

_PROGRESS_EVERY = 512  # records between progress bar updates


def load_conversations(
    source: str = "package",
    path: str | Path | None = None,
    max_conversations: int | None = None,
    progress: bool = True,
    *,
    repair: bool = True,
) -> tuple[list[Conversation], LoadReport]:
    """Conversations in file order, and the report that accounts for every record read."""
    if max_conversations is not None and max_conversations < 0:
        raise ValueError(f"max_conversations must be >= 0, got {max_conversations}")
    file_path = resolve_source(source, path)
    started = time.perf_counter()
    data = _read_bytes(file_path)
    report = LoadReport(source=source, path=str(file_path), bytes_read=len(data))
    text = _decode_utf8(data)
    del data
    with gc_paused():
        conversations = _collect(text, file_path, report, max_conversations, progress, repair)
    report.seconds = round(time.perf_counter() - started, 3)
    if not conversations and max_conversations != 0:
        raise ShareGPTSourceError(_nothing_usable(file_path, report))
    return conversations, report


def _nothing_usable(path: Path, report: LoadReport) -> str:
    """One line for a file that yields no conversation: what was read and why it was dropped."""
    reasons = ", ".join(f"{r} {n:,}" for r, n in sorted(report.dropped.items())) or "none"
    return (
        f"{path}: no usable conversation: {report.records_seen:,} records read, "
        f"{report.records_dropped:,} dropped ({reasons}); give a ShareGPT file with at least "
        "one conversation that starts with a user message"
    )


def _collect(
    text: str,
    path: Path,
    report: LoadReport,
    max_conversations: int | None,
    progress: bool,
    repair: bool,
) -> list[Conversation]:
    start = _SEPARATORS.match(text).end() if text else 0
    if start >= len(text):
        raise ShareGPTSourceError(f"ShareGPT file is empty: {path}")
    if text[start] == "[":
        records = _array_records(text, start + 1, report)
    elif text[start] == "{":
        report.format = "jsonl"
        records = _jsonl_records(text, start, report)
    else:
        raise ShareGPTSourceError(
            f"{path} is not JSON: it starts with {text[start : start + 20]!r}; "
            "expected a JSON array of records or JSON Lines"
        )
    from tqdm import tqdm

    conversations: list[Conversation] = []
    ids = _UniqueIds()
    dropped: Counter[str] = Counter()
    repairs: Counter[str] = Counter()
    roles: Counter[str] = Counter()
    with tqdm(
        total=len(text),
        unit="char",
        unit_scale=True,
        desc="ShareGPT",
        disable=None if progress else True,
    ) as bar:
        for record, end in records:
            if max_conversations is not None and len(conversations) >= max_conversations:
                report.stopped_at_limit = True
                break
            ordinal = report.records_seen
            report.records_seen += 1
            if ordinal % _PROGRESS_EVERY == 0:
                bar.update(end - bar.n)
            if record is _MALFORMED:
                dropped["malformed_json"] += 1
                continue
            _count_roles(record, roles)
            outcome = _examine(record, ordinal, repair)
            if isinstance(outcome, str):
                dropped[outcome] += 1
                continue
            conversation = outcome.build(ids)
            conversations.append(conversation)
            report.messages_kept += len(conversation.messages)
            if outcome.fixes:
                repairs.update(outcome.fixes)
                report.conversations_repaired += 1
        if not report.stopped_at_limit:
            bar.update(bar.total - bar.n)
    if report.stopped_at_limit:  # the rest was not read: say nothing about it
        report.truncated, report.bytes_unparsed_tail = False, 0
    report.conversations_kept = len(conversations)
    report.dropped = dict(sorted(dropped.items()))
    report.repairs = dict(sorted(repairs.items()))
    report.roles = dict(sorted(roles.items(), key=lambda kv: (-kv[1], kv[0])))
    return conversations
