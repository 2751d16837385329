"""What vLLM scheduled in each step: the batch make-up that a step's cost depends on.

Both engines expose the same `Scheduler`, so one wrapper on `schedule()` reads every step's
make-up in either: right after `schedule()` returns, each scheduled request's
`num_computed_tokens` has been advanced past this step's tokens (vLLM's
`_update_after_schedule`), so a request that was given `n` tokens computes positions
`[end - n, end)` against `end - n` tokens already in its KV cache, and it samples a token this
step unless it is still inside a chunked prefill (`is_prefill_chunk`). Cached tokens are
never scheduled, so a prefix-cache hit shows as fewer tokens, which is what it saves.

The features, one row per `schedule()` call (names as the step-cost profile uses them):

- `tokens`: tokens computed (the forward pass's rows);
- `sequences`: requests given any token;
- `new_requests`: requests entering the batch this step (`scheduled_new_reqs`): the model
  runner sets up their state, and on a GPU copies their prompt and block table over;
- `finished_requests`: requests that finished since the previous step, whose state the
  model runner now drops (`finished_req_ids`);
- `prefill_requests`: requests given more than one token (a prefill or a chunk of one);
- `sampled`: requests that sample a token (the LM head and the sampler run once each);
- `prefill_pairs`: query-key pairs of causal attention over multi-token chunks,
  n * (end - n) + n * (n + 1) / 2 per chunk (what attention costs in a prefill);
- `decode_context`: tokens of context read by one-token queries (a decode, or a prefill
  whose prompt was cached but for its last token): attention there is a read of the KV cache;
- `distinct_context`: the same reads with each block counted once a step: a prompt block that
  several decoding requests share (a cached prefix) counts for the first of them only
  (`SharedPromptBlocks`). On a CPU a block that one decode of the step has read is still in
  the processor's caches when the next reads it, so those reads cost less than as many tokens
  of blocks of their own (`python bench/run.py decode_sharing`). A profile charges every read
  (`decode_context`) and, on top, the first reads of each block (`distinct_context`).

The real engine adds each step's wall time (`wall_s`), so that the profile can be fitted on
exactly these rows; replay on a clock adds the time its profile gave.
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Container
from typing import Any

import numpy as np
import pandas as pd

FEATURES = (
    "tokens",
    "sequences",
    "new_requests",
    "finished_requests",
    "prefill_requests",
    "sampled",
    "prefill_pairs",
    "decode_context",
    "distinct_context",
)


def step_features(
    scheduler: Any, scheduler_output: Any, known: Container[str] | None = None
) -> tuple[int, ...]:
    """The FEATURES of one step, read after `schedule()` returned `scheduler_output`;
    `known` (the run's own request ids) leaves out requests that are not the run's, such as
    an engine warm-up's, which vLLM reports finished at the run's first step."""
    tokens = sequences = prefill_requests = sampled = prefill_pairs = decode_context = 0
    new_requests = len(scheduler_output.scheduled_new_reqs)
    finished = scheduler_output.finished_req_ids
    finished_requests = len(finished if known is None else [r for r in finished if r in known])
    requests = scheduler.requests
    for request_id, count in scheduler_output.num_scheduled_tokens.items():
        if count <= 0:
            continue
        request = requests[request_id]
        end = request.num_computed_tokens
        start = end - count
        tokens += count
        sequences += 1
        if not request.is_prefill_chunk:
            sampled += 1
        if count == 1:
            decode_context += end
        else:
            prefill_requests += 1
            prefill_pairs += count * start + count * (count + 1) // 2
    return (
        tokens,
        sequences,
        new_requests,
        finished_requests,
        prefill_requests,
        sampled,
        prefill_pairs,
        decode_context,
        decode_context,  # distinct_context before shared blocks are taken off (StepLog)
    )


class SharedPromptBlocks:
    """The prompt blocks that decoding requests hold, counted by block, and how many reads of
    them repeat a read another decoding request makes in the same step.

    A request joins when it decodes (the step after its prompt is done, or a one-token prefill
    of a cached prompt) and leaves when vLLM reports it finished or preempted. Only full prompt
    blocks can be shared: a decoding request's own new blocks are never another running
    request's. Every decoding request decodes in every step (vLLM schedules the running ones
    first), so the repeated reads of a step are the blocks' holders beyond the first. Updated
    only when a request joins or leaves: the decode fast path's parked requests stay counted
    without being looked at, as its running sums of context do.
    """

    def __init__(self) -> None:
        self.holders: dict[str, list[int]] = {}  # request id -> its full prompt blocks' ids
        self.readers: dict[int, int] = {}  # block id -> decoding requests holding it
        self.repeated_blocks = 0  # sum over blocks of (readers - 1)
        self.block_size = 0
        self._blocks: Any = None

    def attach(self, scheduler: Any) -> None:
        manager = scheduler.kv_cache_manager.coordinator.single_type_managers[0]
        self._blocks = manager.req_to_blocks
        self.block_size = scheduler.block_size

    @property
    def repeated_tokens(self) -> int:
        return self.repeated_blocks * self.block_size

    def join(self, request: Any) -> None:
        rid = request.request_id
        if rid in self.holders:
            return
        full = request.num_prompt_tokens // self.block_size
        ids = [block.block_id for block in self._blocks.get(rid, ())[:full]]
        self.holders[rid] = ids
        readers = self.readers
        for block_id in ids:
            count = readers.get(block_id, 0)
            if count:
                self.repeated_blocks += 1
            readers[block_id] = count + 1

    def leave(self, request_ids: Any) -> None:
        readers = self.readers
        for rid in request_ids:
            ids = self.holders.pop(rid, None)
            for block_id in ids or ():
                count = readers[block_id]
                if count > 1:
                    self.repeated_blocks -= 1
                    readers[block_id] = count - 1
                else:
                    del readers[block_id]

    def update(self, scheduler: Any, output: Any, known: Container[str] | None) -> int:
        """After `schedule()` returned `output`: the repeated reads (tokens) of this step's
        decodes. Requests whose prompt this step completes join after it: they decode from the
        next step on."""
        self.leave(output.finished_req_ids)
        if output.preempted_req_ids:
            self.leave(output.preempted_req_ids)
        requests = scheduler.requests
        done: list[Any] = []
        for rid, count in output.num_scheduled_tokens.items():
            if count <= 0 or (known is not None and rid not in known):
                continue
            request = requests[rid]
            if request.is_prefill_chunk:
                continue
            if count == 1:
                self.join(request)
            else:
                done.append(request)
        repeated = self.repeated_tokens
        for request in done:
            self.join(request)
        return repeated


class StepLog:
    """One row of FEATURES per `schedule()` call of one scheduler, plus times the driver adds."""

    def __init__(self, known: Container[str] | None = None) -> None:
        self.known = known  # the run's request ids (None: every request is the run's)
        self.sharing = SharedPromptBlocks()
        self.step = array("q")
        self.columns = {name: array("q") for name in FEATURES}
        self.start_s = array("d")
        self.wall_s = array("d")  # the real engine's measured step, or the clock's cost
        self.admitted = array("q")  # requests handed to the engine since the previous step
        self.admit_s = array("d")  # seconds that took
        self.gap_s = array("d")  # the driver's other time since the previous step ended

    def attach(self, scheduler: Any) -> None:
        """Wrap this scheduler instance's `schedule()` (never the class)."""
        schedule = scheduler.schedule
        columns = [self.columns[name] for name in FEATURES]
        distinct = self.columns["distinct_context"]
        sharing = self.sharing
        sharing.attach(scheduler)

        def schedule_and_log(*args: Any, **kwargs: Any) -> Any:
            output = schedule(*args, **kwargs)
            features = step_features(scheduler, output, self.known)
            for column, value in zip(columns, features, strict=True):
                column.append(value)
            distinct[-1] -= sharing.update(scheduler, output, self.known)
            self.step.append(scheduler.current_step)
            return output

        scheduler.schedule = schedule_and_log

    def __len__(self) -> int:
        return len(self.step)

    def last(self) -> dict[str, int]:
        """The FEATURES of the step just scheduled."""
        return {name: self.columns[name][-1] for name in FEATURES}

    def add_decodes(self, count: int, context: int) -> None:
        """Decodes the step just scheduled did outside `schedule()` (replay's decode fast path):
        each one token computed and sampled against its `context` tokens, as `step_features`
        would have counted them."""
        if count:
            for name in ("tokens", "sequences", "sampled"):
                self.columns[name][-1] += count
            self.columns["decode_context"][-1] += context
            self.columns["distinct_context"][-1] += context

    def decodes_only(self, step: int, count: int, context: int, finished: Collection[str]) -> None:
        """A step that ran no `schedule()` (replay skipped it: only parked decodes), logged as
        `schedule()` would have logged it, with the requests that finished before it (their
        ids, as `schedule()` would have reported them)."""
        self.sharing.leave(finished)
        made_up = dict.fromkeys(FEATURES, 0)
        made_up |= {"tokens": count, "sequences": count, "sampled": count}
        made_up |= {"decode_context": context, "finished_requests": len(finished)}
        made_up["distinct_context"] = context - self.sharing.repeated_tokens
        for name, value in made_up.items():
            self.columns[name].append(value)
        self.step.append(step)

    def timed(
        self, start_s: float, wall_s: float, admitted: int, admit_s: float, gap_s: float
    ) -> None:
        """Times of the step just scheduled: when it started, how long it took, and the
        driver's work since the previous step (requests handed over, and the rest)."""
        while len(self.wall_s) < len(self.step) - 1:  # a step the driver did not time
            self._append(np.nan, np.nan, 0, np.nan, np.nan)
        self._append(start_s, wall_s, admitted, admit_s, gap_s)

    def _append(self, start_s, wall_s, admitted, admit_s, gap_s) -> None:
        self.start_s.append(start_s)
        self.wall_s.append(wall_s)
        self.admitted.append(admitted)
        self.admit_s.append(admit_s)
        self.gap_s.append(gap_s)

    def frame(self) -> pd.DataFrame:
        n = len(self.step)
        frame = pd.DataFrame({"step": np.frombuffer(self.step, dtype=np.int64).copy()})
        for name in FEATURES:
            frame[name] = np.frombuffer(self.columns[name], dtype=np.int64).copy()
        for name, values in (
            ("start_s", self.start_s),
            ("wall_s", self.wall_s),
            ("admitted", self.admitted),
            ("admit_s", self.admit_s),
            ("gap_s", self.gap_s),
        ):
            dtype = np.int64 if values.typecode == "q" else np.float64
            column = np.full(n, 0 if dtype is np.int64 else np.nan, dtype=dtype)
            taken = np.frombuffer(values, dtype=dtype)[:n].copy()
            column[: taken.shape[0]] = taken
            frame[name] = column
        return frame
