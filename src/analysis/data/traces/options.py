"""What shapes a trace build and what a build yields: the options, the counts of the length
policy, the set of both traces, and the constants the other steps share.

A module of its own because building, saving and the cached build all speak in these terms;
keeping them apart from the builder lets storage and the cache use them without the builder.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from analysis.data.chat_template import DEFAULT_DATE, DEFAULT_TEMPLATE, ChatTemplate
from analysis.data.tokenizer import TokenizerSource

if TYPE_CHECKING:
    from tokenizers import Tokenizer

POLICIES = ("exclude", "truncate")
SINGLE_TURN_MODES = ("first", "sampled")
TRACE_NAMES = ("multi_turn", "single_turn")
MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 2  # bump when the same inputs would give different traces

TRACE_COLUMNS = (
    "request_id",
    "conversation_id",
    "turn_index",
    "prompt_ids",
    "response_ids",
    "prompt_tokens",
    "response_tokens",
    "timestamp",
)


def is_model_folder(template: str) -> bool:
    """Whether `template` is a folder with a tokenizer_config.json (not a template's name)."""
    from pathlib import Path

    return (Path(template).expanduser() / "tokenizer_config.json").is_file()


@dataclass(frozen=True)
class TraceOptions:
    """Everything that shapes a trace besides the conversations and the tokenizer file."""

    max_model_len: int = 8192
    policy: str = "exclude"  # "exclude" | "truncate": what happens to a turn that does not fit
    single_turn: str = "first"  # "first" | "sampled": which turn a single-turn request is
    seed: int = 0  # for single_turn="sampled"
    min_turns: int = 1  # conversations with fewer user turns are left out of both traces
    max_conversations: int | None = None  # the first N conversations only
    tokenizer: str | None = None  # None: the packaged Llama 3.2; a tokenizer.json path; a hub id
    arrival_interval_s: float = 1.0  # synthetic timestamps: row i arrives at i * this
    template: str = DEFAULT_TEMPLATE  # "llama3.2" (system block with a date) | "llama3"
    template_date: str = DEFAULT_DATE  # Llama 3.2's "Today Date", e.g. "26 Jul 2024"

    def __post_init__(self) -> None:
        if not self.uses_model_template:
            ChatTemplate(self.template, self.template_date)  # validates both
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.policy == "truncate" and self.uses_model_template:
            raise ValueError(
                "policy 'truncate' cuts a prompt assembled the Llama way; a model's own chat "
                "template (--model) renders whole turns, so a turn that does not fit is left "
                "out: use --policy exclude (the default) or raise --max-model-len"
            )
        if self.single_turn not in SINGLE_TURN_MODES:
            raise ValueError(
                f"single_turn must be one of {SINGLE_TURN_MODES}, got {self.single_turn!r}"
            )
        if self.max_model_len < 16:
            raise ValueError(f"max_model_len must be at least 16, got {self.max_model_len}")
        if self.min_turns < 1:
            raise ValueError(f"min_turns must be at least 1, got {self.min_turns}")
        if self.max_conversations is not None and self.max_conversations < 0:
            raise ValueError(f"max_conversations must be >= 0, got {self.max_conversations}")
        if self.arrival_interval_s < 0:
            raise ValueError(f"arrival_interval_s must be >= 0, got {self.arrival_interval_s}")

    @property
    def uses_model_template(self) -> bool:
        """`template` names a model folder: its own chat_template renders every turn
        (`analysis.data.traces.templated`) instead of the Llama assembly."""
        return is_model_folder(self.template)

    @property
    def chat_template(self) -> ChatTemplate:
        return ChatTemplate(self.template, self.template_date)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TraceCounts:
    """What the length policy did to one trace: every candidate request is kept or counted."""

    requests_candidate: int = 0
    requests: int = 0
    requests_excluded: int = 0  # dropped: the prompt does not fit max_model_len
    requests_truncated: int = 0  # kept with their last user message cut (policy "truncate")
    conversations: int = 0  # with at least one request kept
    conversations_cut: int = 0  # some requests kept, later ones dropped
    conversations_excluded: int = 0  # every request dropped
    prompt_tokens: int = 0
    prompt_tokens_excluded: int = 0  # whole prompts of the dropped requests
    prompt_tokens_truncated: int = 0  # tokens cut from truncated prompts
    response_tokens: int = 0
    responses_capped: int = 0  # replies cut so that prompt + response <= max_model_len
    response_tokens_capped: int = 0
    responses_empty: int = 0  # the conversation ends on this user message

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class TraceSet:
    """Both traces of one build, with what is needed to save and explain them."""

    multi: pd.DataFrame
    single: pd.DataFrame
    counts: dict[str, Any]  # "conversations" (selection), "multi_turn", "single_turn"
    options: TraceOptions
    tokenizer: TokenizerSource
    seconds: dict[str, float] = field(default_factory=dict)
    tokenizer_object: Tokenizer | None = field(default=None, repr=False)

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"multi_turn": self.multi, "single_turn": self.single}

    def summary(self) -> str:
        """A few lines, deterministic (no timings), for logs and notebook outputs."""
        return summarize_counts(self.counts, self.options.to_dict())


def summarize_counts(counts: dict[str, Any], parameters: dict[str, Any]) -> str:
    """The counts of a build (a TraceSet's or a manifest's) in a few lines."""
    lines = [_selection_line(counts["conversations"])]
    for name in TRACE_NAMES:
        c = counts[name]
        lines.append(
            f"{name}: {c['requests']:,} requests in {c['conversations']:,} conversations, "
            f"{c['prompt_tokens']:,} prompt tokens; max_model_len "
            f"{parameters['max_model_len']} ({parameters['policy']}): "
            f"{c['requests_excluded']:,} requests excluded, "
            f"{c['requests_truncated']:,} truncated, "
            f"{c['conversations_cut']:,} conversations cut, "
            f"{c['conversations_excluded']:,} excluded, "
            f"{c['responses_capped']:,} replies capped"
        )
    return "\n".join(lines)


def _selection_line(c: dict[str, int]) -> str:
    return (
        f"conversations: {c['used']:,} used of {c['input']:,} "
        f"({c['skipped_max_conversations']:,} beyond max_conversations, "
        f"{c['skipped_min_turns']:,} with fewer than the minimum turns)"
    )


def template_info(options: TraceOptions | None = None) -> dict[str, str | None]:
    """The template a trace was rendered with: name, date (Llama 3.2), hash, Jinja text."""
    options = options or TraceOptions()
    if options.uses_model_template:
        import hashlib

        from analysis.data.template_render import template_from_folder

        template = template_from_folder(options.template)
        digest = hashlib.sha256(template.jinja.encode()).hexdigest()
        return {
            "name": template.name,
            "date": None,
            "sha256": digest,
            "jinja": template.jinja,
            "source": template.source,
        }
    return options.chat_template.info()
