"""What a chat template does to reuse: ideal hit rates per template, and the prefixes it breaks.

The same conversations go through each template (`analysis.data.traces.templated`); the
infinite-cache bound (replies cached, as a teacher-forced replay caches them) says how much
each template lets a cache reuse, and the per-turn rows say where the next prompt stopped
repeating what the engine had computed.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from analysis.data.traces.templated import TemplatedTraces
from analysis.metrics import bounds


def template_row(traces: TemplatedTraces, block_size: int) -> dict:
    """One template: its ideal multi- and single-turn hit rates and its breaks."""
    turns = traces.turns
    broken = turns[turns["break_kind"] != "none"]
    return {
        "template": traces.template,
        "requests": len(traces.multi),
        "multi_ideal": bounds.ideal_hit_rate(traces.multi, block_size, include_outputs=True),
        "single_ideal": bounds.ideal_hit_rate(traces.single, block_size, include_outputs=True),
        "later_turns": len(turns),
        "template_breaks": int((broken["break_kind"] == "template").sum()),
        "tokenizer_breaks": int((broken["break_kind"] == "tokenizer").sum()),
        "conversations_broken": int(broken["conversation_id"].nunique()),
    }


def template_table(all_traces: Iterable[TemplatedTraces], block_size: int) -> pd.DataFrame:
    return pd.DataFrame([template_row(traces, block_size) for traces in all_traces])


def template_reading(table: pd.DataFrame) -> str:
    """The reading of the template figure, every number from `table`."""
    rows = table.set_index("template")
    stable = rows[rows["template_breaks"] == 0]
    broken = rows[rows["template_breaks"] > 0]
    single = rows["single_ideal"]
    text = [
        f"**Reading.** Over the same {int(rows['requests'].iloc[0]):,} requests, the single-turn "
        f"ideal runs from {100 * single.min():.1f} % ({single.idxmin()}) to "
        f"{100 * single.max():.1f} % ({single.idxmax()}): the difference is the fixed "
        "preamble a template writes before every first prompt."
    ]
    if len(stable):
        text.append(
            f"{', '.join(stable.index)} re-render the history as it was: no later prompt "
            "departs from what the engine computed, and the multi-turn ideal is "
            + ", ".join(f"{100 * r.multi_ideal:.1f} % ({name})" for name, r in stable.iterrows())
            + "."
        )
    best = stable["multi_ideal"].max() if len(stable) else None
    for name, row in broken.iterrows():
        text.append(
            f"{name} departs in {int(row['template_breaks']):,} of {int(row['later_turns']):,} "
            f"later turns ({int(row['conversations_broken']):,} conversations); its multi-turn "
            f"ideal is {100 * row['multi_ideal']:.1f} %"
            + (
                f", against {100 * best:.1f} % for the best template that keeps prefixes."
                if best is not None
                else "."
            )
        )
    return " ".join(text)


def reasoning_drop_check(table: pd.DataFrame) -> tuple[str, bool, bool] | None:
    """Notebook 15's claim that dropping earlier reasoning (Qwen3's template, `chatml-reasoning`)
    costs multi-turn reuse: its ideal falls below ChatML's by more than a preamble alone moves
    the ideal (Llama 3.0 against 3.2, which differ only in their system preamble), since Qwen3's
    template also lacks Qwen2.5's default system message. `Checks.add`'s arguments, or None
    where the four templates did not all run."""
    rows = table.set_index("template")
    if not {"chatml", "chatml-reasoning", "llama3", "llama3.2"} <= set(rows.index):
        return None
    drop = rows.loc["chatml", "multi_ideal"] - rows.loc["chatml-reasoning", "multi_ideal"]
    preamble = abs(rows.loc["llama3.2", "multi_ideal"] - rows.loc["llama3", "multi_ideal"])
    return (
        "reasoning dropped: multi-turn ideal falls by more than a preamble moves it "
        f"({drop:.1%} vs {preamble:.1%})",
        True,
        bool(drop > preamble),
    )
