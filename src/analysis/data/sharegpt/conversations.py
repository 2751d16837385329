"""One ShareGPT record judged: kept as a Conversation (repaired if need be) or dropped for
one reason; and the LoadReport that counts every outcome.

A module of its own because the rules for one record (roles, drop reasons, repairs: see the
package docstring) do not depend on how the file around it is framed or where it came from.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

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
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


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
