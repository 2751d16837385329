"""Which notebooks may run side by side: the order `make report` and nbval execute them in.

Notebooks 08, 10, 11 and 12 time a real vLLM server or engine (12 reads what the others
cached, and measures what it does not find): nothing may run beside them, or the cores they
share would show in their times. Notebooks 00, 01 and 04 make what others read (the packaged
ShareGPT, the traces, the default sweep's points: 05 and 06 run what they miss of it, so that
beside 04 they ran the same points again, 8 minutes each, and 07 draws what it finds): they run
alone too. Every other notebook counts or replays, where time is not what it measures;
consecutive ones share the cores, a few at a time. On a 2-core AMD EPYC, six of them took 87 s
two at a time against 135 s one after another.

So the notebooks fall into runs: a run of notebooks executed one after another, or a run
executed side by side. They keep their reading order, but for one move: a notebook that reads
nothing of the serving study yet sits inside it (09, between 08 and 10) runs after it, beside
the notebooks that follow.

Running the others beside the study at the scheduler's idle priority (`chrt --idle`), in the
hope that they would take only the cycles the study leaves free, was measured and dropped: on a
2-core AMD EPYC the whole nbval took 16m53s against 17m39s alone, notebook 11 took 5m29s against
2m00s, and the study's cells moved against a quiet run by as much as +110 % in mean TPOT and
-36 % in requests/s.

Running nbval's notebooks that neither time the study nor read it (every one but 08, 10-12 and
16) beside pytest, which times nothing either, was measured and dropped too: in a fresh
`.ci/run` on a 2-core AMD EPYC, pytest took 12m55s beside them and they 12m06s, together as
long as the two had taken one after the other (7m48s and about 5 minutes). Both keep the two
cores busy on their own; `make test` runs them one after the other.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The notebooks that make what others read, and the serving study: they run alone.
INPUTS = ("00", "01", "04")
SERVING_STUDY = ("08", "10", "11", "12")
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
        """ "notebook 04", "notebooks 02-07", "notebooks 09, 13-17": their numbers."""
        numbers = [int(p.name[:2]) for p in self.notebooks]
        spans: list[list[int]] = []
        for number in numbers:
            if spans and number == spans[-1][-1] + 1:
                spans[-1].append(number)
            else:
                spans.append([number])
        words = [f"{s[0]:02d}" + (f"-{s[-1]:02d}" if len(s) > 1 else "") for s in spans]
        return ("notebook " if len(numbers) == 1 else "notebooks ") + ", ".join(words)


def runs(notebooks: Sequence[Path]) -> list[Run]:
    """The notebooks as runs: those that run alone together, the others side by side (a run of
    one is executed alone), in the order given but for the serving study's interlopers."""
    result: list[Run] = []
    for notebook in execution_order(notebooks):
        shared = notebook.name[:2] not in INPUTS + SERVING_STUDY
        if result and result[-1].side_by_side == shared:
            last = result.pop()
            result.append(Run((*last.notebooks, notebook), shared))
        else:
            result.append(Run((notebook,), shared))
    return [Run(r.notebooks, r.side_by_side and len(r.notebooks) > 1) for r in result]


def execution_order(notebooks: Sequence[Path]) -> list[Path]:
    """Reading order, with a shareable notebook that lies between the serving study's first
    and last moved to just after the last: the study then runs as one, alone."""
    paths = list(map(Path, notebooks))
    study = [i for i, p in enumerate(paths) if p.name[:2] in SERVING_STUDY]
    if not study:
        return paths
    first, last = study[0], study[-1]
    inside = paths[first : last + 1]
    interlopers = [p for p in inside if p.name[:2] not in SERVING_STUDY]
    kept = [p for p in inside if p.name[:2] in SERVING_STUDY]
    return paths[:first] + kept + interlopers + paths[last + 1 :]


def side_by_side_workers(cores: int | None = None) -> int:
    """How many notebooks share the cores: one per core, at most `MOST_SIDE_BY_SIDE`, unless
    `WORKERS_ENV` says."""
    chosen = os.environ.get(WORKERS_ENV, "").strip()
    if chosen:
        if not chosen.isdigit() or int(chosen) < 1:
            from analysis.platform.errors import UsageError

            raise UsageError(f"{WORKERS_ENV} must be a whole number >= 1, got {chosen!r}")
        return int(chosen)
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
