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


@dataclass(frozen=True)
class TemplatedTraces:
    """Both traces of one template, and one row per turn about the next prompt."""

    template: str
    multi: pd.DataFrame
    single: pd.DataFrame
    turns: pd.DataFrame  # conversation_id, turn_index, held_tokens, extends, break_kind, lost
    too_long: int  # turns left out: prompt of max_model_len tokens or more (and those after)


def templated_traces(
    conversations: Sequence[Conversation],
    template: Template,
    tokenizer_file: str | None = None,
    max_model_len: int = 8192,
) -> TemplatedTraces:
    """Multi- and single-turn traces of `conversations` through `template` (single-turn: each
    conversation's first turn, as the default builder's `single_turn="first"`)."""
    renderer = Renderer(template, tokenizer_file)
    rows, turn_rows, too_long = [], [], 0
    for conversation in conversations:
        pairs = _pairs(conversation)
        rendered = render_conversation(renderer, conversation.system, pairs)
        for k, turn in enumerate(rendered):
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
    multi = pd.DataFrame(rows)
    single = multi[multi["turn_index"] == 0].reset_index(drop=True)
    return TemplatedTraces(template.name, multi, single, pd.DataFrame(turn_rows), too_long)


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
    tokens or more ends its conversation (the "exclude" policy), counted."""
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
        used, template_from_folder(options.template), tokenizer, options.max_model_len
    )
    counts = {
        "conversations": {
            "input": len(conversations),
            "skipped_max_conversations": len(conversations) - len(chosen),
            "skipped_min_turns": len(chosen) - len(used),
            "used": len(used),
        },
        "multi_turn": _counts(traces.multi, traces.too_long, TraceCounts()),
        "single_turn": _counts(traces.single, 0, TraceCounts()),
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
