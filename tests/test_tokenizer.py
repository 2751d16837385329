"""The trace tokenizer: the packaged Llama 3.2 one by default, paths and hub ids as options."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from analysis.data.chat_template import header, message_body
from analysis.data.sharegpt import load_conversations
from analysis.data.tokenizer import (
    DEFAULT_TOKENIZER,
    TokenizerUnavailable,
    encode_texts,
    load_tokenizer,
    packaged_tokenizer_file,
    tokenizer_file,
    tokenizer_source,
)
from analysis.platform.errors import AnalysisError


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def real_texts() -> list[tuple[str, str]]:
    """(role, text) of the messages of the first 150 real ShareGPT conversations."""
    conversations, _ = load_conversations(max_conversations=150, progress=False)
    return [(m.role, m.text) for c in conversations for m in c.messages]


def test_default_is_the_packaged_llama_3_2_tokenizer(tokenizer):
    assert tokenizer.get_vocab_size(with_added_tokens=True) == 128_257
    assert tokenizer.token_to_id("<|begin_of_text|>") == 128_000
    assert tokenizer.token_to_id("<|eot_id|>") == 128_009
    source = tokenizer_source()
    assert source.name == DEFAULT_TOKENIZER
    assert source.file == str(packaged_tokenizer_file())
    assert len(source.sha256) == 64


def test_encoding_adds_no_bos_and_keeps_special_tokens(tokenizer):
    ids = tokenizer.encode("Hello world", add_special_tokens=False).ids
    assert 128_000 not in ids
    assert tokenizer.encode("<|begin_of_text|>Hi<|eot_id|>", add_special_tokens=False).ids[::2] == [
        128_000,
        128_009,
    ]


def test_a_path_or_folder_gives_the_same_tokenizer(tmp_path, tokenizer):
    copy = tmp_path / "tok"
    copy.mkdir()
    shutil.copy(packaged_tokenizer_file(), copy / "tokenizer.json")
    assert tokenizer_file(copy) == copy / "tokenizer.json"
    assert tokenizer_file(copy / "tokenizer.json") == copy / "tokenizer.json"
    text = "Prefix caching reuses KV blocks."
    expected = tokenizer.encode(text, add_special_tokens=False).ids
    assert load_tokenizer(copy).encode(text, add_special_tokens=False).ids == expected
    assert tokenizer_source(copy).sha256 == tokenizer_source().sha256


def test_missing_or_invalid_files_are_one_line_errors(tmp_path):
    with pytest.raises(TokenizerUnavailable, match="not found"):
        load_tokenizer(tmp_path / "nothing" / "tokenizer.json")
    with pytest.raises(TokenizerUnavailable, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(TokenizerUnavailable, match="not a tokenizers JSON") as caught:
        load_tokenizer(bad)
    assert "\n" not in str(caught.value)
    assert issubclass(TokenizerUnavailable, AnalysisError)  # the CLI prints it as one line


def test_unreachable_hub_id_names_the_offline_default(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(TokenizerUnavailable) as caught:
        load_tokenizer("meta-llama/Llama-3.2-1B-Instruct")
    message = str(caught.value)
    assert "meta-llama/Llama-3.2-1B-Instruct" in message
    assert DEFAULT_TOKENIZER in message and "offline" in message
    assert "\n" not in message


def test_encode_texts_matches_encoding_one_by_one(tokenizer, real_texts):
    texts = [header(role) + message_body(text) for role, text in real_texts[:300]]
    texts += ["", "<|eot_id|>", "🙂 émoji ünïcode 中文"]
    expected = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    for workers in (1, 2):
        encoded = encode_texts(tokenizer, texts, workers=workers, chunk_chars=2_000, progress=False)
        assert len(encoded) == len(texts)
        assert encoded.values.dtype == np.int32
        assert [encoded.ids(i).tolist() for i in range(len(texts))] == expected
        assert encoded.lengths.tolist() == [len(e) for e in expected]


def test_encode_texts_of_nothing(tokenizer):
    encoded = encode_texts(tokenizer, [], progress=False)
    assert len(encoded) == 0 and encoded.values.size == 0


def test_header_and_body_tokenise_apart_on_real_messages(tokenizer, real_texts):
    """Why a reply's ids can follow the assistant header's ids: the text after
    `<|end_header_id|>\\n\\n` never merges with the blank line (checked on real messages)."""
    checked = 0
    for role, text in real_texts[:400]:
        head = tokenizer.encode(header(role), add_special_tokens=False).ids
        body = tokenizer.encode(message_body(text), add_special_tokens=False).ids
        both = tokenizer.encode(header(role) + message_body(text), add_special_tokens=False).ids
        assert both == head + body
        checked += 1
    assert checked == min(400, len(real_texts)) > 100
