"""`python -m analysis <command>`: one entry point, one module per command under `commands/`."""

from __future__ import annotations

import argparse
import importlib
import sys

from analysis.platform.errors import AnalysisError

# command name -> (module under analysis.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "traces": ("traces", "build multi- and single-turn request traces from ShareGPT"),
    "run": ("run", "replay a trace through vLLM under one configuration"),
    "sweep": ("sweep", "run every point of a sweep grid (configs/*.toml)"),
    "bounds": ("bounds", "ideal, LRU and optimal hit rates of a trace, without an engine"),
    "plan": ("plan", "KV memory (blocks, GiB, GPUs) a trace needs for a target hit rate"),
    "serve-bench": ("serve_bench", "TTFT and throughput against a real vLLM server"),
    "calibrate": (
        "calibrate",
        "measure the real engine's step costs, fit replay's clock, validate",
    ),
    "predict": ("predict", "TTFT, TPOT and throughput from replay on a calibrated clock"),
    "gpu-check": ("gpu_check", "prove a GPU machine: real engine vs replay, then GPU timing"),
    "report": ("report", "re-execute the notebooks with papermill and build the HTML report"),
    "durations": ("durations", "where make test or make report spent its time: table and CSV"),
    "coverage": (
        "coverage",
        "line coverage make coverage measured: total, least covered files, CSV",
    ),
    "readme": ("readme", "rewrite README.md's generated blocks from committed notebook outputs"),
    "vllm": ("vllm_cli", "vLLM's own command line (serve, bench ...) in this environment"),
}
# Commands whose arguments, options included, all belong to another program's command line.
PASSTHROUGH = ("vllm",)


# The name the command modules used before the errors moved to analysis.platform.errors.
CommandError = AnalysisError


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported (all are listed in `--help`)."""
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(f"analysis.commands.{module_name}")
            module.configure(command_parser)
            command_parser.set_defaults(handler=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(_pass_through(argv, command))
    try:
        status = int(args.handler(args) or 0)
        sys.stdout.flush()  # a reader gone raises here, not in Python's flush at exit
        return status
    except AnalysisError as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing partial was kept", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of our output went away (`sweep --list | head`): stop quietly, as a Unix
    tool ended by SIGPIPE does, and point stdout at /dev/null so that Python's flush at exit
    does not raise again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + 13  # SIGPIPE


def _pass_through(argv: list[str], command: str | None) -> list[str]:
    """`argv` with `--` after a pass-through command's name, so that argparse hands on its
    options (`vllm --version`) instead of reading them as ours."""
    if command not in PASSTHROUGH:
        return argv
    after = argv.index(command) + 1
    if argv[after : after + 1] == ["--"]:
        return argv
    return [*argv[:after], "--", *argv[after:]]


def _one_line(exc: BaseException) -> str:
    """The message on one line: a multi-line message (a server log's tail) is joined with ' | '."""
    return " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
