"""The fleet on a clock: each replica a server of its own time, requests routed as they arrive.

Lockstep (`driver`) counts; time needs each replica to run at its own pace: a replica with a
long prefill takes longer per step than one that only decodes. So each replica keeps its own
clock (when it is next free to start a step), and the run is a discrete-event loop over two
kinds of event, in time order: an arrival (routed there and then, from what the router sees
of the replicas at that moment) and the next step of the replica that is free first. A step
is `replay`'s own (`run_step`, the decode fast path, the profile's cost, `loop_s` after it);
requests routed to a replica are handed over, each charged `admit_s`, when its next step
starts, as `replay` hands over at its step boundary. A fleet of one is `replay` on a clock,
to the bit (a test checks it).

Steps of different replicas overlap in time; the recorder's steps are the replica steps in
the order they start (`step` in the tables), each at its replica's time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from analysis.engines.clock import StepCostProfile, VirtualClock
from analysis.engines.recorder import Recorder
from analysis.engines.replay import charge_step, run_step, skip_on_clock
from analysis.engines.steps import StepLog
from analysis.engines.timed_arrivals import TimedArrivals


def drive_on_clock(
    replicas: list[Any],
    arrivals: TimedArrivals,
    live: dict[str, Any],
    recorder: Recorder,
    route: Callable[[int, int], Any],
    profile: StepCostProfile,
    observe: Callable[[], None],
    progress: Any = None,
) -> dict[str, Any]:
    """Run every request to its end; `route(index, step)` places one arrival and returns its
    replica, `observe()` is called after each replica step or run of skipped steps (the
    fleet's load balance, counted per call)."""
    clocks = [VirtualClock() for _ in replicas]
    logs = [StepLog() for _ in replicas]
    for replica, log in zip(replicas, logs, strict=True):
        log.attach(replica.scheduler)
    handed = [0] * len(replicas)  # routed since the replica's last step: admitted at its next
    arrival_clock = VirtualClock()
    reading = [arrival_clock]  # the clock the recorder reads: an arrival's, or a stepping replica's
    recorder.clock = lambda: reading[0].now()
    fleet_steps = 0

    def mark(_: int, start: float) -> None:
        nonlocal fleet_steps
        fleet_steps += 1
        recorder.mark_step(fleet_steps, start)

    while live or arrivals.pending():
        busy = [r for r in replicas if r.scheduler.get_request_counts() != (0, 0)]
        first = min(busy, key=lambda r: (clocks[r.index].now(), r.index)) if busy else None
        arrival = arrivals.next_time()
        if arrival is not None and (first is None or arrival <= clocks[first.index].now()):
            arrival_clock.wait_until(arrival)
            reading[0] = arrival_clock
            due = arrivals.due(arrival)
            recorder.arrival_seconds[due] = arrivals.arrival_s[due]
            for index in due:
                replica = route(index, fleet_steps)
                clocks[replica.index].wait_until(arrival)  # an idle replica starts then
                handed[replica.index] += 1
            continue
        k = first.index
        clock, log, fast, scheduler = clocks[k], logs[k], first.fast, first.scheduler
        clock.advance(profile.admit_s * handed[k])
        admitted, handed[k] = handed[k], 0
        reading[0] = clock
        step = scheduler.current_step + 1
        mark(step, clock.now())
        if fast.prepare(step) and fast.nothing_to_schedule():
            fast.restore()
            others = [clocks[r.index].now() for r in busy if r is not first]
            limit = min(others + ([arrival] if arrival is not None else []), default=None)
            skip_on_clock(
                scheduler,
                fast,
                step,
                clock,
                profile,
                log,
                mark=mark,
                stop=lambda start, limit=limit: limit is not None and limit <= start,
            )
            observe()
            continue

        charge = (log, fast, step, profile, clock, admitted)
        finished = run_step(
            scheduler,
            fast,
            live,
            recorder.ids,
            recorder,
            fleet_steps,
            lambda _, charge=charge: charge_step(*charge),
        )
        first.scheduled_steps += 1
        if first.kv_index is not None:
            first.kv_index.publish_pending(scheduler.kv_cache_manager)
        if finished:
            if progress is not None:
                progress.update(len(finished))
            arrivals.after_finished(finished, clock.now())
        clock.advance(profile.loop_s)
        observe()
    return {
        "steps": fleet_steps,
        "seconds": max((c.now() for c in clocks), default=0.0),
        "steps_table": steps_table(logs),
    }


def steps_table(logs: list[StepLog]) -> Any:
    """Every replica's steps, with a `replica` column, in the order they started."""
    import pandas as pd

    frames = [log.frame().assign(replica=k) for k, log in enumerate(logs)]
    table = pd.concat(frames, ignore_index=True)
    return table.sort_values(["start_s", "replica"], kind="stable").reset_index(drop=True)
