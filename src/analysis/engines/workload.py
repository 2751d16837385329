"""From a trace to what an engine is fed: requests, the tokens they emit, and when they arrive.

Both engines take the same `Workload`, so a comparison between them differs only in the engine.

Outputs. A request's reply is, by default, its recorded reply (teacher forcing): turn k+1's
prompt then really extends what turn k left in the cache, as in real serving. `free` replaces
each reply by as many deterministic pseudo-random tokens (seeded per request), like replaying
the trace with another model; explicit per-request token lists reproduce what another engine
generated. A reply is at least one token (an engine always samples one): an empty recorded
reply becomes `<|eot_id|>`. `max_output_tokens` caps every reply.

Arrivals. `batch` submits every request before the first step (the seeds' "all at once").
`closed-loop` runs C clients: each takes the next conversation, submits its first turn, and
submits turn k+1 at the first step boundary after turn k finished; C=1 is the seeds'
"conversation by conversation". Requests that finish in the same step release their next turns
in trace order, so the order never depends on the engine.

Prompts of `max_model_len` tokens or more cannot run (vLLM refuses them). With
`long_prompts="skip"` they are left out, counted and reported; with "error" the run stops
before starting, naming how many there are and what to change.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.data.traces.check import REBUILD, check_trace
from analysis.data.traces.storage import limit_trace
from analysis.engines.config import ConfigError, RunConfig
from analysis.platform.errors import TraceError

EOT_ID = 128009  # <|eot_id|>: the recorded replies end with it
FREE_TOKEN_LIMIT = 128_000  # free tokens are drawn below this id (plain text ids)
TRACE_COLUMNS = ("request_id", "conversation_id", "turn_index", "prompt_ids", "response_ids")


@dataclass
class RequestSpec:
    """One request as an engine sees it."""

    index: int  # position in the workload (row of the limited trace)
    request_id: str
    conversation_id: str
    turn_index: int
    prompt: np.ndarray  # int32 prompt token ids
    outputs: np.ndarray  # int32 tokens the request emits (its length is max_tokens)
    recorded_output_tokens: int  # length of the recorded reply (before any cap)
    skipped: bool = False  # prompt too long for max_model_len
    timestamp_s: float = float("nan")  # the trace's own arrival time, where it has one

    @property
    def prompt_tokens(self) -> int:
        return int(self.prompt.shape[0])


class _SharedInts:
    """Python lists of token ids that share one int object per id (saves ~28 bytes a token)."""

    def __init__(self) -> None:
        self._table = np.arange(0, dtype=object)

    def to_list(self, ids: np.ndarray) -> list[int]:
        if ids.size == 0:
            return []
        top = int(ids.max()) + 1
        if top > self._table.shape[0]:
            self._table = np.array(range(max(top, 131_072)), dtype=object)
        return self._table[ids].tolist()


@dataclass
class Workload:
    """Requests in trace order, grouped by conversation, with the skip report."""

    specs: list[RequestSpec]
    conversations: list[list[int]]  # request indices per conversation, in turn order
    max_model_len: int
    explicit: bool = False  # outputs given per request (another engine's tokens)

    def __post_init__(self) -> None:
        self._ints = _SharedInts()

    @property
    def skipped(self) -> list[int]:
        return [s.index for s in self.specs if s.skipped]

    def prompt_list(self, index: int) -> list[int]:
        return self._ints.to_list(self.specs[index].prompt)

    def output_list(self, index: int) -> list[int]:
        return self._ints.to_list(self.specs[index].outputs)

    def by_request_id(self) -> dict[str, int]:
        return {s.request_id: s.index for s in self.specs}


def build_workload(
    trace: pd.DataFrame,
    config: RunConfig,
    explicit_outputs: Mapping[str, Sequence[int]] | None = None,
) -> Workload:
    """Limit the trace, mark too-long prompts, and choose every request's output tokens."""
    missing = [c for c in TRACE_COLUMNS if c not in trace.columns]
    if missing:
        raise ConfigError(f"the trace lacks column(s) {', '.join(missing)}: rebuild it")
    frame = limit_trace(trace, config.limit)
    check_trace(frame)
    specs: list[RequestSpec] = []
    conversations: dict[str, list[int]] = {}
    for index, row in enumerate(frame.itertuples(index=False)):
        request_id = str(row.request_id)
        prompt = token_ids(row.prompt_ids, request_id, "prompt_ids")
        response = token_ids(row.response_ids, request_id, "response_ids")
        if prompt.shape[0] == 0:
            raise TraceError(f"request {request_id!r} has an empty prompt: {REBUILD}")
        spec = RequestSpec(
            index=index,
            request_id=request_id,
            conversation_id=str(row.conversation_id),
            turn_index=int(row.turn_index),
            prompt=prompt,
            outputs=_choose_outputs(request_id, response, config, explicit_outputs),
            recorded_output_tokens=int(response.shape[0]),
            skipped=prompt.shape[0] >= config.max_model_len,
            timestamp_s=float(getattr(row, "timestamp", float("nan"))),
        )
        specs.append(spec)
        conversations.setdefault(spec.conversation_id, []).append(index)
    workload = Workload(
        specs, list(conversations.values()), config.max_model_len, explicit_outputs is not None
    )
    too_long = workload.skipped
    if too_long and config.long_prompts == "error":
        longest = max(specs[i].prompt_tokens for i in too_long)
        raise ConfigError(
            f"{len(too_long)} prompt(s) have max_model_len={config.max_model_len} tokens or more "
            f"(longest {longest}): raise --max-model-len or use --long-prompts skip to leave "
            "them out (counted in the result)"
        )
    return workload


def token_ids(
    values: Sequence[int] | np.ndarray | None, request_id: str, column: str
) -> np.ndarray:
    """A request's token ids as int32, or a TraceError for a null list or a null id in it
    (a Parquet null reads as None, or as NaN inside a list; casting would invent an id)."""
    array = None if values is None else np.asarray(values)
    if array is None or (array.dtype.kind in "fO" and pd.isna(array).any()):
        raise TraceError(f"request {request_id!r} has a null token id in {column}: {REBUILD}")
    return array.astype(np.int32, copy=False)


def _choose_outputs(
    request_id: str,
    response: np.ndarray,
    config: RunConfig,
    explicit: Mapping[str, Sequence[int]] | None,
) -> np.ndarray:
    if explicit is not None:
        if request_id not in explicit:
            raise ConfigError(f"explicit outputs lack request {request_id!r}")
        tokens = np.asarray(explicit[request_id], dtype=np.int32)
        if tokens.size == 0:
            raise ConfigError(f"explicit outputs for {request_id!r} are empty: give >= 1 token")
        return tokens
    length = response.shape[0]
    if config.max_output_tokens is not None:
        length = min(length, config.max_output_tokens)
    length = max(length, 1)
    if config.outputs == "free":
        rng = np.random.default_rng(_stable_seed(config.seed, request_id))
        return rng.integers(0, FREE_TOKEN_LIMIT, size=length, dtype=np.int32)
    if response.shape[0] == 0:
        return np.array([EOT_ID], dtype=np.int32)
    return response[:length].copy()


def _stable_seed(seed: int, request_id: str) -> int:
    digest = hashlib.sha256(f"{seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


class Arrivals:
    """Which requests to submit at the next step boundary (batch or closed loop)."""

    def __init__(self, workload: Workload, mode: str, concurrency: int) -> None:
        self._specs = workload.specs
        self._mode = mode
        self._concurrency = concurrency
        self._queue: deque[list[int]] = deque(workload.conversations)
        self._next_turn: dict[int, list[int]] = {}  # request index -> later turns
        self.submitted = 0

    def initial(self) -> list[int]:
        if self._mode == "batch":
            ready = [s.index for s in self._specs if not s.skipped]
            self.submitted += len(ready)
            return ready
        ready: list[int] = []
        for _ in range(self._concurrency):
            index = self._start_next_conversation()
            if index is not None:
                ready.append(index)
        return ready

    def after_finished(self, finished: Iterable[int]) -> list[int]:
        """Next turns released by requests that finished this step, in trace order."""
        if self._mode == "batch":
            return []
        ready: list[int] = []
        for index in sorted(finished):
            later = self._next_turn.pop(index, None)
            if later is None:
                continue
            nxt = self._submit_first_runnable(later)
            if nxt is None:  # conversation over: this client takes the next one
                nxt = self._start_next_conversation()
            if nxt is not None:
                ready.append(nxt)
        return ready

    def _start_next_conversation(self) -> int | None:
        while self._queue:
            index = self._submit_first_runnable(self._queue.popleft())
            if index is not None:
                return index
        return None

    def _submit_first_runnable(self, turns: list[int]) -> int | None:
        for position, index in enumerate(turns):
            if not self._specs[index].skipped:
                self._next_turn[index] = turns[position + 1 :]
                self.submitted += 1
                return index
        return None
