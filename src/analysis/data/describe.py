"""Small tables that describe a data set, for the notebooks' figures and checked outputs."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from analysis.data.sharegpt import Conversation


def conversations_frame(conversations: Sequence[Conversation]) -> pd.DataFrame:
    """One row per conversation: its user turns and how long its messages are (characters)."""
    rows = []
    for conv in conversations:
        user = [m.text for m in conv.messages if m.role == "user"]
        assistant = [m.text for m in conv.messages if m.role == "assistant"]
        rows.append(
            {
                "conversation_id": conv.id,
                "user_turns": len(user),
                "messages": len(conv.messages),
                "user_chars": sum(map(len, user)),
                "assistant_chars": sum(map(len, assistant)),
                "has_system": conv.system is not None,
            }
        )
    return pd.DataFrame(rows)


def turn_count_table(frame: pd.DataFrame, top: int = 10) -> pd.DataFrame:
    """Conversations by number of user turns, the long tail folded into `>top`."""
    turns = frame["user_turns"].clip(upper=top + 1)
    counts = turns.value_counts().sort_index()
    labels = [str(t) if t <= top else f">{top}" for t in counts.index]
    return pd.DataFrame({"user_turns": labels, "conversations": counts.to_numpy()})
