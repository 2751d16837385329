"""Block-hash production traces: import them, and turn them into token traces an engine can run.

Format (JSON Lines, one request per line): `hash_ids` (one id per `block_size` tokens of the
prompt; equal ids at equal positions mean equal prefixes), `input_length`, `output_length`,
`timestamp`, and optionally `chat_id`, `parent_chat_id`, `turn`, `type`. Public traces in this
format: Mooncake (FAST'25; 512-token blocks, timestamps in milliseconds) and the Qwen/Bailian
traces of "KVCache Cache in the Wild" (ATC'25; 16-token blocks, timestamps in seconds, chats
linked by `parent_chat_id`, -1 for a first turn).

Bad lines are skipped, counted by reason and reported; they never stop an import.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.platform.errors import BlockHashError

BLOCKHASH_SUFFIXES = (".jsonl", ".json", ".gz")  # plain or gzipped JSON Lines
REQUIRED_FIELDS = ("hash_ids", "input_length", "output_length", "timestamp")
OPTIONAL_INT_FIELDS = ("chat_id", "parent_chat_id", "turn")
TIMESTAMP_UNITS = ("auto", "s", "ms")
TOKEN_LIMIT = 128_000  # synthetic token ids stay below Llama 3's special tokens
HASH_ID_LIMIT = 2**62
LENGTH_LIMIT = 2**53  # tokens, far beyond any context; keeps int64 sums of a few lengths exact
MAX_EXAMPLES = 5


@dataclass
class ImportReport:
    """What an import kept, skipped and assumed."""

    path: str
    block_size: int
    lines: int = 0  # non-blank lines read
    records: int = 0  # requests kept
    malformed: int = 0  # lines skipped
    reasons: dict[str, int] = field(default_factory=dict)  # why lines were skipped
    examples: list[str] = field(default_factory=list)  # the first few skipped lines, "line N: why"
    short_hash_ids: int = 0  # fewer ids than full blocks: the rest count as unshared blocks
    long_hash_ids: int = 0  # more ids than ceil(input_length / block_size): extra ids ignored
    orphan_turns: int = 0  # parent_chat_id not in the file: taken as a first turn
    repeated_chat_ids: int = 0
    timestamp_unit: str = "s"
    reordered: bool = False  # lines were not in arrival order and were sorted by timestamp

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        text = (
            f"{self.path}: {self.records} requests from {self.lines} lines "
            f"({self.malformed} malformed skipped), block size {self.block_size}, "
            f"timestamps in {self.timestamp_unit}"
        )
        notes = []
        if self.reasons:
            notes.append("skipped: " + ", ".join(f"{k} {v}" for k, v in self.reasons.items()))
        if self.short_hash_ids or self.long_hash_ids:
            notes.append(
                f"hash_ids length differs from ceil(input_length / {self.block_size}): "
                f"{self.short_hash_ids} shorter, {self.long_hash_ids} longer"
            )
        if self.orphan_turns:
            notes.append(f"{self.orphan_turns} turns whose parent chat is not in the file")
        if self.repeated_chat_ids:
            notes.append(f"{self.repeated_chat_ids} repeated chat_id values")
        if self.reordered:
            notes.append("lines sorted by timestamp")
        return "; ".join([text, *notes])


def load_blockhash_trace(
    path: str | Path, block_size: int, *, timestamp_unit: str = "auto"
) -> tuple[pd.DataFrame, ImportReport]:
    """Read a block-hash JSONL trace (plain or .gz) into one row per request, in arrival order.

    Columns: hash_ids (int64 arrays), input_length, output_length, timestamp (seconds, as in the
    file), conversation_id, turn_index (0 for a first turn; the depth in the parent_chat_id
    chain), line (1-based line in the file), and chat_id, parent_chat_id, turn, type when the
    file has them. `frame.attrs["block_size"]` keeps the block size. `timestamp_unit="auto"`
    reads integer timestamps without chat ids as milliseconds (Mooncake), others as seconds.
    """
    if block_size < 1:
        raise BlockHashError(f"block size must be >= 1, got {block_size}")
    if timestamp_unit not in TIMESTAMP_UNITS:
        raise BlockHashError(f"timestamp unit must be one of {', '.join(TIMESTAMP_UNITS)}")
    path = Path(path)
    if not path.is_file():
        raise BlockHashError(f"no block-hash trace at {path}")
    report = ImportReport(path=str(path), block_size=block_size)
    reasons: Counter[str] = Counter()
    try:
        rows = _read_records(path, report, reasons)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise BlockHashError(
            f"{path} is not a readable gzip file ({exc}): give the plain .jsonl, or a complete .gz"
        ) from None
    report.malformed = sum(reasons.values())
    report.reasons = dict(reasons.most_common())
    if not rows:
        detail = f" ({report.examples[0]})" if report.examples else ""
        raise BlockHashError(f"no valid request in {path}: {report.lines} lines read{detail}")
    frame = _to_frame(rows, block_size, timestamp_unit, report)
    report.records = len(frame)
    return frame, report


def _read_records(path: Path, report: ImportReport, reasons: Counter[str]) -> list[dict[str, Any]]:
    """The usable records of a plain or gzipped file; bad lines are counted in `reasons`."""
    rows: list[dict[str, Any]] = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            report.lines += 1
            record, problem = _parse_line(line)
            if problem is not None:
                reasons[problem] += 1
                if len(report.examples) < MAX_EXAMPLES:
                    report.examples.append(f"line {number}: {problem}")
                continue
            record["line"] = number
            rows.append(record)
    return rows


def _parse_line(line: str) -> tuple[dict[str, Any], str | None]:
    """One record, or the reason it cannot be used."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return {}, "invalid JSON"
    if not isinstance(obj, dict):
        return {}, "not a JSON object"
    for name in REQUIRED_FIELDS:
        if name not in obj:
            return {}, f"missing {name}"
    hashes = obj["hash_ids"]
    if not isinstance(hashes, list) or not all(_is_int(h) for h in hashes):
        return {}, "hash_ids is not a list of integers"
    if any(abs(h) >= HASH_ID_LIMIT for h in hashes):
        return {}, "hash id out of range"
    if not _is_int(obj["input_length"]) or obj["input_length"] < 1:
        return {}, "input_length is not a positive integer"
    if not _is_int(obj["output_length"]) or obj["output_length"] < 0:
        return {}, "output_length is not a non-negative integer"
    if max(obj["input_length"], obj["output_length"]) >= LENGTH_LIMIT:
        return {}, "length out of range"
    stamp = obj["timestamp"]
    if not _is_number(stamp) or not math.isfinite(stamp):
        return {}, "timestamp is not a number"
    record: dict[str, Any] = {
        "hash_ids": np.asarray(hashes, dtype=np.int64),
        "input_length": int(obj["input_length"]),
        "output_length": int(obj["output_length"]),
        "timestamp": stamp,
    }
    for name in OPTIONAL_INT_FIELDS:
        value = obj.get(name)
        if value is not None:
            if not _is_int(value):
                return {}, f"{name} is not an integer"
            record[name] = int(value)
    if obj.get("type") is not None:
        record["type"] = str(obj["type"])
    return record, None


def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and value.is_integer()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _to_frame(
    rows: list[dict[str, Any]], block_size: int, timestamp_unit: str, report: ImportReport
) -> pd.DataFrame:
    has_chats = any("chat_id" in row for row in rows)
    stamps = np.array([float(row["timestamp"]) for row in rows])
    if timestamp_unit == "auto":
        integral = all(not isinstance(row["timestamp"], float) for row in rows)
        timestamp_unit = "ms" if integral and not has_chats else "s"
    report.timestamp_unit = timestamp_unit
    scale = 1e-3 if timestamp_unit == "ms" else 1.0
    frame = pd.DataFrame(
        {
            "hash_ids": pd.Series([row["hash_ids"] for row in rows], dtype=object),
            "input_length": np.array([row["input_length"] for row in rows], np.int64),
            "output_length": np.array([row["output_length"] for row in rows], np.int64),
            "timestamp": stamps * scale,
            "line": np.array([row["line"] for row in rows], np.int64),
        }
    )
    for name in OPTIONAL_INT_FIELDS:
        if any(name in row for row in rows):
            frame[name] = pd.array([row.get(name) for row in rows], dtype="Int64")
    if any("type" in row for row in rows):
        frame["type"] = pd.array([row.get("type") for row in rows], dtype="string")
    if np.any(np.diff(stamps) < 0):
        frame = frame.sort_values("timestamp", kind="stable").reset_index(drop=True)
        report.reordered = True
    expected = -(-frame["input_length"].to_numpy() // block_size)
    lengths = frame["hash_ids"].map(len).to_numpy()
    report.short_hash_ids = int((lengths < frame["input_length"].to_numpy() // block_size).sum())
    report.long_hash_ids = int((lengths > expected).sum())
    conversation, turn = _conversations(frame, report)
    frame["conversation_id"] = conversation
    frame["turn_index"] = turn
    frame.attrs["block_size"] = block_size
    return frame


def _conversations(frame: pd.DataFrame, report: ImportReport) -> tuple[list[str], np.ndarray]:
    """Conversation (root chat id) and turn (depth) of every row, following parent_chat_id."""
    count = len(frame)
    if "chat_id" not in frame.columns:
        return [str(i) for i in range(count)], np.zeros(count, np.int64)
    chats = frame["chat_id"].tolist()
    parents = (
        frame["parent_chat_id"].tolist() if "parent_chat_id" in frame.columns else [None] * count
    )
    row_of: dict[int, int] = {}
    for row, chat in enumerate(chats):
        if chat is pd.NA or chat is None:
            continue
        if chat in row_of:
            report.repeated_chat_ids += 1
        else:
            row_of[chat] = row
    root = list(range(count))
    depth = np.zeros(count, np.int64)
    for row in range(count):  # parents arrive earlier, so their roots are already known
        parent = parents[row]
        if parent is pd.NA or parent is None or parent < 0:
            continue
        parent_row = row_of.get(parent)
        if parent_row is None or parent_row >= row:
            report.orphan_turns += 1
            continue
        root[row] = root[parent_row]
        depth[row] = depth[parent_row] + 1
    names = []
    for row in range(count):
        chat = chats[root[row]]
        names.append(str(chat) if chat is not pd.NA and chat is not None else f"row{root[row]}")
    return names, depth


def blockhash_to_trace(frame: pd.DataFrame, block_size: int | None = None) -> pd.DataFrame:
    """A token trace (schemas.md columns) that any engine can replay.

    Block j of a prompt is a fixed function of its hash id, so equal ids at the same chained
    position give equal token blocks and different ids never collide (the id's digits in base
    TOKEN_LIMIT open the block). Whatever follows the last id-covered full block (a partial
    last block, blocks without an id, the reply of `output_length` tokens) is drawn from a
    stream unique to the request, so it can never match another request: vLLM never caches a
    partial block, so nothing that could be shared is lost.
    """
    block_size = int(block_size or frame.attrs.get("block_size") or 0)
    if block_size < 1:
        raise BlockHashError("blockhash_to_trace needs the trace's block size")
    hash_lists = [np.asarray(h, dtype=np.int64) for h in frame["hash_ids"]]
    prompts_n = frame["input_length"].to_numpy(np.int64)
    replies_m = frame["output_length"].to_numpy(np.int64)
    distinct = np.unique(np.concatenate(hash_lists)) if hash_lists else np.zeros(0, np.int64)
    count = len(frame)
    largest = distinct.shape[0] + count  # dense ids, then one stream id per request
    digits = 1
    while TOKEN_LIMIT**digits < largest:
        digits += 1
    if digits > block_size:
        raise BlockHashError(
            f"block size {block_size} is too small to give {largest} distinct token blocks "
            f"below id {TOKEN_LIMIT}: use a larger block size"
        )
    prompts: list[np.ndarray] = []
    replies: list[np.ndarray] = []
    for r in range(count):
        n, m = int(prompts_n[r]), int(replies_m[r])
        known = min(hash_lists[r].shape[0], n // block_size)
        dense = np.searchsorted(distinct, hash_lists[r][:known])
        shared = _blocks(dense, block_size, digits).ravel()
        tail_length = n - known * block_size + m
        tail_blocks = -(-tail_length // block_size)
        stream = np.full(tail_blocks, distinct.shape[0] + r, np.int64)
        tail = _blocks(stream, block_size, digits, salt=np.arange(tail_blocks)).ravel()
        tail = tail[:tail_length]
        prompts.append(np.concatenate([shared, tail[: n - known * block_size]]))
        replies.append(tail[n - known * block_size :].copy())
    conversation = frame["conversation_id"].astype(str).tolist()
    turn = frame["turn_index"].to_numpy(np.int32)
    stamps = frame["timestamp"].to_numpy(np.float64)
    return pd.DataFrame(
        {
            "request_id": _unique_request_ids(conversation, turn),
            "conversation_id": conversation,
            "turn_index": turn,
            "prompt_ids": pd.Series(prompts, dtype=object),
            "response_ids": pd.Series(replies, dtype=object),
            "prompt_tokens": prompts_n.astype(np.int32),
            "response_tokens": replies_m.astype(np.int32),
            "timestamp": stamps - (stamps[0] if count else 0.0),
        }
    )


def _blocks(
    ids: np.ndarray, block_size: int, digits: int, salt: np.ndarray | None = None
) -> np.ndarray:
    """One row of `block_size` token ids per id: its base-TOKEN_LIMIT digits, then filler."""
    out = np.empty((ids.shape[0], block_size), np.int64)
    value = ids.copy()
    for d in range(digits):
        out[:, d] = value % TOKEN_LIMIT
        value //= TOKEN_LIMIT
    if block_size > digits:
        mix = ids if salt is None else ids * 1_000_003 + salt
        position = np.arange(digits, block_size, dtype=np.int64)
        out[:, digits:] = (mix[:, None] * 2_654_435_761 + position * 40_503 + 7) % TOKEN_LIMIT
    return out.astype(np.int32)


def _unique_request_ids(conversations: list[str], turns: np.ndarray) -> list[str]:
    """`<conversation>/<turn>`, with `#2`, `#3`... on repeats (a conversation that branches)."""
    seen: Counter[str] = Counter()
    ids = []
    for conversation, turn in zip(conversations, turns.tolist(), strict=True):
        base = f"{conversation}/{turn}"
        seen[base] += 1
        ids.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return ids


def is_blockhash_path(path: str | Path) -> bool:
    """Whether `path` names a block-hash trace (JSON Lines, plain or gzipped), not a token one."""
    return Path(path).suffix.lower() in BLOCKHASH_SUFFIXES


def token_trace_file(path: str | Path, frame: pd.DataFrame, limit: int | None = None) -> Path:
    """The token trace of block-hash file `path`, whose `frame` `load_blockhash_trace` read
    (its first `limit` conversations, or all), written once under data/cache/blockhash/ by the
    file's content, block size and limit: runs, grids and plans then replay it as any .parquet
    trace, and its config ids follow the content. A limit keeps the file small: production
    prompts are long (Mooncake's whole trace is about 145 M tokens)."""
    from analysis.data.traces import limit_trace, write_trace
    from analysis.platform.manifest import file_sha256
    from analysis.platform.paths import cache_dir

    path = Path(path)
    block_size = int(frame.attrs["block_size"])
    label = path.name.split(".")[0]
    part = "" if limit is None else f"-first{int(limit)}"
    name = f"{label}-b{block_size}-{file_sha256(path)[:12]}{part}.parquet"
    out = cache_dir() / "blockhash" / name
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        write_trace(out, blockhash_to_trace(limit_trace(frame, limit), block_size))
    return out
