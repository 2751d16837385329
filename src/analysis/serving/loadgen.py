"""Workloads, an async streaming client and the statistics of a serving benchmark.

Everything here speaks token ids: prompts are sent to vLLM's OpenAI-compatible
`/v1/completions` as lists of ids, so a "shared prefix" is shared token for token and the
server's prefix cache sees exactly the prefix we meant. Nothing here starts a server (that is
`analysis.serving`), and nothing here imports vllm or torch.

Per request we record TTFT (the arrival of the first streamed chunk that carries a token),
end-to-end latency, prompt and output tokens and a status:

    ok        the stream ended with `[DONE]`
    timeout   the request passed its time limit (the connection is closed, so vLLM aborts it)
    error     an HTTP error, a broken stream, or an error event from the server
    not_sent  the run's deadline passed before the request could be sent

Timeouts and errors are counted and reported, never fatal.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.platform.errors import WorkloadError
from analysis.platform.paths import traces_dir

BOS_ID = 128000
# Ids below the Llama 3 special tokens (128000+) are ordinary BPE tokens of the vocabulary.
ORDINARY_ID_RANGE = (1_000, 128_000)
STATUSES = ("ok", "timeout", "error", "not_sent")


# --------------------------------------------------------------------------------------------
# Requests and results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: its prompt ids and how many tokens to generate."""

    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    group: str = ""  # prefix regime, or conversation id in a closed loop
    turn_index: int = 0
    warmup: bool = False  # sent alone before the measured phase, to populate the cache


@dataclass
class RequestResult:
    request_id: str
    group: str
    turn_index: int
    warmup: bool
    status: str
    sent_prompt_tokens: int
    prompt_tokens: int | None = None  # as counted by the server (usage)
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache (usage)
    output_tokens: int = 0
    start_s: float = math.nan  # seconds since the start of the run
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    chunks: int = 0
    error: str | None = None


def results_frame(results: Iterable[RequestResult]) -> pd.DataFrame:
    """Per-request table, one row per request, in the order given."""
    rows = [asdict(r) for r in results]
    columns = list(RequestResult.__dataclass_fields__)
    frame = pd.DataFrame(rows, columns=columns)
    frame = frame.astype(
        {
            "turn_index": "int32",
            "sent_prompt_tokens": "int32",
            "prompt_tokens": "Int64",
            "cached_tokens": "Int64",
        }
    )
    frame["tpot_s"] = time_per_output_token(frame)
    return frame


def time_per_output_token(frame: pd.DataFrame) -> pd.Series:
    """Seconds per generated token after the first, (e2e - TTFT) / (output tokens - 1): the
    decode speed a client sees (inter-token latency); NaN where fewer than 2 tokens came."""
    steps = frame["output_tokens"].astype(float) - 1.0
    tpot = (frame["e2e_s"].astype(float) - frame["ttft_s"].astype(float)) / steps
    return tpot.where(steps > 0)


# --------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------


def _rng(*key: object) -> np.random.Generator:
    """A generator seeded by a stable hash of `key`, so workloads are the same on every run."""
    digest = hashlib.sha256(json.dumps(key, default=str).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def ordinary_ids(count: int, *key: object) -> list[int]:
    """`count` pseudo-random ordinary token ids, fixed by `key`."""
    low, high = ORDINARY_ID_RANGE
    return _rng(*key).integers(low, high, size=count).tolist()


def shared_prefix(prefix_tokens: int, *key: object) -> list[int]:
    """A prefix of exactly `prefix_tokens` ids, BOS first; empty for 0."""
    if prefix_tokens < 0:
        raise WorkloadError(f"prefix length must be >= 0, got {prefix_tokens}")
    if prefix_tokens == 0:
        return []
    return [BOS_ID, *ordinary_ids(prefix_tokens - 1, "prefix", *key)]


def unique_suffix(index: int, suffix_tokens: int, *key: object) -> list[int]:
    """A suffix whose first id differs for every `index`, so that no two suffixes share a block."""
    low, high = ORDINARY_ID_RANGE
    first = low + (index * 7919) % (high - low)  # distinct for index < high - low
    return [first, *ordinary_ids(suffix_tokens - 1, "suffix", index, *key)]


def _evenly_chosen(index: int, share: float) -> bool:
    """Whether the `index`-th request belongs to a share `share` spread evenly over the run."""
    return math.floor((index + 1) * share + 1e-9) > math.floor(index * share + 1e-9)


def synthetic_prefix_workload(
    prefix_tokens: int,
    num_requests: int,
    *,
    suffix_tokens: int = 24,
    output_tokens: int = 16,
    warmup_requests: int = 1,
    seed: int = 0,
    salt: str = "",
    eligible_share: float = 1.0,
    distinct_prefixes: int = 1,
    churn_every: int = 0,
) -> list[RequestSpec]:
    """Requests that share a prefix of `prefix_tokens` ids token for token, then a unique suffix.

    Every prompt is exactly `prefix_tokens + suffix_tokens` long (BOS opens the prefix, or the
    suffix when there is no prefix). The first `warmup_requests` are marked warm-up: they
    populate the cache before the measured ones. `salt` changes the prefix, so that runs on
    one server (another concurrency, say) start cold instead of hitting the last run's prefix.

    Variants of seed 003's traffic patterns (all prompts keep the same length):
    - `eligible_share` f: only that share of the measured requests (spread evenly) uses a
      shared prefix; the others get a prefix of their own (mixed traffic, the f·h dilution);
    - `distinct_prefixes` K: eligible requests cycle over K different prefixes (many
      distinct prefixes; they thrash once K prefixes no longer fit the KV cache);
    - `churn_every` N: the prefix changes to a new version every N measured requests
      (an edited system prompt invalidates reuse).
    """
    if suffix_tokens < 1:
        raise WorkloadError(f"suffix length must be >= 1, got {suffix_tokens}")
    if num_requests < 1 or warmup_requests < 0 or output_tokens < 1:
        raise WorkloadError(
            f"need num_requests >= 1, warmup_requests >= 0, output_tokens >= 1; got "
            f"{num_requests}, {warmup_requests}, {output_tokens}"
        )
    if not 0.0 <= eligible_share <= 1.0 or distinct_prefixes < 1 or churn_every < 0:
        raise WorkloadError(
            f"need 0 <= eligible_share <= 1, distinct_prefixes >= 1, churn_every >= 0; got "
            f"{eligible_share}, {distinct_prefixes}, {churn_every}"
        )
    key = (seed, prefix_tokens, salt)
    specs = []
    for index in range(warmup_requests + num_requests):
        warmup = index < warmup_requests
        measured = index - warmup_requests
        if warmup:
            prefix_key: tuple = (*key,)
        elif not _evenly_chosen(measured, eligible_share):
            prefix_key = (*key, "unique", measured)
        else:
            version = measured // churn_every if churn_every else 0
            variant = measured % distinct_prefixes
            prefix_key = (*key,) if (version, variant) == (0, 0) else (*key, version, variant)
        prefix = shared_prefix(prefix_tokens, *prefix_key)
        suffix = unique_suffix(index, suffix_tokens, *key)
        if not prefix:
            suffix = [BOS_ID, *suffix[:-1]]
        specs.append(
            RequestSpec(
                request_id=f"p{prefix_tokens}/{'w' if warmup else 'r'}{index}",
                prompt_ids=tuple(prefix + suffix),
                max_tokens=output_tokens,
                group=str(prefix_tokens),
                turn_index=0,
                warmup=warmup,
            )
        )
    return specs


def cacheable_tokens(prompt_tokens: int, shared_tokens: int, block_size: int) -> int:
    """Tokens of a prompt that vLLM can serve from cache: full shared blocks, never the last
    prompt token (`max_cache_hit_length = num_tokens - 1`)."""
    usable = min(shared_tokens, prompt_tokens - 1)
    return max(0, usable // block_size * block_size)


def predicted_ttft_saving(prefix_tokens: int, suffix_tokens: int, block_size: int) -> float:
    """First-order TTFT saving on a cache hit, P / (P + S), with P the cacheable prefix."""
    total = prefix_tokens + suffix_tokens
    return cacheable_tokens(total, prefix_tokens, block_size) / total if total else 0.0


def prefix_sweep_prompts(
    fraction: float, num_prompts: int, input_len: int = 1000, *, seed: int = 0
) -> list[list[int]]:
    """Seed 004's workload: `num_prompts` prompts of `input_len` ids whose first
    round(fraction * input_len) ids are shared by all; the rest is unique per prompt."""
    if not 0.0 <= fraction <= 1.0:
        raise WorkloadError(f"shared fraction must lie in [0, 1], got {fraction}")
    if input_len < 2 or num_prompts < 1:
        raise WorkloadError(
            f"need input_len >= 2 and num_prompts >= 1, got {input_len}, {num_prompts}"
        )
    shared = round(fraction * input_len)
    key = ("sweep", seed, fraction, input_len)
    prefix = shared_prefix(shared, *key)
    prompts = []
    for index in range(num_prompts):
        rest = input_len - shared
        if rest == 0:
            prompts.append(list(prefix))
            continue
        suffix = unique_suffix(index, rest, *key)
        prompts.append(prefix + suffix if prefix else [BOS_ID, *suffix[:-1]])
    return prompts


@dataclass
class ShareGPTWorkload:
    """Closed-loop conversations: each inner list is one conversation's turns, in order."""

    conversations: list[list[RequestSpec]]
    skipped_turns: dict[str, int] = field(default_factory=dict)  # reason -> count

    @property
    def num_requests(self) -> int:
        return sum(len(c) for c in self.conversations)


def load_trace_frame(path: Path) -> pd.DataFrame:
    """The multi-turn trace (shared schema), or a one-line error saying how to build it."""
    from analysis.data.traces import load_trace

    return load_trace(path)


def sharegpt_workload(
    trace: pd.DataFrame | Path | None = None,
    *,
    conversations: int = 8,
    max_turns: int = 4,
    min_turns: int = 2,
    output_tokens: int = 16,
    max_model_len: int = 4096,
) -> ShareGPTWorkload:
    """The first `conversations` conversations of the trace with at least `min_turns` usable
    turns, cut to `max_turns` turns. A turn is usable if its prompt plus its output fits
    `max_model_len`; a conversation stops at its first turn that does not fit (later turns
    are longer still). Output length: the recorded reply's length, capped at `output_tokens`.
    """
    if isinstance(trace, pd.DataFrame):
        frame = trace
    else:
        frame = load_trace_frame(Path(trace) if trace else traces_dir() / "multi_turn.parquet")
    skipped: dict[str, int] = {}
    chosen: list[list[RequestSpec]] = []
    for conversation_id, turns in frame.groupby("conversation_id", sort=False):
        if len(chosen) >= conversations:
            break
        specs: list[RequestSpec] = []
        for row in turns.sort_values("turn_index").itertuples(index=False):
            if len(specs) >= max_turns:
                skipped["beyond_max_turns"] = skipped.get("beyond_max_turns", 0) + 1
                continue
            max_tokens = int(min(max(row.response_tokens, 1), output_tokens))
            if int(row.prompt_tokens) + max_tokens > max_model_len:
                skipped["too_long"] = skipped.get("too_long", 0) + len(turns) - len(specs)
                break
            specs.append(
                RequestSpec(
                    request_id=str(row.request_id),
                    prompt_ids=tuple(int(t) for t in row.prompt_ids),
                    max_tokens=max_tokens,
                    group=str(conversation_id),
                    turn_index=int(row.turn_index),
                )
            )
        if len(specs) >= min_turns:
            chosen.append(specs)
        else:
            skipped["short_conversation"] = skipped.get("short_conversation", 0) + len(specs)
    if not chosen:
        raise WorkloadError(
            f"no conversation of the trace has {min_turns}+ turns within {max_model_len} tokens"
        )
    return ShareGPTWorkload(chosen, skipped)


# --------------------------------------------------------------------------------------------
# Async streaming client
# --------------------------------------------------------------------------------------------


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
    return result


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled or not sys.stderr.isatty(), leave=False)


def _not_sent(spec: RequestSpec) -> RequestResult:
    return RequestResult(
        request_id=spec.request_id,
        group=spec.group,
        turn_index=spec.turn_index,
        warmup=spec.warmup,
        status="not_sent",
        sent_prompt_tokens=len(spec.prompt_ids),
        error="run deadline passed",
    )


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
    try:

        async def send(spec: RequestSpec) -> None:
            async with semaphore:
                if time.perf_counter() - t0 > deadline_s:
                    results[spec.request_id] = _not_sent(spec)
                else:
                    results[spec.request_id] = await stream_completion(
                        session, base_url, model, spec, timeout_s=timeout_s, t0=t0
                    )
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
    t0 = time.perf_counter()
    queue = deque(conversations)
    results: list[RequestResult] = []
    bar = _progress(sum(len(c) for c in conversations), desc, progress)
    session = await _session(concurrency)

    async def client() -> None:
        while queue:
            conversation = queue.popleft()
            for spec in conversation:
                if time.perf_counter() - t0 > deadline_s:
                    results.append(_not_sent(spec))
                else:
                    results.append(
                        await stream_completion(
                            session, base_url, model, spec, timeout_s=timeout_s, t0=t0
                        )
                    )
                bar.update(1)

    try:
        await asyncio.gather(*(client() for _ in range(concurrency)))
    finally:
        await session.close()
        bar.close()
    order = {s.request_id: i for i, s in enumerate(s for c in conversations for s in c)}
    results.sort(key=lambda r: order[r.request_id])
    return results, PhaseTiming(0.0, time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (linear interpolation) of the finite values; NaN if there are none."""
    array = np.asarray([v for v in values if v is not None], dtype=float)
    array = array[np.isfinite(array)]
    return float(np.percentile(array, q)) if array.size else math.nan


def _mean(values: Iterable[float]) -> float:
    array = np.asarray(list(values), dtype=float)
    array = array[np.isfinite(array)]
    return float(array.mean()) if array.size else math.nan


def latency_stats(frame: pd.DataFrame, prefix: str = "") -> dict[str, float]:
    """mean / p50 / p95 of TTFT, end-to-end latency and TPOT over the `ok` rows of `frame`."""
    ok = frame[frame["status"] == "ok"]
    stats = {}
    for column in ("ttft", "e2e", "tpot"):
        if f"{column}_s" not in ok.columns:
            continue
        values = ok[f"{column}_s"].to_numpy(dtype=float)
        stats[f"mean_{column}{prefix}_s"] = _mean(values)
        stats[f"p50_{column}{prefix}_s"] = percentile(values, 50)
        stats[f"p95_{column}{prefix}_s"] = percentile(values, 95)
    return stats


def summarize_requests(frame: pd.DataFrame, wall_s: float) -> dict[str, Any]:
    """Per-run statistics. Latencies exclude warm-up rows; `*_incl_warmup_s` include them.

    Throughput is over the measured phase: measured `ok` requests (and their output tokens)
    per second of its wall-clock time.
    """
    measured = frame[~frame["warmup"].astype(bool)]
    counts = {f"n_{s}": int((measured["status"] == s).sum()) for s in STATUSES}
    ok = measured[measured["status"] == "ok"]
    summary: dict[str, Any] = {
        "n_requests": len(measured),
        **counts,
        "n_warmup": int(frame["warmup"].astype(bool).sum()),
        **latency_stats(measured),
        **{
            k: v
            for k, v in latency_stats(frame, "_incl_warmup").items()
            if k.startswith(("mean", "p95"))
        },
        "wall_s": float(wall_s),
        "req_s": len(ok) / wall_s if wall_s > 0 else math.nan,
        "tok_s": float(ok["output_tokens"].sum()) / wall_s if wall_s > 0 else math.nan,
        "prompt_tokens": int(ok["sent_prompt_tokens"].sum()),
        "output_tokens": int(ok["output_tokens"].sum()),
    }
    warm = frame[frame["warmup"].astype(bool) & (frame["status"] == "ok")]
    summary["warmup_ttft_s"] = _mean(warm["ttft_s"]) if len(warm) else math.nan
    return summary


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
# Counters that explain a run; Prometheus names without the `_total` suffix.
SERVER_COUNTERS = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:prompt_tokens_cached",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:num_preemptions",
    "vllm:request_success",
)
# Gauges sampled during a run: KV-cache use (0-1, cached-but-idle blocks count as free) and
# the scheduler's queues.
SERVER_GAUGES = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)


def parse_prometheus(text: str, names: Sequence[str] = SERVER_COUNTERS) -> dict[str, float]:
    """Sum each counter over its label sets (engines, finish reasons). `_total` is dropped;
    `_created` timestamps are ignored. Counters absent from the text are absent here."""
    wanted = set(names)
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name = match.group(1).removesuffix("_total")
        if name not in wanted or match.group(1).endswith("_created"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        totals[name] = totals.get(name, 0.0) + value
    return totals


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before for every counter in `after` (a counter new in `after` starts at 0).

    A negative delta means the server restarted between the scrapes: refuse it loudly."""
    deltas = {}
    for name, value in after.items():
        delta = value - before.get(name, 0.0)
        if delta < 0:
            raise ValueError(f"counter {name} went down ({before[name]} -> {value}): server reset?")
        deltas[name] = delta
    return deltas


def counter_summary(deltas: dict[str, float], prefix: str = "") -> dict[str, float]:
    """Flat columns from counter deltas: queries, hits, hit rate, preemptions, ..."""
    out = {f"{prefix}{k.removeprefix('vllm:')}": v for k, v in sorted(deltas.items())}
    queries = deltas.get("vllm:prefix_cache_queries", 0.0)
    hits = deltas.get("vllm:prefix_cache_hits", 0.0)
    out[f"{prefix}hit_rate"] = hits / queries if queries else math.nan
    return out
