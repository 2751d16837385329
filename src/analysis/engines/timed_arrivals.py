"""Arrivals in time: when each request reaches the engine, in seconds, on any clock.

The step-based `Arrivals` (workload.py) releases a closed-loop client's next turn at the step
boundary after its previous turn finished. Here every request has an arrival *time*, and a
driver submits, at each step boundary, every request whose time has come (on the real
engine's wall clock, or on replay's virtual clock); with nothing running it waits for the
next one. Modes:

- `batch`: every request at time 0.
- `closed-loop`: C clients; a client's next request arrives `think_time_s` after its previous
  one finished: the next turn of its conversation, or, the conversation over, the first turn
  of the next one (a real client's next conversation crosses the server's front end as a
  next turn does, so replay on a server's clock, `analysis.timing.served`, needs both late).
  Client k's first request arrives at k * `start_stagger_s` (default 0: all at once), and
  requests released by replies that finished in one step arrive a stagger apart too (a
  server's front end hands them to the engine one after another: with the engine idle, the
  first is prefilled alone and the others join the next step).
  With a think time of 0 this releases exactly what `Arrivals` releases, at the same step
  boundaries (a test holds the counts equal).
- `poisson`: open loop; conversations start at the times of a Poisson process of
  `arrival_rate` per second (seeded), and a conversation's later turns arrive `think_time_s`
  after the previous one finished, as a person replies. For a single-turn trace this is the
  usual Poisson request stream. Later turns released by replies of one step arrive
  `start_stagger_s` apart, as in a closed loop (the conversations' starts are the schedule's).
- `timestamps`: the trace's own times (its `timestamp` column, counted from the first): a
  conversation's first turn arrives at its time; a later turn at its time, but never before
  `think_time_s` after the previous turn finished (a person cannot answer a reply not yet
  written), so an engine slower than the logged one delays the conversation.
Requests due at the same time go in the order they were released. Requests that finished in
one step release theirs in trace order at a think time of 0, as `Arrivals` does; with a think
time, in the order the engine reported them finished, as a real client's replies stream out
of a server (the reply out first is answered first, and its next turn reaches the engine
first, so it takes the larger share of the next step's token budget).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable

import numpy as np

from analysis.engines.config import RunConfig
from analysis.engines.workload import Workload
from analysis.platform.errors import ConfigError


def poisson_starts(count: int, rate: float | None, seed: int = 0) -> np.ndarray:
    """When `count` conversations start in an open loop of `rate` per second: a seeded Poisson
    process, the first at 0. One schedule for replay and for the load generator that sends it
    to a real server, so that the two start the same conversations at the same times."""
    if not rate or not np.isfinite(rate) or rate <= 0:
        raise ValueError(f"poisson arrivals need a positive arrival_rate, got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, count)
    return np.cumsum(gaps) - gaps[0] if count else gaps


class TimedArrivals:
    """Requests with arrival times; `due(now)` hands over those that have arrived."""

    def __init__(
        self,
        workload: Workload,
        mode: str,
        concurrency: int,
        *,
        arrival_rate: float | None = None,
        think_time_s: float = 0.0,
        start_stagger_s: float = 0.0,
        seed: int = 0,
    ) -> None:
        self._specs = workload.specs
        self._mode = mode
        self._think = float(think_time_s)
        self._stagger = float(start_stagger_s)
        self._heap: list[tuple[float, int, int]] = []
        self._order = 0
        self._next_turn: dict[int, list[int]] = {}
        self.arrival_s = np.full(len(workload.specs), np.nan)
        self.submitted = 0
        conversations = [self._runnable(turns) for turns in workload.conversations]
        conversations = [turns for turns in conversations if turns]
        if mode == "batch":
            for spec in self._specs:
                if not spec.skipped:
                    self._push(0.0, spec.index, [])
        elif mode == "closed-loop":
            self._queue = deque(conversations)
            for client in range(concurrency):
                self._start_next(client * float(start_stagger_s))
        elif mode == "poisson":
            starts = poisson_starts(len(conversations), arrival_rate, seed)
            for start, turns in zip(starts, conversations, strict=True):
                self._push(float(start), turns[0], turns[1:])
        elif mode == "timestamps":
            self._logged = self._logged_times(conversations)
            for turns in conversations:
                self._push(self._logged[turns[0]], turns[0], turns[1:])
        else:
            raise ValueError(f"no timed arrivals for mode {mode!r}")

    @classmethod
    def for_config(cls, workload: Workload, config: RunConfig) -> TimedArrivals:
        """The arrivals a run's config asks for (mode, clients, rate, think time, seed)."""
        return cls(
            workload,
            config.mode,
            config.concurrency,
            arrival_rate=config.arrival_rate,
            think_time_s=config.think_time_s,
            start_stagger_s=config.start_stagger_s,
            seed=config.seed,
        )

    def _logged_times(self, conversations: list[list[int]]) -> dict[int, float]:
        """Each request's logged time, counted from the earliest: a trace without times is one
        line, not arrivals all at 0."""
        indices = [index for turns in conversations for index in turns]
        stamps = np.array([self._specs[index].timestamp_s for index in indices], dtype=float)
        if not indices or not np.isfinite(stamps).all():
            missing = int((~np.isfinite(stamps)).sum()) if indices else 0
            raise ConfigError(
                f"mode 'timestamps' needs a time for every request; {missing} of {len(indices)} "
                "have none (the trace has no usable `timestamp` column): use --clients or --rate"
            )
        return dict(zip(indices, (stamps - stamps.min()).tolist(), strict=True))

    def _runnable(self, turns: list[int]) -> list[int]:
        return [index for index in turns if not self._specs[index].skipped]

    def _push(self, time_s: float, index: int, later: list[int]) -> None:
        self._next_turn[index] = later
        heapq.heappush(self._heap, (time_s, self._order, index))
        self._order += 1

    def _start_next(self, time_s: float) -> bool:
        """The next conversation's first turn arrives at `time_s`; False: none is left."""
        if not self._queue:
            return False
        turns = self._queue.popleft()
        self._push(time_s, turns[0], turns[1:])
        return True

    def next_time(self) -> float | None:
        """When the next request arrives (None: no request is waiting to arrive)."""
        return self._heap[0][0] if self._heap else None

    def pending(self) -> bool:
        return bool(self._heap)

    def due(self, now: float) -> list[int]:
        """The requests that have arrived by `now`, in arrival order; each is handed once."""
        ready = []
        while self._heap and self._heap[0][0] <= now:
            time_s, _, index = heapq.heappop(self._heap)
            self.arrival_s[index] = time_s
            ready.append(index)
        self.submitted += len(ready)
        return ready

    def after_finished(self, finished: Iterable[int], now: float) -> None:
        """Release what requests that finished at `now` (in the engine's order) were holding
        back: in trace order at a think time of 0, else in the engine's; each a stagger after
        the one before."""
        if self._mode == "batch":
            return
        released = 0
        for index in sorted(finished) if self._think == 0 else list(finished):
            later = self._next_turn.pop(index, None)
            if later is None:
                continue
            due = now + self._think + released * self._stagger
            if later:
                if self._mode == "timestamps":
                    due = max(due, self._logged[later[0]])
                self._push(due, later[0], later[1:])
                released += 1
            elif self._mode == "closed-loop":
                released += self._start_next(due)
