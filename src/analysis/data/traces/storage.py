"""Traces on disk: the Parquet schema, writing and loading one trace, saving a build with its
manifest as one set (`sets`), and the JSONL export.

A module of its own because readers of a saved trace (runs, sweeps, bounds, the load
generator) need only this, never the builder and its tokenizer. `load_trace` refuses a file of
a build that is not the one the manifest beside it describes (a mixed or interrupted build).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.data.chat_template import EOT
from analysis.data.tokenizer import load_tokenizer, token_id
from analysis.data.traces.check import check_trace
from analysis.data.traces.options import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    TRACE_COLUMNS,
    TRACE_NAMES,
    TraceSet,
    template_info,
)
from analysis.data.traces.sets import (
    file_entry,
    matches_entry,
    remove_stale_temps,
    set_lock,
    staged_path,
    swap_in,
)
from analysis.platform.errors import TraceError

if TYPE_CHECKING:
    import pyarrow as pa
    from tokenizers import Tokenizer

TRACE_FILES = tuple(f"{name}.parquet" for name in TRACE_NAMES)  # what readers load
EXPORT_FILES = tuple(f"{name}.jsonl" for name in TRACE_NAMES)


def trace_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("request_id", pa.string()),
            ("conversation_id", pa.string()),
            ("turn_index", pa.int32()),
            ("prompt_ids", pa.list_(pa.int32())),
            ("response_ids", pa.list_(pa.int32())),
            ("prompt_tokens", pa.int32()),
            ("response_tokens", pa.int32()),
            ("timestamp", pa.float64()),
        ]
    )


def trace_table(frame: pd.DataFrame) -> pa.Table:
    """The frame as an Arrow table of the trace schema (list columns joined in one copy)."""
    import pyarrow as pa

    columns = {}
    for name, kind in zip(trace_schema().names, trace_schema().types, strict=True):
        if pa.types.is_list(kind):
            columns[name] = _list_array(frame[name])
        else:
            values = frame[name].to_numpy()
            columns[name] = pa.array(values.tolist() if kind == pa.string() else values, kind)
    return pa.table(columns, schema=trace_schema())


def _list_array(column: pd.Series) -> pa.Array:
    import pyarrow as pa

    arrays = [np.asarray(ids, dtype=np.int32) for ids in column]
    lengths = np.fromiter((a.size for a in arrays), np.int64, len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
    if offsets[-1] >= 2**31:
        raise TraceError(f"a trace of {offsets[-1]:,} tokens exceeds Parquet list<int32> offsets")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))


def write_trace(path: Path, frame: pd.DataFrame) -> None:
    """One trace as Parquet, written atomically."""
    import pyarrow.parquet as pq

    from analysis.platform.manifest import atomic_path

    table = trace_table(frame)
    with atomic_path(Path(path)) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def limit_trace(trace: pd.DataFrame, limit: int | None) -> pd.DataFrame:
    """The first `limit` conversations (in order of first appearance), all their turns."""
    if limit is None:
        return trace.reset_index(drop=True)
    conversation_ids = pd.unique(trace["conversation_id"])[:limit]
    return trace[trace["conversation_id"].isin(set(conversation_ids))].reset_index(drop=True)


def load_trace(path: str | Path) -> pd.DataFrame:
    """One trace (Parquet) as a frame with the schema's columns, or a one-line TraceError
    (also for a trace `check_trace` refuses: every reader of a file shares that check)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace {path} not found: build it with `python -m analysis traces`")
    _refuse_a_mixed_build(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"{path} is not a readable Parquet trace: {exc}") from None
    missing = [c for c in TRACE_COLUMNS if c not in table.column_names]
    if missing:
        raise TraceError(f"trace {path} lacks columns {missing}; rebuild it")
    table = table.select(list(TRACE_COLUMNS))
    wrong = [
        f"{f.name} is {table.schema.field(f.name).type}, not {f.type}"
        for f in trace_schema()
        if not _same_kind(table.schema.field(f.name).type, f.type)
    ]
    try:
        if wrong:  # Arrow would parse "12" as 12 or cut 1.5 to 1: refuse instead
            raise pa.ArrowInvalid("; ".join(wrong))
        table = table.cast(trace_schema())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise TraceError(
            f"trace {path} has columns of the wrong type ({exc}); rebuild it"
        ) from None
    for column in ("prompt_ids", "response_ids"):
        values = table.column(column).combine_chunks().flatten()
        if len(values) and pc.min(values).as_py() < 0:
            raise TraceError(f"trace {path}: {column} holds negative token ids; rebuild it")
    frame = table.to_pandas()
    check_trace(frame, str(path))
    return frame


def _refuse_a_mixed_build(path: Path) -> None:
    """A trace the builder wrote must be the file the manifest beside it describes, and one
    without a manifest must not sit beside the builder's other files (an interrupted build).
    A Parquet file of the user's own, unnamed by a trace manifest beside it, is not checked."""
    manifest = load_manifest(path.parent)
    rebuild = f"rebuild it with `python -m analysis traces --out {path.parent}` and its options"
    if not isinstance(manifest, dict) or manifest.get("kind") != "traces":
        if path.name in TRACE_FILES and _left_by_a_build(path.parent):
            raise TraceError(
                f"trace {path} has no {MANIFEST_NAME} beside it but the trace builder's other "
                f"files are there (an interrupted build); {rebuild}"
            )
        return
    entries = {entry.get("file"): entry for entry in manifest.get("files", {}).values()}
    entry = entries.get(path.name)
    if entry is None and path.name not in TRACE_FILES:
        return  # a trace of the user's own beside a build
    if entry is None or not matches_entry(path, entry):
        raise TraceError(
            f"trace {path} is not the file {path.parent / MANIFEST_NAME} describes (its sha256 "
            f"differs: a mixed set left by an interrupted or concurrent build); {rebuild}"
        )


def _left_by_a_build(folder: Path) -> bool:
    """Whether the trace builder's files are in `folder`: both traces, or a temporary file."""
    names = (*TRACE_FILES, *EXPORT_FILES, MANIFEST_NAME)
    temporary = any(f".{n}." in p.name for p in folder.glob(".*.tmp") for n in names)
    return temporary or all((folder / name).is_file() for name in TRACE_FILES)


def set_is_intact(out: Path, manifest: dict[str, Any], names: Sequence[str]) -> bool:
    """Whether each file of `names` is in `out` and is the one `manifest` describes."""
    entries = {entry.get("file"): entry for entry in manifest.get("files", {}).values()}
    return all(
        (out / name).is_file() and name in entries and matches_entry(out / name, entries[name])
        for name in names
    )


def _same_kind(actual: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a column can be cast to the schema's type without reinterpreting it: integers
    stay integers (any width, overflow is checked by the cast), strings stay strings."""
    import pyarrow as pa

    if pa.types.is_list(wanted) or pa.types.is_large_list(wanted):
        list_like = pa.types.is_list(actual) or pa.types.is_large_list(actual)
        return list_like and _same_kind(actual.value_type, wanted.value_type)
    if pa.types.is_integer(wanted):
        return pa.types.is_integer(actual)
    if pa.types.is_floating(wanted):
        return pa.types.is_integer(actual) or pa.types.is_floating(actual)
    if pa.types.is_string(wanted):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    return actual == wanted


def save_traces(
    trace_set: TraceSet,
    out_dir: str | Path | None = None,
    manifest_extra: dict[str, Any] | None = None,
    *,
    jsonl: bool = False,
    progress: bool = True,
) -> dict[str, Path]:
    """Write both traces (Parquet), optionally their JSONL export, and the manifest as one set:
    under the folder's lock, staged under temporary names, then swapped in, manifest last (see
    `sets`). A failed save leaves the previous build as it was.

    The JSONL export repeats each prompt's whole history as text (hundreds of MB for the whole
    data set): opt in.
    """
    from analysis.platform.paths import traces_dir

    out = Path(out_dir) if out_dir is not None else traces_dir()
    with set_lock(out):
        return write_trace_set(trace_set, out, manifest_extra, jsonl=jsonl, progress=progress)


def write_trace_set(
    trace_set: TraceSet,
    out: Path,
    manifest_extra: dict[str, Any] | None = None,
    *,
    jsonl: bool = False,
    progress: bool = True,
) -> dict[str, Path]:
    """`save_traces` for a caller that already holds `set_lock(out)` (`ensure_traces`)."""
    from analysis.platform.manifest import git_commit, package_versions, write_json

    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out, (*TRACE_FILES, *EXPORT_FILES, MANIFEST_NAME))
    staged: list[tuple[Path, Path]] = []
    started = time.perf_counter()
    try:
        files = _stage_traces(trace_set, out, staged, jsonl=jsonl, progress=progress)
        manifest = {
            "kind": "traces",
            "format_version": FORMAT_VERSION,
            "files": files,
            "counts": trace_set.counts,
            "parameters": trace_set.options.to_dict(),
            "tokenizer": trace_set.tokenizer.to_dict(),
            "template": template_info(trace_set.options),
            "seconds": {**trace_set.seconds, "save": round(time.perf_counter() - started, 3)},
            "package_versions": package_versions(),
            "git_commit": git_commit(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **(manifest_extra or {}),
        }
        staged.append((staged_path(out / MANIFEST_NAME), out / MANIFEST_NAME))
        write_json(staged[-1][0], manifest)
        swap_in(staged)
    except OSError as exc:
        raise TraceError(
            f"cannot write the traces into {out} ({exc}); the previous build, if any, is left "
            "as it was: free space or choose another --out"
        ) from None
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    paths = {name: out / entry["file"] for name, entry in files.items()}
    for name in EXPORT_FILES:
        if not jsonl:  # never leave an export of an older build beside
            (out / name).unlink(missing_ok=True)
    return {**paths, "manifest": out / MANIFEST_NAME}


def _stage_traces(
    trace_set: TraceSet,
    out: Path,
    staged: list[tuple[Path, Path]],
    *,
    jsonl: bool,
    progress: bool,
) -> dict[str, Any]:
    """Write each trace (and its JSONL export) to a temporary file beside its target, adding
    (temporary, target) to `staged`; return the manifest's entries of the files."""
    files: dict[str, Any] = {}
    for name, frame in trace_set.frames().items():
        target = out / f"{name}.parquet"
        staged.append((staged_path(target), target))
        write_trace(staged[-1][0], frame)
        files[name] = file_entry(staged[-1][0], target.name, rows=len(frame))
        if jsonl:
            target = out / f"{name}.jsonl"
            staged.append((staged_path(target), target))
            tokenizer = trace_set.tokenizer_object or load_tokenizer(trace_set.options.tokenizer)
            export_jsonl(frame, staged[-1][0], tokenizer, progress=progress, label=target.name)
            files[f"{name}_jsonl"] = file_entry(staged[-1][0], target.name, rows=len(frame))
    return files


def load_manifest(out_dir: str | Path | None = None) -> dict[str, Any] | None:
    """The manifest of a finished build in `out_dir`, or None if there is none."""
    from analysis.platform.paths import traces_dir

    path = (Path(out_dir) if out_dir is not None else traces_dir()) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TraceError(
            f"{path} is not a readable manifest ({exc}); rebuild with --force"
        ) from None


def export_jsonl(
    frame: pd.DataFrame,
    path: str | Path,
    tokenizer: Tokenizer,
    *,
    batch: int = 512,
    progress: bool = True,
    label: str | None = None,
) -> Path:
    """The seeds' JSONL (prompt, response, conversation_id, turn_index, timestamp) of a trace.

    Texts are decoded from the ids (lossless for byte-level BPE): "prompt" is the rendered
    prompt, special tokens included; "response" the recorded (possibly capped) reply without
    its closing <|eot_id|>. `label`: the name the progress bar shows (default: the file's).
    """
    from tqdm import tqdm

    from analysis.platform.manifest import atomic_path

    eot = token_id(tokenizer, EOT)
    path = Path(path)
    rows = len(frame)
    with (
        atomic_path(path) as tmp,
        open(tmp, "w", encoding="utf-8") as handle,
        tqdm(
            total=rows,
            unit="req",
            desc=f"export {label or path.name}",
            disable=None if progress else True,
        ) as bar,
    ):
        for start in range(0, rows, batch):
            part = frame.iloc[start : start + batch]
            prompts = tokenizer.decode_batch(
                [np.asarray(ids).tolist() for ids in part["prompt_ids"]],
                skip_special_tokens=False,
            )
            replies = tokenizer.decode_batch(
                [_without_eot(ids, eot) for ids in part["response_ids"]],
                skip_special_tokens=False,
            )
            for row, prompt, reply in zip(
                part.itertuples(index=False), prompts, replies, strict=True
            ):
                record = {
                    "prompt": prompt,
                    "response": reply,
                    "conversation_id": row.conversation_id,
                    "turn_index": int(row.turn_index),
                    "timestamp": float(row.timestamp),
                }
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            bar.update(len(part))
    return path


def _without_eot(ids: Any, eot: int) -> list[int]:
    values = np.asarray(ids).tolist()
    return values[:-1] if values and values[-1] == eot else values
