"""Which notebooks may run side by side: the order `make report` and nbval execute them in.

Notebooks 08, 10, 11 and 12 time a real vLLM server or engine (12 reads what the others
cached, and measures what it does not find): nothing may run beside them, or the cores they
share would show in their times. Notebooks 00, 01 and 04 make what others read (the packaged
ShareGPT, the traces, the default sweep's points: 05 and 06 run what they miss of it, so that
beside 04 they ran the same points again, 8 minutes each, and 07 draws what it finds): they run
alone too. Every other notebook counts or replays, where time is not what it measures;
consecutive ones share the cores, a few at a time. On a 2-core AMD EPYC, six of them took 87 s
two at a time against 135 s one after another.

So the notebooks, in reading order, fall into runs: a run of notebooks executed one after
another, or a run executed side by side. Notebook 09 sits between 08 and 10, whose servers are
kept from one to the other (`server_keeper`): it runs alone, in the same run as they do.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The notebooks that run alone: the inputs' makers, then the serving study and what lies
# between its notebooks.
ALONE = ("00", "01", "04", "08", "09", "10", "11", "12")
# At most this many notebooks at once: each starts a kernel and imports vLLM (about 1 GiB), and
# a sweep notebook starts its own workers besides.
MOST_SIDE_BY_SIDE = 4
# Overrides the count (the Makefile hands nbval's `NOTEBOOK_WORKERS` the same rule).
WORKERS_ENV = "PREFIX_CACHE_LAB_NOTEBOOK_WORKERS"


@dataclass(frozen=True)
class Run:
    """Consecutive notebooks, executed one after another or `side_by_side`."""

    notebooks: tuple[Path, ...]
    side_by_side: bool

    @property
    def name(self) -> str:
        """ "notebooks 02-07" (their numbers, first to last)."""
        first, last = self.notebooks[0].name[:2], self.notebooks[-1].name[:2]
        return f"notebook {first}" if first == last else f"notebooks {first}-{last}"


def runs(notebooks: Sequence[Path]) -> list[Run]:
    """The notebooks, in the order given, as runs: the ones that run alone together, the others
    side by side (a run of one is executed alone)."""
    result: list[Run] = []
    for notebook in map(Path, notebooks):
        shared = notebook.name[:2] not in ALONE
        if result and result[-1].side_by_side == shared:
            last = result.pop()
            result.append(Run((*last.notebooks, notebook), shared))
        else:
            result.append(Run((notebook,), shared))
    return [Run(r.notebooks, r.side_by_side and len(r.notebooks) > 1) for r in result]


def side_by_side_workers(cores: int | None = None) -> int:
    """How many notebooks share the cores: one per core, at most `MOST_SIDE_BY_SIDE`, unless
    `WORKERS_ENV` says."""
    chosen = os.environ.get(WORKERS_ENV, "").strip()
    if chosen:
        return max(1, int(chosen))
    cores = cores or os.cpu_count() or 1
    return max(1, min(cores, MOST_SIDE_BY_SIDE))


def plan_lines(notebooks: Sequence[Path], root: Path) -> list[str]:
    """One line per run for the Makefile's nbval loop: "alone" or "shared", then the notebooks'
    paths relative to `root`."""
    lines = []
    for run in runs(notebooks):
        paths = " ".join(p.relative_to(root).as_posix() for p in run.notebooks)
        lines.append(f"{'shared' if run.side_by_side else 'alone'} {paths}")
    return lines
