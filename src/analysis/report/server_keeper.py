"""The serving study's servers, kept across a run of notebooks: `make report`, `make study` and
nbval start the caching-on and caching-off servers once and stop them after the last notebook
that measures on them (`analysis.serving.study.kept_servers`). Two vLLM starts cost about 45 s
on 2 cores; notebooks 08 and 10 used to pay them each. `make report` starts them as its
notebooks begin, so that their start-up overlaps the notebooks before the study; the others,
before the first notebook that measures on them.

A run with only one of those notebooks keeps nothing: that notebook starts and stops its own
pair, as when it runs alone.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

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
        self._launched: Any = None  # the ServerPair `launch` started
        self._waited = False

    def __enter__(self) -> ServerKeeper:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def launch(self) -> None:
        """Start the servers now without waiting for them: their start-up (about 50 s of both
        cores) overlaps the notebooks before the first that measures on them, which leave a
        core idle at times; `before` that notebook waits until they are ready."""
        if self.first is None or self._launched is not None:
            return
        from analysis.serving import ServerPair, study

        self._say_starting()
        self._launched = ServerPair()
        self._stack.callback(self._launched.stop)
        study.launch_servers(self._launched, self.profile)

    def starting(self) -> bool:
        """Whether the servers `launch` started may still be starting (nothing waited yet)."""
        return self._launched is not None and not self._waited

    def before(self, notebook: Path) -> None:
        if Path(notebook).name == self.first:
            self._waited = True
            from analysis.serving import study

            if self._launched is None:
                self._say_starting()
            self._stack.enter_context(study.kept_servers(self.profile, self._launched))

    def after(self, notebook: Path) -> None:
        if Path(notebook).name == self.last:
            self.close()

    def close(self) -> None:
        self._stack.close()

    def _say_starting(self) -> None:
        print(
            f"starting the serving study's servers for notebooks {self.span()}",
            file=sys.stderr,
            flush=True,
        )

    def span(self) -> str:
        return f"{self.first[:2]} to {self.last[:2]}" if self.first else "none"
