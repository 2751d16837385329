"""Small synthetic traces with the real trace schema, for tests and benchmarks.

Token ids are random below 128000 (plain text ids of the Llama 3 vocabulary). In a multi-turn
conversation, prompt[k] + response[k] is a prefix of prompt[k+1], as in traces built from
ShareGPT. Real traces come from `analysis.data.traces`; these only exercise the engines.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

BOS_ID = 128000
EOT_ID = 128009
TEXT_ID_LIMIT = 128000


def synthetic_trace(
    num_conversations: int = 8,
    turns: int | tuple[int, int] = 3,
    user_tokens: int | tuple[int, int] = (20, 120),
    reply_tokens: int | tuple[int, int] = (10, 80),
    seed: int = 0,
    shared_prefix: int = 0,
) -> pd.DataFrame:
    """A trace frame (columns of analysis.data.traces) of random multi-turn conversations.

    `turns`, `user_tokens`, `reply_tokens` are fixed values or inclusive (low, high) ranges.
    `shared_prefix` tokens (a common system prompt) start every conversation.
    """
    rng = np.random.default_rng(seed)
    system = rng.integers(0, TEXT_ID_LIMIT, size=shared_prefix, dtype=np.int32)
    rows = []
    timestamp = 0.0
    for c in range(num_conversations):
        conversation_id = f"conv{c:05d}"
        history = np.concatenate([[BOS_ID], system]).astype(np.int32)
        for k in range(_draw(rng, turns)):
            user = rng.integers(0, TEXT_ID_LIMIT, size=_draw(rng, user_tokens), dtype=np.int32)
            prompt = np.concatenate([history, user]).astype(np.int32)
            reply = rng.integers(0, TEXT_ID_LIMIT, size=_draw(rng, reply_tokens), dtype=np.int32)
            response = np.concatenate([reply, [EOT_ID]]).astype(np.int32)
            rows.append(_row(conversation_id, k, prompt, response, timestamp))
            timestamp += 1.0
            history = np.concatenate([prompt, response]).astype(np.int32)
    return _frame(rows)


def identical_requests(count: int, prompt_tokens: int, reply_tokens: int = 8, seed: int = 0):
    """`count` single-turn requests with the same prompt (seed 002's experiment)."""
    rng = np.random.default_rng(seed)
    prompt = np.concatenate(
        [[BOS_ID], rng.integers(0, TEXT_ID_LIMIT, size=prompt_tokens - 1)]
    ).astype(np.int32)
    reply = np.concatenate([rng.integers(0, TEXT_ID_LIMIT, size=reply_tokens - 1), [EOT_ID]])
    rows = [
        _row(f"same{i:03d}", 0, prompt.copy(), reply.astype(np.int32), float(i))
        for i in range(count)
    ]
    return _frame(rows)


def _draw(rng: np.random.Generator, spec: int | tuple[int, int]) -> int:
    if isinstance(spec, tuple):
        return int(rng.integers(spec[0], spec[1] + 1))
    return int(spec)


def _row(conversation_id, turn, prompt, response, timestamp) -> dict:
    return {
        "request_id": f"{conversation_id}/{turn}",
        "conversation_id": conversation_id,
        "turn_index": turn,
        "prompt_ids": prompt,
        "response_ids": response,
        "prompt_tokens": int(prompt.shape[0]),
        "response_tokens": int(response.shape[0]),
        "timestamp": timestamp,
    }


def _frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    for column in ("turn_index", "prompt_tokens", "response_tokens"):
        frame[column] = frame[column].astype(np.int32)
    return frame
