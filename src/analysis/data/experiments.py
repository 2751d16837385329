"""Small workloads built for one explanatory experiment each, in the trace schema.

The engines take these frames exactly like traces built from ShareGPT.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis.data.chat_template import DEFAULT, ChatTemplate

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
    from analysis.data.tokenizer import load_tokenizer

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


# Seed 001's 3-turn toy: prompts of 120, 230 and 340 characters (its log), and what it printed.
SEED_001_TOY_BLOCKS = ((0, 3), (2, 5), (4, 7))  # (blocks hit, blocks) per turn, block size 8
SEED_001_TOY_TURNS = (
    ("What is prefix caching in LLM serving? Explain briefly, please.", "It reuses KV."),
    ("And why do whole blocks matter for hits? Say more about it.", "Only full blocks hash."),
    ("So what happens to the last partial block of a prompt then?", "It is recomputed."),
)


def toy_conversation_trace(
    turns: Sequence[tuple[str, str]], tokenizer=None, template: ChatTemplate = DEFAULT
) -> pd.DataFrame:
    """One conversation in the trace schema: turn k's prompt is the template over turns 0..k-1
    (user message and reply) and turn k's user message; its response is its reply + eot."""
    from analysis.data.tokenizer import load_tokenizer

    tokenizer = tokenizer or load_tokenizer()
    rows, messages = [], []
    for k, (user, reply) in enumerate(turns):
        messages.append({"role": "user", "content": user})
        prompt = tokenizer.encode(template.render(messages), add_special_tokens=False).ids
        response = tokenizer.encode(reply.strip() + "<|eot_id|>", add_special_tokens=False).ids
        messages.append({"role": "assistant", "content": reply})
        rows.append(
            {
                "request_id": f"toy/{k}",
                "conversation_id": "toy",
                "turn_index": k,
                "prompt_ids": np.asarray(prompt, dtype=np.int32),
                "response_ids": np.asarray(response, dtype=np.int32),
                "prompt_tokens": len(prompt),
                "response_tokens": len(response),
                "timestamp": float(k),
            }
        )
    return pd.DataFrame(rows).astype(
        {"turn_index": np.int32, "prompt_tokens": np.int32, "response_tokens": np.int32}
    )


def seed_001_filter(trace: pd.DataFrame, max_tokens: int = 800, min_turns: int = 2) -> pd.DataFrame:
    """Seed 001's selection: conversations with at least `min_turns` requests, every prompt
    at most `max_tokens` tokens (its `all(turn['token_count'] <= 800)`), in trace order."""
    grouped = trace.groupby("conversation_id", sort=False)["prompt_tokens"]
    keep = (grouped.transform("size") >= min_turns) & (grouped.transform("max") <= max_tokens)
    return trace[keep].reset_index(drop=True)


SEED_001_LENGTH_BINS = {
    "0-200": 35.0,
    "200-400": 25.0,
    "400-600": 18.0,
    "600-800": 12.0,
    "800+": 10.0,
}  # % of multi-turn prompts, seed 001's histogram


def length_bin_shares(prompt_tokens: Sequence[int] | np.ndarray) -> pd.Series:
    """% of prompts in seed 001's token-length bins (0-200, 200-400, ..., 800+)."""
    tokens = np.asarray(prompt_tokens)
    edges = [0, 200, 400, 600, 800, np.inf]
    counts = np.histogram(tokens, bins=edges)[0]
    return pd.Series(100 * counts / max(len(tokens), 1), index=list(SEED_001_LENGTH_BINS))


# Seed 001's printed results (its log, block size 8, V0 engine): its 77 filtered requests per
# trace, of which 62 single-turn and 23 multi-turn completed. Strings, as the seed printed them.
SEED_001_RESULTS = {
    "single-turn": {
        "requests completed": "62 of 77",
        "blocks hit / blocks": "3 / 308",
        "correct hit rate (first prefill)": "0.97%",
        "vLLM GPU hit rate": "74.14%",
        "vLLM CPU hit rate": "0.00%",
    },
    "multi-turn": {
        "requests completed": "23 of 77",
        "blocks hit / blocks": "30 / 128",
        "correct hit rate (first prefill)": "23.44%",
        "vLLM GPU hit rate": "81.18%",
        "vLLM CPU hit rate": "0.00%",
    },
}

# Seed 001's "Task 2" table (its "Cache Block Hit Statistics"), as printed.
SEED_001_TASK2 = {
    "single-turn": {
        "blocks hit": "3",
        "hits per block (mean)": "1.00",
        "hits per block (max)": "1",
        "total block reuses": "0",
    },
    "multi-turn": {
        "blocks hit": "16",
        "hits per block (mean)": "1.88",
        "hits per block (max)": "4",
        "total block reuses": "14",
    },
}
