"""The Llama 3 chat template: the Jinja text engines use, and the pieces the trace builder uses.

The packaged Llama 3.2 tokenizer ships without a chat template. We use Llama 3 Instruct's own
(messages rendered as `<|start_header_id|>ROLE<|end_header_id|>\\n\\nTEXT<|eot_id|>`, BOS first).
Every piece between two special tokens is tokenised on its own by the tokenizer, so a prompt's
ids are the concatenation of its messages' ids: `analysis.traces` relies on that (and tests it).
"""

from __future__ import annotations

BOS = "<|begin_of_text|>"
EOT = "<|eot_id|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"

LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)


def header(role: str) -> str:
    """The text that opens a message of `role` (also the generation prompt for the assistant)."""
    return f"{START_HEADER}{role}{END_HEADER}\n\n"


def message_body(content: str) -> str:
    """A message's content as the template writes it: trimmed, closed by `<|eot_id|>`."""
    return f"{content.strip()}{EOT}"


def render(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The template's output in plain Python (what `apply_chat_template` gives), for checks."""
    text = BOS + "".join(header(m["role"]) + message_body(m["content"]) for m in messages)
    return text + header("assistant") if add_generation_prompt else text
