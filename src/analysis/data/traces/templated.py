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
    """(user, reply) per turn; a last user message without a reply is left out."""
    messages = conversation.messages
    return [
        (messages[i].text, messages[i + 1].text)
        for i in range(0, len(messages) - 1, 2)
        if messages[i].role == "user" and messages[i + 1].role == "assistant"
    ]


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
