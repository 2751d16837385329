"""Llama chat templates: the Jinja text engines use, and the pieces the trace builder uses.

Default: Llama 3.1/3.2 Instruct's template, the one in the `chat_template` field of
`tokenizer_config.json` of meta-llama/Llama-3.2-1B-Instruct (Hugging Face hub), which vLLM's chat
endpoint renders for that model. `LLAMA32_CHAT_TEMPLATE` below is that text, character for
character (taken from a public copy of the file; the Llama 3.1 Instruct template differs only in
its tool handling and the missing `strftime_now` branch, and renders plain chats identically).
Every prompt starts with a system block, whether or not the conversation has a system message:

    <|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n
    Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n{system}<|eot_id|>

so about 26 tokens are shared by every prompt, and the date line changes with the day the
request is rendered (`strftime_now("%d %b %Y")`; "26 Jul 2024" where the renderer has no clock).
The project fixes the date (default: the template's own fallback) and records it.

Option: Llama 3 (3.0) Instruct's template (no system block unless the conversation has one).

Every piece between two special tokens is tokenised on its own by the tokenizer, so a prompt's
ids are the concatenation of its messages' ids: `analysis.data.traces` relies on that (and tests it
against `transformers.apply_chat_template` over `LLAMA32_CHAT_TEMPLATE`, byte for byte).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

BOS = "<|begin_of_text|>"
EOT = "<|eot_id|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"

KNOWLEDGE_CUTOFF = "December 2023"
DEFAULT_DATE = "26 Jul 2024"  # the template's own fallback when it cannot read the clock
DATE_FORMAT = "%d %b %Y"
TEMPLATE_NAMES = ("llama3.2", "llama3")
DEFAULT_TEMPLATE = "llama3.2"

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

LLAMA32_CHAT_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""  # noqa: E501


def header(role: str) -> str:
    """The text that opens a message of `role` (also the generation prompt for the assistant)."""
    return f"{START_HEADER}{role}{END_HEADER}\n\n"


def message_body(content: str) -> str:
    """A message's content as the template writes it: trimmed, closed by `<|eot_id|>`."""
    return f"{content.strip()}{EOT}"


def check_date(date: str) -> str:
    """`date` as the template writes it ("26 Jul 2024"), or a one-line error naming the fix."""
    try:
        parsed = datetime.strptime(date, DATE_FORMAT)
    except (TypeError, ValueError):
        raise ValueError(
            f"template date must look like {DEFAULT_DATE!r} (day, month abbreviation, year), "
            f"got {date!r}"
        ) from None
    if parsed.strftime(DATE_FORMAT) != date:
        raise ValueError(f"template date must be written {parsed.strftime(DATE_FORMAT)!r}")
    return date


@dataclass(frozen=True)
class ChatTemplate:
    """One template and, for Llama 3.2, the date its system block states."""

    name: str = DEFAULT_TEMPLATE
    date: str = DEFAULT_DATE  # only Llama 3.2's system block states a date

    def __post_init__(self) -> None:
        if self.name not in TEMPLATE_NAMES:
            raise ValueError(f"template must be one of {TEMPLATE_NAMES}, got {self.name!r}")
        check_date(self.date)

    @property
    def has_system_block(self) -> bool:
        """Whether every prompt opens with a system block (Llama 3.2), system message or not."""
        return self.name == "llama3.2"

    @property
    def jinja(self) -> str:
        """The reference Jinja text (the date comes from the renderer: see `engine_jinja`)."""
        return LLAMA32_CHAT_TEMPLATE if self.has_system_block else LLAMA3_CHAT_TEMPLATE

    def engine_jinja(self) -> str:
        """The Jinja text with this date fixed, for an engine's tokenizer_config.json: the
        served prompts then equal the trace's instead of following the server's clock."""
        if not self.has_system_block:
            return self.jinja
        return f'{{%- set date_string = "{self.date}" %}}\n' + self.jinja

    def system_preamble(self) -> str:
        """What Llama 3.2 writes before the system message's own text (empty for Llama 3)."""
        if not self.has_system_block:
            return ""
        return f"Cutting Knowledge Date: {KNOWLEDGE_CUTOFF}\nToday Date: {self.date}\n\n"

    def segment(self, role: str, content: str) -> str:
        """One message as the template writes it: header, body, `<|eot_id|>`."""
        if role == "system":
            return header(role) + self.system_preamble() + message_body(content)
        return header(role) + message_body(content)

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The template's output in plain Python (what `apply_chat_template` gives)."""
        pieces = [BOS]
        rest = list(messages)
        if self.has_system_block:
            system = rest.pop(0)["content"] if rest and rest[0]["role"] == "system" else ""
            pieces.append(self.segment("system", system))
        pieces += [self.segment(m["role"], m["content"]) for m in rest]
        if add_generation_prompt:
            pieces.append(header("assistant"))
        return "".join(pieces)

    def info(self) -> dict[str, str | None]:
        """What a trace manifest records: name, date, and a hash of what shapes the prompts."""
        date = self.date if self.has_system_block else None
        digest = hashlib.sha256(f"{self.jinja}\0{date}".encode()).hexdigest()
        return {"name": self.name, "date": date, "sha256": digest, "jinja": self.jinja}


DEFAULT = ChatTemplate()


def render(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The default template's (Llama 3.2, fixed date) output, for checks."""
    return DEFAULT.render(messages, add_generation_prompt)
