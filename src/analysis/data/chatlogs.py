"""Conversations from chat request logs (OpenAI chat completions) and chat data sets on the hub.

ShareGPT stores whole conversations; production traffic is logged request by request. This
module turns such a log back into the `Conversation` objects that `analysis.data.sharegpt`
yields, so that the trace builder builds both traces from either, unchanged.

Input (`load_chat_log`, the trace command's ``--source openai-jsonl --path LOG``): JSON Lines,
one chat-completions request per line::

    {"messages": [{"role": ..., "content": ...}, ...], "timestamp": 12.5, "conversation_id": ...}

or the OpenAI batch-file shape, the request under "body"::

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": ...}}

Conversation key: the first of ``conversation_id``, ``session_id``, ``chat_id`` found on the line,
then in its "body", then in the "metadata" object of either (a string or an integer; anything else
is ignored and counted as the repair ``key_unusable``). Timestamp: a number under "timestamp" on
the line or in its body (anything else is counted as ``timestamp_unusable`` and ignored).

Rebuilding conversations. Requests are grouped by key (all requests without a key form one group
of their own; a keyed and an unkeyed request never join). A group is ordered by timestamp when
every request in it has one (ties keep file order), else by file order. Within a group, request B
continues the conversation whose latest request A it extends: B has the same system prompt and
B's messages start with all of A's messages (compared after the message rules below). The
assistant message right after A's messages in B is A's reply (a recorded reply of A that differs
from it is counted in ``recorded_replies_differing``; the one in B is kept: it is what the engine
saw). When B extends several conversations' latest requests, the longest one wins. A request that
continues nobody starts a conversation. B may extend A by more than one turn: the turns in
between, like the history of a conversation whose first request was not logged (or that forks off
an earlier point of another), become requests of the trace without a request of their own in the
log; they are counted in ``turns_not_logged``. A request whose messages and system prompt equal
the latest request of a conversation in its group (a retry) is dropped as ``repeated_request``
(its recorded reply, if the first had none, is kept). Without keys, two users who open with the
same words cannot be told apart: the second is such a repeat.

The final request of a conversation has no reply in the log's later requests. Its reply is the
response the line records, when it carries one: a string under "response", or the first choice's
``message.content`` of a chat-completion object under "response" (or under "response"/"body",
as in OpenAI batch output) or of the line itself ("choices"). Otherwise the turn is kept with an
empty reply (the trace's response is empty) and counted in ``final_replies_missing``.

Message rules (each change is counted per request used, so a message that every later request of
a conversation repeats is counted in each of them; a dropped request's changes are not counted,
but the roles of every message read are, as written, in ``roles``):

- roles, matched without regard to case or spaces: user, assistant, system, and developer (the
  system prompt of OpenAI's newer models). All system messages form the system prompt, joined by
  a blank line (``system_joined``; one after the first turn: ``system_moved_to_front``).
- tool and function messages are dropped (``tool_message_dropped``); an assistant message's
  ``tool_calls`` / ``function_call`` are dropped (``tool_calls_dropped``, once per message), and
  the message with them when it has no text.
- a message under any other role is dropped (``unknown_role_dropped``), the request is kept.
- content: a string; or a list of OpenAI content parts, whose "text" parts are joined by a
  newline (as vLLM does) and whose other parts are dropped and counted (``image_url_part_dropped``,
  ``input_audio_part_dropped``, ``other_part_dropped`` for any other part); null is empty.
- an empty or whitespace-only message is dropped (``empty_message_dropped``).
- assistant messages before the first user message are dropped (``leading_assistant_dropped``):
  a request must start with a user message after the system prompt.
- messages of the same role in a row are joined by a blank line (``same_role_merged``).
- lone surrogates and bytes that are not UTF-8 become U+FFFD (``invalid_unicode_replaced``,
  ``invalid_utf8_replaced``). Texts are never stripped.

Request drop reasons (every line read is used or dropped for exactly one, so
``records_seen == records_used + sum(dropped.values())``; blank lines are not records):
``malformed_json``, ``not_an_object``, ``missing_messages`` (no "messages" on the line or in its
"body"), ``messages_not_a_list``, ``no_messages`` (an empty list), ``malformed_message`` (a message
that is not an object), ``non_text_content`` (content that is neither a string, a list of parts
nor null: dropping only that message would splice a dialogue that never happened),
``no_user_message``, ``not_ending_with_user`` (after the rules above the last message is not the
user's: nothing to answer), ``repeated_request``, ``line_too_long`` (a line over
`MAX_LINE_BYTES`, 16 MiB: millions of tokens, far beyond any context window, and tokenizing it
would take gigabytes before the trace builder left it out).

Conversation ids: the key; without one, the first request's "custom_id" (or "id"), else
``line-<n>`` (1-based line number); made unique as ShareGPT's ("X", "X#2": a key whose requests
form several conversations). Conversations come out in the order of their first request's line.

Hub data sets (`load_hf_conversations`): a `datasets` data set with a column of OpenAI-style
message lists, one whole conversation per row (LMSYS-Chat-1M's and WildChat's "conversation"),
read with the same message rules; needs a network and says so in one line when offline.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from analysis.data.sharegpt.conversations import (
    TURN_JOINER,
    Conversation,
    Message,
    _UniqueIds,
    _valid_unicode,
)
from analysis.platform.errors import AnalysisError

SOURCE = "openai-jsonl"
CONVERSATION_KEYS = ("conversation_id", "session_id", "chat_id")
ROLES: dict[str, str] = {
    "user": "user",
    "assistant": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}
PART_JOINER = "\n"  # vLLM joins the text parts of one message with a newline
MEDIA_PARTS = ("image_url", "input_audio")
HF_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
HF_ENDPOINT = "https://huggingface.co"
MAX_LINE_BYTES = 16 * 2**20  # a longer request line is dropped unread, counted (line_too_long)


class ChatLogError(AnalysisError):
    """A chat log or hub data set that cannot be read, or that yields no usable conversation."""


@dataclass
class ChatLogReport:
    """What was read, used, dropped and repaired, and how requests became conversations."""

    source: str  # "openai-jsonl" | "hf:<name>"
    path: str  # the log file, or "<name>:<split>:<column>"
    format: str = "openai_jsonl"  # "openai_jsonl" | "hf_dataset"
    bytes_read: int = 0
    blank_lines: int = 0
    records_seen: int = 0  # lines (or rows) that are not blank
    records_used: int = 0  # each became a turn, or a whole conversation (hub rows)
    dropped: dict[str, int] = field(default_factory=dict)
    repairs: dict[str, int] = field(default_factory=dict)
    records_repaired: int = 0
    batch_shaped: int = 0  # lines with the request under "body"
    keys: dict[str, int] = field(default_factory=dict)  # key name -> lines that used it
    groups_by_timestamp: int = 0
    groups_by_file_order: int = 0
    conversations_kept: int = 0
    messages_kept: int = 0
    replies_from_next_request: int = 0
    recorded_replies_differing: int = 0
    turns_not_logged: int = 0
    final_replies_recorded: int = 0
    final_replies_missing: int = 0
    roles: dict[str, int] = field(default_factory=dict)  # roles as written, every message read
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
        rows += [("kept", "records", self.records_used)]
        rows += [("dropped", reason, n) for reason, n in sorted(self.dropped.items())]
        rows += [("repaired", reason, n) for reason, n in sorted(self.repairs.items())]
        return pd.DataFrame(rows, columns=["outcome", "reason", "count"])

    def summary(self) -> str:
        """One line, deterministic (no timings), for logs and notebook outputs."""
        dropped = ", ".join(f"{r} {n:,}" for r, n in sorted(self.dropped.items())) or "none"
        unit = "rows" if self.format == "hf_dataset" else "requests"
        return (
            f"chat log ({self.source}): {self.conversations_kept:,} conversations from "
            f"{self.records_used:,} of {self.records_seen:,} {unit}; dropped "
            f"{self.records_dropped:,} ({dropped}); {sum(self.repairs.values()):,} repairs in "
            f"{self.records_repaired:,} {unit}; {self.turns_not_logged:,} turns only in history; "
            f"final replies {self.final_replies_recorded:,} recorded, "
            f"{self.final_replies_missing:,} missing"
        )


@dataclass
class _Request:
    """One usable line: its messages after the message rules, and where it belongs."""

    line: int  # 1-based
    name: str | None  # "custom_id" or "id"
    key: str | None
    timestamp: float | None
    system: str | None
    messages: tuple[Message, ...]  # alternating, starting and ending with user
    reply: str | None  # the recorded response, if the line carries one
    fixes: Counter[str]


@dataclass
class _Chain:
    """A conversation being rebuilt: its latest request so far."""

    base_id: str
    first_line: int
    system: str | None
    messages: tuple[Message, ...]
    reply: str | None
    requests: int = 1


# ----------------------------------------------------------------------------- messages


def _content_text(content: Any, fixes: Counter[str]) -> str | None:
    """The text of one message's content; None when the content is not text at all."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts: list[str] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in MEDIA_PARTS:
            fixes[f"{kind}_part_dropped"] += 1
        else:
            fixes["other_part_dropped"] += 1
    return PART_JOINER.join(texts)


def _has_tool_calls(message: dict) -> bool:
    return bool(message.get("tool_calls") or message.get("function_call"))


def _normalise(
    raw_messages: list, fixes: Counter[str], roles: Counter[str]
) -> tuple[str | None, tuple[Message, ...]] | str:
    """(system prompt, alternating messages starting with user), or the request's drop reason."""
    if not raw_messages:
        return "no_messages"
    system_parts: list[str] = []
    turns: list[tuple[str, list[str]]] = []
    for message in raw_messages:
        if not isinstance(message, dict):
            return "malformed_message"
        raw_role = message.get("role")
        roles[raw_role if isinstance(raw_role, str) else f"<{type(raw_role).__name__}>"] += 1
        role = ROLES.get(raw_role.strip().lower()) if isinstance(raw_role, str) else None
        if role is None:
            fixes["unknown_role_dropped"] += 1
            continue
        if role == "tool":
            fixes["tool_message_dropped"] += 1
            continue
        calls = role == "assistant" and _has_tool_calls(message)
        if calls:
            fixes["tool_calls_dropped"] += 1
        text = _content_text(message.get("content"), fixes)
        if text is None:
            return "non_text_content"
        if not text or text.isspace():
            if not calls:
                fixes["empty_message_dropped"] += 1
            continue
        text = _valid_unicode(text, fixes)
        if role == "system":
            if turns:
                fixes["system_moved_to_front"] += 1
            if system_parts:
                fixes["system_joined"] += 1
            system_parts.append(text)
        elif not turns and role == "assistant":
            fixes["leading_assistant_dropped"] += 1
        elif turns and turns[-1][0] == role:
            fixes["same_role_merged"] += 1
            turns[-1][1].append(text)
        else:
            turns.append((role, [text]))
    if not turns:
        return "no_user_message"
    system = TURN_JOINER.join(system_parts) if system_parts else None
    return system, tuple(Message(role, TURN_JOINER.join(parts)) for role, parts in turns)


# ----------------------------------------------------------------------------- one line


def _request_object(record: dict) -> tuple[dict | None, bool]:
    """The object that holds "messages" (the line, or its batch "body"), and whether batch."""
    if "messages" in record:
        return record, False
    body = record.get("body")
    if isinstance(body, dict) and "messages" in body:
        return body, True
    return None, False


def _places(record: dict, request: dict) -> list[dict]:
    """Where a key may sit: the line, its body, then the "metadata" object of either."""
    places = [record] if request is record else [record, request]
    for place in list(places):
        metadata = place.get("metadata")
        if isinstance(metadata, dict):
            places.append(metadata)
    return places


def _conversation_key(record: dict, request: dict, fixes: Counter[str]) -> tuple[str, str] | None:
    """(key name, value) of the first conversation key found, or None."""
    for place in _places(record, request):
        for name in CONVERSATION_KEYS:
            value = place.get(name)
            if value is None:
                continue
            if isinstance(value, int) and not isinstance(value, bool):
                return name, str(value)
            if isinstance(value, str) and value.strip():
                return name, _valid_unicode(value, fixes)
            fixes["key_unusable"] += 1
    return None


def _timestamp(record: dict, request: dict, fixes: Counter[str]) -> float | None:
    value = record.get("timestamp", request.get("timestamp"))
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    fixes["timestamp_unusable"] += 1
    return None


def _completion_text(value: Any, fixes: Counter[str]) -> str | None:
    """The reply a logged response holds: a string, or a chat completion's first choice."""
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("body"), dict):  # OpenAI batch output: response.body
        value = value["body"]
    choices = value.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return None
    return _content_text(message.get("content"), fixes)


def _recorded_reply(record: dict, fixes: Counter[str]) -> str | None:
    """The line's recorded response ("response", or the line's own "choices"), if any."""
    reply = _completion_text(record.get("response"), fixes)
    if reply is None and "choices" in record:
        reply = _completion_text(record, fixes)
    if reply is None or not reply or reply.isspace():
        return None
    return _valid_unicode(reply, fixes)


def _request_name(record: dict) -> str | None:
    for name in ("custom_id", "id"):
        value = record.get(name)
        if isinstance(value, str) and value.strip():
            return value
    return None


def _parse_record(
    record: Any, line: int, fixes: Counter[str], report: ChatLogReport, roles: Counter[str]
) -> _Request | str:
    """The usable request of one decoded line, or the reason it is dropped."""
    if not isinstance(record, dict):
        return "not_an_object"
    request, batch = _request_object(record)
    if request is None:
        return "missing_messages"
    if not isinstance(request["messages"], list):
        return "messages_not_a_list"
    normalised = _normalise(request["messages"], fixes, roles)
    if isinstance(normalised, str):
        return normalised
    system, messages = normalised
    if messages[-1].role != "user":
        return "not_ending_with_user"
    report.batch_shaped += batch
    key = _conversation_key(record, request, fixes)
    if key is not None:
        report.keys[key[0]] = report.keys.get(key[0], 0) + 1
    return _Request(
        line=line,
        name=_request_name(record),
        key=None if key is None else key[1],
        timestamp=_timestamp(record, request, fixes),
        system=system,
        messages=messages,
        reply=_recorded_reply(record, fixes),
        fixes=fixes,
    )


def _decode_line(raw: bytes, fixes: Counter[str]) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        fixes["invalid_utf8_replaced"] += 1
        return raw.decode("utf-8", errors="replace")


def _parse_line(
    raw: bytes, line: int, report: ChatLogReport, roles: Counter[str]
) -> _Request | str:
    """One line of the log: a usable request, or the reason it is dropped."""
    fixes: Counter[str] = Counter()
    text = _decode_line(raw, fixes)
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return "malformed_json"
    return _parse_record(record, line, fixes, report, roles)


# ----------------------------------------------------------------------------- rebuilding


def _group_by_key(requests: Iterable[_Request]) -> list[list[_Request]]:
    """Requests by key, groups in the order of their first line; unkeyed ones form one group."""
    groups: dict[tuple[bool, str | None], list[_Request]] = {}
    for request in requests:
        groups.setdefault((request.key is None, request.key), []).append(request)
    return list(groups.values())


def _in_order(group: list[_Request], report: ChatLogReport) -> list[_Request]:
    """By timestamp when every request of the group has one (stable), else file order."""
    if all(request.timestamp is not None for request in group):
        report.groups_by_timestamp += 1
        return sorted(group, key=lambda request: request.timestamp)
    report.groups_by_file_order += 1
    return group


def _extended_chain(request: _Request, latest: dict[tuple, _Chain]) -> tuple[_Chain | None, int]:
    """The conversation whose latest request this one extends (longest first), and that
    request's message count. Messages alternate and end with user, so the message right after
    a shorter user-ending prefix is always an assistant reply."""
    messages = request.messages
    for length in range(len(messages) - 2, 0, -2):
        chain = latest.get((request.system, messages[:length]))
        if chain is not None:
            return chain, length
    return None, 0


def _use(request: _Request, report: ChatLogReport, repairs: Counter[str]) -> None:
    report.records_used += 1
    if request.fixes:
        repairs.update(request.fixes)
        report.records_repaired += 1


def _rebuild_group(
    group: list[_Request],
    report: ChatLogReport,
    dropped: Counter[str],
    repairs: Counter[str],
) -> list[_Chain]:
    """The conversations of one group, each request continuing one or starting one."""
    chains: list[_Chain] = []
    latest: dict[tuple, _Chain] = {}  # (system, messages) of each chain's latest request
    for request in _in_order(group, report):
        own = (request.system, request.messages)
        repeated = latest.get(own)
        if repeated is not None:
            dropped["repeated_request"] += 1
            repeated.reply = repeated.reply or request.reply
            continue
        chain, length = _extended_chain(request, latest)
        if chain is None:
            chain = _Chain(
                base_id=request.key or request.name or f"line-{request.line}",
                first_line=request.line,
                system=request.system,
                messages=request.messages,
                reply=request.reply,
            )
            chains.append(chain)
        else:
            del latest[(chain.system, chain.messages)]
            if chain.reply is not None and chain.reply != request.messages[length].text:
                report.recorded_replies_differing += 1
            report.replies_from_next_request += 1
            chain.messages, chain.reply = request.messages, request.reply
            chain.requests += 1
        latest[own] = chain
        _use(request, report, repairs)
    return chains


def _conversation(chain: _Chain, conversation_id: str, report: ChatLogReport) -> Conversation:
    """The chain's latest request, answered by its recorded reply when the log has one."""
    messages = chain.messages
    if chain.reply is not None:
        messages += (Message("assistant", chain.reply),)
        report.final_replies_recorded += 1
    else:
        report.final_replies_missing += 1
    user_turns = sum(1 for message in chain.messages if message.role == "user")
    report.turns_not_logged += user_turns - chain.requests
    report.messages_kept += len(messages)
    return Conversation(id=conversation_id, messages=messages, system=chain.system)


def _rebuild_conversations(
    requests: Sequence[_Request], report: ChatLogReport, dropped: Counter[str]
) -> list[Conversation]:
    """Conversations from usable requests (see the module docstring), in first-line order."""
    repairs: Counter[str] = Counter(report.repairs)
    chains: list[_Chain] = []
    for group in _group_by_key(requests):
        chains += _rebuild_group(group, report, dropped, repairs)
    chains.sort(key=lambda chain: chain.first_line)
    ids = _UniqueIds()
    conversations = []
    for chain in chains:
        conversation_id = ids.claim(chain.base_id)
        if conversation_id != chain.base_id:
            repairs["duplicate_id_renamed"] += 1
        conversations.append(_conversation(chain, conversation_id, report))
    report.repairs = dict(sorted(repairs.items()))
    return conversations


# ----------------------------------------------------------------------------- the log file


def _lines(data: bytes) -> list[bytes]:
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
        data = data[3:]
    return data.split(b"\n")


def _finish(
    report: ChatLogReport,
    dropped: Counter[str],
    roles: Counter[str],
    conversations: list[Conversation],
    started: float,
) -> None:
    """Counts into the report; a one-line error when nothing is usable."""
    report.dropped = dict(sorted(dropped.items()))
    report.roles = dict(sorted(roles.items(), key=lambda kv: (-kv[1], kv[0])))
    report.conversations_kept = len(conversations)
    report.seconds = round(time.perf_counter() - started, 3)
    if not conversations:
        reasons = ", ".join(f"{r} {n:,}" for r, n in sorted(report.dropped.items())) or "none"
        raise ChatLogError(
            f"{report.path}: no usable conversation: {report.records_seen:,} records read, "
            f"{report.records_dropped:,} dropped ({reasons}); give OpenAI chat-completions "
            "requests whose messages end with a user message"
        )


def load_chat_log(
    path: str | Path, progress: bool = True
) -> tuple[list[Conversation], ChatLogReport]:
    """Conversations rebuilt from an OpenAI chat-completions JSONL request log, and the report
    that accounts for every line (rules: the module docstring)."""
    from tqdm import tqdm

    started = time.perf_counter()
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ChatLogError(f"chat log not found: {path}") from None
    except OSError as exc:
        raise ChatLogError(f"cannot read the chat log {path}: {exc.strerror or exc}") from None
    report = ChatLogReport(source=SOURCE, path=str(path), bytes_read=len(data))
    dropped: Counter[str] = Counter()
    roles: Counter[str] = Counter()
    requests: list[_Request] = []
    lines = _lines(data)
    del data
    for number, raw in enumerate(tqdm(lines, desc="chat log", disable=None if progress else True)):
        if not raw.strip():
            end_of_file = number == len(lines) - 1 and not raw  # after the last newline
            report.blank_lines += not end_of_file
            continue
        report.records_seen += 1
        if len(raw) > MAX_LINE_BYTES:  # read at call time: tests lower it
            dropped["line_too_long"] += 1
            continue
        outcome = _parse_line(raw, number + 1, report, roles)
        if isinstance(outcome, str):
            dropped[outcome] += 1
        else:
            requests.append(outcome)
    conversations = _rebuild_conversations(requests, report, dropped)
    _finish(report, dropped, roles, conversations, started)
    return conversations, report


# ----------------------------------------------------------------------------- hub data sets


def _row_id(row: dict, ordinal: int) -> str:
    value = row.get("conversation_id")
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"row-{ordinal}"


def conversations_from_dataset(
    rows: Iterable[dict],
    column: str = "conversation",
    source: str = "hf",
    path: str | None = None,
) -> tuple[list[Conversation], ChatLogReport]:
    """One conversation per row of OpenAI-style messages under `column` (LMSYS-Chat-1M,
    WildChat), with the message rules of the request logs; rows are whole conversations, so
    nothing is rebuilt. Works on any iterable of dicts, a `datasets.Dataset` included."""
    started = time.perf_counter()
    where = path or f"{source}:{column}"
    report = ChatLogReport(source=source, path=where, format="hf_dataset")
    dropped: Counter[str] = Counter()
    repairs: Counter[str] = Counter()
    roles: Counter[str] = Counter()
    ids = _UniqueIds()
    conversations: list[Conversation] = []
    for ordinal, row in enumerate(rows):
        report.records_seen += 1
        raw = row.get(column) if isinstance(row, dict) else None
        if not isinstance(raw, list):
            dropped["missing_messages" if raw is None else "messages_not_a_list"] += 1
            continue
        fixes: Counter[str] = Counter()
        outcome = _normalise(raw, fixes, roles)
        if isinstance(outcome, str):
            dropped[outcome] += 1
            continue
        system, messages = outcome
        base_id = _row_id(row, ordinal)
        conversation_id = ids.claim(base_id)
        if conversation_id != base_id:
            fixes["duplicate_id_renamed"] += 1
        report.records_used += 1
        if fixes:
            repairs.update(fixes)
            report.records_repaired += 1
        if messages[-1].role == "assistant":
            report.final_replies_recorded += 1
        else:
            report.final_replies_missing += 1
        report.messages_kept += len(messages)
        conversations.append(Conversation(conversation_id, messages, system))
    report.repairs = dict(sorted(repairs.items()))
    _finish(report, dropped, roles, conversations, started)
    return conversations, report


def _offline_variable() -> str | None:
    """The offline switch that is set (HF_HUB_OFFLINE=1 ...), or None."""
    for name in HF_OFFLINE_VARIABLES:
        if (os.environ.get(name) or "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return name
    return None


def _needs_network(name: str, reason: str) -> ChatLogError:
    return ChatLogError(
        f"the hub data set {name!r} needs a network ({reason}); use a local chat log "
        "(--source openai-jsonl --path LOG) or ShareGPT's offline package instead"
    )


def load_hf_conversations(
    name: str,
    split: str = "train",
    column: str = "conversation",
    limit: int | None = None,
) -> tuple[list[Conversation], ChatLogReport]:
    """Conversations of a Hugging Face data set with a messages column, read from the hub
    (streamed when `limit` is given, so that 1M rows need not be downloaded for 1,000)."""
    from analysis.data.sharegpt.sources import _network_problem, _one_line

    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    offline = _offline_variable()
    if offline:
        raise _needs_network(name, f"{offline} is set")
    problem = _network_problem(os.environ.get("HF_ENDPOINT") or HF_ENDPOINT, 5.0)
    if problem:
        raise _needs_network(name, problem)
    try:
        import datasets

        dataset = datasets.load_dataset(name, split=split, streaming=limit is not None)
        rows = dataset.take(limit) if limit is not None else dataset
        conversations, report = conversations_from_dataset(
            rows, column, source=f"hf:{name}", path=f"{name}:{split}:{column}"
        )
    except ChatLogError:
        raise
    except Exception as exc:  # the network and the hub: whatever failed, say it in one line
        raise ChatLogError(f"cannot read the hub data set {name!r}: {_one_line(exc)}") from None
    return conversations, report
