"""Independent checks for the notebooks' claims, and the table they end with.

Each oracle recomputes a number by a route that shares no code with what it checks: a brute
force over block hashes (not `analysis.metrics.bounds`), vLLM's own start-up check (not
`RunConfig.min_num_blocks`), a closed form (not a run), a plain re-read of a file with `json`
(not `analysis.data.sharegpt`). A notebook collects its checks in `Checks` and calls
`assert_all()` last, so a wrong number fails the notebook (and `make test`), not just changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Check:
    claim: str
    expected: Any
    measured: Any
    holds: bool


@dataclass
class Checks:
    """The claims of one notebook, each with its oracle's value and the measured one."""

    items: list[Check] = field(default_factory=list)

    def add(self, claim: str, expected: Any, measured: Any, holds: bool | None = None) -> bool:
        """Record one claim; `holds` defaults to expected == measured."""
        ok = bool(expected == measured) if holds is None else bool(holds)
        self.items.append(Check(claim, expected, measured, ok))
        return ok

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(
            [(c.claim, str(c.expected), str(c.measured), c.holds) for c in self.items],
            columns=["claim", "oracle", "measured", "holds"],
        )

    def assert_all(self) -> pd.DataFrame:
        """The table, or AssertionError naming every claim that does not hold."""
        if not self.items:
            raise AssertionError("no checks were recorded")
        failed = [c for c in self.items if not c.holds]
        if failed:
            lines = "; ".join(f"{c.claim} (oracle {c.expected}, got {c.measured})" for c in failed)
            raise AssertionError(f"{len(failed)} of {len(self.items)} claims fail: {lines}")
        return self.table()


# ----------------------------------------------------------------------------- hit-rate oracles


def _block_keys(tokens: Sequence[int], block_size: int, count: int) -> list[bytes]:
    """Chained sha256 keys of the first `count` full blocks (a block's key covers its prefix)."""
    keys, parent = [], b""
    for i in range(count):
        block = np.asarray(tokens[i * block_size : (i + 1) * block_size], dtype=np.int64)
        parent = hashlib.sha256(parent + block.tobytes()).digest()
        keys.append(parent)
    return keys


def brute_force_hits(
    prompts: Iterable[Sequence[int]],
    block_size: int,
    responses: Iterable[Sequence[int]] | None = None,
) -> np.ndarray:
    """Tokens each request could hit with an infinite cache, requests taken in the given order.

    A request hits its longest run of leading full blocks already seen, never its last token
    (at most floor((L - 1) / B) blocks). Then the blocks of everything it computed are seen:
    its prompt and, when `responses` is given, its reply except the last token (whose KV is
    never computed before the request finishes).
    """
    seen: set[bytes] = set()
    replies = iter(responses) if responses is not None else None
    hits = []
    for prompt in prompts:
        prompt = list(prompt)
        reply = list(next(replies)) if replies is not None else []
        hittable = (len(prompt) - 1) // block_size
        keys = _block_keys(prompt, block_size, hittable)
        hit = 0
        for key in keys:
            if key not in seen:
                break
            hit += 1
        hits.append(hit * block_size)
        computed = prompt + reply[:-1]
        seen.update(_block_keys(computed, block_size, len(computed) // block_size))
    return np.asarray(hits, dtype=np.int64)


def identical_requests_closed_form(prompt_tokens: int, block_size: int, count: int) -> np.ndarray:
    """Cumulative token hit rate after each of `count` identical requests (vLLM V1 since PR
    #18003): the first misses, each later one hits h = floor((L - 1) / B) * B of L tokens."""
    h = (prompt_tokens - 1) // block_size * block_size
    k = np.arange(1, count + 1)
    return (k - 1) * h / (k * prompt_tokens)


def legacy_closed_form(prompt_tokens: int, block_size: int, count: int) -> np.ndarray:
    """The same sequence in whole blocks (vLLM V1 before PR #18003): (k - 1) / k whenever the
    prompt has at least one full block (the hit blocks are then all the queried blocks)."""
    queried = prompt_tokens // block_size - (prompt_tokens % block_size == 0)
    k = np.arange(1, count + 1)
    return (k - 1) / k if queried > 0 else np.zeros(count)


# ----------------------------------------------------------------------------- vLLM's own refusal


def vllm_refusal(max_model_len: int, block_size: int, num_blocks: int) -> str | None:
    """vLLM's own start-up check of a KV cache of `num_blocks` blocks (the local random Llama's
    layer shape): None if vLLM accepts it, else vLLM's error message. Runs vLLM's
    `get_kv_cache_configs` with `num_gpu_blocks_override`, as engine start-up does."""
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from analysis.engines.config import RunConfig
    from analysis.engines.vllm_args import engine_kwargs
    from analysis.models.resolved import resolve_model

    model = resolve_model(None)  # the local random Llama, as the engines run it
    config = RunConfig(
        engine="replay", block_size=block_size, num_blocks=num_blocks, max_model_len=max_model_len
    )
    vllm_config = EngineArgs(**engine_kwargs(config, model)).create_engine_config(
        usage_context=UsageContext.LLM_CLASS
    )
    if vllm_config.cache_config.kv_cache_layout is None:  # the engine core resolves it
        vllm_config.cache_config.kv_cache_layout = "NHD"
    spec = FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=model.num_kv_heads,
        head_size=model.head_size,
        dtype=torch.bfloat16,
    )
    specs = {f"model.layers.{i}.self_attn.attn": spec for i in range(model.num_layers)}
    plenty = 1 << 40  # the override, not this, sets the size
    try:
        get_kv_cache_configs(vllm_config, [specs], [plenty])
    except ValueError as exc:
        if "max seq len" not in str(exc):
            raise
        return str(exc)
    return None


# ----------------------------------------------------------------------------- data re-parse


def plain_sharegpt_counts(path: str | Path) -> dict[str, int]:
    """Records and user turns of a ShareGPT JSON list read with `json` alone: complete records
    are decoded one by one (`raw_decode`), so a file cut mid-record still gives its whole
    records. Counts records, records with at least one human turn, and human turns."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    decoder = json.JSONDecoder()
    start = text.index("[") + 1
    records = with_user = user_turns = 0
    position = start
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            break
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            break  # the cut tail
        records += 1
        turns = sum(
            1
            for m in record.get("conversations") or []
            if m.get("from") in ("human", "user") and str(m.get("value") or "").strip()
        )
        user_turns += turns
        with_user += turns > 0
    return {"records": records, "records_with_user_turn": with_user, "user_turns": user_turns}


# ----------------------------------------------------------------------------- sweep points


def sample_ideal_hits(trace: pd.DataFrame, point: pd.Series) -> tuple[int, int]:
    """(ideal hit tokens, prompt tokens) of one sweep point's sample by brute force: the first
    `limit` conversations, prompts that fit `max_model_len`, replies cached when recorded."""
    from analysis.engines.workload import limit_trace

    sample = limit_trace(trace, None if pd.isna(point["limit"]) else int(point["limit"]))
    sample = sample[sample["prompt_tokens"] < int(point["max_model_len"])]
    responses = sample["response_ids"] if point["outputs"] == "recorded" else None
    hits = brute_force_hits(sample["prompt_ids"], int(point["block_size"]), responses)
    return int(hits.sum()), int(sample["prompt_tokens"].sum())


def check_sweep_points(
    points: pd.DataFrame, checks: Checks, traces: dict[str, pd.DataFrame]
) -> None:
    """The claims every hit-rate notebook rests on, for each group of sweep points:
    exported (vLLM's counters) = first-prefill at every point; first-prefill <= the
    brute-force ideal at every point, and = it at the roomiest point when nothing there was
    preempted; all-prefill = first-prefill wherever nothing was preempted.
    `traces`: the trace frames by name (the points' `trace` column)."""
    capped = points["max_output_tokens"].notna() if "max_output_tokens" in points else False
    usable = points[~capped] if isinstance(capped, pd.Series) else points
    checks.add(
        f"exported = first-prefill at all {len(points)} points",
        len(points),
        int((points["exported_rate"] == points["first_prefill_rate"]).sum()),
    )
    quiet = points[points["preemptions"] == 0]
    checks.add(
        f"all-prefill = first-prefill at the {len(quiet)} points without preemption",
        len(quiet),
        int((quiet["all_prefill_hits"] == quiet["first_prefill_hits"]).sum()),
    )
    keys = ["trace", "limit", "block_size", "outputs", "max_model_len"]
    for key, group in usable.groupby(keys, dropna=False, sort=False):
        ideal, _ = sample_ideal_hits(traces[key[0]], group.iloc[0])
        label = f"{key[0]} B={key[2]} {key[3]}"
        checks.add(
            f"{label}: first-prefill hits <= brute-force ideal at {len(group)} points",
            True,
            bool((group["first_prefill_hits"] <= ideal).all()),
        )
        roomiest = group.loc[group["num_blocks"].idxmax()]
        if roomiest["preemptions"] == 0 and roomiest["engine"] == "replay":
            checks.add(
                f"{label}: first-prefill = brute-force ideal at {int(roomiest['num_blocks']):,} "
                "blocks (no preemption)",
                ideal,
                int(roomiest["first_prefill_hits"]),
            )


# ----------------------------------------------------------------------------- memory oracles
VALUE_DTYPES = {1: "float8_e4m3fn", 2: "bfloat16", 4: "float32"}  # bytes -> a torch dtype


def vllm_bytes_per_block(
    num_layers: int, kv_heads_per_gpu: int, head_size: int, value_bytes: int, block_size: int
) -> int:
    """One block's bytes on one GPU as vLLM counts them: one `FullAttentionSpec` per decoder
    layer, their `page_size_bytes` summed (`_get_kv_cache_bytes_per_block`)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=kv_heads_per_gpu,
        head_size=head_size,
        dtype=getattr(torch, VALUE_DTYPES[value_bytes]),
    )
    return num_layers * spec.page_size_bytes
