"""Files kept only to skip a computation (notebook 16's offload tables, the serving
calibrations): one that cannot be read back whole (cut, corrupt) is computed again, with a note
naming it, as if it were missing."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def read_kept(path: Path, reader: Callable[[Path], T]) -> T | None:
    """`reader(path)`; None when the file is missing, or when it cannot be read, said on
    stderr (the caller computes it again and writes it whole)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return reader(path)
    except Exception as exc:  # json, pyarrow, a missing key: all mean a file not written whole
        reason = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{path} cannot be read ({reason}): computing it again", file=sys.stderr)
        return None
