"""`python -m analysis report`: execute the committed notebooks in order, then the HTML report."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "notebooks",
        nargs="*",
        help="notebook names or prefixes to run (default: all, in order), e.g. 04 05",
    )
    parser.add_argument("--no-html", action="store_true", help="skip the HTML export")


def main(args: argparse.Namespace) -> int:
    from analysis.errors import UsageError
    from analysis.report import execute, report_notebooks, to_html

    notebooks = report_notebooks()
    if args.notebooks:
        notebooks = [p for p in notebooks if any(p.name.startswith(s) for s in args.notebooks)]
        if not notebooks:
            raise UsageError(f"no notebook matches {' '.join(args.notebooks)} in notebooks/")
    for notebook in notebooks:
        print(f"executing {notebook.name} ...", flush=True)
        done = execute(notebook)
        print(f"  {notebook.name}: {done.seconds:.0f} s", flush=True)
    if not args.no_html:
        index = to_html(report_notebooks())
        print(f"report: {index}")
    return 0
