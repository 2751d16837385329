"""The workloads a clock is calibrated on, and the held-out ones it is validated on.

Calibration varies what a step's cost depends on, one thing at a time where it can:
- `prefill-ladder`: one request at a time, prompts from 32 tokens to near the context, so
  prefill steps of every size (tokens and attention pairs grow together only in part: the
  ladder's decode steps then read contexts of every length);
- `decode-batch`: every request at once, replies of staggered lengths, so decode batches
  shrink from all requests to one, at contexts of several lengths;
- `shared-decode`: every request at once over one long cached prefix, replies of staggered
  lengths, so decode batches that read the same blocks (`distinct_context` against
  `decode_context`) shrink from all requests to one;
- `short-decode`: a few requests at once with short prompts, replies of staggered lengths, so
  small decode batches at short contexts too (in `decode-batch` a batch is small only near its
  end, when its contexts are long: a fit could not tell the batch's size from its context);
- `short-turns`: closed-loop clients sending short single-turn requests with short replies:
  steps where several new requests of a few tokens are prefilled beside a few decodes (a fit
  without them may charge a new request almost nothing or several ms, as its noise falls);
- `mixed-cached`: closed-loop multi-turn conversations sharing a system prompt: prefills
  beside decodes, and cache hits;
- `open-loop`: single-turn requests of random length arriving as a Poisson process, so
  requests join a running batch one by one, as they do in serving.
Every workload keeps the engine's settings (the token budget included): a profile holds for
the settings it was measured with.

Held out (never fitted): real ShareGPT traffic, as conversations in closed loop and as
single-turn requests arriving open-loop (Poisson). Their size depends on the device: a CPU
runs a tiny model slowly, a GPU a real-size shape quickly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.engines.config import RunConfig
from analysis.engines.synthetic import BOS_ID, EOT_ID, TEXT_ID_LIMIT, _frame, _row, synthetic_trace


@dataclass(frozen=True)
class TimingWorkload:
    """A trace (a frame builder, or None for the config's trace file) and its run settings."""

    name: str
    trace: Callable[[], pd.DataFrame] | None
    changes: dict[str, Any]

    def config(self, base: RunConfig) -> RunConfig:
        return base.with_(**self.changes)

    def frame(self) -> pd.DataFrame | None:
        return None if self.trace is None else self.trace()


# Sizes per device: the longest ladder prompt, decode-batch requests, mixed clients and their
# conversations, open-loop requests and their rate per second; held out: conversations,
# single-turn requests, their Poisson rate per second, and the cap on replies. (On a CPU, the
# open-loop and mixed workloads, most of the calibration's time, were cut from 40 requests and 18
# conversations to 28 and 12: refitted on the first 70 % of a calibration's steps of those two, the
# profile's median error on all its steps moved from 5.3 % to 5.7 %.)
SIZES = {
    "cpu": {
        "ladder_max": 1536,
        "batch": 24,
        "shared_prefix": 1024,
        "short_batch": 8,
        "short_turns": 40,
        "short_clients": 5,
        "clients": 6,
        "mixed": 12,
        "conversations": 16,
        "singles": 48,
        "rate": 2.0,
        "reply_cap": 32,
        "open": 28,
        "open_rate": 3.0,
    },
    "cuda": {
        "ladder_max": 3584,
        "batch": 96,
        "shared_prefix": 2048,
        "short_batch": 16,
        "short_turns": 160,
        "short_clients": 16,
        "clients": 16,
        "mixed": 48,
        "conversations": 48,
        "singles": 256,
        "rate": 20.0,
        "reply_cap": 64,
        "open": 240,
        "open_rate": 30.0,
    },
}


def prefill_ladder(max_tokens: int, seed: int = 11) -> pd.DataFrame:
    """Single-turn requests, prompts on a geometric ladder from 32 to `max_tokens`, 4 tokens
    of reply each; no two share a first block."""
    rng = np.random.default_rng(seed)
    lengths = np.unique(np.geomspace(32, max_tokens, 14).astype(int))
    rows = []
    for i, length in enumerate(lengths):
        prompt = np.concatenate([[BOS_ID], rng.integers(0, TEXT_ID_LIMIT, length - 1)])
        reply = np.concatenate([rng.integers(0, TEXT_ID_LIMIT, 3), [EOT_ID]])
        rows.append(_row(f"ladder{i:03d}", 0, prompt.astype(np.int32), reply.astype(np.int32), i))
    return _frame(rows)


def decode_batch(
    count: int,
    seed: int = 12,
    prompt_tokens: tuple[int, int] = (64, 768),
    reply_step: int = 2,
    name: str = "batch",
) -> pd.DataFrame:
    """`count` single-turn requests at once, prompts of `prompt_tokens` (inclusive range),
    replies of `reply_step` - 1 to `count * reply_step` - 1 tokens and their end: the decode
    batch shrinks one request every `reply_step` steps."""
    rng = np.random.default_rng(seed)
    low, high = prompt_tokens
    rows = []
    for i in range(count):
        length = int(rng.integers(low, high + 1))
        prompt = np.concatenate([[BOS_ID], rng.integers(0, TEXT_ID_LIMIT, length - 1)])
        reply = np.concatenate([rng.integers(0, TEXT_ID_LIMIT, reply_step * (i + 1) - 1), [EOT_ID]])
        rows.append(_row(f"{name}{i:03d}", 0, prompt.astype(np.int32), reply.astype(np.int32), i))
    return _frame(rows)


def shared_decode_batch(count: int, prefix: int, seed: int = 15) -> pd.DataFrame:
    """`count` single-turn requests at once, one `prefix`-token prompt prefix and 16-64 tokens
    of their own, replies of 2 to 2 * count tokens: decodes over shared cached blocks."""
    rng = np.random.default_rng(seed)
    shared = np.concatenate([[BOS_ID], rng.integers(0, TEXT_ID_LIMIT, prefix - 1)])
    rows = []
    for i in range(count):
        own = rng.integers(0, TEXT_ID_LIMIT, int(rng.integers(16, 65)))
        prompt = np.concatenate([shared, own])
        reply = np.concatenate([rng.integers(0, TEXT_ID_LIMIT, 2 * i + 1), [EOT_ID]])
        rows.append(_row(f"shared{i:03d}", 0, prompt.astype(np.int32), reply.astype(np.int32), i))
    return _frame(rows)


def short_decode_batch(count: int, steps_per_size: int = 6, seed: int = 16) -> pd.DataFrame:
    """`decode_batch` with prompts of 16-64 tokens, each batch size decoded for
    `steps_per_size` steps: decode batches of every size from `count` down to one at contexts
    under 64 + that."""
    return decode_batch(count, seed, (16, 64), steps_per_size, "short")


def calibration_workloads(device: str) -> list[TimingWorkload]:
    size = SIZES[device]
    return [
        TimingWorkload(
            "prefill-ladder",
            lambda: prefill_ladder(size["ladder_max"]),
            {"mode": "closed-loop", "concurrency": 1},
        ),
        TimingWorkload(
            "decode-batch",
            lambda: decode_batch(size["batch"]),
            {"mode": "batch"},
        ),
        TimingWorkload(
            "shared-decode",
            lambda: shared_decode_batch(size["batch"] // 2, size["shared_prefix"]),
            {"mode": "batch"},
        ),
        TimingWorkload(
            "short-decode",
            lambda: short_decode_batch(size["short_batch"]),
            {"mode": "batch"},
        ),
        TimingWorkload(
            "short-turns",
            lambda: synthetic_trace(
                num_conversations=size["short_turns"],
                turns=1,
                user_tokens=(16, 96),
                reply_tokens=(2, 8),
                seed=17,
            ),
            {"mode": "closed-loop", "concurrency": size["short_clients"]},
        ),
        TimingWorkload(
            "mixed-cached",
            lambda: synthetic_trace(
                num_conversations=size["mixed"],
                turns=3,
                user_tokens=(30, 240),
                reply_tokens=(8, 40),
                shared_prefix=256,
                seed=13,
            ),
            {"mode": "closed-loop", "concurrency": size["clients"]},
        ),
        TimingWorkload(
            "open-loop",
            lambda: synthetic_trace(
                num_conversations=size["open"],
                turns=1,
                user_tokens=(16, 1024),
                reply_tokens=(8, 64),
                seed=14,
            ),
            {"mode": "poisson", "arrival_rate": size["open_rate"]},
        ),
    ]


def held_out_workloads(device: str) -> list[TimingWorkload]:
    """Real ShareGPT traffic the profile never saw (the traces under data/traces/)."""
    size = SIZES[device]
    return [
        TimingWorkload(
            "sharegpt-conversations",
            None,
            {
                "trace": "multi_turn",
                "mode": "closed-loop",
                "concurrency": 4,
                "limit": size["conversations"],
                "max_output_tokens": size["reply_cap"],
            },
        ),
        TimingWorkload(
            "sharegpt-poisson",
            None,
            {
                "trace": "single_turn",
                "mode": "poisson",
                "arrival_rate": size["rate"],
                "limit": size["singles"],
                "max_output_tokens": size["reply_cap"],
            },
        ),
    ]
