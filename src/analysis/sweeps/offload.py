"""CPU offloading against CPU memory (notebook 16): vLLM's own connector, replayed, per CPU size.

For one trace, one GPU of `gpu_blocks` KV blocks and `clients` closed-loop clients, each CPU
multiple m runs `engines.offload.run_offload` with m x `gpu_blocks` CPU blocks (m = 0: the same
loop on `replay`'s scheduler without the connector, no CPU tier at all). Beside each run sit the
two-level bounds (`metrics.bounds.tier_bounds`: vLLM's write-through LRU, policy "lru", and
Belady's MIN on the GPU over it, "opt-lru") at the same GPU and CPU sizes, computed in engine
order: the trace reordered as the run with the largest CPU admitted it (`bounds.in_engine_order`).

A bound's GPU capacity is not the engine's `num_blocks`. The bound counts blocks kept between
requests; the engine's `num_blocks` also holds the blocks of the requests running at that moment
(up to `clients` of them, each its whole prompt and reply so far), so the engine keeps fewer
finished blocks than the bound's G, and a preempted request gives its blocks back. The bound's
GPU tier is therefore an optimistic stand-in for the engine's, not its model. The CPU tier has
no such gap: running requests hold no CPU blocks, and vLLM's CPU manager only refuses a store
while blocks are pinned by a load in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.metrics.oracles import Checks

DEFAULT_MULTIPLES = (0, 1, 2, 4, 8)
COLUMNS = [
    "multiple",
    "cpu_blocks",
    "gpu_hit_rate",
    "cpu_hit_rate",
    "total",
    "bound_gpu",
    "bound_cpu",
    "bound_total",
    "bound_opt_gpu",
    "bound_opt_total",
    "stored_blocks",
    "stored_never_loaded",
    "loaded_blocks",
    "preemptions",
    "computed_prompt_tokens",
]
FLAT_TOLERANCE = 0.01  # "stops helping": within 1 percentage point of the largest CPU's total
TABLE_VERSION = 5  # bump when a column or its meaning changes: cached tables are then recomputed


@dataclass(frozen=True)
class OffloadSetting:
    """A named size of notebook 16's question: how much of the trace, how big a GPU, how many
    clients."""

    conversations: int | None  # first N conversations (None: the whole trace)
    gpu_blocks: int
    clients: int


SETTINGS = {
    "default": OffloadSetting(conversations=80, gpu_blocks=600, clients=16),
    "large": OffloadSetting(conversations=1000, gpu_blocks=2800, clients=64),  # the size
}


def setting(name: str) -> OffloadSetting:
    """The named setting, or a one-line error that lists the names."""
    if name not in SETTINGS:
        raise ValueError(f"setting={name!r}: choose one of {', '.join(SETTINGS)}")
    return SETTINGS[name]


def offload_table(
    trace: pd.DataFrame,
    *,
    gpu_blocks: int,
    clients: int,
    multiples: Sequence[int] = DEFAULT_MULTIPLES,
    block_size: int = 16,
    max_model_len: int = 8192,
    eviction_policy: str = "lru",
    include_outputs: bool = True,
    compare_replay: bool = True,
    compare_replies: bool = True,
) -> pd.DataFrame:
    """One row per CPU multiple: the run's hit rates by tier, the bounds at the same sizes, and
    the connector's transfers (columns `COLUMNS`). `trace` is the frame replayed (already
    limited). `table.attrs` keeps the settings, and with `compare_replay` the first-prefill hit
    tokens of plain `replay` (`analysis.runs.run`) on the same trace and GPU, for the checks;
    with `compare_replies` the largest CPU run again with reply blocks stored too (vLLM's
    `offload_prompt_only` off; the bounds keep replies), under "replies_stored"."""
    from analysis.engines.config import RunConfig
    from analysis.engines.offload import run_offload
    from analysis.engines.vllm_args import config_model
    from analysis.engines.workload import build_workload
    from analysis.metrics import bounds
    from analysis.platform.progress import bar

    multiples = sorted({int(m) for m in multiples})
    if not multiples or multiples[0] < 0:
        raise ValueError(f"multiples={multiples}: give CPU multiples >= 0 of the GPU's blocks")
    config = RunConfig(
        block_size=block_size,
        num_blocks=gpu_blocks,
        max_model_len=max_model_len,
        mode="closed-loop",
        concurrency=clients,
    )
    model = config_model(config)
    workload = build_workload(trace, config)
    runs = {
        m: run_offload(workload, config, model, m * gpu_blocks, eviction_policy)
        for m in bar(multiples, desc="CPU multiples", unit="run")
    }
    largest = runs[multiples[-1]]
    ordered = bounds.in_engine_order(trace, largest.admissions)
    pairs = [(gpu_blocks, m * gpu_blocks) for m in multiples]
    bound = tier_bound_rows(ordered, block_size, pairs, include_outputs)
    rows = []
    for m in multiples:
        counts = runs[m].counts
        limit = bound.loc[("lru", gpu_blocks, m * gpu_blocks)]
        belady = bound.loc[("opt-lru", gpu_blocks, m * gpu_blocks)]
        rows.append(
            {
                "multiple": m,
                "cpu_blocks": m * gpu_blocks,
                "gpu_hit_rate": counts.gpu_hit_rate,
                "cpu_hit_rate": counts.cpu_hit_rate,
                "total": counts.gpu_hit_rate + counts.cpu_hit_rate,
                "bound_gpu": float(limit["gpu_hit_rate"]),
                "bound_cpu": float(limit["cpu_hit_rate"]),
                "bound_total": float(limit["hit_rate"]),
                "bound_opt_gpu": float(belady["gpu_hit_rate"]),
                "bound_opt_total": float(belady["hit_rate"]),
                "stored_blocks": counts.stored_blocks,
                "stored_never_loaded": counts.stored_never_loaded,
                "loaded_blocks": counts.loaded_blocks,
                "preemptions": counts.preemptions,
                "computed_prompt_tokens": counts.computed_prompt_tokens,
            }
        )
    table = pd.DataFrame(rows, columns=COLUMNS)
    table.attrs = {
        "gpu_blocks": gpu_blocks,
        "clients": clients,
        "block_size": block_size,
        "max_model_len": max_model_len,
        "eviction_policy": eviction_policy,
        "include_outputs": include_outputs,
        "conversations": int(trace["conversation_id"].nunique()),
        "requests": int(len(ordered)),
        "prompt_tokens": int(runs[multiples[0]].counts.prompt_tokens),
        "gpu_hit_tokens": {m: runs[m].counts.gpu_hit_tokens for m in multiples},
        "recorder_gpu_hit_tokens": {m: runs[m].first_prefill_gpu_hit_tokens for m in multiples},
        "store_refusals": {m: runs[m].counts.store_refusals for m in multiples},
        "hit_tokens": {
            m: runs[m].counts.gpu_hit_tokens + runs[m].counts.cpu_hit_tokens for m in multiples
        },
        "ideal_hit_tokens": int(
            bounds.ideal_bound(
                bounds.index_trace(ordered, include_outputs=include_outputs), block_size
            ).hit_tokens
        ),
    }
    if compare_replay:
        table.attrs["replay_gpu_hit_tokens"] = replay_first_prefill_hits(trace, config)
    if compare_replies and multiples[-1] > 0:
        top = multiples[-1]
        replies = run_offload(
            workload, config, model, top * gpu_blocks, eviction_policy, prompt_only=False
        ).counts
        table.attrs["replies_stored"] = {
            "multiple": top,
            "gpu_hit_rate": replies.gpu_hit_rate,
            "cpu_hit_rate": replies.cpu_hit_rate,
            "total": replies.gpu_hit_rate + replies.cpu_hit_rate,
            "stored_blocks": replies.stored_blocks,
            "hit_tokens": replies.gpu_hit_tokens + replies.cpu_hit_tokens,
        }
    return table


def tier_bound_rows(
    ordered: pd.DataFrame, block_size: int, pairs: list[tuple[int, int]], include_outputs: bool
) -> pd.DataFrame:
    """`tier_bounds` at each (GPU, CPU) pair for vLLM's write-through LRU ("lru") and for
    Belady's MIN on the GPU over it ("opt-lru"), indexed by (policy, GPU, CPU)."""
    from analysis.metrics.bounds.tiers import tier_bounds

    frame = tier_bounds(
        ordered, block_size, pairs, ("lru", "opt-lru"), include_outputs=include_outputs
    )
    return frame.set_index(["policy", "gpu_capacity", "cpu_capacity"])


def replay_first_prefill_hits(trace: pd.DataFrame, config: Any) -> int:
    """First-prefill hit tokens of plain `replay` (`analysis.runs.run`, fast path on)."""
    from analysis.runs import run

    result = run(trace, config, progress=False)
    first = result.admissions[result.admissions["kind"] == "first"]
    return int(first["tokens_hit"].sum())


def cached_offload_table(
    trace: pd.DataFrame, *, force: bool = False, **settings: Any
) -> tuple[pd.DataFrame, Path]:
    """`offload_table(trace, **settings)`, kept under data/results/offload/ (Parquet, with the
    settings and the table's attributes beside it in JSON) by the trace's content and the
    settings: a re-run re-plots without replaying, and the table is on disk for other tools;
    a kept file that cannot be read back is computed again. Returns the table and the path of
    its Parquet file."""
    import hashlib
    import json

    from analysis.platform.kept_files import read_kept
    from analysis.platform.manifest import read_json, write_json, write_parquet
    from analysis.platform.paths import results_dir
    from analysis.runs.runner import frame_sha256

    key = {"trace_sha256": frame_sha256(trace), "version": TABLE_VERSION, **settings}
    if "multiples" in key:
        key["multiples"] = sorted({int(m) for m in key["multiples"]})
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    path = results_dir() / "offload" / f"offload-{digest}.parquet"
    meta = path.with_suffix(".json")
    if not force:  # a cut or corrupt file (either of the two) is computed again
        table = read_kept(path, pd.read_parquet)
        attrs = read_kept(meta, lambda p: _attrs_from_json(read_json(p)["attrs"]))
        if table is not None and attrs is not None:
            table.attrs = attrs
            return table, path
    table = offload_table(trace, **settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet(path, table)
    write_json(meta, {"key": key, "attrs": table.attrs})
    return table, path


def _attrs_from_json(attrs: dict[str, Any]) -> dict[str, Any]:
    """JSON keeps a dict's integer keys (the CPU multiples) as text: give them back as ints."""
    return {
        name: {_int_key(k): v for k, v in value.items()} if isinstance(value, dict) else value
        for name, value in attrs.items()
    }


def _int_key(key: str) -> int | str:
    return int(key) if key.isdigit() else key


def prefill_time_saved(table: pd.DataFrame, prefill_tok_s: float) -> pd.DataFrame:
    """Prompt tokens each CPU size spared the GPU against the smallest multiple (no CPU), and
    that as seconds of prefill at `prefill_tok_s`: derived, not measured (prefill taken as
    linear in tokens, as the calibration measures it; the stub moves no bytes, so loading
    blocks back from CPU memory costs nothing here)."""
    if not prefill_tok_s > 0:
        raise ValueError(f"prefill_tok_s={prefill_tok_s}: give a measured rate above 0")
    rows = table.sort_values("multiple").reset_index(drop=True)
    base = int(rows["computed_prompt_tokens"].iloc[0])
    saved = base - rows["computed_prompt_tokens"].astype(int)
    return pd.DataFrame(
        {
            "multiple": rows["multiple"],
            "cpu_blocks": rows["cpu_blocks"],
            "computed_prompt_tokens": rows["computed_prompt_tokens"],
            "tokens_saved": saved,
            "prefill_s_derived": rows["computed_prompt_tokens"] / prefill_tok_s,
            "prefill_s_saved_derived": saved / prefill_tok_s,
            "share_of_prefill_saved": saved / base if base else 0.0,
        }
    )


def prefill_time_reading(saved: pd.DataFrame, prefill_tok_s: float, source: str) -> str:
    """One paragraph on what the saved prefill comes to in time, with where the rate is from."""
    base, top = saved.iloc[0], saved.iloc[-1]
    best = saved.loc[saved["prefill_s_saved_derived"].idxmax()]
    return (
        f"Derived, not measured: at {prefill_tok_s:,.0f} prefill tokens/s ({source}), the "
        f"{int(base['multiple'])}x run's {int(base['computed_prompt_tokens']):,} computed prompt "
        f"tokens are {base['prefill_s_derived']:,.1f} s of prefill; the most saved is at "
        f"{int(best['multiple'])}x: {int(best['tokens_saved']):,} tokens, "
        f"{best['prefill_s_saved_derived']:,.1f} s ({_pct(best['share_of_prefill_saved'])}); "
        f"the {int(top['multiple'])}x run saves {top['prefill_s_saved_derived']:,.1f} s. Left "
        "out: the time to load blocks back from CPU memory (nothing moves here) and prefill's "
        "growth with context length (the rate is measured at one prompt length)."
    )


def _pct(rate: float) -> str:
    return f"{100 * rate:.1f} %"


def flat_from(table: pd.DataFrame, tolerance: float = FLAT_TOLERANCE) -> pd.Series:
    """The row of the smallest CPU multiple whose total hit rate is within `tolerance` of the
    largest multiple's: where adding CPU memory stops helping on this grid."""
    rows = table.sort_values("multiple")
    best = float(rows["total"].iloc[-1])
    return rows[rows["total"] >= best - tolerance].iloc[0]


def offload_reading(table: pd.DataFrame) -> str:
    """The reading of the offloading figure, every number from `table`."""
    rows = table.sort_values("multiple").reset_index(drop=True)
    attrs = table.attrs
    base, top = rows.iloc[0], rows.iloc[-1]
    flat = flat_from(rows)
    gained = rows[rows["multiple"] > 0]
    stored, unread = int(gained["stored_blocks"].sum()), int(gained["stored_never_loaded"].sum())
    text = [
        f"**Reading.** On {attrs['conversations']:,} conversations ({attrs['requests']:,} "
        f"requests, {attrs['prompt_tokens']:,} prompt tokens) with a GPU of "
        f"{attrs['gpu_blocks']:,} blocks and {attrs['clients']} clients, "
        f"{'no CPU' if base['multiple'] == 0 else f'{int(base.cpu_blocks):,} CPU blocks'} gives "
        f"{_pct(base['total'])} of prompt tokens from the GPU "
        f"({int(base['preemptions']):,} preemptions). "
    ]
    steps = [
        f"{int(r.multiple)}x ({int(r.cpu_blocks):,} blocks): {_pct(r.gpu_hit_rate)} GPU + "
        f"{_pct(r.cpu_hit_rate)} CPU = {_pct(r.total)} (LRU bound {_pct(r.bound_total)}, "
        f"Belady GPU over LRU CPU {_pct(r.bound_opt_total)})"
        for r in gained.itertuples()
    ]
    if steps:
        text.append("With CPU memory of " + "; ".join(steps) + ". ")
    text.append(
        f"Adding CPU memory stops helping at {int(flat['multiple'])}x the GPU "
        f"({int(flat['cpu_blocks']):,} blocks, {_pct(flat['total'])}, within "
        f"{100 * FLAT_TOLERANCE:.0f} percentage point of the {int(top['multiple'])}x total, "
        f"{_pct(top['total'])}). "
    )
    under = gained[gained["total"] > gained["bound_total"]]
    if len(under):
        first = under.iloc[0]
        text.append(
            f"At {int(first['multiple'])}x the run's {_pct(first['total'])} is above the LRU "
            f"bound's {_pct(first['bound_total'])}: the bound's GPU keeps all "
            f"{attrs['gpu_blocks']:,} blocks for finished requests, so an inclusive CPU no larger "
            "than that adds little, while vLLM's GPU also holds the running requests and keeps "
            "far fewer; the bound is a reference, not a ceiling, until the CPU outgrows that gap. "
        )
    text.append(_replies_sentence(rows, attrs))
    if stored:
        text.append(
            f"Write-through costs transfers: over the runs with a CPU, "
            f"{stored:,} blocks were stored and {unread:,} ({_pct(unread / stored)}) were never "
            f"loaded back; the {int(top['multiple'])}x run loaded {int(top['loaded_blocks']):,} "
            f"blocks and still computed {int(top['computed_prompt_tokens']):,} prompt tokens "
            f"(against {int(base['computed_prompt_tokens']):,} at {int(base['multiple'])}x)."
        )
    return "".join(text)


def _replies_sentence(rows: pd.DataFrame, attrs: dict[str, Any]) -> str:
    """How much of the gap between the largest CPU and its bound storing replies closes."""
    replies = attrs.get("replies_stored")
    if not replies:
        return ""
    top = rows[rows["multiple"] == replies["multiple"]].iloc[0]
    gap = float(top["bound_total"] - top["total"])
    closed = replies["total"] - float(top["total"])
    share = closed / gap if gap > 0 else 0.0
    verdict = (
        "the whole gap to the bound is the replies vLLM does not store by default"
        if share >= 0.9995
        else "most of the gap to the bound is the replies vLLM does not store by default"
        if share > 0.5
        else "the replies vLLM does not store by default are not most of the gap to the bound"
    )
    return (
        f"By default vLLM stores prompt blocks only (`offload_prompt_only`), while the bounds "
        f"keep replies, which a later turn's prompt repeats; with replies stored too, the "
        f"{int(top['multiple'])}x run gives {_pct(replies['gpu_hit_rate'])} GPU + "
        f"{_pct(replies['cpu_hit_rate'])} CPU = {_pct(replies['total'])} against "
        f"{_pct(top['total'])} by default and the bound's {_pct(top['bound_total'])}, closing "
        f"{_pct(share)} of the gap: {verdict}. "
    )


def offload_checks(table: pd.DataFrame) -> Checks:
    """What must hold between the runs, the bounds and plain replay (see `offload_reading`)."""
    checks = Checks()
    rows = table.sort_values("multiple").reset_index(drop=True)
    attrs = table.attrs
    for r in rows.itertuples():
        if r.multiple == 0:  # no connector: "never loaded <= stored" would read 0 <= 0
            checks.add(
                "0x (no connector): no block stored or loaded",
                0,
                int(r.stored_blocks + r.loaded_blocks),
            )
            continue
        checks.add(
            f"{r.multiple}x: stored blocks never loaded <= stored blocks",
            f"<= {r.stored_blocks}",
            r.stored_never_loaded,
            r.stored_never_loaded <= r.stored_blocks,
        )
    gpu, recorded = attrs["gpu_hit_tokens"], attrs["recorder_gpu_hit_tokens"]
    checks.add(
        "recorder's first-prefill GPU hits = vLLM's PrefixCacheStats (every run)",
        list(gpu.values()),
        list(recorded.values()),
        gpu == recorded,
    )
    if "replay_gpu_hit_tokens" in attrs and 0 in gpu:
        checks.add(
            "no CPU: first-prefill hit tokens = plain replay's",
            attrs["replay_gpu_hit_tokens"],
            gpu[0],
            attrs["replay_gpu_hit_tokens"] == gpu[0],
        )
    with_cpu = rows[rows["multiple"] > 0]
    if len(with_cpu):
        checks.add(
            "with a CPU, the CPU tier gives hits",
            "> 0",
            round(float(with_cpu["cpu_hit_rate"].min()), 4),
            bool((with_cpu["cpu_hit_rate"] > 0).all()),
        )
        checks.add(
            "a CPU never lowers the total hit rate below no CPU's",
            f">= {rows['total'].iloc[0]:.4f}",
            round(float(with_cpu["total"].min()), 4),
            bool((with_cpu["total"] >= rows["total"].iloc[0]).all()),
        )
    if len(rows) > 1:
        flat, top = flat_from(rows), float(rows["total"].iloc[-1])
        plateau = rows[rows["multiple"] >= flat["multiple"]]["total"]
        checks.add(
            f"from {int(flat['multiple'])}x on, every CPU size's total is within "
            f"{100 * FLAT_TOLERANCE:.0f} point of the largest's (where the reading says more CPU "
            "stops helping)",
            True,
            bool((plateau - top).abs().le(FLAT_TOLERANCE + 1e-12).all()),
        )
    hits, ideal = attrs["hit_tokens"], attrs["ideal_hit_tokens"]
    replied = [attrs["replies_stored"]["hit_tokens"]] if "replies_stored" in attrs else []
    most = max([*hits.values(), *replied])
    checks.add(
        "every run's hit tokens (GPU + CPU; replies stored too) <= an infinite cache's "
        "(ideal bound, engine order)",
        f"<= {ideal}",
        most,
        most <= ideal,
    )
    checks.add(
        "CPU bound grows with CPU size (monotone)",
        "non-decreasing",
        [round(x, 4) for x in rows["bound_total"]],
        bool(rows["bound_total"].is_monotonic_increasing),
    )
    checks.add(
        "Belady's MIN on the GPU tier hits at least LRU's there (every size)",
        [round(x, 4) for x in rows["bound_gpu"]],
        [round(x, 4) for x in rows["bound_opt_gpu"]],
        bool((rows["bound_opt_gpu"] >= rows["bound_gpu"]).all()),
    )
    checks.add(
        "no CPU store refused (CPU never full of pinned blocks)",
        0,
        sum(attrs["store_refusals"].values()),
        sum(attrs["store_refusals"].values()) == 0,
    )
    return checks
