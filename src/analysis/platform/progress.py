"""Progress bars only where someone watches them: on an interactive terminal.

In a notebook run by papermill (or a CI log) a bar is noise: `tqdm.auto` warns that IProgress
(ipywidgets) is missing and then prints carriage-return lines that end up as blank stderr
outputs in the executed notebook and the HTML report. So the package's bars are plain tqdm,
shown only when stderr is a terminal, and the IProgress warning that libraries importing
`tqdm.auto` (vLLM, huggingface_hub) would print is filtered once, on `import analysis`.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable
from typing import Any

# tqdm.autonotebook's warning when ipywidgets is missing (a kernel without widgets).
IPROGRESS_WARNING = "IProgress not found"


def interactive() -> bool:
    """Whether stderr is a terminal (False in a notebook kernel, a pipe or a CI log)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


def bar(iterable: Iterable[Any] | None = None, *, enabled: bool = True, **kwargs: Any) -> Any:
    """A tqdm bar (same arguments) that is disabled unless `enabled` and stderr is a terminal.

    A call site switches with one line: `from analysis.platform.progress import bar as tqdm`.
    """
    from tqdm import tqdm

    disable = bool(kwargs.pop("disable", False)) or not enabled or not interactive()
    return tqdm(iterable, disable=disable, **kwargs)


def quiet_iprogress_warning() -> None:
    """Drop tqdm's IProgress warning (it only says that notebook widgets are not installed)."""
    warnings.filterwarnings("ignore", message=IPROGRESS_WARNING)
