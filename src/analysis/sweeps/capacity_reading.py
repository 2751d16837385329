"""Notebook 14's tables, readings and checks, every number taken from the plans it is given."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from analysis.sweeps.capacity_plan import CapacityPlan
from analysis.sweeps.capacity_target import TargetAnswer


def answers_table(answers: Iterable[tuple[str, TargetAnswer]]) -> pd.DataFrame:
    """One row per (trace, model, KV dtype): the target in blocks, GiB and GPUs."""
    rows = []
    for label, answer in answers:
        engine = answer.engine
        rows.append(
            {
                "trace": label,
                "model": answer.model,
                "kv_dtype": answer.kv_cache_dtype,
                "target_%": 100 * answer.target_rate,
                "lru_blocks": answer.lru_blocks,
                "engine_blocks": engine.num_blocks,
                "engine_%": None if engine.rate is None else 100 * engine.rate,
                "bytes_per_block": answer.bytes_per_block,
                "engine_GiB": None if engine.num_blocks is None else answer.engine_bytes / 2**30,
                "tensor_parallel": answer.tensor_parallel,
                "gpu_share_%": None if answer.gpu_share is None else 100 * answer.gpu_share,
                "gpu_blocks": answer.gpu_num_blocks,
            }
        )
    return pd.DataFrame(rows)


def memory_table(
    models: Iterable[str],
    kv_cache_dtypes: Iterable[str],
    block_size: int,
    gpu_memory_utilization: float,
) -> pd.DataFrame:
    """What one GPU of each kind gives each model: bytes per block and vLLM's num_blocks."""
    from analysis.models import memory

    rows = []
    for model in models:
        for dtype in kv_cache_dtypes:
            layout = memory.kv_layout(model, dtype)
            for gpu_name, gpu in memory.GPUS.items():
                budget = memory.kv_budget(
                    gpu,
                    layout,
                    block_size,
                    gpu_memory_utilization=gpu_memory_utilization,
                    weights_bytes=memory.weight_bytes(model),
                )
                rows.append(
                    {
                        "model": model,
                        "kv_dtype": dtype,
                        "gpu": gpu_name,
                        "bytes_per_block": budget.bytes_per_block,
                        "weights_GiB": budget.weights_bytes / 2**30,
                        "kv_GiB": budget.kv_bytes / 2**30,
                        "num_blocks": budget.num_blocks,
                        "tokens": budget.tokens,
                    }
                )
    return pd.DataFrame(rows)


def _pct(rate: float) -> str:
    return f"{100 * rate:.1f} %"


def plan_reading(
    plans: Mapping[str, CapacityPlan], table: pd.DataFrame, share_of_ideal: float
) -> str:
    """The reading of the capacity figure: one paragraph per trace, numbers from the plans."""
    parts = ["**Reading.**"]
    for label, plan in plans.items():
        rows = table[table["trace"] == label]
        first = rows.iloc[0]
        in_trace = plan.lru_blocks_for(share_of_ideal, "trace")
        in_engine = plan.lru_blocks_for(share_of_ideal, "engine")
        grid = plan.points.sort_values("num_blocks")
        fewest = grid.iloc[0]
        stored = "" if plan.trace.include_outputs else ", prompts only: replies carry no hash ids"
        text = (
            f"*{label}* (ideal {_pct(plan.ideal['engine'])}{stored}): LRU keeps "
            f"{share_of_ideal:.0%} of the ideal with {in_trace:,} blocks in trace order and "
            f"{in_engine:,} in the engine's order, {plan.settings.concurrency} clients at once"
        )
        if first["engine_blocks"] is None or pd.isna(first["engine_blocks"]):
            text += f"; the engine never reaches it (best {_pct(grid['first_prefill'].max())})."
        else:
            blocks = int(first["engine_blocks"])
            if blocks == int(fewest["num_blocks"]):
                # no smaller cache runs, so the gap to LRU is vLLM's floor, not a measured need
                text += (
                    f"; the engine reaches it already at vLLM's minimum, num_blocks = "
                    f"{blocks:,}, the smallest cache vLLM starts with for this max_model_len: "
                    "no smaller one was run, so how many blocks the engine needs below it is "
                    "not measured"
                )
            else:
                text += (
                    f"; the engine reaches it at num_blocks = {blocks:,} ({blocks - in_engine:+,} "
                    "blocks against LRU in engine order: what its running requests hold)"
                )
            for row in rows.itertuples():
                text += f"; for {row.model} with {row.kv_dtype} KV that is {row.engine_GiB:.2f} GiB"
            text += "."
        text += (
            f" At vLLM's minimum, {int(fewest['num_blocks']):,} blocks, it measures "
            f"{_pct(fewest['first_prefill'])} with {int(fewest['preemptions']):,} preemptions."
        )
        parts.append(text)
    return "\n\n".join(parts)


def target_check(
    label: str, points: pd.DataFrame, search: Any, rate: float
) -> tuple[str, Any, Any, bool]:
    """The check of one reached target (`capacity_target.EngineSearch`): the answer reaches
    the rate and the point below it does not; where no point below was run, the answer must be
    the smallest cache run (vLLM's minimum), which nothing below can undercut. Returns
    `Checks.add`'s arguments."""
    measured = points.set_index("num_blocks")["first_prefill"]
    if search.below is None:
        fewest = int(points["num_blocks"].min())
        return (
            f"{label}: the engine's answer reaches the target and is vLLM's minimum "
            "(no smaller cache runs)",
            fewest,
            int(search.num_blocks),
            bool(search.rate >= rate) and int(search.num_blocks) == fewest,
        )
    return (
        f"{label}: the engine's answer reaches the target, the point below it does not",
        True,
        bool(search.rate >= rate > measured.loc[search.below]),
        bool(search.rate >= rate > measured.loc[search.below]),
    )


def order_check(label: str, plan: Any, share_of_ideal: float) -> tuple[str, Any, Any, bool]:
    """The reading's headline: LRU in the engine's admission order (clients interleaved) needs
    no fewer blocks than in trace order, so a bound taken in trace order undersizes the cache.
    Returns `Checks.add`'s arguments (`holds` False where either order never reaches it)."""
    in_trace = plan.lru_blocks_for(share_of_ideal, "trace")
    in_engine = plan.lru_blocks_for(share_of_ideal, "engine")
    return (
        f"{label}: LRU keeps {share_of_ideal:.0%} of the ideal with no fewer blocks in the "
        "engine's order than in trace order",
        f">= {in_trace}",
        in_engine,
        in_trace is not None and in_engine is not None and in_engine >= in_trace,
    )


def plan_checks(
    plans: Mapping[str, CapacityPlan],
    answers: Iterable[tuple[str, TargetAnswer]],
    blockhash_pair: tuple[Any, Any] | None = None,
    share_of_ideal: float | None = None,
):
    """The claims notebook 14 makes, each against an independent computation (with
    `share_of_ideal`, the reading's trace-order against engine-order LRU too)."""
    from analysis.metrics import bounds
    from analysis.metrics.cached_tokens import cached_tokens_table
    from analysis.metrics.hitrates import first_prefill
    from analysis.metrics.oracles import Checks, vllm_bytes_per_block
    from analysis.models import memory

    checks = Checks()
    for label, plan in plans.items():
        curves = plan.curves[plan.curves["order"] == "engine"]
        table = curves.pivot_table(index="capacity", columns="policy", values="hit_blocks")
        checks.add(
            f"{label}: LRU <= Belady <= ideal at every capacity, engine order",
            True,
            bool((table["lru"] <= table["opt"]).all())
            and bool((table["opt"] <= plan.ideal_hit_blocks()).all()),
        )
        checks.add(
            f"{label}: no engine point exceeds the ideal in engine order",
            len(plan.points),
            int((plan.points["first_prefill"] <= plan.ideal["engine"] + 1e-12).sum()),
        )
        run = plan.spare_run
        checks.add(
            f"{label}: cached_tokens sum to vLLM's first-prefill hits",
            first_prefill(run.admissions).hits,
            int(cached_tokens_table(run.requests)["cached_tokens"].sum()),
        )
    for label, plan in plans.items():
        for rate, search in plan.searches.items():
            if not search.reached:
                continue
            checks.add(*target_check(label, plan.points, search, rate))
    if share_of_ideal is not None:
        for label, plan in plans.items():
            checks.add(*order_check(label, plan, share_of_ideal))
    layouts = {
        (a.model, a.kv_cache_dtype, plans[label].trace.block_size, a.bytes_per_block)
        for label, a in answers
    }
    for model, dtype, size, bytes_per_block in sorted(layouts):
        layout = memory.kv_layout(model, dtype)
        checks.add(
            f"{model} {dtype}, block {size}: bytes per block = vLLM's page sizes",
            vllm_bytes_per_block(
                layout.num_layers,
                layout.kv_heads_per_gpu,
                layout.head_size,
                layout.kv_bytes_per_value,
                size,
            ),
            bytes_per_block,
        )
    if blockhash_pair is not None:
        tokens, hashes = blockhash_pair
        size = 16
        checks.add(
            "ShareGPT written as block hashes: the same ideal hits as its tokens (prompts)",
            bounds.ideal_bound(bounds.index_trace(tokens), size).hit_tokens,
            bounds.ideal_bound(bounds.index_trace(hashes), size).hit_tokens,
        )
    return checks
