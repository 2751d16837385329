"""The async streaming client: payloads, server-sent events, bursts and closed loops.

The only part of the load generator that talks to a server (aiohttp, imported when a run
starts); it never raises for timeouts or server errors, each result's status says.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from analysis.platform.errors import WorkloadError
from analysis.serving.loadgen.records import RequestResult, RequestSpec


def completion_payload(model: str, spec: RequestSpec) -> dict[str, Any]:
    """A streaming `/v1/completions` body with a token-id prompt and a fixed output length."""
    return {
        "model": model,
        "prompt": list(spec.prompt_ids),
        "max_tokens": spec.max_tokens,
        "ignore_eos": True,  # vLLM extra parameter: random weights would stop anywhere
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def parse_sse_line(raw: bytes) -> dict[str, Any] | str | None:
    """One line of a server-sent event stream: a decoded event, "[DONE]", or None to skip."""
    line = raw.strip()
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return "[DONE]"
    return json.loads(data)


async def stream_completion(
    session: Any, base_url: str, model: str, spec: RequestSpec, *, timeout_s: float, t0: float
) -> RequestResult:
    """Send one streaming request; never raises for timeouts or server errors (status says)."""
    import aiohttp

    result = RequestResult(
        request_id=spec.request_id,
        group=spec.group,
        turn_index=spec.turn_index,
        warmup=spec.warmup,
        status="error",
        sent_prompt_tokens=len(spec.prompt_ids),
    )
    start = time.perf_counter()
    result.start_s = start - t0
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(
                f"{base_url}/v1/completions", json=completion_payload(model, spec)
            ) as response:
                if response.status != 200:
                    body = (await response.text())[:300]
                    result.error = f"HTTP {response.status}: {body}"
                    return result
                done = False
                async for raw in response.content:
                    event = parse_sse_line(raw)
                    if event is None:
                        continue
                    if event == "[DONE]":
                        done = True
                        break
                    if "error" in event:
                        result.error = json.dumps(event["error"])[:300]
                        return result
                    if event.get("choices"):
                        result.chunks += 1
                        if math.isnan(result.ttft_s):
                            result.ttft_s = time.perf_counter() - start
                    usage = event.get("usage")
                    if usage:
                        result.prompt_tokens = usage.get("prompt_tokens")
                        details = usage.get("prompt_tokens_details") or {}
                        if details.get("cached_tokens") is not None:
                            result.cached_tokens = int(details["cached_tokens"])
                        result.output_tokens = int(usage.get("completion_tokens") or 0)
        result.e2e_s = time.perf_counter() - start
        if not done:
            result.error = "stream ended without [DONE]"
            return result
        result.status = "ok"
    except TimeoutError:
        result.status = "timeout"
        result.e2e_s = time.perf_counter() - start
        result.error = f"no complete answer within {timeout_s:g} s"
    except (aiohttp.ClientError, json.JSONDecodeError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    if asyncio.current_task().cancelling():
        # the caller was cancelled (Ctrl-C) while this request ended in an error or a timeout
        # that hid it: a counted failure must not swallow the cancellation, or the run goes on
        raise asyncio.CancelledError
    return result


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled or not sys.stderr.isatty(), leave=False)


DEADLINE_PASSED = "run deadline passed"
FROZEN = "not sent: the server answered neither a request nor /health"
HEALTH_TIMEOUT_S = 5.0  # a server that cannot answer /health in this long is frozen


def _not_sent(spec: RequestSpec, reason: str = DEADLINE_PASSED) -> RequestResult:
    return RequestResult(
        request_id=spec.request_id,
        group=spec.group,
        turn_index=spec.turn_index,
        warmup=spec.warmup,
        status="not_sent",
        sent_prompt_tokens=len(spec.prompt_ids),
        error=reason,
    )


class FrozenServerWatch:
    """After a request times out, one `/health` probe: a server that answers neither is frozen
    (stopped, swapped out, deadlocked), and the requests not yet sent are not sent. Otherwise a
    frozen server costs a whole request timeout per request before the run can say so."""

    def __init__(self, session: Any, base_url: str) -> None:
        self.session = session
        self.base_url = base_url
        self.frozen = False

    async def after(self, result: RequestResult) -> None:
        if result.status == "timeout" and not self.frozen:
            self.frozen = not await self._healthy()

    async def _healthy(self) -> bool:
        import aiohttp

        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                async with self.session.get(f"{self.base_url}/health") as response:
                    return response.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    def reason_not_to_send(self, t0: float, deadline_s: float) -> str | None:
        if self.frozen:
            return FROZEN
        if time.perf_counter() - t0 > deadline_s:
            return DEADLINE_PASSED
        return None


@dataclass
class PhaseTiming:
    """Wall-clock bounds of the measured phase (for requests/s and tokens/s)."""

    start_s: float = 0.0
    end_s: float = 0.0

    @property
    def wall_s(self) -> float:
        return max(self.end_s - self.start_s, 0.0)


async def _session(concurrency: int):
    import aiohttp

    connector = aiohttp.TCPConnector(limit=max(concurrency, 1) + 1, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


async def run_burst(
    base_url: str,
    model: str,
    specs: Sequence[RequestSpec],
    concurrency: int,
    *,
    timeout_s: float = 120.0,
    deadline_s: float = 600.0,
    progress: bool = True,
    desc: str = "requests",
    t0: float | None = None,
) -> tuple[list[RequestResult], PhaseTiming]:
    """Warm-up requests one by one, then the others with at most `concurrency` in flight.

    The measured phase starts after the warm-up, so that requests/s counts measured requests
    only. Requests not started before `deadline_s` (from `t0`, by default now) are `not_sent`;
    `start_s` and the phase bounds are seconds since `t0` (a `time.perf_counter()` value).
    """
    if concurrency < 1:
        raise WorkloadError(f"concurrency must be >= 1, got {concurrency}")
    t0 = time.perf_counter() if t0 is None else t0
    results: dict[str, RequestResult] = {}
    timing = PhaseTiming()
    semaphore = asyncio.Semaphore(concurrency)
    bar = _progress(len(specs), desc, progress)
    session = await _session(concurrency)
    watch = FrozenServerWatch(session, base_url)
    try:

        async def send(spec: RequestSpec) -> None:
            async with semaphore:
                reason = watch.reason_not_to_send(t0, deadline_s)
                if reason is not None:
                    results[spec.request_id] = _not_sent(spec, reason)
                else:
                    results[spec.request_id] = await stream_completion(
                        session, base_url, model, spec, timeout_s=timeout_s, t0=t0
                    )
                    await watch.after(results[spec.request_id])
            bar.update(1)

        for spec in (s for s in specs if s.warmup):
            await send(spec)
        timing.start_s = time.perf_counter() - t0
        await asyncio.gather(*(send(s) for s in specs if not s.warmup))
        timing.end_s = time.perf_counter() - t0
    finally:
        await session.close()
        bar.close()
    return [results[s.request_id] for s in specs], timing


async def run_closed_loop(
    base_url: str,
    model: str,
    conversations: Sequence[Sequence[RequestSpec]],
    concurrency: int,
    *,
    timeout_s: float = 120.0,
    deadline_s: float = 600.0,
    progress: bool = True,
    desc: str = "turns",
) -> tuple[list[RequestResult], PhaseTiming]:
    """`concurrency` clients; each takes the next conversation and sends its turns one after
    another, the next only when the previous answer has finished (or failed)."""
    if concurrency < 1:
        raise WorkloadError(f"concurrency must be >= 1, got {concurrency}")
    queue = deque(conversations)

    async def client(turns: _Turns) -> None:
        while queue:
            await turns.send(queue.popleft())

    return await _send_conversations(
        (base_url, model, conversations, concurrency),
        (timeout_s, deadline_s),
        progress,
        desc,
        lambda turns: [client(turns) for _ in range(concurrency)],
    )


async def run_open_loop(
    base_url: str,
    model: str,
    conversations: Sequence[Sequence[RequestSpec]],
    starts_s: Sequence[float],
    concurrency: int,
    *,
    timeout_s: float = 120.0,
    deadline_s: float = 600.0,
    progress: bool = True,
    desc: str = "turns",
) -> tuple[list[RequestResult], PhaseTiming]:
    """Conversation i starts at `starts_s[i]` seconds, whatever the server is doing (an open
    loop: a slow server builds a queue instead of slowing the arrivals), and sends its turns
    one after another, each when the previous answer has finished. At most `concurrency`
    conversations are in flight; one that arrives with all of them busy waits for a slot (as
    `vllm bench serve --max-concurrency` does)."""
    if concurrency < 1:
        raise WorkloadError(f"concurrency must be >= 1, got {concurrency}")
    if len(starts_s) != len(conversations):
        raise WorkloadError(f"{len(starts_s)} start times for {len(conversations)} conversations")
    slots = asyncio.Semaphore(concurrency)

    async def arrive(turns: _Turns, conversation: Sequence[RequestSpec], start_s: float) -> None:
        await asyncio.sleep(max(0.0, start_s - (time.perf_counter() - turns.t0)))
        async with slots:
            await turns.send(conversation, due_s=start_s)

    return await _send_conversations(
        (base_url, model, conversations, concurrency),
        (timeout_s, deadline_s),
        progress,
        desc,
        lambda turns: [arrive(turns, c, s) for c, s in zip(conversations, starts_s, strict=True)],
    )


async def _send_conversations(
    run: tuple[str, str, Sequence[Sequence[RequestSpec]], int],
    limits: tuple[float, float],
    progress: bool,
    desc: str,
    senders: Any,
) -> tuple[list[RequestResult], PhaseTiming]:
    """One session and one progress bar for the coroutines `senders(turns)` makes, each
    sending whole conversations through `turns`; the results in the order of `conversations`.
    `run`: the server's URL, the model, the conversations and the connections to open."""
    base_url, model, conversations, connections = run
    t0 = time.perf_counter()
    results: list[RequestResult] = []
    bar = _progress(sum(len(c) for c in conversations), desc, progress)
    session = await _session(connections)
    turns = _Turns(session, base_url, model, t0, limits, results, bar)
    try:
        await asyncio.gather(*senders(turns))
    finally:
        await session.close()
        bar.close()
    order = {s.request_id: i for i, s in enumerate(s for c in conversations for s in c)}
    results.sort(key=lambda r: order[r.request_id])
    return results, PhaseTiming(0.0, time.perf_counter() - t0)


class _Turns:
    """Sends a conversation's turns in order, each after the previous answer (or failure),
    into one list of results; a frozen server stops what is not yet sent."""

    def __init__(
        self,
        session: Any,
        base_url: str,
        model: str,
        t0: float,
        limits: tuple[float, float],
        results: list[RequestResult],
        bar: Any,
    ) -> None:
        self.session, self.base_url, self.model, self.t0 = session, base_url, model, t0
        self.timeout_s, self.deadline_s = limits
        self.results, self.bar = results, bar
        self.watch = FrozenServerWatch(session, base_url)

    async def send(self, conversation: Sequence[RequestSpec], due_s: float = math.nan) -> None:
        """`due_s`: when the first turn was to start (open loop), kept beside when it did."""
        for index, spec in enumerate(conversation):
            reason = self.watch.reason_not_to_send(self.t0, self.deadline_s)
            if reason is not None:
                result = _not_sent(spec, reason)
            else:
                result = await stream_completion(
                    self.session,
                    self.base_url,
                    self.model,
                    spec,
                    timeout_s=self.timeout_s,
                    t0=self.t0,
                )
                await self.watch.after(result)
            if index == 0:
                result.due_s = due_s
            self.results.append(result)
            self.bar.update(1)
