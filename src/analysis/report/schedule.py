"""Which notebooks may run side by side: the order `make report` and nbval execute them in.

Notebooks 08, 10 and 11 time a real vLLM server or engine: nothing may run beside them, or the
cores they share would show in their times. Notebooks 00 and 01 make what every other reads (the
packaged ShareGPT, the traces): they run alone, first. Notebook 04 draws the default sweep and runs
the points it misses; 05 and 06 run what they miss of it too, so that beside a 04 that found the
sweep missing they ran the same points again, 8 minutes each: 04 runs alone, before them, unless
the sweep is complete (`make report` runs it as a stage of its own first). Notebooks 12 and 16 read
what the study cached (12 measures what it does not find, which after the study is nothing; 16
reads the caching-off server's calibration): they run after it, side by side. Every other notebook
counts or replays, where time is not what it measures: they all share the cores, a few at a time,
before the study, the longest first (by the time its first cell states), so that the last to start
are short and no core idles long at the end. On a 2-core AMD EPYC, six of them took 87 s two at a
time against 135 s one after another.

So the notebooks fall into runs: a run of notebooks executed one after another, or a run
executed side by side: the inputs alone; 04 alone if the sweep is not complete; the shareable
notebooks side by side; the study alone; what reads the study side by side.

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

# The notebooks that make what every other reads: they run alone, first.
INPUTS = ("00", "01")
# Draws the default sweep, and runs the points it misses: alone unless the sweep is complete.
SWEEP = "04"
# The serving study, and the notebooks that read what it cached: alone, then after it.
SERVING_STUDY = ("08", "10", "11")
READS_STUDY = ("12", "16")
# The grid notebook 04 draws (`make report` runs its points as a stage before the notebooks).
SWEEP_GRID = "default"
# At most this many notebooks at once: each starts a kernel and imports vLLM (about 1 GiB), and
# a sweep notebook starts its own workers besides.
MOST_SIDE_BY_SIDE = 4
# Overrides the count (the Makefile hands nbval's `NOTEBOOK_WORKERS` the same rule).
WORKERS_ENV = "PREFIX_CACHE_LAB_NOTEBOOK_WORKERS"


@dataclass(frozen=True)
class Run:
    """Notebooks executed one after another or `side_by_side`."""

    notebooks: tuple[Path, ...]
    side_by_side: bool

    @property
    def name(self) -> str:
        """ "notebook 04", "notebooks 02-07", "notebooks 09, 13-17": their numbers, in order."""
        numbers = sorted(int(p.name[:2]) for p in self.notebooks)
        spans: list[list[int]] = []
        for number in numbers:
            if spans and number == spans[-1][-1] + 1:
                spans[-1].append(number)
            else:
                spans.append([number])
        words = [f"{s[0]:02d}" + (f"-{s[-1]:02d}" if len(s) > 1 else "") for s in spans]
        return ("notebook " if len(numbers) == 1 else "notebooks ") + ", ".join(words)


def runs(notebooks: Sequence[Path], sweep_complete: bool = True) -> list[Run]:
    """The notebooks as runs, in the order they execute (a run of one is executed alone)."""
    paths = [Path(p) for p in notebooks]

    def pick(numbers: Sequence[str]) -> list[Path]:
        return [p for p in paths if p.name[:2] in numbers]

    sweep_alone = () if sweep_complete else (SWEEP,)
    apart = (*INPUTS, *sweep_alone, *SERVING_STUDY, *READS_STUDY)
    shareable = longest_first([p for p in paths if p.name[:2] not in apart])
    groups = [
        Run(tuple(pick(INPUTS)), False),
        Run(tuple(pick(sweep_alone)), False),
        Run(tuple(shareable), True),
        Run(tuple(pick(SERVING_STUDY)), False),
        Run(tuple(pick(READS_STUDY)), True),
    ]
    return [
        Run(g.notebooks, g.side_by_side and len(g.notebooks) > 1) for g in groups if g.notebooks
    ]


def longest_first(notebooks: Sequence[Path]) -> list[Path]:
    """By the run time each notebook's first cell states, longest first (reading order among
    equals, and for a notebook that states none or cannot be read)."""
    from analysis.report.timings import stated_seconds

    def stated(notebook: Path) -> float:
        try:
            return stated_seconds(notebook) or 0.0
        except (OSError, ValueError):
            return 0.0

    return sorted(notebooks, key=lambda p: -stated(p))


def sweep_complete(notebooks: Sequence[Path], grid: str = SWEEP_GRID) -> bool:
    """Whether notebook 04, if among `notebooks`, finds every point of the grid it draws done
    (not while the traces its points are sized from are not built)."""
    from analysis.report.timings import pending_points

    if not any(Path(p).name[:2] == SWEEP for p in notebooks):
        return True
    return pending_points(grid) == {}


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


def plan_lines(notebooks: Sequence[Path], root: Path, sweep_complete: bool = True) -> list[str]:
    """One line per run for the Makefile's nbval loop: "alone" or "shared", then the notebooks'
    paths relative to `root`."""
    lines = []
    for run in runs(notebooks, sweep_complete):
        paths = " ".join(p.relative_to(root).as_posix() for p in run.notebooks)
        lines.append(f"{'shared' if run.side_by_side else 'alone'} {paths}")
    return lines
