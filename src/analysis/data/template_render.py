"""Any chat template, rendered as vLLM's chat endpoint renders it, and where it breaks prefixes.

vLLM's OpenAI server renders a request's messages with the model's Jinja `chat_template`
(`transformers`' `apply_chat_template`, text out) and tokenizes the text without adding
special tokens. Prefix caching then reuses turn k's blocks for turn k+1 only as far as turn
k+1's prompt repeats, token for token, what the engine computed for turn k: turn k's prompt
followed by the reply the model generated. Llama's and ChatML's templates re-render history
as it was. Others do not: Qwen3 and DeepSeek-R1 drop an earlier turn's reasoning from the
history, so turn k+1 departs from what the cache holds right where turn k's reply began; a
date or turn counter in the preamble departs near the start.

`render_conversation` renders every turn of a conversation through a template and finds,
per turn, the first token where the next prompt stops extending it, and whether the cause is
the template (the rendered text departs) or the tokenizer (the text extends, its tokens do
not: a reply's first or last characters merged with the template's markup). The trace builder
(`analysis.data.traces`) assembles Llama prompts piece by piece, which is fast and exact for
those templates; this module renders any template, turn by turn (slower), and says where the
fast assembly would be wrong.

Templates shipped (their texts below, sources cited): Llama 3.0 and 3.1/3.2 Instruct (from
`analysis.data.chat_template`), ChatML as Qwen2.5 Instruct writes it, and ChatML with Qwen3's
rule for reasoning (earlier turns keep only what follows `</think>`). A reasoning model's reply
is generated as `<think>\n{reasoning}\n</think>\n\n{answer}`; ShareGPT's replies are answers
only, so the reasoning is a stand-in text: where the next prompt departs does not depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.data.chat_template import LLAMA3_CHAT_TEMPLATE, ChatTemplate

# Qwen2.5-7B-Instruct's `chat_template` (tokenizer_config.json on the Hugging Face hub), its
# branch for plain chats (no tools): a default system message when the chat has none.
QWEN25_CHATML = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# ChatML with Qwen3's handling of reasoning (Qwen3's `chat_template`, plain chats): an assistant
# message before the last user message keeps only its text after `</think>`, stripped.
QWEN3_STYLE_CHATML = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(last_user=0) %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content %}"
    "{%- if loop.index0 < ns.last_user and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
REASONING_STANDIN = "Let me think about what is asked before I answer."


@dataclass(frozen=True)
class Template:
    """A chat template and what a model served with it emits."""

    name: str
    jinja: str
    source: str  # where the text comes from
    end_of_turn: str  # the token a reply ends with (its KV is never computed)
    reasoning: bool = False  # replies open with a <think> block
    special_tokens: tuple[str, ...] = ()  # markup the tokenizer must keep as single tokens
    variables: dict[str, Any] = field(default_factory=dict)  # passed to the renderer
    bos_token: str | None = "<|begin_of_text|>"  # what the template's `bos_token` writes


def templates() -> dict[str, Template]:
    """The templates this project ships, by name."""
    llama32 = ChatTemplate("llama3.2")
    return {
        "llama3": Template("llama3", LLAMA3_CHAT_TEMPLATE, "Meta Llama 3 Instruct", "<|eot_id|>"),
        "llama3.2": Template(
            "llama3.2",
            llama32.jinja,
            "Meta Llama 3.2 Instruct (fixed date)",
            "<|eot_id|>",
            variables={"date_string": llama32.date},
        ),
        "chatml": Template(
            "chatml", QWEN25_CHATML, "Qwen2.5 Instruct", "<|im_end|>", special_tokens=CHATML_TOKENS
        ),
        "chatml-reasoning": Template(
            "chatml-reasoning",
            QWEN3_STYLE_CHATML,
            "Qwen3 (earlier reasoning dropped)",
            "<|im_end|>",
            reasoning=True,
            special_tokens=(*CHATML_TOKENS, "<think>", "</think>"),
        ),
    }


class Renderer:
    """One template over one tokenizer: messages to text, text to ids, as vLLM's server does."""

    def __init__(self, template: Template, tokenizer_file: str | Path | None = None) -> None:
        from transformers import PreTrainedTokenizerFast

        from analysis.data.tokenizer import load_tokenizer

        self.template = template
        self.hf = PreTrainedTokenizerFast(  # a broken tokenizer.json: load_tokenizer's one line
            tokenizer_object=load_tokenizer(tokenizer_file), bos_token=template.bos_token
        )
        missing = [t for t in template.special_tokens if t not in self.hf.get_vocab()]
        if missing:  # markup the vocabulary lacks: single new ids, as the model's own has them
            self.hf.add_special_tokens({"additional_special_tokens": missing})
        self.end_of_turn = self._end_of_turn_id()

    def _end_of_turn_id(self) -> int:
        """The id every reply ends with; a token the vocabulary lacks has none (a reply would
        end with a null id), so it is refused here."""
        from analysis.platform.errors import TraceError

        token = self.template.end_of_turn
        if token not in self.hf.get_vocab():
            raise TraceError(
                f"the end-of-turn token {token!r} ({self.template.source}) is not in the "
                "tokenizer's vocabulary: name as eos_token a token its tokenizer.json has"
            )
        return int(self.hf.convert_tokens_to_ids(token))

    def text(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        from analysis.platform.errors import TraceError

        try:
            return self.hf.apply_chat_template(
                messages,
                chat_template=self.template.jinja,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **self.template.variables,
            )
        except Exception as exc:  # a template's own raise_exception or a Jinja error
            raise TraceError(f"template {self.template.name!r} failed to render: {exc}") from None

    def ids(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def generated(self, reply: str) -> str:
        """The reply as the model generates it (a reasoning model thinks first)."""
        if self.template.reasoning:
            return f"<think>\n{REASONING_STANDIN}\n</think>\n\n{reply}"
        return reply


@dataclass(frozen=True)
class RenderedTurn:
    """One turn: its prompt, what the model generated, and how the next prompt extends it."""

    prompt_ids: list[int]
    response_ids: list[int]  # the generated reply and its end-of-turn token
    next_extends: int | None  # tokens of prompt + reply the next prompt repeats (None: last)
    break_kind: str | None  # None, "template" (the text departs) or "tokenizer"


def render_conversation(
    renderer: Renderer, system: str | None, turns: list[tuple[str, str]]
) -> list[RenderedTurn]:
    """Every turn of a conversation (user text, reply text), rendered as a server would."""
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    texts, rendered = [], []
    for user, reply in turns:
        history.append({"role": "user", "content": user})
        prompt_text = renderer.text(history)
        generated = renderer.generated(reply)
        texts.append(prompt_text + generated)
        rendered.append(
            (renderer.ids(prompt_text), renderer.ids(generated) + [renderer.end_of_turn])
        )
        history.append({"role": "assistant", "content": generated})
    out = []
    for k, (prompt, response) in enumerate(rendered):
        extends, kind = None, None
        if k + 1 < len(rendered):
            held = prompt + response[:-1]  # the engine never computes the last token
            following = rendered[k + 1][0]
            extends = _common_prefix(held, following)
            if extends < len(held):
                kind = "tokenizer" if texts[k + 1].startswith(texts[k]) else "template"
        out.append(RenderedTurn(prompt, response, extends, kind))
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def template_from_folder(folder: str | Path) -> Template:
    """A model folder's own template: `chat_template` and `eos_token` of its
    tokenizer_config.json (the reply ends with the EOS token the folder names)."""
    import json

    from analysis.platform.errors import TraceError

    path = Path(folder) / "tokenizer_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TraceError(f"cannot read {path}: {exc}") from None
    jinja = config.get("chat_template")
    if isinstance(jinja, list):  # named templates: the default one
        jinja = next((t.get("template") for t in jinja if t.get("name") == "default"), None)
    if not isinstance(jinja, str) or not jinja.strip():
        raise TraceError(f"{path} has no chat_template: give a model folder that has one")
    eos, bos = (_token_text(config.get(name)) for name in ("eos_token", "bos_token"))
    if eos is None:
        raise TraceError(f"{path} names no eos_token: the end of a reply is unknown")
    return Template(Path(folder).name, jinja, str(path), eos, bos_token=bos)


def _token_text(value: Any) -> str | None:
    """A token as tokenizer_config.json writes it: a string, or {"content": ...}."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def model_files(name: str | Path) -> Path:
    """A folder with the model's tokenizer.json and tokenizer_config.json: `name` itself, or a
    hub model id's two files from the local cache or, when online, downloaded into it."""
    from analysis.platform.errors import TraceError

    folder = Path(name).expanduser()
    if folder.is_dir():
        if not (folder / "tokenizer_config.json").is_file():
            raise TraceError(
                f"{folder}: no tokenizer_config.json there; give a model folder with its "
                "tokenizer.json and tokenizer_config.json (chat_template), or a hub model id"
            )
        return folder
    from huggingface_hub import snapshot_download

    files = ["tokenizer.json", "tokenizer_config.json"]
    try:
        return Path(snapshot_download(str(name), allow_patterns=files, local_files_only=True))
    except Exception:  # not cached: the network, unless offline
        pass
    from analysis.data.tokenizer import _hub_offline

    if _hub_offline():
        raise TraceError(
            f"{name!r} is neither a model folder nor a hub model in the local cache, and "
            "HF_HUB_OFFLINE is set: give a folder, or fetch it once with HF_HUB_OFFLINE=0"
        )
    try:
        return Path(snapshot_download(str(name), allow_patterns=files))
    except Exception as exc:  # the network boundary: one line
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise TraceError(f"cannot get {name!r}'s tokenizer files from the hub: {reason}") from None
