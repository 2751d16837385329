"""Small workloads built for one explanatory experiment each, in the trace schema.

The engines take these frames exactly like traces built from ShareGPT.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis.chat_template import DEFAULT, ChatTemplate

# Seed 002's request: Qwen's default system prompt and a short Chinese essay request.
SEED_002_MESSAGES = (
    {
        "role": "system",
        "content": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    },
    {"role": "user", "content": "给我写一篇100字的春游作文"},
)


# Seed 002's log: "Avg prompt throughput: 4.0 tokens/s" over each 10 s interval that admitted one
# request, so its prompt had 35-44 tokens (4.0 is printed to one decimal); 40 is the middle.
SEED_002_PROMPT_TOKENS = 40
SEED_002_LOGGED_RATES = (0.0, 50.0, 66.7, 75.0, 80.0, 83.3, 85.7)  # %, one per request


def chat_prompt_ids(
    messages: Sequence[dict[str, str]], tokenizer=None, template: ChatTemplate = DEFAULT
) -> np.ndarray:
    """Token ids of a chat prompt (Llama 3.2 template by default, generation header included)."""
    from analysis.tokenizer import load_tokenizer

    tokenizer = tokenizer or load_tokenizer()
    ids = tokenizer.encode(template.render(list(messages)), add_special_tokens=False).ids
    return np.asarray(ids, dtype=np.int32)


def repeated_prompt_trace(
    prompt_ids: np.ndarray, count: int, reply_tokens: int = 8, reply_token: int = 11
) -> pd.DataFrame:
    """`count` independent requests with one prompt, each its own conversation, in order."""
    prompt = np.asarray(prompt_ids, dtype=np.int32)
    reply = np.full(reply_tokens, reply_token, dtype=np.int32)
    rows = [
        {
            "request_id": f"repeat{i:03d}/0",
            "conversation_id": f"repeat{i:03d}",
            "turn_index": 0,
            "prompt_ids": prompt.copy(),
            "response_ids": reply.copy(),
            "prompt_tokens": len(prompt),
            "response_tokens": reply_tokens,
            "timestamp": float(i),
        }
        for i in range(count)
    ]
    return pd.DataFrame(rows).astype(
        {"turn_index": np.int32, "prompt_tokens": np.int32, "response_tokens": np.int32}
    )


def prefix_hit_tokens(prompt_tokens: np.ndarray | int, block_size: int) -> np.ndarray | int:
    """What vLLM can hit of a prompt already fully cached: whole blocks, the last token excluded."""
    return (np.asarray(prompt_tokens) - 1) // block_size * block_size
