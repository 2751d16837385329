"""The serving study's servers, kept across a run of notebooks: `make report`, `make study` and
nbval start the caching-on and caching-off servers once, before the first notebook that
measures on them, and stop them after the last (`analysis.serving.study.kept_servers`). Two vLLM
starts cost about 45 s on 2 cores; notebooks 08 and 10 used to pay them each.

A run with only one of those notebooks keeps nothing: that notebook starts and stops its own
pair, as when it runs alone.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

# The notebooks that measure on the serving study's two servers (notebook 12 reads what they
# cached).
MEASURING_NOTEBOOKS = ("08", "10")


class ServerKeeper:
    """`with ServerKeeper(notebooks) as keeper:` then `keeper.before(nb)` / `keeper.after(nb)`
    around each notebook, in order."""

    def __init__(self, notebooks: Sequence[Path], profile: str = "cpu") -> None:
        users = [Path(n).name for n in notebooks if Path(n).name[:2] in MEASURING_NOTEBOOKS]
        self.first, self.last = (users[0], users[-1]) if len(users) > 1 else (None, None)
        self.profile = profile
        self._stack = ExitStack()

    def __enter__(self) -> ServerKeeper:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def before(self, notebook: Path) -> None:
        if Path(notebook).name == self.first:
            from analysis.serving import study

            print(
                f"starting the serving study's servers for notebooks {self.span()}",
                file=sys.stderr,
                flush=True,
            )
            self._stack.enter_context(study.kept_servers(self.profile))

    def after(self, notebook: Path) -> None:
        if Path(notebook).name == self.last:
            self.close()

    def close(self) -> None:
        self._stack.close()

    def span(self) -> str:
        return f"{self.first[:2]} to {self.last[:2]}" if self.first else "none"
