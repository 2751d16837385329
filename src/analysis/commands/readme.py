"""`python -m analysis readme`: rewrite README.md's generated blocks from the committed notebooks.

Each block between `<!-- generated:NAME begin -->` and `<!-- generated:NAME end -->` is rendered
from the outputs stored in the executed notebooks (`analysis.report.readme`); nothing is
re-executed. `--check` rewrites nothing and exits 1 when a block is out of date.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and name the blocks that differ from the notebooks' outputs",
    )
    parser.add_argument(
        "--path", type=Path, default=None, help="the markdown file (default: README.md)"
    )


def main(args: argparse.Namespace) -> int:
    import os
    import tempfile

    from analysis.report import readme

    path = args.path or readme.readme_path()
    markdown = path.read_text(encoding="utf-8")
    updated, changed = readme.update(markdown)
    names = [b.name for b in readme.blocks(markdown)]
    if args.check:
        if changed:
            print(f"{path.name}: out of date: {', '.join(changed)} (run python -m analysis readme)")
            return 1
        print(f"{path.name}: {len(names)} generated blocks up to date")
        return 0
    if changed:
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
        ) as handle:
            handle.write(updated)
        os.chmod(handle.name, path.stat().st_mode & 0o7777)
        os.replace(handle.name, path)
        print(f"{path.name}: rewrote {', '.join(changed)}")
    else:
        print(f"{path.name}: {len(names)} generated blocks already up to date")
    return 0
