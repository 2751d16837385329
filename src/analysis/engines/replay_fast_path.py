"""The replay engine's savings that change no count: the decode fast path and reused hashes.

A module of its own because it is the one place where replay schedules anything itself; every
rule it follows is stated here and checked by the tests against `fast_path=False` and against
the real engine.

Decode fast path (`fast_path=True`, the default). On the whole multi-turn trace most work is
decode: 17 M tokens, each one scheduler step of one request. A decoding request whose next
token needs no new block, fills no block and does not finish it changes nothing vLLM shares
between requests but one token of budget. Such requests are *parked*: taken out of `running`
while `schedule()` runs, with the scheduler's token, input and sequence budgets lowered by
their number, and advanced without any work until their next event, which their block table
tells in advance. At a cache event (a block became full) or an allocation event (the token
needs a block) the request is scheduled here, before `schedule()` runs for the others, with
the calls vLLM's `allocate_slots` makes for it (`cache_blocks`, or
`coordinator.allocate_new_blocks`); a finishing request goes back to vLLM. A step is only run
this way when it is provably the same as vLLM's: every running request gets its whole token
demand, the free blocks cover every allocation of the step (so nothing is preempted), and no
two requests cache the same hash in it (their order would matter); otherwise vLLM schedules
everyone. Admissions, prefills, preemptions and finishes always go through `schedule()` and
`update_from_output()`. The one difference is the order of allocations inside a step, so
block *ids* may differ (the blocks are interchangeable); hits, queries, preemptions and
every stored / hit / evicted block hash are identical per step, which the tests check
against `fast_path=False` and against the real engine.

On a clock, what the fast path does outside `schedule()` is still charged: `hidden_decodes`
gives the number and context of each step's parked and handled decodes (kept as running sums,
so no parked request is touched), and the replay driver logs every skipped step.

Reused hashes (`PrefixHashes`) change no result either: block hashes that a conversation's
previous turn computed are reused (vLLM's hash of block i depends only on the first (i+1)*B
tokens).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class PrefixHashes:
    """Reuses block hashes a conversation's previous turn already computed.

    vLLM's block hashes chain over the whole prefix, so block i's hash depends only on the
    first (i+1)*B tokens: when a new turn's prompt starts with the previous turn's tokens
    (always its prompt; with recorded outputs also its reply), those hashes are the same
    values vLLM would compute again. The rest is hashed by vLLM's own block hasher.
    """

    def __init__(self, block_size: int, hasher: Callable[[Any], list[Any]]) -> None:
        self.block_size = block_size
        self.hasher = hasher
        self.reused_blocks = 0
        self._last: dict[str, tuple[list[int], int, list[Any]]] = {}

    def remember(self, conversation_id: str, request: Any) -> None:
        """Keep a request's tokens and hashes for the conversation's next turn."""
        self._last[conversation_id] = (
            request._all_token_ids,
            request.num_prompt_tokens,
            request.block_hashes,
        )

    def forget(self, conversation_id: str) -> None:
        self._last.pop(conversation_id, None)

    def attach(self, request: Any, conversation_id: str) -> None:
        """Give a request built without a hasher its block hashes (reused, then computed)."""
        previous = self._last.get(conversation_id)
        reused: list[Any] = []
        if previous is not None:
            tokens, prompt_len, hashes = previous
            new_tokens = request._all_token_ids
            size = self.block_size
            for length in (len(tokens), prompt_len):
                length = min(length, len(new_tokens), len(hashes) * size) // size * size
                if length and new_tokens[:length] == tokens[:length]:
                    reused = hashes[: length // size]
                    break
        request.block_hashes = list(reused)
        request._block_hasher = self.hasher
        request.update_block_hashes()
        self.reused_blocks += len(reused)


class DecodeFastPath:
    """Runs the decode steps of running requests outside `schedule()` (see module doc).

    A running request that is decoding (prefill done, one new token per step) is *parked*:
    taken out of `running`, it advances one token per step without any work until its next
    event, which its block table and counters tell in advance: a block becomes full (to be
    cached), the next token needs a new block, or the token finishes the request. At a cache
    or allocation event the request is scheduled here, with vLLM's own
    `KVCacheManager.allocate_slots(request, 1)`, before `schedule()` runs for the others;
    a finishing request goes back to vLLM, which finishes it. Parked requests are caught up
    (tokens appended, computed tokens added, block hashes computed) when they are handled.
    """

    def __init__(self, scheduler: Any, hash_block_size: int) -> None:
        self.scheduler = scheduler
        manager = scheduler.kv_cache_manager
        managers = manager.coordinator.single_type_managers
        self.kv_cache_manager = manager
        self.req_to_blocks = managers[0].req_to_blocks
        self.num_cached_block = managers[0].num_cached_block
        self.block_pool = manager.block_pool
        self.block_size = scheduler.block_size
        self.hash_block_size = hash_block_size
        self.max_model_len = scheduler.max_model_len
        self.enabled = self._supported(scheduler, len(managers))
        self.parked_request_steps = 0
        self.handled_events = 0
        self.skipped_steps = 0
        self.plain_steps = 0
        self._wake_heap: list[int] = []  # each wake step once; stale ones popped lazily
        self._parked_by_wake: dict[int, int] = {}  # wake step -> requests parked until it
        self._full: list[Any] = []
        self._visible: list[Any] = []
        self._num_visible = 0
        self._budgets: tuple[int, int, int] | None = None
        # The decodes done outside `schedule()`, for a clock to charge (`hidden_decodes`):
        # parked requests, each with its token count at parking minus the step it was parked at,
        # and the requests handled this step that were not parked again.
        self._parked_count = 0
        self._parked_base = 0
        self._handled_count = 0
        self._handled_context = 0

    @staticmethod
    def _supported(scheduler: Any, num_groups: int) -> bool:
        """Only the plain configuration this path was proven on (no spec decode, no connector)."""
        from vllm.v1.core.sched.request_queue import SchedulingPolicy
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        config = scheduler.scheduler_config
        spec = scheduler.kv_cache_config.kv_cache_groups[0].kv_cache_spec
        return (
            type(scheduler) is Scheduler
            and num_groups == 1
            and type(spec) is FullAttentionSpec
            and scheduler.connector is None
            and scheduler.ec_connector is None
            and scheduler.policy == SchedulingPolicy.FCFS
            and scheduler.num_spec_tokens == 0
            and scheduler.num_lookahead_tokens == 0
            and scheduler.num_prefill_lookahead == 0
            and scheduler.kv_cache_manager.watermark_blocks == 0
            and scheduler.kv_cache_manager.enable_caching
            and not config.long_prefill_token_threshold
            and not scheduler.use_pp
            and not scheduler.need_mamba_block_aligned_split
            and scheduler.hash_block_size == scheduler.block_size
        )

    # ------------------------------------------------------------------ per request
    def _next_event(self, request: Any) -> tuple[int, bool]:
        """(steps until the request's next event, whether that event finishes it).

        The request must be decoding with exact state: num_computed_tokens == num_tokens - 1.
        0 steps means the event is now.
        """
        num_tokens = len(request._all_token_ids)
        rid = request.request_id
        block_size = self.block_size
        room = len(self.req_to_blocks[rid]) * block_size - num_tokens + 1
        until_full = (self.num_cached_block.get(rid, 0) + 1) * block_size - num_tokens
        until_last_token = request.max_tokens - len(request._output_token_ids) - 1
        until_max_len = self.max_model_len - num_tokens - 1
        event = min(room, until_full)
        finish = min(until_last_token, until_max_len)
        if finish <= event:
            return max(finish, 0), True
        return max(event, 0), False

    @staticmethod
    def _decoding(request: Any) -> bool:
        return (
            len(request._all_token_ids) - request.num_computed_tokens == 1
            and not request.is_prefill_chunk
            and not request.spec_token_ids
        )

    def _park(self, request: Any, step: int, steps: int, finishing: bool) -> None:
        wake = step + steps
        request._park_step = step
        self._parked_count += 1
        self._parked_base += len(request._all_token_ids) - step
        request._park_wake = wake
        request._park_finishing = finishing
        parked = self._parked_by_wake
        if wake in parked:
            parked[wake] += 1
        else:
            parked[wake] = 1
            heapq.heappush(self._wake_heap, wake)

    def _catch_up(self, request: Any, step: int) -> None:
        """Advance a parked request to the start of `step`, as vLLM's steps would have."""
        self._parked_count -= 1
        self._parked_base -= len(request._all_token_ids) - request._park_step
        steps = step - request._park_step
        if steps > 0:
            self._advance(request, steps)
            self.parked_request_steps += steps
        parked = self._parked_by_wake
        wake = request._park_wake
        if parked[wake] == 1:
            del parked[wake]
        else:
            parked[wake] -= 1
        request._park_wake = 0

    def _advance(self, request: Any, steps: int) -> None:
        """`steps` decode steps: computed tokens, then the next workload tokens appended."""
        outputs = request._output_token_ids
        done = len(outputs)
        tokens = request._replay_outputs[done : done + steps]
        outputs.extend(tokens)
        request._all_token_ids.extend(tokens)
        request.num_computed_tokens += steps
        # vLLM's hasher returns nothing until a block is full: call it only then.
        hash_end = (len(request.block_hashes) + 1) * self.hash_block_size
        if len(request._all_token_ids) >= hash_end:
            request.update_block_hashes()

    def _unpark_all(self, step: int) -> None:
        for request in self.scheduler.running:  # every parked request is in `running`
            if request._park_wake:
                self._catch_up(request, step)
        self._wake_heap.clear()

    def next_wake(self, step: int) -> int:
        """The first step after `step` at which a running request has something to do."""
        if not all(request._park_wake for request in self.scheduler.running):
            return step + 1  # a request handled this step is not parked: it acts next step
        heap = self._wake_heap
        while True:
            wake = heap[0]
            if wake > step and wake in self._parked_by_wake:
                return wake
            heapq.heappop(heap)

    def _visible_cache_hashes(self, visible: list[Any]) -> set[bytes]:
        """Hashes the visible running requests will cache this step (all get their demand)."""
        hashes: set[bytes] = set()
        block_size = self.block_size
        for request in visible:
            start = self.num_cached_block.get(request.request_id, 0)
            end = len(request._all_token_ids) // block_size
            if end > start:
                hashes.update(request.block_hashes[start:end])
        return hashes

    # ------------------------------------------------------------------ one step
    def prepare(self, step: int) -> bool:
        """Set up `step`: handle due events, park what decodes, hide it from `running`.

        Returns False for a plain vLLM step (nothing hidden, `running` untouched).
        """
        self._handled_count = self._handled_context = 0
        if not self.enabled:
            return False
        scheduler = self.scheduler
        full = scheduler.running
        if not full:
            return False
        block_size = self.block_size
        max_model_len = self.max_model_len
        req_to_blocks = self.req_to_blocks
        blocks_needed = 0
        due: list[Any] = []
        newly: list[tuple[Any, int, bool]] = []
        visible: list[Any] = []
        # Requests parked past this step only take their one token: count them, skip them.
        acting = [request for request in full if request._park_wake <= step]
        demand = len(full) - len(acting)
        for request in acting:
            # (steps to its next event, whether vLLM must schedule it then)
            if request._park_wake:
                # Parked until this very step: its event is now, as `_next_event` said then.
                self._catch_up(request, step)
                steps, to_vllm = 0, request._park_finishing
            elif self._decoding(request):
                steps, to_vllm = self._next_event(request)
            else:
                steps, to_vllm = 0, True  # a prefill: vLLM's own work
            if steps:
                newly.append((request, steps, to_vllm))
                demand += 1
                continue
            if not to_vllm:
                due.append(request)
                demand += 1
                num_tokens = len(request._all_token_ids)
                if len(req_to_blocks[request.request_id]) * block_size < num_tokens:
                    blocks_needed += 1
                continue
            visible.append(request)
            num_tokens = len(request._all_token_ids)
            demand += num_tokens - request.num_computed_tokens
            needed = -(-min(num_tokens, max_model_len) // block_size) - len(
                req_to_blocks[request.request_id]
            )
            if needed > 0:
                blocks_needed += needed
        config = scheduler.scheduler_config
        token_budget = scheduler.max_num_scheduled_tokens
        input_budget = config.max_num_batched_tokens
        if (
            demand > token_budget
            or demand > input_budget
            or blocks_needed > self.block_pool.get_num_free_blocks()
            or (due and visible and self._cache_collision(due, visible))
        ):
            # Budget pressure, a possible preemption, or two requests caching the same hash
            # in one step (their order matters): vLLM must see every request.
            self._unpark_all(step)
            self.plain_steps += 1
            return False
        for request, steps, finishing in newly:
            self._park(request, step, steps, finishing)
        for request in due:
            self._handle_event(request, step)
        if len(visible) == len(full):
            return False
        count = len(full) - len(visible)
        self._full = full
        self._visible = visible
        self._num_visible = len(visible)
        self._budgets = (token_budget, input_budget, scheduler.max_num_active_reqs)
        scheduler.running = visible
        scheduler.max_num_scheduled_tokens = token_budget - count
        config.max_num_batched_tokens = input_budget - count
        scheduler.max_num_active_reqs -= count
        return True

    def _cache_collision(self, due: list[Any], visible: list[Any]) -> bool:
        """Would a due request cache a hash that a visible request also caches this step?

        Duplicate blocks of one hash are kept in insertion order and the first one serves
        later hits, so such a step must keep vLLM's own order.
        """
        hashes = self._visible_cache_hashes(visible)
        if not hashes:
            return False
        block_size = self.block_size
        for request in due:
            start = self.num_cached_block.get(request.request_id, 0)
            end = len(request._all_token_ids) // block_size
            if any(h in hashes for h in request.block_hashes[start:end]):
                return True
        return False

    def _handle_event(self, request: Any, step: int) -> None:
        """Schedule one decode step of a due request as vLLM's running loop would, then park it.

        vLLM's running loop calls `allocate_slots(request, 1)`, which for a decoding request
        of plain full attention does one of two things, both done here with the same vLLM
        calls it makes: cache the block that just became full (its last statement,
        `cache_blocks(request, num_tokens)`), or, when the new token needs a block, allocate
        it (`coordinator.allocate_new_blocks`; nothing becomes full at that token). The free
        blocks were checked for the whole step in `prepare`.
        """
        manager = self.kv_cache_manager
        rid = request.request_id
        num_tokens = len(request._all_token_ids)
        num_blocks = len(self.req_to_blocks[rid])
        if num_blocks * self.block_size >= num_tokens:
            manager.cache_blocks(request, num_tokens)
        elif num_tokens // self.block_size == self.num_cached_block.get(rid, 0):
            manager.coordinator.allocate_new_blocks(rid, num_tokens, num_tokens)
        elif manager.allocate_slots(request, 1) is None:  # pragma: no cover - see prepare()
            raise AssertionError(f"allocation failed for {rid} at step {step}")
        self._advance(request, 1)
        self.handled_events += 1
        steps, finishing = self._next_event(request)
        if steps or not finishing:
            # Parked even when its next event is the next step: `prepare` then knows it is due.
            self._park(request, step + 1, steps, finishing)
        else:
            self._handled_count += 1
            self._handled_context += num_tokens

    def hidden_decodes(self, step: int) -> tuple[int, int]:
        """(requests, context tokens) of the decodes `step` does outside `schedule()`: every
        parked request (one token against its context, which grows by one a step) and every
        request handled here; what a clock charges beside the batch vLLM scheduled."""
        count = self._parked_count + self._handled_count
        return count, self._parked_base + self._parked_count * step + self._handled_context

    def nothing_to_schedule(self) -> bool:
        """After prepare(): vLLM would schedule only parked requests this step."""
        return not self._visible and not self.scheduler.get_request_counts()[1]

    def restore(self) -> None:
        """Put parked requests back in `running`, in their order, after `schedule()`."""
        if self._budgets is None:
            return
        scheduler = self.scheduler
        admitted = self._visible[self._num_visible :]
        scheduler.running = self._full + admitted if admitted else self._full
        token_budget, input_budget, active = self._budgets
        scheduler.max_num_scheduled_tokens = token_budget
        scheduler.scheduler_config.max_num_batched_tokens = input_budget
        scheduler.max_num_active_reqs = active
        self._budgets = None
        self._full = []
        self._visible = []
