"""CPU offloading in time: what the CPU tier's hits buy in TTFT and throughput, on a GPU's
clock.

Notebook 16 counts what each CPU size gives back in tokens. Here the same conversations, GPU
blocks and clients run through the same offloading replay (`analysis.engines.offload`) on the
step costs the H100 calibration measured for Llama-3.2-1B, refitted on seconds
(`analysis.timing.routers.seconds_profile`), with every block loaded from or stored to the CPU
crossing the host link at its published bandwidth. The CPU build of vLLM refuses offloading,
so no real engine here can check these times: they are the clock's, with its held-out errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.engines.offload.transfers import PCIE5_X16_BYTES_PER_S
from analysis.engines.steps import FEATURES
from analysis.metrics.oracles import Checks
from analysis.timing.prediction import summarise


def offload_on_clock(
    profile: Path,
    trace: pd.DataFrame,
    *,
    gpu_blocks: int,
    clients: int,
    multiples: Sequence[int],
    block_size: int = 16,
    max_model_len: int = 8192,
    host_link_bytes_per_s: float = PCIE5_X16_BYTES_PER_S,
) -> pd.DataFrame:
    """One row per CPU multiple of `gpu_blocks` (0: no CPU tier): hits, then time on the clock,
    closed loop with `clients` clients (each sends its conversation's next turn when the last
    one finished), the same requests for every multiple."""
    from analysis.engines.clock import load_profile
    from analysis.engines.offload import run_offload
    from analysis.engines.offload.driver import cpu_block_bytes
    from analysis.engines.vllm_args import config_model
    from analysis.engines.workload import build_workload
    from analysis.timing.calibration import BASE

    costs = load_profile(profile)
    config = BASE["cuda"].with_(
        engine="replay",
        device="cpu",  # replay needs no GPU: the clock is the GPU's
        # the KV dtype the clock's engine ran (a block's bytes on the host link), not this
        # machine's choice: a CPU without bf16 would have doubled every load and store
        dtype=costs.identity.get("dtype"),
        clock=str(profile),
        mode="closed-loop",
        concurrency=clients,
        num_blocks=gpu_blocks,
        block_size=block_size,
        max_model_len=max_model_len,
        warmup=False,
    )
    model = config_model(config)
    workload = build_workload(trace, config)
    rows = []
    for multiple in sorted({int(m) for m in multiples}):
        result = run_offload(
            workload,
            config,
            model,
            multiple * gpu_blocks,
            host_link_bytes_per_s=host_link_bytes_per_s,
        )
        counts = result.counts
        summary = summarise(result.requests)
        rows.append(
            {
                "multiple": multiple,
                "cpu_blocks": multiple * gpu_blocks,
                "hit_rate": counts.gpu_hit_rate + counts.cpu_hit_rate,
                "computed_prompt_tokens": counts.computed_prompt_tokens,
                "requests": summary["requests"],
                "span_s": summary["span_s"],
                "throughput_req_s": summary["throughput_req_s"],
                "ttft_p50_s": summary["ttft_s"]["p50"],
                "ttft_p90_s": summary["ttft_s"]["p90"],
                "tpot_p50_s": summary["tpot_s"]["p50"],
                "token_compute_s": token_compute_seconds(costs, result.steps),
                "decode_only_share": decode_only_share(result.steps),
                "load_s": result.link_seconds["load"],
                "store_s": result.link_seconds["store"],
                "loaded_blocks": counts.loaded_blocks,
            }
        )
    table = pd.DataFrame(rows)
    base = table.iloc[0]
    table["span_saved"] = 1 - table["span_s"] / base["span_s"]
    table["ttft_p50_vs_none"] = table["ttft_p50_s"] / base["ttft_p50_s"]
    table.attrs = {
        "host_link_bytes_per_s": host_link_bytes_per_s,
        "block_bytes": cpu_block_bytes(config, model),
        "clients": clients,
        "model": config.model,
    }
    return table


def token_compute_seconds(profile: Any, steps: pd.DataFrame) -> float:
    """What the profile charges a run for the tokens it computed and their prefill attention
    (its `token` and `prefill_pair` terms over every step): what fewer computed tokens save."""
    features = dict.fromkeys(FEATURES, 0)
    features |= {
        "tokens": int(steps["tokens"].sum()),
        "prefill_pairs": int(steps["prefill_pairs"].sum()),
    }
    return profile.step_seconds(features) - profile.step_seconds(dict.fromkeys(FEATURES, 0))


def decode_only_share(steps: pd.DataFrame) -> float:
    """The share of a run's step time spent in steps that only decode (no prefill in them)."""
    decode_only = steps["prefill_requests"] == 0
    return float(steps.loc[decode_only, "wall_s"].sum() / steps["wall_s"].sum())


def reading(table: pd.DataFrame, errors: pd.DataFrame) -> str:
    """What the CPU tier bought on the clock, against what it saved in tokens, with the
    clock's own held-out errors beside it."""
    rows = table.sort_values("multiple").reset_index(drop=True)
    none, best = rows.iloc[0], rows.loc[rows["hit_rate"].idxmax()]
    tokens_saved = int(none["computed_prompt_tokens"] - best["computed_prompt_tokens"])
    compute_saved = none["token_compute_s"] - best["token_compute_s"]
    own = "; ".join(
        f"{row.workload}: median TTFT {row.p50_ttft_error:+.1%}, throughput "
        f"{row.throughput_req_error:+.1%}"
        for row in errors.itertuples()
    )
    gbps = table.attrs["host_link_bytes_per_s"] / 1e9
    return (
        f"On the clock, {int(none['requests'])} requests from {table.attrs['clients']} clients "
        f"in closed loop: with no CPU tier the run takes {none['span_s']:.1f} s. At "
        f"{int(best['multiple'])}x the CPU lifts the hit rate from {none['hit_rate']:.1%} to "
        f"{best['hit_rate']:.1%} and computes {tokens_saved:,} fewer prompt tokens "
        f"({tokens_saved / none['computed_prompt_tokens']:.0%}), yet the run's span changes by "
        f"{-best['span_saved']:+.1%} and its median TTFT by {best['ttft_p50_vs_none'] - 1:+.0%}. "
        f"The profile prices those tokens (and their prefill attention) at "
        f"{compute_saved:.2f} s in all: a prompt token is cheap for a "
        f"{table.attrs['model']} shape on this GPU, and {none['decode_only_share']:.0%} of the "
        f"run's step time goes to steps that only decode (median TPOT "
        f"{1e3 * none['tpot_p50_s']:.1f} ms). "
        f"Loading {int(best['loaded_blocks']):,} blocks back took {1e3 * best['load_s']:.0f} ms "
        f"of link time at {gbps:.0f} GB/s. The clock's own errors against the real H100 "
        f"engine on its held-out workloads: {own}."
    )


def checks(table: pd.DataFrame) -> Checks:
    """Claims that hold on any clock: the same requests finish at every CPU size, no CPU moves
    no bytes, and the link's time is its blocks' bytes at its bandwidth."""
    result = Checks()
    rows = table.sort_values("multiple").reset_index(drop=True)
    result.add(
        "every CPU size finishes the same requests",
        int(rows["requests"].iloc[0]),
        sorted(set(rows["requests"].astype(int))),
        holds=rows["requests"].nunique() == 1 and rows["requests"].iloc[0] > 0,
    )
    none = rows[rows["multiple"] == 0]
    result.add(
        "no CPU tier: no second of link time",
        0.0,
        float((none["load_s"] + none["store_s"]).sum()),
        holds=len(none) == 1 and float((none["load_s"] + none["store_s"]).sum()) == 0.0,
    )
    expected = (
        rows["loaded_blocks"] * table.attrs["block_bytes"] / table.attrs["host_link_bytes_per_s"]
    )
    result.add(
        "load time = loaded blocks x block bytes / link bandwidth, at every size",
        expected.round(6).tolist(),
        rows["load_s"].round(6).tolist(),
        holds=bool(np.allclose(expected, rows["load_s"], rtol=1e-9, atol=0.0)),
    )
    return result
