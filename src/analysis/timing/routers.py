"""Routers in time: what each router's reuse buys in TTFT and goodput, on a GPU's clock.

Notebook 13 counts each router's reuse in lockstep, where time does not exist. Here the same
routers run a fleet with each replica on its own clock (`analysis.engines.fleet.clocked`), on
the step costs the H100 calibration measured for Llama-3.2-1B, refitted on seconds (the fit
whose totals add up, `analysis.timing.fit`), at Poisson arrivals of multi-turn ShareGPT
conversations. Beside the table: that profile's own errors on the held-out workloads against
the real H100 engine, so a difference between routers is read against what the clock can
tell apart.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.platform.paths import repo_root
from analysis.timing import held_out
from analysis.timing.prediction import summarise

CALIBRATION = "data/external/h100/2026-11-26/calibration-3"
ROUTERS = (
    "round-robin",
    "least-loaded",
    "affinity",
    "approx-prefix",
    "precise-prefix",
    "prefix-load-beta0.5",
)


def seconds_profile(folder: str | Path = CALIBRATION) -> Path:
    """The calibration refitted on seconds, written once under data/cache/profiles/."""
    folder = repo_root() / folder
    path = repo_root() / "data" / "cache" / "profiles" / f"{folder.name}-seconds.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(held_out.refit(folder, "seconds").to_dict(), indent=1))
    return path


def profile_errors(profile: Path, folder: str | Path = CALIBRATION) -> pd.DataFrame:
    """The profile's errors on the calibration's held-out workloads (replay on its clock
    against the real engine's latencies, per workload)."""
    folder = repo_root() / folder
    device = held_out.device_of(held_out.load_profile(profile))
    per_request = held_out.compare(
        held_out.read_requests(folder), held_out.predictions(profile, device)
    )
    return held_out.errors(per_request, "replayed")


def routers_on_clock(
    profile: Path,
    *,
    replicas: int,
    rate: float,
    conversations: int,
    num_blocks: int,
    slo_ttft_s: float,
    routers: tuple[str, ...] = ROUTERS,
) -> pd.DataFrame:
    """One row per router: its reuse and what it gave in time, the same arrivals for all."""
    from analysis.runs import run
    from analysis.timing.calibration import BASE

    base = BASE["cuda"].with_(
        engine="fleet",
        device="cpu",  # replay needs no GPU: the clock is the GPU's
        trace="multi_turn",
        limit=conversations,
        warmup=False,
        clock=str(profile),
        mode="poisson",
        arrival_rate=rate,
        replicas=replicas,
        num_blocks=num_blocks,
    )
    rows = []
    for router in routers:
        result = run(None, base.with_(router=router), progress=False)
        summary = summarise(result.requests, slo_ttft_s=slo_ttft_s)
        engine = result.manifest["engine"]
        rows.append(
            {
                "router": router,
                "requests": summary["requests"],
                "unfinished": int((result.requests["status"] == "unfinished").sum()),
                "hit_rate": result.summary["first_prefill"]["rate"],
                "preemptions": result.summary["preemptions"],
                "load_imbalance_mean": engine["load_imbalance_mean"],
                "busiest_replica_share": max(engine["routed_per_replica"])
                / sum(engine["routed_per_replica"]),
                "ttft_p50_s": summary["ttft_s"]["p50"],
                "ttft_p90_s": summary["ttft_s"]["p90"],
                "ttft_mean_s": summary["ttft_s"]["mean"],
                "tpot_p50_s": summary["tpot_s"]["p50"],
                "throughput_req_s": summary["throughput_req_s"],
                "slo_attained": summary["slo_attained"],
                "goodput_req_s": summary["goodput_req_s"],
            }
        )
    return pd.DataFrame(rows)


def reading(table: pd.DataFrame, errors: pd.DataFrame, slo_ttft_s: float) -> str:
    """What the table says, every number from it or from the profile's errors."""
    worst_p50 = max(abs(e) for e in errors["p50_ttft_error"])
    baseline = table.set_index("router").loc["round-robin"]
    spread = table[table["busiest_replica_share"] < 1.0]
    best = spread.sort_values(["ttft_p50_s", "router"]).iloc[0]
    gain = 1 - best["ttft_p50_s"] / baseline["ttft_p50_s"]
    lines = [
        f"- **Reuse buys first tokens.** {best['router']} keeps a first-prefill hit rate of "
        f"{best['hit_rate']:.1%} against round-robin's {baseline['hit_rate']:.1%}, and its median "
        f"TTFT is {_time(best['ttft_p50_s'])} against {_time(baseline['ttft_p50_s'])} "
        f"({gain:.0%} less). The profile's median-TTFT error on the held-out workloads is at "
        f"most {worst_p50:.0%}, "
        + (
            "smaller than this difference."
            if gain > worst_p50
            else "as large as this difference: the clock cannot tell the two apart."
        ),
    ]
    collapsed = table[table["busiest_replica_share"] == 1.0]
    if len(collapsed):
        first = collapsed.iloc[0]
        names = " and ".join(collapsed["router"])
        lines.append(
            f"- **{names} sent every request to one replica.** A prefix score with no load term "
            "sends each request where most of its prompt is cached, and here that was always "
            f"the same replica: hit rate {first['hit_rate']:.1%}, {first['preemptions']} "
            f"preemptions, median TTFT {_time(first['ttft_p50_s'])} (p90 "
            f"{_time(first['ttft_p90_s'])}), {first['slo_attained']:.1%} of requests within the "
            f"{_time(slo_ttft_s)} TTFT target, goodput {first['goodput_req_s']:.1f} requests/s "
            f"against {best['goodput_req_s']:.1f} for {best['router']}."
        )
    return "\n".join(lines)


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def checks(table: pd.DataFrame, replicas: int):
    """What the section claims, each measured: every request ran to its end under every
    router, and the readings' orderings hold on the table."""
    from analysis.metrics.oracles import Checks

    found = Checks()
    found.add(
        "every router finished every request (none unfinished)",
        0,
        int(table["unfinished"].sum()),
    )
    found.add("every router finished as many requests", 1, table["requests"].nunique())
    ordered = table.sort_values("hit_rate")
    found.add(
        "the router with the highest hit rate has a lower median TTFT than the lowest",
        True,
        bool(ordered["ttft_p50_s"].iloc[-1] < ordered["ttft_p50_s"].iloc[0]),
    )
    collapsed = table[table["busiest_replica_share"] == 1.0]
    found.add(
        "a router that routed every request to one replica ran them all there (running "
        "requests' max over mean = the number of replicas at every step)",
        [float(replicas)] * len(collapsed),
        [round(float(v), 6) for v in collapsed["load_imbalance_mean"]],
    )
    found.add(
        "p50 <= p90 TTFT for every router",
        True,
        bool((table["ttft_p50_s"] <= table["ttft_p90_s"]).all()),
    )
    return found
