"""Request traces from conversations: the token ids an engine replays, turn by turn.

Multi-turn trace: every user turn is a request whose prompt is the chat template (Llama 3.2
Instruct's by default, with its system block and a fixed date; Llama 3.0's as an option: see
`analysis.data.chat_template`) over all earlier messages (recorded assistant replies included) plus
this user message, ending with the assistant header. The request also carries the recorded
reply's ids followed by `<|eot_id|>`, so that prompt[k] + response[k] is a prefix of
prompt[k + 1] (teacher-forced replay).

Single-turn trace: one independent request per conversation, either its first turn (`"first"`)
or one turn drawn at random (`"sampled"`, seeded) with the earlier messages removed. A system
prompt is not history: it stays in front of the sampled turn.

Speed: each distinct message is tokenised once (header and body together, so that the only
boundaries are special tokens) and prompts are assembled from those ids. Tokenising every turn's
whole prompt would cost time quadratic in the turns. The builder checks the assumption it rests on
(every message's ids start with its header's ids and end with `<|eot_id|>`); the tests check that
assembled ids equal tokenising the rendered prompt text on real conversations.

`max_model_len`: vLLM accepts a prompt only if it is shorter than `max_model_len` (one token must
be left to generate). Prompts of one conversation grow turn by turn, so once a turn does not fit,
no later turn does: those requests are always dropped, and a conversation is cut at its first
turn that does not fit. The policy says what happens to that turn:

- `exclude` (default): it is dropped too. Every kept prompt is exactly the rendered conversation.
- `truncate`: it is kept, with its last user message cut (tokens kept from the message's start,
  then `<|eot_id|>` and the assistant header) so that the prompt is `max_model_len - 1` tokens.
  Its ids no longer tokenise any text exactly; everything else stays prefix-preserving. If not
  even one token of the message fits, it is dropped as under `exclude`.

A kept request's reply is capped so that prompt + response <= max_model_len (counted): a replay
can then generate the whole (capped) reply. A capped reply only happens on a conversation's last
kept turn, since the next prompt contains the whole reply.

Timestamps are synthetic: request i (in row order) arrives at i * `arrival_interval_s` seconds.
Arrival modes (closed loop, rates) belong to the run configuration, not to the trace.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.data.chat_template import (
    BOS,
    DEFAULT_DATE,
    DEFAULT_TEMPLATE,
    EOT,
    ChatTemplate,
    header,
)
from analysis.data.tokenizer import (
    EncodedTexts,
    TokenizerSource,
    encode_texts,
    load_tokenizer,
    token_id,
    tokenizer_source,
)
from analysis.platform.errors import TraceError
from analysis.platform.manifest import file_sha256

if TYPE_CHECKING:
    import pyarrow as pa
    from tokenizers import Tokenizer

    from analysis.data.sharegpt import Conversation

POLICIES = ("exclude", "truncate")
SINGLE_TURN_MODES = ("first", "sampled")
TRACE_NAMES = ("multi_turn", "single_turn")
MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 2  # bump when the same inputs would give different traces

TRACE_COLUMNS = (
    "request_id",
    "conversation_id",
    "turn_index",
    "prompt_ids",
    "response_ids",
    "prompt_tokens",
    "response_tokens",
    "timestamp",
)


@dataclass(frozen=True)
class TraceOptions:
    """Everything that shapes a trace besides the conversations and the tokenizer file."""

    max_model_len: int = 8192
    policy: str = "exclude"  # "exclude" | "truncate": what happens to a turn that does not fit
    single_turn: str = "first"  # "first" | "sampled": which turn a single-turn request is
    seed: int = 0  # for single_turn="sampled"
    min_turns: int = 1  # conversations with fewer user turns are left out of both traces
    max_conversations: int | None = None  # the first N conversations only
    tokenizer: str | None = None  # None: the packaged Llama 3.2; a tokenizer.json path; a hub id
    arrival_interval_s: float = 1.0  # synthetic timestamps: row i arrives at i * this
    template: str = DEFAULT_TEMPLATE  # "llama3.2" (system block with a date) | "llama3"
    template_date: str = DEFAULT_DATE  # Llama 3.2's "Today Date", e.g. "26 Jul 2024"

    def __post_init__(self) -> None:
        ChatTemplate(self.template, self.template_date)  # validates both
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.single_turn not in SINGLE_TURN_MODES:
            raise ValueError(
                f"single_turn must be one of {SINGLE_TURN_MODES}, got {self.single_turn!r}"
            )
        if self.max_model_len < 16:
            raise ValueError(f"max_model_len must be at least 16, got {self.max_model_len}")
        if self.min_turns < 1:
            raise ValueError(f"min_turns must be at least 1, got {self.min_turns}")
        if self.max_conversations is not None and self.max_conversations < 0:
            raise ValueError(f"max_conversations must be >= 0, got {self.max_conversations}")
        if self.arrival_interval_s < 0:
            raise ValueError(f"arrival_interval_s must be >= 0, got {self.arrival_interval_s}")

    @property
    def chat_template(self) -> ChatTemplate:
        return ChatTemplate(self.template, self.template_date)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TraceCounts:
    """What the length policy did to one trace: every candidate request is kept or counted."""

    requests_candidate: int = 0
    requests: int = 0
    requests_excluded: int = 0  # dropped: the prompt does not fit max_model_len
    requests_truncated: int = 0  # kept with their last user message cut (policy "truncate")
    conversations: int = 0  # with at least one request kept
    conversations_cut: int = 0  # some requests kept, later ones dropped
    conversations_excluded: int = 0  # every request dropped
    prompt_tokens: int = 0
    prompt_tokens_excluded: int = 0  # whole prompts of the dropped requests
    prompt_tokens_truncated: int = 0  # tokens cut from truncated prompts
    response_tokens: int = 0
    responses_capped: int = 0  # replies cut so that prompt + response <= max_model_len
    response_tokens_capped: int = 0
    responses_empty: int = 0  # the conversation ends on this user message

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class TraceSet:
    """Both traces of one build, with what is needed to save and explain them."""

    multi: pd.DataFrame
    single: pd.DataFrame
    counts: dict[str, Any]  # "conversations" (selection), "multi_turn", "single_turn"
    options: TraceOptions
    tokenizer: TokenizerSource
    seconds: dict[str, float] = field(default_factory=dict)
    tokenizer_object: Tokenizer | None = field(default=None, repr=False)

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"multi_turn": self.multi, "single_turn": self.single}

    def summary(self) -> str:
        """A few lines, deterministic (no timings), for logs and notebook outputs."""
        return summarize_counts(self.counts, self.options.to_dict())


def summarize_counts(counts: dict[str, Any], parameters: dict[str, Any]) -> str:
    """The counts of a build (a TraceSet's or a manifest's) in a few lines."""
    lines = [_selection_line(counts["conversations"])]
    for name in TRACE_NAMES:
        c = counts[name]
        lines.append(
            f"{name}: {c['requests']:,} requests in {c['conversations']:,} conversations, "
            f"{c['prompt_tokens']:,} prompt tokens; max_model_len "
            f"{parameters['max_model_len']} ({parameters['policy']}): "
            f"{c['requests_excluded']:,} requests excluded, "
            f"{c['requests_truncated']:,} truncated, "
            f"{c['conversations_cut']:,} conversations cut, "
            f"{c['conversations_excluded']:,} excluded, "
            f"{c['responses_capped']:,} replies capped"
        )
    return "\n".join(lines)


def _selection_line(c: dict[str, int]) -> str:
    return (
        f"conversations: {c['used']:,} used of {c['input']:,} "
        f"({c['skipped_max_conversations']:,} beyond max_conversations, "
        f"{c['skipped_min_turns']:,} with fewer than the minimum turns)"
    )


# ----------------------------------------------------------------------------- building


@dataclass
class _Plan:
    """One conversation as segment numbers: [system?] + its messages, in order."""

    conversation_id: str
    segments: list[int]
    roles: list[str]
    user_positions: list[int]  # positions in `segments` of the user messages


class _SegmentTable:
    """Distinct (role, text) pairs, each rendered as header + body, to be tokenised once."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.index: dict[tuple[str, str], int] = {}
        self.texts: list[str] = []
        self.roles: list[str] = []

    def add(self, role: str, text: str) -> int:
        key = (role, text)
        found = self.index.get(key)
        if found is None:
            found = len(self.texts)
            self.index[key] = found
            self.texts.append(self.template.segment(role, text))
            self.roles.append(role)
        return found


@dataclass(frozen=True)
class _Ids:
    bos: int
    eot: int
    headers: dict[str, np.ndarray]


def build_traces(
    conversations: Sequence[Conversation],
    options: TraceOptions | None = None,
    tokenizer: Tokenizer | None = None,
    *,
    progress: bool = True,
) -> TraceSet:
    """Multi- and single-turn traces of `conversations` (in their order).

    `tokenizer`: an already loaded tokenizer for `options.tokenizer` (saves loading it again).
    """
    options = options or TraceOptions()
    started = time.perf_counter()
    source = tokenizer_source(options.tokenizer)
    if tokenizer is None:
        tokenizer = load_tokenizer(options.tokenizer)
    plans, table, selection = _plan(conversations, options)
    ids = _special_ids(tokenizer, table)
    planned = time.perf_counter()
    encoded = encode_texts(tokenizer, table.texts, progress=progress, desc="tokenize messages")
    del table.index
    encoded_at = time.perf_counter()
    _check_boundaries(encoded, table.roles, ids)
    multi, multi_counts = _multi_turn(plans, encoded, ids, options)
    single, single_counts = _single_turn(plans, encoded, ids, options)
    done = time.perf_counter()
    return TraceSet(
        multi=multi,
        single=single,
        counts={
            "conversations": selection,
            "multi_turn": multi_counts.to_dict(),
            "single_turn": single_counts.to_dict(),
            "distinct_messages": len(encoded),
            "distinct_message_tokens": int(encoded.values.size),
        },
        options=options,
        tokenizer=source,
        seconds={
            "plan": round(planned - started, 3),
            "tokenize": round(encoded_at - planned, 3),
            "assemble": round(done - encoded_at, 3),
            "total": round(done - started, 3),
        },
        tokenizer_object=tokenizer,
    )


def _plan(
    conversations: Sequence[Conversation], options: TraceOptions
) -> tuple[list[_Plan], _SegmentTable, dict[str, int]]:
    limit = options.max_conversations
    chosen = conversations if limit is None else conversations[:limit]
    table = _SegmentTable(options.chat_template)
    plans: list[_Plan] = []
    skipped_min_turns = 0
    for conversation in chosen:
        messages = conversation.messages
        user_count = sum(1 for m in messages if m.role == "user")
        if user_count < options.min_turns:
            skipped_min_turns += 1
            continue
        segments: list[int] = []
        roles: list[str] = []
        if conversation.system is not None or table.template.has_system_block:
            segments.append(table.add("system", conversation.system or ""))
            roles.append("system")
        for message in messages:
            segments.append(table.add(message.role, message.text))
            roles.append(message.role)
        user_positions = [i for i, role in enumerate(roles) if role == "user"]
        plans.append(_Plan(conversation.id, segments, roles, user_positions))
    selection = {
        "input": len(conversations),
        "skipped_max_conversations": len(conversations) - len(chosen),
        "skipped_min_turns": skipped_min_turns,
        "used": len(plans),
    }
    return plans, table, selection


def _special_ids(tokenizer: Tokenizer, table: _SegmentTable) -> _Ids:
    roles = sorted(set(table.roles) | {"user", "assistant"})
    headers = {}
    for role in roles:
        encoding = tokenizer.encode(header(role), add_special_tokens=False)
        headers[role] = np.asarray(encoding.ids, dtype=np.int32)
    return _Ids(bos=token_id(tokenizer, BOS), eot=token_id(tokenizer, EOT), headers=headers)


def _check_boundaries(encoded: EncodedTexts, roles: list[str], ids: _Ids) -> None:
    """Prompts are assembled from message ids: that needs each message to start with its
    header's ids and end with <|eot_id|>, which holds when the tokenizer splits at special
    tokens (Llama 3 does)."""
    if len(encoded) == 0:
        return
    starts, lengths = encoded.offsets[:-1], encoded.lengths
    role_array = np.asarray(roles)
    bad = np.zeros(len(encoded), dtype=bool)
    for role, head in ids.headers.items():
        rows = np.flatnonzero(role_array == role)
        if rows.size == 0:
            continue
        short = lengths[rows] < len(head) + 1
        bad[rows[short]] = True
        rows = rows[~short]
        heads = encoded.values[starts[rows, None] + np.arange(len(head))]
        bad[rows[(heads != head).any(axis=1)]] = True
    ends = encoded.values[np.maximum(encoded.offsets[1:] - 1, 0)]
    bad |= ends != ids.eot
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise TraceError(
            f"{int(bad.sum())} messages do not tokenise as header + body + <|eot_id|> "
            f"(first: message {first}, role {roles[first]!r}); this tokenizer does not split at "
            "the Llama 3 template's special tokens, so prompts cannot be assembled from messages"
        )


class _Assembler:
    """Collects ragged pieces of ids for many rows, then joins them in one copy."""

    def __init__(self) -> None:
        self.pieces: list[np.ndarray] = []
        self.lengths: list[int] = []
        self._row = 0

    def add(self, *pieces: np.ndarray) -> None:
        self.pieces.extend(pieces)
        self._row += sum(len(p) for p in pieces)

    def end_row(self) -> None:
        self.lengths.append(self._row)
        self._row = 0

    def column(self) -> tuple[np.ndarray, np.ndarray]:
        """(object array of int32 views, lengths as int32)."""
        values = np.concatenate(self.pieces) if self.pieces else np.zeros(0, np.int32)
        lengths = np.asarray(self.lengths, dtype=np.int64)
        return _ragged(values.astype(np.int32, copy=False), lengths), lengths.astype(np.int32)


def _ragged(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    ends = np.cumsum(lengths)
    column = np.empty(len(lengths), dtype=object)
    for i, (start, end) in enumerate(zip((ends - lengths).tolist(), ends.tolist(), strict=True)):
        column[i] = values[start:end]
    return column


class _TraceBuilder:
    """Rows of one trace, with the length policy applied and counted as they are added."""

    def __init__(self, encoded: EncodedTexts, ids: _Ids, options: TraceOptions) -> None:
        self.encoded = encoded
        self.ids = ids
        self.options = options
        self.counts = TraceCounts()
        self.prompts = _Assembler()
        self.responses = _Assembler()
        self.conversation_ids: list[str] = []
        self.turns: list[int] = []
        self.bos = np.asarray([ids.bos], dtype=np.int32)
        self.eot = np.asarray([ids.eot], dtype=np.int32)
        self.assistant_header = ids.headers["assistant"]

    def segment(self, index: int) -> np.ndarray:
        return self.encoded.ids(index)

    def add_request(
        self,
        conversation_id: str,
        turn: int,
        prefix: list[np.ndarray],
        user_segment: int,
        reply_segment: int | None,
    ) -> bool:
        """Add one request (prefix + user message + assistant header) if the policy keeps it;
        returns whether it was kept untruncated (a later turn of it may then follow)."""
        limit = self.options.max_model_len
        user = self.segment(user_segment)
        prefix_tokens = sum(len(p) for p in prefix)
        prompt_tokens = prefix_tokens + len(user) + len(self.assistant_header)
        self.counts.requests_candidate += 1
        whole = True
        if prompt_tokens >= limit:
            user_header = self.ids.headers["user"]
            room = limit - 1 - prefix_tokens - len(user_header) - 1 - len(self.assistant_header)
            if self.options.policy != "truncate" or room < 1:
                self.counts.requests_excluded += 1
                self.counts.prompt_tokens_excluded += prompt_tokens
                return False
            user = np.concatenate([user[: len(user_header) + room], self.eot])
            self.counts.requests_truncated += 1
            self.counts.prompt_tokens_truncated += prompt_tokens - (limit - 1)
            prompt_tokens = limit - 1
            whole = False
        self.prompts.add(*prefix, user, self.assistant_header)
        self.prompts.end_row()
        reply = self._reply(reply_segment, limit - prompt_tokens)
        self.responses.add(reply)
        self.responses.end_row()
        self.conversation_ids.append(conversation_id)
        self.turns.append(turn)
        self.counts.requests += 1
        self.counts.prompt_tokens += prompt_tokens
        self.counts.response_tokens += len(reply)
        return whole

    def _reply(self, reply_segment: int | None, room: int) -> np.ndarray:
        if reply_segment is None:
            self.counts.responses_empty += 1
            return np.zeros(0, dtype=np.int32)
        reply = self.segment(reply_segment)[len(self.assistant_header) :]
        if len(reply) > room:
            self.counts.responses_capped += 1
            self.counts.response_tokens_capped += len(reply) - room
            reply = reply[:room]
        return reply

    def end_conversation(self, kept: int, candidates: int) -> None:
        if kept:
            self.counts.conversations += 1
            if kept < candidates:
                self.counts.conversations_cut += 1
        elif candidates:
            self.counts.conversations_excluded += 1

    def frame(self) -> pd.DataFrame:
        prompts, prompt_tokens = self.prompts.column()
        responses, response_tokens = self.responses.column()
        turns = np.asarray(self.turns, dtype=np.int32)
        request_ids = [f"{c}/{t}" for c, t in zip(self.conversation_ids, self.turns, strict=True)]
        timestamps = np.arange(len(turns), dtype=np.float64) * self.options.arrival_interval_s
        return pd.DataFrame(
            {
                "request_id": pd.Series(request_ids, dtype="str"),
                "conversation_id": pd.Series(self.conversation_ids, dtype="str"),
                "turn_index": turns,
                "prompt_ids": prompts,
                "response_ids": responses,
                "prompt_tokens": prompt_tokens,
                "response_tokens": response_tokens,
                "timestamp": timestamps,
            }
        )


def _conversation_ids(plan: _Plan, encoded: EncodedTexts, bos: np.ndarray) -> np.ndarray:
    return np.concatenate([bos, *(encoded.ids(s) for s in plan.segments)])


def _reply_segment(plan: _Plan, position: int) -> int | None:
    following = position + 1
    if following < len(plan.roles) and plan.roles[following] == "assistant":
        return plan.segments[following]
    return None


def _multi_turn(
    plans: list[_Plan], encoded: EncodedTexts, ids: _Ids, options: TraceOptions
) -> tuple[pd.DataFrame, TraceCounts]:
    builder = _TraceBuilder(encoded, ids, options)
    segment_lengths = encoded.lengths
    for plan in plans:
        whole_ids = _conversation_ids(plan, encoded, builder.bos)
        starts = np.concatenate([[1], 1 + np.cumsum(segment_lengths[plan.segments])])
        kept_before = builder.counts.requests
        for turn, position in enumerate(plan.user_positions):
            still_whole = builder.add_request(
                plan.conversation_id,
                turn,
                [whole_ids[: starts[position]]],
                plan.segments[position],
                _reply_segment(plan, position),
            )
            if not still_whole:  # later turns are longer still: dropped, counted
                _count_dropped_later(builder, starts, plan.user_positions[turn + 1 :])
                break
        builder.end_conversation(builder.counts.requests - kept_before, len(plan.user_positions))
    return builder.frame(), builder.counts


def _count_dropped_later(builder: _TraceBuilder, starts: np.ndarray, positions: list[int]) -> None:
    header_tokens = len(builder.assistant_header)
    for position in positions:
        builder.counts.requests_candidate += 1
        builder.counts.requests_excluded += 1
        builder.counts.prompt_tokens_excluded += int(starts[position + 1]) + header_tokens


def _single_turn(
    plans: list[_Plan], encoded: EncodedTexts, ids: _Ids, options: TraceOptions
) -> tuple[pd.DataFrame, TraceCounts]:
    builder = _TraceBuilder(encoded, ids, options)
    for plan, turn in zip(plans, _single_turn_choice(plans, options), strict=True):
        position = plan.user_positions[turn]
        if options.single_turn == "first":  # everything before the first user message
            prefix = [builder.bos, *(encoded.ids(s) for s in plan.segments[:position])]
        else:  # history removed; a system prompt is not history
            system = [encoded.ids(plan.segments[0])] if plan.roles[0] == "system" else []
            prefix = [builder.bos, *system]
        kept_before = builder.counts.requests
        builder.add_request(
            plan.conversation_id,
            turn,
            prefix,
            plan.segments[position],
            _reply_segment(plan, position),
        )
        builder.end_conversation(builder.counts.requests - kept_before, 1)
    return builder.frame(), builder.counts


def _single_turn_choice(plans: list[_Plan], options: TraceOptions) -> list[int]:
    if options.single_turn == "first":
        return [0] * len(plans)
    rng = np.random.default_rng(options.seed)
    turn_counts = np.asarray([len(p.user_positions) for p in plans], dtype=np.int64)
    if turn_counts.size == 0:
        return []
    return rng.integers(0, turn_counts).tolist()


# ----------------------------------------------------------------------------- saving, loading


def template_info(options: TraceOptions | None = None) -> dict[str, str | None]:
    """The template a trace was rendered with: name, date (Llama 3.2), hash, Jinja text."""
    return (options or TraceOptions()).chat_template.info()


def build_request(
    options: TraceOptions, data: dict[str, Any], tokenizer: TokenizerSource
) -> dict[str, Any]:
    """What a build depends on; a saved build with the same request need not be redone.

    `data`: the conversations' origin, for example {"source": "package", "sha256": ...}.
    """
    return {
        "format_version": FORMAT_VERSION,
        "data": data,
        "parameters": options.to_dict(),
        "tokenizer_sha256": tokenizer.sha256,
        "template_sha256": template_info(options)["sha256"],
    }


def trace_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("request_id", pa.string()),
            ("conversation_id", pa.string()),
            ("turn_index", pa.int32()),
            ("prompt_ids", pa.list_(pa.int32())),
            ("response_ids", pa.list_(pa.int32())),
            ("prompt_tokens", pa.int32()),
            ("response_tokens", pa.int32()),
            ("timestamp", pa.float64()),
        ]
    )


def trace_table(frame: pd.DataFrame) -> pa.Table:
    """The frame as an Arrow table of the trace schema (list columns joined in one copy)."""
    import pyarrow as pa

    columns = {}
    for name, kind in zip(trace_schema().names, trace_schema().types, strict=True):
        if pa.types.is_list(kind):
            columns[name] = _list_array(frame[name])
        else:
            values = frame[name].to_numpy()
            columns[name] = pa.array(values.tolist() if kind == pa.string() else values, kind)
    return pa.table(columns, schema=trace_schema())


def _list_array(column: pd.Series) -> pa.Array:
    import pyarrow as pa

    arrays = [np.asarray(ids, dtype=np.int32) for ids in column]
    lengths = np.fromiter((a.size for a in arrays), np.int64, len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
    if offsets[-1] >= 2**31:
        raise TraceError(f"a trace of {offsets[-1]:,} tokens exceeds Parquet list<int32> offsets")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))


def write_trace(path: Path, frame: pd.DataFrame) -> None:
    """One trace as Parquet, written atomically."""
    import pyarrow.parquet as pq

    from analysis.platform.manifest import atomic_path

    table = trace_table(frame)
    with atomic_path(Path(path)) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def load_trace(path: str | Path) -> pd.DataFrame:
    """One trace (Parquet) as a frame with the schema's columns, or a one-line TraceError."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace {path} not found: build it with `python -m analysis traces`")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"{path} is not a readable Parquet trace: {exc}") from None
    missing = [c for c in TRACE_COLUMNS if c not in table.column_names]
    if missing:
        raise TraceError(f"trace {path} lacks columns {missing}; rebuild it")
    table = table.select(list(TRACE_COLUMNS))
    wrong = [
        f"{f.name} is {table.schema.field(f.name).type}, not {f.type}"
        for f in trace_schema()
        if not _same_kind(table.schema.field(f.name).type, f.type)
    ]
    try:
        if wrong:  # Arrow would parse "12" as 12 or cut 1.5 to 1: refuse instead
            raise pa.ArrowInvalid("; ".join(wrong))
        table = table.cast(trace_schema())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise TraceError(
            f"trace {path} has columns of the wrong type ({exc}); rebuild it"
        ) from None
    for column in ("prompt_ids", "response_ids"):
        values = table.column(column).combine_chunks().flatten()
        if len(values) and pc.min(values).as_py() < 0:
            raise TraceError(f"trace {path}: {column} holds negative token ids; rebuild it")
    return table.to_pandas()


def _same_kind(actual: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a column can be cast to the schema's type without reinterpreting it: integers
    stay integers (any width, overflow is checked by the cast), strings stay strings."""
    import pyarrow as pa

    if pa.types.is_list(wanted) or pa.types.is_large_list(wanted):
        list_like = pa.types.is_list(actual) or pa.types.is_large_list(actual)
        return list_like and _same_kind(actual.value_type, wanted.value_type)
    if pa.types.is_integer(wanted):
        return pa.types.is_integer(actual)
    if pa.types.is_floating(wanted):
        return pa.types.is_integer(actual) or pa.types.is_floating(actual)
    if pa.types.is_string(wanted):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    return actual == wanted


def save_traces(
    trace_set: TraceSet,
    out_dir: str | Path | None = None,
    manifest_extra: dict[str, Any] | None = None,
    *,
    jsonl: bool = False,
    progress: bool = True,
) -> dict[str, Path]:
    """Write both traces (Parquet), optionally their JSONL export, then the manifest (last).

    A folder without manifest.json holds an unfinished build. The JSONL export repeats each
    prompt's whole history as text (hundreds of MB for the whole data set): opt in.
    """
    from analysis.platform.manifest import git_commit, package_versions, write_json
    from analysis.platform.paths import traces_dir

    out = Path(out_dir) if out_dir is not None else traces_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    paths: dict[str, Path] = {}
    files: dict[str, Any] = {}
    started = time.perf_counter()
    for name, frame in trace_set.frames().items():
        path = out / f"{name}.parquet"
        write_trace(path, frame)
        paths[name] = path
        files[name] = {"file": path.name, "rows": len(frame), "sha256": file_sha256(path)}
        jsonl_path = out / f"{name}.jsonl"
        jsonl_path.unlink(missing_ok=True)  # never leave an export of an older build beside
        if jsonl:
            tokenizer = trace_set.tokenizer_object or load_tokenizer(trace_set.options.tokenizer)
            export_jsonl(frame, jsonl_path, tokenizer, progress=progress)
            paths[f"{name}_jsonl"] = jsonl_path
            files[f"{name}_jsonl"] = {"file": jsonl_path.name, "rows": len(frame)}
    manifest = {
        "kind": "traces",
        "format_version": FORMAT_VERSION,
        "files": files,
        "counts": trace_set.counts,
        "parameters": trace_set.options.to_dict(),
        "tokenizer": trace_set.tokenizer.to_dict(),
        "template": template_info(trace_set.options),
        "seconds": {**trace_set.seconds, "save": round(time.perf_counter() - started, 3)},
        "package_versions": package_versions(),
        "git_commit": git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **(manifest_extra or {}),
    }
    write_json(out / MANIFEST_NAME, manifest)
    paths["manifest"] = out / MANIFEST_NAME
    return paths


@dataclass
class TraceBuild:
    """The outcome of `ensure_traces`: the manifest of the traces on disk, and whether this
    call built them (False: an identical build was already there)."""

    manifest: dict[str, Any]
    built: bool
    paths: dict[str, Path]
    load_report: Any = None  # the ShareGPT LoadReport when this call loaded the data

    def summary(self) -> str:
        return summarize_counts(self.manifest["counts"], self.manifest["parameters"])


def ensure_traces(
    options: TraceOptions | None = None,
    source: str = "package",
    path: str | Path | None = None,
    out_dir: str | Path | None = None,
    *,
    jsonl: bool = False,
    force: bool = False,
    progress: bool = True,
) -> TraceBuild:
    """Build both traces unless a build of the same data, parameters, tokenizer and template
    is already in `out_dir` (data/traces by default): notebooks and the CLI share this."""
    from analysis.data.sharegpt import load_conversations, resolve_source
    from analysis.platform.paths import traces_dir

    options = options or TraceOptions()
    out = Path(out_dir) if out_dir is not None else traces_dir()
    data_file = resolve_source(source, path)
    if not data_file.is_file():
        raise TraceError(f"ShareGPT file not found: {data_file}")
    data = {"source": source, "sha256": file_sha256(data_file)}
    request = build_request(options, data, tokenizer_source(options.tokenizer))
    wanted = ["multi_turn.parquet", "single_turn.parquet"]
    if jsonl:
        wanted += ["multi_turn.jsonl", "single_turn.jsonl"]
    manifest = load_manifest(out)
    if (
        not force
        and manifest is not None
        and manifest.get("request") == request
        and all((out / name).is_file() for name in wanted)
    ):
        paths = {name.replace(".", "_"): out / name for name in wanted}
        return TraceBuild(manifest, built=False, paths=paths)
    tokenizer = load_tokenizer(options.tokenizer)
    conversations, report = load_conversations(
        source, path, max_conversations=options.max_conversations, progress=progress
    )
    trace_set = build_traces(conversations, options, tokenizer, progress=progress)
    del conversations
    if trace_set.multi.empty:
        raise TraceError(_no_request_kept(data_file, trace_set))
    paths = save_traces(
        trace_set,
        out,
        {"request": request, "source": report.to_dict()},
        jsonl=jsonl,
        progress=progress,
    )
    return TraceBuild(load_manifest(out), built=True, paths=paths, load_report=report)


def _no_request_kept(data_file: Path, trace_set: TraceSet) -> str:
    """One line for a build that dropped every request: the counts, and what to change."""
    selection, multi = trace_set.counts["conversations"], trace_set.counts["multi_turn"]
    options = trace_set.options
    return (
        f"{data_file}: every request was dropped: {selection['used']:,} of "
        f"{selection['input']:,} conversations used ({selection['skipped_min_turns']:,} with "
        f"fewer than min_turns={options.min_turns}), {multi['requests_excluded']:,} requests "
        f"excluded at max_model_len={options.max_model_len}; lower --min-turns, raise "
        "--max-model-len or use --policy truncate"
    )


def load_manifest(out_dir: str | Path | None = None) -> dict[str, Any] | None:
    """The manifest of a finished build in `out_dir`, or None if there is none."""
    from analysis.platform.paths import traces_dir

    path = (Path(out_dir) if out_dir is not None else traces_dir()) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TraceError(
            f"{path} is not a readable manifest ({exc}); rebuild with --force"
        ) from None


def export_jsonl(
    frame: pd.DataFrame,
    path: str | Path,
    tokenizer: Tokenizer,
    *,
    batch: int = 512,
    progress: bool = True,
) -> Path:
    """The seeds' JSONL (prompt, response, conversation_id, turn_index, timestamp) of a trace.

    Texts are decoded from the ids (lossless for byte-level BPE): "prompt" is the rendered
    prompt, special tokens included; "response" the recorded (possibly capped) reply without
    its closing <|eot_id|>.
    """
    from tqdm import tqdm

    from analysis.platform.manifest import atomic_path

    eot = token_id(tokenizer, EOT)
    path = Path(path)
    rows = len(frame)
    with (
        atomic_path(path) as tmp,
        open(tmp, "w", encoding="utf-8") as handle,
        tqdm(
            total=rows, unit="req", desc=f"export {path.name}", disable=None if progress else True
        ) as bar,
    ):
        for start in range(0, rows, batch):
            part = frame.iloc[start : start + batch]
            prompts = tokenizer.decode_batch(
                [np.asarray(ids).tolist() for ids in part["prompt_ids"]],
                skip_special_tokens=False,
            )
            replies = tokenizer.decode_batch(
                [_without_eot(ids, eot) for ids in part["response_ids"]],
                skip_special_tokens=False,
            )
            for row, prompt, reply in zip(
                part.itertuples(index=False), prompts, replies, strict=True
            ):
                record = {
                    "prompt": prompt,
                    "response": reply,
                    "conversation_id": row.conversation_id,
                    "turn_index": int(row.turn_index),
                    "timestamp": float(row.timestamp),
                }
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            bar.update(len(part))
    return path


def _without_eot(ids: Any, eot: int) -> list[int]:
    values = np.asarray(ids).tolist()
    return values[:-1] if values and values[-1] == eot else values


# ----------------------------------------------------------------------------- statistics


@dataclass
class TraceStats:
    """Shape of a trace: what prompts are made of, for figures and sanity checks."""

    per_request: pd.DataFrame  # + history_tokens, history_share
    per_conversation: pd.DataFrame  # conversation_id, turns, prompt_tokens, response_tokens
    by_turn: pd.DataFrame  # turn_index, requests, prompt tokens, history share (mean, median)
    summary: dict[str, float]


def trace_stats(frame: pd.DataFrame) -> TraceStats:
    """Prompt lengths, turns per conversation, and the share of each prompt that is history.

    A request's history is the previous turn's prompt and reply when that turn is the row
    before it in the same conversation (multi-turn traces); otherwise it has none.
    """
    columns = ["request_id", "conversation_id", "turn_index", "prompt_tokens", "response_tokens"]
    table = frame[columns].copy()
    previous = table.shift(1)
    follows = (previous["conversation_id"] == table["conversation_id"]) & (
        previous["turn_index"] == table["turn_index"] - 1
    )
    carried = previous["prompt_tokens"].fillna(0) + previous["response_tokens"].fillna(0)
    table["history_tokens"] = np.where(follows, carried, 0).astype(np.int64)
    table["history_share"] = table["history_tokens"] / table["prompt_tokens"].clip(lower=1)
    per_conversation = (
        table.groupby("conversation_id", sort=False)
        .agg(
            turns=("turn_index", "size"),
            prompt_tokens=("prompt_tokens", "sum"),
            response_tokens=("response_tokens", "sum"),
        )
        .reset_index()
    )
    by_turn = (
        table.groupby("turn_index")
        .agg(
            requests=("request_id", "size"),
            mean_prompt_tokens=("prompt_tokens", "mean"),
            mean_history_share=("history_share", "mean"),
            median_history_share=("history_share", "median"),
        )
        .reset_index()
    )
    prompt = table["prompt_tokens"].to_numpy(dtype=np.int64)
    total = int(prompt.sum())
    summary = {
        "requests": len(table),
        "conversations": len(per_conversation),
        "prompt_tokens": total,
        "response_tokens": int(table["response_tokens"].sum()),
        "history_tokens": int(table["history_tokens"].sum()),
        "history_share": float(table["history_tokens"].sum() / total) if total else 0.0,
        "prompt_tokens_median": float(np.median(prompt)) if prompt.size else 0.0,
        "prompt_tokens_p90": float(np.percentile(prompt, 90)) if prompt.size else 0.0,
        "prompt_tokens_p99": float(np.percentile(prompt, 99)) if prompt.size else 0.0,
        "prompt_tokens_max": int(prompt.max()) if prompt.size else 0,
        "turns_per_conversation_mean": float(per_conversation["turns"].mean())
        if len(per_conversation)
        else 0.0,
    }
    return TraceStats(table, per_conversation, by_turn, summary)
