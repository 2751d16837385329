"""Building both traces: conversations to the token ids an engine replays, turn by turn.

A module of its own because this is the one step that needs a tokenizer and the template:
saving, loading and statistics work on the frames it returns.

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

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.data.chat_template import BOS, EOT, ChatTemplate, header
from analysis.data.tokenizer import (
    EncodedTexts,
    encode_texts,
    load_tokenizer,
    token_id,
    tokenizer_source,
)
from analysis.data.traces.options import TraceCounts, TraceOptions, TraceSet
from analysis.platform.errors import TraceError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from analysis.data.sharegpt import Conversation


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
    for plan, turn in zip(plans, _chosen_turns(plans, options), strict=True):
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


def single_turn_choice(turn_counts: Sequence[int], mode: str, seed: int) -> list[int]:
    """Which turn each conversation's single-turn request is: the first, or one drawn with
    `seed` (shared with the templated builder, so both pick the same turns)."""
    if mode == "first" or len(turn_counts) == 0:
        return [0] * len(turn_counts)
    rng = np.random.default_rng(seed)
    return rng.integers(0, np.asarray(turn_counts, dtype=np.int64)).tolist()


def _chosen_turns(plans: list[_Plan], options: TraceOptions) -> list[int]:
    counts = [len(p.user_positions) for p in plans]
    return single_turn_choice(counts, options.single_turn, options.seed)
