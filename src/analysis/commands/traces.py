"""`python -m analysis traces`: build the multi- and single-turn traces under data/traces/, from
ShareGPT or from an OpenAI chat-completions request log (`--source openai-jsonl --path LOG`).

A build whose manifest records the same request (data file, parameters, tokenizer, template),
with files that are the ones it describes, is not redone unless --force is given. Both traces and
the manifest are replaced as one set, one build at a time per folder: an interrupted or failed
build leaves the previous one; only a kill in the middle of the renames leaves a mix, which readers
refuse and the next build replaces (`analysis.data.traces.sets`).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        choices=("package", "hub", "file", "openai-jsonl"),
        default="package",
        help="ShareGPT: the offline package (default), the hub, or a local file (--path); "
        "openai-jsonl: an OpenAI chat-completions request log (--path), one request a line, "
        "rebuilt into conversations (analysis.data.chatlogs)",
    )
    parser.add_argument(
        "--path", help="the ShareGPT JSON/JSONL file (--source file) or request log (openai-jsonl)"
    )
    parser.add_argument(
        "--max-conversations", type=int, help="the first N conversations only (default: all)"
    )
    parser.add_argument(
        "--min-turns", type=int, default=1, help="leave out conversations with fewer user turns"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=8192,
        help="longest request accepted; prompts must be shorter (default 8192)",
    )
    parser.add_argument(
        "--policy",
        choices=("exclude", "truncate"),
        default="exclude",
        help="the first turn of a conversation that does not fit: dropped (default) or cut",
    )
    parser.add_argument(
        "--single-turn",
        choices=("first", "sampled"),
        default="first",
        help="single-turn requests: first turns (default) or one random turn without history",
    )
    parser.add_argument(
        "--tokenizer",
        help="a tokenizer.json file or folder, or a hub model id (default: packaged Llama 3.2)",
    )
    parser.add_argument(
        "--template",
        choices=("llama3.2", "llama3"),
        default="llama3.2",
        help="chat template: Llama 3.1/3.2 Instruct's (default, system block with a date) or 3.0's",
    )
    parser.add_argument(
        "--model",
        help="a model folder (tokenizer.json and tokenizer_config.json) or a hub model id: its "
        "own tokenizer and "
        "chat template render every turn, as vLLM's chat endpoint would (instead of --tokenizer "
        "and --template; slower, and prefix breaks are counted)",
    )
    parser.add_argument(
        "--template-date",
        default="26 Jul 2024",
        help="the date Llama 3.2's system block states (default: the template's own fallback)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --single-turn sampled")
    parser.add_argument("--out", type=Path, help="output folder (default: data/traces)")
    parser.add_argument("--jsonl", action="store_true", help="also export the seeds' JSONL format")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def main(args: argparse.Namespace) -> int:
    from analysis.data.traces import TraceOptions, ensure_traces
    from analysis.platform.errors import UsageError
    from analysis.platform.paths import traces_dir

    if args.model is not None:
        from analysis.data.template_render import model_files

        if args.tokenizer is not None:
            raise UsageError("--model brings its own tokenizer: leave out --tokenizer")
        args.model = model_files(args.model)
        args.tokenizer = args.template = str(args.model.resolve())
    try:
        options = TraceOptions(
            max_model_len=args.max_model_len,
            policy=args.policy,
            single_turn=args.single_turn,
            seed=args.seed,
            min_turns=args.min_turns,
            max_conversations=args.max_conversations,
            tokenizer=args.tokenizer,
            template=args.template,
            template_date=args.template_date,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    build = ensure_traces(
        options,
        args.source,
        args.path,
        args.out,
        jsonl=args.jsonl,
        force=args.force,
        progress=not args.no_progress,
    )
    if not build.built:
        out = args.out or traces_dir()
        print(f"traces in {out} are up to date (same data, parameters and tokenizer); --force")
        print(build.summary())
        return 0
    print(build.load_report.summary())
    print(build.summary())
    seconds = build.manifest["seconds"]
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items() if k not in ("total", "save"))
    print(
        f"built in {seconds['total']:.1f} s ({parts}) after loading in "
        f"{build.load_report.seconds:.1f} s"
    )
    for name, path in build.paths.items():
        print(f"  {name}: {path}")
    return 0
