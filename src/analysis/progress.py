"""Progress bars only where someone watches them: on an interactive terminal.

In a papermill or nbval kernel, a pipe or CI, a bar is noise in the executed notebook (one
line per redraw, a blank line when it closes) and `tqdm.auto` adds a widget warning, so
there the bars show nothing. Every bar of the package comes from `bar`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

# tqdm.auto's warning in a Jupyter kernel without ipywidgets; vLLM imports tqdm.auto too,
# so `analysis/__init__.py` filters it for the whole process.
WIDGET_WARNING = "IProgress not found"


def interactive() -> bool:
    """stderr is a terminal (False in a Jupyter kernel, a pipe or a CI log)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def bar(iterable: Iterable[Any] | None = None, *, enabled: bool | None = None, **kwargs: Any):
    """A plain-text tqdm bar on stderr when `enabled` is not False and stderr is a terminal;
    otherwise a silent one (same interface: update, close, iteration)."""
    from tqdm import tqdm  # not tqdm.auto: never the notebook widget

    show = enabled is not False and interactive()
    return tqdm(iterable, disable=not show, file=sys.stderr, **kwargs)
