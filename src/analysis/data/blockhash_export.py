"""A token trace written as a block-hash trace, in the format of Alibaba's published traces.

The Qwen-Bailian traces of "KVCache Cache in the Wild" (ATC'25; github.com/alibaba-edu/
qwen-bailian-usagetraces-anon) give one JSON line per request: `chat_id`, `parent_chat_id`
(-1 for a first turn), `timestamp` (seconds), `input_length`, `output_length`, `type`, `turn`
(1 for a first turn) and `hash_ids`, one id per 16-token block of the prompt, ids remapped to
sequential integers. Writing a ShareGPT trace the same way lets every tool that reads those
traces read ours, and lets the project's own block-hash path be checked against the token
path on the same requests (tests/test_capacity_plan.py: equal bounds).

Ids here chain like vLLM's block hashes (a block's id depends on every token before it), so
equal ids at equal positions mean equal prefixes, which is how the importer reads them. A
partial last block gets an id of its own too, as the published traces give ceil(n / 16) ids.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

ALIBABA_BLOCK_SIZE = 16


def to_blockhash_records(trace: pd.DataFrame, block_size: int = ALIBABA_BLOCK_SIZE) -> list[dict]:
    """One Alibaba-format record per request of a token trace, in the trace's order."""
    ids: dict[bytes, int] = {}
    chat_of_previous_turn: dict[str, int] = {}
    records = []
    for chat_id, row in enumerate(trace.itertuples(index=False)):
        prompt = np.asarray(row.prompt_ids, dtype=np.int64)
        conversation = str(row.conversation_id)
        parent = chat_of_previous_turn.get(conversation, -1) if row.turn_index > 0 else -1
        chat_of_previous_turn[conversation] = chat_id
        records.append(
            {
                "chat_id": chat_id,
                "parent_chat_id": parent,
                "timestamp": float(getattr(row, "timestamp", chat_id)),
                "input_length": int(prompt.shape[0]),
                "output_length": len(row.response_ids),
                "type": "text",
                "turn": int(row.turn_index) + 1,
                "hash_ids": _chained_ids(prompt, block_size, ids),
            }
        )
    return records


def _chained_ids(prompt: np.ndarray, block_size: int, ids: dict[bytes, int]) -> list[int]:
    """Sequential ids of the prompt's blocks, each digest chained through its parent's."""
    out = []
    parent = b""
    for start in range(0, prompt.shape[0], block_size):
        digest = hashlib.sha256(parent + prompt[start : start + block_size].tobytes()).digest()
        out.append(ids.setdefault(digest, len(ids)))
        parent = digest
    return out


def write_blockhash_trace(
    trace: pd.DataFrame, path: str | Path, block_size: int = ALIBABA_BLOCK_SIZE
) -> Path:
    """The trace as an Alibaba-format JSON Lines file, written atomically."""
    from analysis.platform.manifest import atomic_path

    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for record in to_blockhash_records(trace, block_size):
            handle.write(json.dumps(record) + "\n")
    return path
