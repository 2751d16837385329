"""Reading a calibration: what replay predicts on its clock against what the real engine
measured, on the held-out workloads, and why a miss is a miss.

Everything here reruns from a calibration's folder alone (committed GPU ones included): the
steps the real engine measured are replayed to check that replay scheduled the very same
steps, the profile is fitted again from them, and the held-out workloads are replayed on its
clock, deterministically, so a notebook shows the same numbers on any machine.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.engines.clock import StepCostProfile, load_profile
from analysis.engines.result import RunResult
from analysis.engines.steps import FEATURES
from analysis.metrics.oracles import Checks
from analysis.platform.manifest import write_json
from analysis.runs import run
from analysis.timing.calibration import BASE, error_row, latencies
from analysis.timing.fit import METHODS, fit_profile, predict_steps
from analysis.timing.workloads import TimingWorkload, calibration_workloads, held_out_workloads

# A run whose steps went more than this far from the profile's speed (median) strayed.
DRIFT = 0.05
# The goal per statistic: |relative error| at most this.
GOALS = {
    "p50_ttft_error": 0.05,
    "p90_ttft_error": 0.10,
    "mean_tpot_error": 0.05,
    "throughput_req_error": 0.05,
}


def device_of(profile: StepCostProfile) -> str:
    return "cuda" if profile.identity.get("machine", {}).get("kind") == "cuda" else "cpu"


def replayed(workload: TimingWorkload, profile_path: Path, device: str) -> RunResult:
    """The workload replayed on the profile's clock: its requests and steps (a RunResult)."""
    config = workload.config(BASE[device]).with_(
        engine="replay", clock=str(profile_path), device="cpu"
    )
    return run(workload.frame(), config, progress=False)


def same_steps(
    measured: pd.DataFrame, profile_path: Path, workloads: Sequence[TimingWorkload], device: str
) -> pd.DataFrame:
    """Per workload with arrivals in steps (batch, closed loop): does replay schedule exactly
    the steps the real engine ran, feature for feature? (Open-loop arrivals follow each
    engine's own clock, so their steps are not comparable one by one. A workload the
    calibration did not run, one added since, is left out.)"""
    rows = []
    for workload in workloads:
        theirs = measured[measured["run"] == workload.name].reset_index(drop=True)
        if workload.changes.get("mode") == "poisson" or theirs.empty:
            continue
        ours = replayed(workload, profile_path, device).steps
        columns = ["step", *[f for f in FEATURES if f in theirs.columns]]
        equal = len(ours) == len(theirs) and bool(
            (ours[columns].to_numpy() == theirs[columns].to_numpy()).all()
        )
        rows.append(
            {
                "workload": workload.name,
                "real_engine_steps": len(theirs),
                "replay_steps": len(ours),
                "features_compared": len(columns) - 1,
                "identical": equal,
            }
        )
    return pd.DataFrame(rows)


def predictions(profile_path: Path, device: str) -> pd.DataFrame:
    """Each held-out workload replayed on the clock: one row per request (predicted)."""
    frames = []
    for workload in held_out_workloads(device):
        result = replayed(workload, profile_path, device)
        frames.append(result.requests.assign(workload=workload.name))
    return pd.concat(frames, ignore_index=True)


def compare(measured: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """Per request: a calibration's requests table (the real engine's latencies, and those
    predicted where it was measured) with the latencies replayed here beside."""
    tables = []
    for name, rows in measured.groupby("workload", sort=False):
        ours = predicted[predicted["workload"] == name].set_index("request_id")
        replayed_here = latencies(ours).loc[rows["request_id"]].add_prefix("replayed_")
        tables.append(rows.set_index("request_id").join(replayed_here).reset_index())
    return pd.concat(tables, ignore_index=True)


def errors(per_request: pd.DataFrame, side: str = "predicted") -> pd.DataFrame:
    """Measured and `side` statistics per workload with relative errors (error_row)."""
    rows = []
    for name, table in per_request.groupby("workload", sort=False):
        view = table.copy()
        if side != "predicted":
            for column in ("ttft_s", "tpot_s", "e2e_s", "arrival_s", "finish_s"):
                view[f"predicted_{column}"] = view[f"{side}_{column}"]
        rows.append({"workload": name, **error_row(view)})
    return pd.DataFrame(rows)


def stand_in_errors(
    folder: Path, profiles: dict[str, StepCostProfile], device: str, into: Path
) -> pd.DataFrame:
    """The folder's held-out workloads replayed on profiles that were not measured on its
    machine (another GPU's, a roofline estimate), against what its real engine measured: what
    a prediction made before the machine was at hand would have missed. One row per (profile,
    workload); each profile is written under `into`."""
    measured = read_requests(folder)
    into.mkdir(parents=True, exist_ok=True)
    frames = []
    for number, (name, profile) in enumerate(profiles.items()):
        path = into / f"stand-in-{number}.json"
        write_json(path, profile.to_dict())
        table = errors(compare(measured, predictions(path, device)), "replayed")
        frames.append(table.assign(profile=name))
    table = pd.concat(frames, ignore_index=True)
    return table[["profile", "workload", *GOALS]]


def repeat_spread(folder: Path) -> pd.DataFrame:
    """Per held-out workload, the real engine's second repeat against its first, in the same
    terms as replay's errors (`calibrate --repeats 2`): the engine's own spread in that run.
    Empty where the calibration ran once."""
    table = pd.read_csv(Path(folder) / "validation.csv")
    repeats = table[table["against"].astype(str).str.startswith("real engine")]
    return repeats[["workload", *GOALS]].reset_index(drop=True)


def goal_table(
    errors_: pd.DataFrame, speed: pd.DataFrame, spread: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Each held-out statistic against its goal, or against the real engine's own spread where
    that is wider (a second repeat against the first); a miss named with the run's own speed:
    how far the real engine's steps in that run were from the profile (median of measured /
    modelled step time), which no schedule-based prediction can follow."""
    spreads = {} if spread is None else spread.set_index("workload").to_dict("index")
    rows = []
    for row in errors_.itertuples(index=False):
        factor = speed.loc[speed["run"] == row.workload, "median_measured_over_model"]
        factor = float(factor.iloc[0]) if len(factor) else np.nan
        for statistic, goal in GOALS.items():
            error = getattr(row, statistic)
            own = spreads.get(row.workload, {}).get(statistic, np.nan)
            allowed = max(goal, abs(own)) if np.isfinite(own) else goal
            rows.append(
                {
                    "workload": row.workload,
                    "statistic": statistic.removesuffix("_error"),
                    "error": round(error, 4),
                    "goal": f"within {goal:.0%}",
                    "engine_repeat_spread": round(own, 4),
                    "met": abs(error) <= allowed,
                    "met_by": _met_by(abs(error), goal, abs(own)),
                    "run_speed_vs_profile": round(factor, 3),
                }
            )
    return pd.DataFrame(rows)


def _met_by(error: float, goal: float, own: float) -> str:
    if error <= goal:
        return "the goal"
    if np.isfinite(own) and error <= own:
        return "the engine's own spread"
    return "missed"


def step_ratios(profile: StepCostProfile, steps: pd.DataFrame) -> pd.DataFrame:
    """Per measured step: its run and measured / modelled time."""
    usable = steps[steps["wall_s"].notna() & (steps["tokens"] > 0)]
    ratio = usable["wall_s"] / predict_steps(profile, usable)
    return pd.DataFrame({"run": usable["run"], "ratio": ratio})


def run_speed(profile: StepCostProfile, steps: pd.DataFrame) -> pd.DataFrame:
    """Per run: the median of measured / modelled step time (1.0: the run went as fast as
    the profile says; 1.3: its steps took 30 % longer for the same work)."""
    ratios = step_ratios(profile, steps)
    return (
        ratios.groupby("run", sort=False)["ratio"]
        .agg(["median", "size"])
        .rename(columns={"median": "median_measured_over_model", "size": "steps"})
        .reset_index()
        .round({"median_measured_over_model": 3})
    )


def lease_comparison(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """The same workloads measured on two machines (two leases of one GPU kind): where the
    two ran exactly the same steps, their summed step time and its ratio."""
    rows = []
    for name in dict.fromkeys(first["run"]):
        a = first[first["run"] == name].reset_index(drop=True)
        b = second[second["run"] == name].reset_index(drop=True)
        columns = ["step", *[f for f in FEATURES if f in a.columns and f in b.columns]]
        if len(a) != len(b) or not (a[columns].to_numpy() == b[columns].to_numpy()).all():
            continue
        rows.append(
            {
                "workload": name,
                "steps": len(a),
                "first_s": round(float(a["wall_s"].sum()), 3),
                "second_s": round(float(b["wall_s"].sum()), 3),
                "second_over_first": round(float(b["wall_s"].sum() / a["wall_s"].sum()), 3),
                "median_step_ratio": round(float((b["wall_s"] / a["wall_s"]).median()), 3),
            }
        )
    return pd.DataFrame(rows)


def method_of(profile: StepCostProfile) -> str:
    """How a profile was fitted (its `fit["method"]`, named as in `fit.METHODS`)."""
    named = {text: name for name, text in METHODS.items()}
    return named.get(profile.fit.get("method", ""), "relative")


def refit(folder: Path, method: str | None = None) -> StepCostProfile:
    """The profile fitted again from the folder's measured steps (by default the committed
    profile's own method, which must give it back)."""
    committed = load_profile(Path(folder) / "profile.json")
    return fit_profile(
        read_steps(folder, held_out=False),
        committed.identity,
        method=method or method_of(committed),
    )


def replay_each_method(folder: Path, device: str, into: Path) -> dict[str, pd.DataFrame]:
    """Per fit method: the profile fitted from the folder's calibration steps that way (written
    under `into`), and the held-out workloads replayed on it beside the real engine's
    latencies, per request. Same steps, same held-out requests: only the fit differs."""
    measured = read_requests(folder)
    into.mkdir(parents=True, exist_ok=True)
    tables = {}
    for method in METHODS:
        path = into / f"{Path(folder).name}-{method}.json"
        path.write_text(json.dumps(refit(folder, method).to_dict(), indent=1))
        tables[method] = compare(measured, predictions(path, device))
    return tables


def errors_by_method(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The held-out errors of each fit method, one row per (method, workload)."""
    frames = [errors(table, "replayed").assign(method=name) for name, table in tables.items()]
    table = pd.concat(frames, ignore_index=True)
    return table[["method", *[c for c in table.columns if c != "method"]]]


def read_steps(folder: Path, *, held_out: bool = True) -> pd.DataFrame:
    """The real engine's measured steps (calibration, then held out where the folder has them)."""
    folder = Path(folder)
    frames = [pd.read_parquet(folder / "steps.parquet")]
    if held_out and (folder / "held_out_steps.parquet").is_file():
        frames.append(pd.read_parquet(folder / "held_out_steps.parquet"))
    return pd.concat(frames, ignore_index=True)


def read_requests(folder: Path) -> pd.DataFrame:
    return pd.read_parquet(Path(folder) / "requests.parquet")


def coefficient_table(profile: StepCostProfile) -> pd.DataFrame:
    """The profile's terms with their units, and the costs outside a step."""
    units = profile.to_dict()["units"]
    rows = [
        {"term": term, "coefficient": value, "unit": units[term]}
        for term, value in profile.coefficients.items()
    ]
    rows.append(
        {"term": "admit", "coefficient": profile.admit_s, "unit": "s per request handed over"}
    )
    rows.append({"term": "loop", "coefficient": profile.loop_s, "unit": "s per step, driver"})
    return pd.DataFrame(rows)


def checks(
    folder: Path,
    makeup: pd.DataFrame,
    per_request: pd.DataFrame,
    refitted: StepCostProfile,
) -> Checks:
    """What must hold whatever the machine: replay schedules the real engine's steps; the
    fit is reproducible; replay on the clock is deterministic (here = where it was measured)."""
    committed = json.loads((Path(folder) / "profile.json").read_text())["coefficients"]
    out = Checks()
    for row in makeup.itertuples(index=False):
        out.add(
            f"{row.workload}: replay's steps = the real engine's, step by step",
            f"{row.real_engine_steps} steps",
            f"{row.replay_steps} steps",
            bool(row.identical),
        )
    out.add(
        "the profile fitted again here = the committed one",
        {k: f"{v:.6g}" for k, v in committed.items()},
        {k: f"{v:.6g}" for k, v in refitted.coefficients.items()},
        set(committed) == set(refitted.coefficients)
        and all(np.isclose(committed[k], refitted.coefficients[k], rtol=1e-6) for k in committed),
    )
    if "predicted_ttft_s" in per_request.columns:
        # Replay now releases a closed-loop client's next turn when its reply finishes, as
        # the real driver does, and charges the driver's loop time after that: one loop time
        # earlier than the code that measured this folder did. Anything more is not allowed.
        loop = json.loads((Path(folder) / "profile.json").read_text())["loop_s"]
        gap = (per_request["replayed_ttft_s"] - per_request["predicted_ttft_s"]).abs().max()
        out.add(
            "TTFT replayed here = TTFT predicted where it was measured, per request, within "
            "one driver loop time",
            f"max difference <= {loop:.2e} s",
            f"{gap:.2e} s",
            bool(gap <= loop + 1e-9),
        )
    return out


def calibration_workloads_for(profile: StepCostProfile) -> list[TimingWorkload]:
    return calibration_workloads(device_of(profile))


def reading(errors_: pd.DataFrame, goals: pd.DataFrame, speed: pd.DataFrame, where: str) -> str:
    """What the comparison says, every number from the tables above: per held-out workload
    its errors, and for a miss whether its run went at the profile's speed (then the miss
    is the model's) or strayed from it (then the machine moved under the same work)."""
    met = int((goals["met_by"] == "the goal").sum())
    inside = int((goals["met_by"] == "the engine's own spread").sum())
    lines = [
        f"**Reading ({where}).** {met} of {len(goals)} held-out statistics meet their goal"
        + (
            f"; {inside} more miss it by less than the real engine's own second repeat missed "
            "its first"
            if inside
            else ""
        )
        + "."
    ]
    factors = dict(zip(speed["run"], speed["median_measured_over_model"], strict=True))
    for row in errors_.itertuples(index=False):
        factor = float(factors[row.workload])
        missed = goals[(goals["workload"] == row.workload) & ~goals["met"]]["statistic"]
        inside = goals[(goals["workload"] == row.workload) & (goals["met_by"] != "the goal")]
        if missed.empty:
            cause = (
                "every statistic meets its goal"
                if inside.empty
                else "every statistic meets its goal or misses it by less than the real "
                f"engine's own repeat did ({', '.join(inside['statistic'])})"
            )
        elif abs(factor - 1) > DRIFT:
            cause = (
                f"its steps took {factor:.2f}x the profile's time for the same work (median), "
                "so the machine, not the schedule, moved"
            )
        else:
            cause = (
                f"its steps went at the profile's speed ({factor:.2f}x, median), so the misses "
                f"({', '.join(missed)}) are the step-cost model's own"
            )
        lines.append(
            f"- `{row.workload}` ({row.requests} requests): median TTFT "
            f"{row.predicted_p50_ttft_s * 1e3:.1f} ms predicted vs "
            f"{row.measured_p50_ttft_s * 1e3:.1f} ms measured ({row.p50_ttft_error:+.1%}), p90 "
            f"{row.p90_ttft_error:+.1%}, mean TPOT {row.mean_tpot_error:+.1%}, throughput "
            f"{row.throughput_req_error:+.1%}: {cause}."
        )
    calibration = speed[~speed["run"].isin(errors_["workload"])]
    if len(calibration):
        low = calibration["median_measured_over_model"].min()
        high = calibration["median_measured_over_model"].max()
        lines.append(
            f"- The calibration runs themselves went at {low:.2f}x to {high:.2f}x the fitted "
            "profile's speed: on this machine the same step's time moves by that much from one "
            "run to the next, which bounds what any schedule-based prediction can reach there."
        )
    return "\n".join(lines)
