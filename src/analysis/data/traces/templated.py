"""Traces rendered through any chat template, turn by turn, with where each breaks prefixes.

The default builder (`build.py`) assembles Llama prompts from pieces, which is fast and exact
for the Llama templates. This one renders every turn with the template itself
(`analysis.data.template_render`), as vLLM's chat endpoint would, so any template can be
measured, and it keeps, per turn, how far the next prompt repeats what the engine computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.data.sharegpt.conversations import Conversation
from analysis.data.template_render import Renderer, Template, render_conversation
from analysis.data.traces.build import single_turn_choice
from analysis.data.traces.options import TRACE_COLUMNS


@dataclass(frozen=True)
class TemplatedTraces:
    """Both traces of one template, and one row per turn about the next prompt."""

    template: str
    multi: pd.DataFrame
    single: pd.DataFrame
    turns: pd.DataFrame  # conversation_id, turn_index, held_tokens, extends, break_kind, lost
    too_long: int  # turns left out: prompt of max_model_len tokens or more (and those after)
    single_too_long: int = 0  # single-turn requests left out: prompt too long


def templated_traces(
    conversations: Sequence[Conversation],
    template: Template,
    tokenizer_file: str | None = None,
    max_model_len: int = 8192,
    single_turn: str = "first",
    seed: int = 0,
) -> TemplatedTraces:
    """Multi- and single-turn traces of `conversations` through `template`. Single-turn: each
    conversation's first turn, or one turn drawn with `seed` without its history (system
    prompt kept), as the default builder's `single_turn` "first" and "sampled" choose them."""
    renderer = Renderer(template, tokenizer_file)
    rows, turn_rows, too_long, firsts = [], [], 0, []
    for conversation in conversations:
        pairs = _pairs(conversation)
        rendered = render_conversation(renderer, conversation.system, pairs)
        firsts.append(rendered[0] if rendered else None)
        for k, turn in enumerate(rendered):
            _refuse_an_empty_prompt(template, conversation.id, k, turn)
            if len(turn.prompt_ids) >= max_model_len:
                too_long += len(rendered) - k
                break
            rows.append(_row(conversation.id, k, turn, len(rows)))
            if turn.next_extends is not None:
                held = len(turn.prompt_ids) + len(turn.response_ids) - 1
                turn_rows.append(
                    {
                        "conversation_id": conversation.id,
                        "turn_index": k,
                        "held_tokens": held,
                        "extends": turn.next_extends,
                        "break_kind": turn.break_kind or "none",
                        "lost_tokens": held - turn.next_extends,
                    }
                )
    choice = single_turn_choice([len(_pairs(c)) for c in conversations], single_turn, seed)
    single_rows, single_too_long = [], 0
    for conversation, first, k in zip(conversations, firsts, choice, strict=True):
        if first is None:  # no message at all
            continue
        turn = first if k == 0 else _alone(renderer, conversation, k)
        _refuse_an_empty_prompt(template, conversation.id, k, turn)
        if len(turn.prompt_ids) >= max_model_len:
            single_too_long += 1
            continue
        single_rows.append(_row(conversation.id, k, turn, len(single_rows)))
    return TemplatedTraces(
        template.name,
        _frame(rows),
        _frame(single_rows),
        pd.DataFrame(turn_rows),
        too_long,
        single_too_long,
    )


def _alone(renderer: Renderer, conversation: Conversation, k: int):
    """Turn k rendered without its history (a system prompt is not history)."""
    return render_conversation(renderer, conversation.system, [_pairs(conversation)[k]])[0]


def _refuse_an_empty_prompt(template: Template, conversation_id: str, k: int, turn) -> None:
    """A template that writes nothing gives a trace every reader refuses: say so here."""
    from analysis.platform.errors import TraceError

    if len(turn.prompt_ids) == 0:
        raise TraceError(
            f"the chat template of {template.source} renders an empty prompt (conversation "
            f"{conversation_id!r}, turn {k}): give a model folder whose chat_template writes "
            "the messages"
        )


def _frame(rows: list[dict]) -> pd.DataFrame:
    """The rows as a trace frame, with the trace's columns even when there is no row."""
    return pd.DataFrame(rows, columns=list(TRACE_COLUMNS))


def _pairs(conversation: Conversation) -> list[tuple[str, str]]:
    """(user, reply) per turn; a conversation that ends on a user message ends with a turn
    whose reply is empty (the engine still emits the end-of-turn token), as in `build.py`."""
    messages = conversation.messages
    pairs = []
    for i in range(0, len(messages), 2):
        reply = messages[i + 1].text if i + 1 < len(messages) else ""
        pairs.append((messages[i].text, reply))
    return pairs


def _row(conversation_id: str, turn: int, rendered, number: int) -> dict:
    prompt = np.asarray(rendered.prompt_ids, dtype=np.int32)
    response = np.asarray(rendered.response_ids, dtype=np.int32)
    return {
        "request_id": f"{conversation_id}:{turn}",
        "conversation_id": conversation_id,
        "turn_index": turn,
        "prompt_ids": prompt,
        "response_ids": response,
        "prompt_tokens": prompt.shape[0],
        "response_tokens": response.shape[0],
        "timestamp": float(number),
    }


def templated_trace_set(conversations: Sequence[Conversation], options, progress: bool = False):
    """Both traces through a model folder's own template (`options.template`), as a
    `TraceSet` the storage writes like any build. Long prompts: a turn of `max_model_len`
    tokens or more ends its conversation (the "exclude" policy; `TraceOptions` refuses
    "truncate" with a model's template), counted; `single_turn` and `seed` as by default."""
    import time

    from analysis.data.template_render import template_from_folder
    from analysis.data.tokenizer import tokenizer_source
    from analysis.data.traces.options import TraceCounts, TraceSet

    started = time.perf_counter()
    limit = options.max_conversations
    chosen = [c for c in (conversations if limit is None else conversations[:limit])]
    used = [c for c in chosen if len(_pairs(c)) >= options.min_turns]
    tokenizer = options.tokenizer or options.template
    traces = templated_traces(
        used,
        template_from_folder(options.template),
        tokenizer,
        options.max_model_len,
        options.single_turn,
        options.seed,
    )
    counts = {
        "conversations": {
            "input": len(conversations),
            "skipped_max_conversations": len(conversations) - len(chosen),
            "skipped_min_turns": len(chosen) - len(used),
            "used": len(used),
        },
        "multi_turn": _counts(traces.multi, traces.too_long, TraceCounts()),
        "single_turn": _counts(traces.single, traces.single_too_long, TraceCounts()),
        "prefix_breaks": traces.turns["break_kind"].value_counts().to_dict()
        if len(traces.turns)
        else {},
    }
    return TraceSet(
        multi=traces.multi,
        single=traces.single,
        counts=counts,
        options=options,
        tokenizer=tokenizer_source(tokenizer),
        seconds={"total": round(time.perf_counter() - started, 3)},
    )


def _counts(frame: pd.DataFrame, excluded: int, counts) -> dict:
    counts.requests = len(frame)
    counts.requests_candidate = len(frame) + excluded
    counts.requests_excluded = excluded
    counts.conversations = int(frame["conversation_id"].nunique()) if len(frame) else 0
    counts.prompt_tokens = int(frame["prompt_tokens"].sum()) if len(frame) else 0
    counts.response_tokens = int(frame["response_tokens"].sum()) if len(frame) else 0
    return counts.to_dict()
