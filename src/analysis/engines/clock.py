"""A step-cost profile: what one vLLM step costs in seconds, from what was scheduled in it.

The model is linear in the step's make-up (`analysis.engines.steps.FEATURES`), every term
named with its unit, fitted on a real engine's measured steps (`analysis.timing`):

    step seconds = fixed + token * tokens + sequence * sequences
                   + new_request * new_requests + finished_request * finished_requests
                   + prefill_request * prefill_requests
                   + sampled * sampled
                   + prefill_pair * prefill_pairs / 1e6 + decode_context * decode_context / 1e3
                   + distinct_context * distinct_context / 1e3

plus, for a step that only decodes n requests, `decode_batch_s[n]`: one term per small
batch size the calibration decoded often enough (1 up to the first size it did not), fitted
with the others, for what a linear model cannot hold (on a 2-core CPU a decode of one request
and one of six cost nearly the same); larger batches take the linear terms alone; plus two
costs outside a step, measured beside it: `admit_s` per request handed to the
engine (request set-up, block hashing) and `loop_s` per step (the driver's own time between
steps). Replay on this clock advances its time by exactly these, so it predicts TTFT, TPOT
and throughput for the workload, machine and engine settings the profile was measured on.

A profile carries its identity (machine, dtype, model shape, vLLM version, engine settings):
`check_applies` refuses a run whose identity differs, in one line naming what differs, unless
the caller says to use it anyway.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from analysis.engines.config import RunConfig
from analysis.models.resolved import ResolvedModel
from analysis.platform.errors import ConfigError

# term -> (feature it multiplies, scale, unit of the coefficient)
TERMS: dict[str, tuple[str | None, float, str]] = {
    "fixed": (None, 1.0, "s per step"),
    "token": ("tokens", 1.0, "s per token computed"),
    "sequence": ("sequences", 1.0, "s per request in the batch"),
    "new_request": ("new_requests", 1.0, "s per request entering the batch"),
    "finished_request": ("finished_requests", 1.0, "s per request dropped from the batch"),
    "prefill_request": ("prefill_requests", 1.0, "s per request given several tokens"),
    "sampled": ("sampled", 1.0, "s per request sampling a token"),
    "prefill_pair": ("prefill_pairs", 1e-6, "s per million prefill query-key pairs"),
    "decode_context": ("decode_context", 1e-3, "s per thousand context tokens read by decodes"),
    "distinct_context": (
        "distinct_context",
        1e-3,
        "s per thousand of those tokens in blocks no other decode of the step read first",
    ),
}
DECODE_BATCH_UNIT = (
    "s added to a step that only decodes, by how many requests it decodes (none beyond the "
    "batch sizes listed)"
)
# What must match between the profile and a run for its times to mean anything.
IDENTITY_KEYS = ("machine", "dtype", "model", "vllm", "engine_settings")


@dataclass(frozen=True)
class StepCostProfile:
    """Coefficients (seconds, see TERMS), the costs outside a step, and where they hold."""

    coefficients: dict[str, float]
    admit_s: float  # per request handed to the engine
    loop_s: float  # per step, the driver's time outside the engine's step
    identity: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)  # residuals, rows, workloads
    # requests decoded -> s added to a decode-only step (DECODE_BATCH_UNIT); empty: none
    decode_batch_s: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.coefficients) - set(TERMS))
        if unknown:
            raise ConfigError(f"step-cost profile: unknown term {unknown[0]!r}; terms: {TERMS}")

    def step_seconds(self, features: Mapping[str, float]) -> float:
        """The modelled cost of one engine step with this make-up."""
        total = 0.0
        for term, coefficient in self.coefficients.items():
            feature, scale, _ = TERMS[term]
            total += coefficient * (1.0 if feature is None else features[feature] * scale)
        if self.decode_batch_s and not features["prefill_requests"]:
            total += self.decode_batch_s.get(int(features["sequences"]), 0.0)
        return total

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["units"] = {term: TERMS[term][2] for term in self.coefficients}
        if self.decode_batch_s:
            data["units"]["decode_batch_s"] = DECODE_BATCH_UNIT
        else:
            del data["decode_batch_s"]  # profiles without the term read as they always did
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepCostProfile:
        try:
            return cls(
                coefficients={k: float(v) for k, v in data["coefficients"].items()},
                admit_s=float(data["admit_s"]),
                loop_s=float(data["loop_s"]),
                identity=dict(data.get("identity", {})),
                fit=dict(data.get("fit", {})),
                decode_batch_s={
                    int(n): float(v) for n, v in data.get("decode_batch_s", {}).items()
                },
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(
                f"not a step-cost profile ({exc!r}): write one with `python -m analysis calibrate`"
            ) from None


def load_profile(path: str | Path) -> StepCostProfile:
    """A profile from its JSON file, or a one-line ConfigError saying how to make one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"step-cost profile {path} not found: measure one with `python -m analysis calibrate`"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"step-cost profile {path} cannot be read ({exc}); calibrate again"
        ) from None
    return StepCostProfile.from_dict(data)


def identity_differences(profile: StepCostProfile, run_identity: Mapping[str, Any]) -> list[str]:
    """Each identity key on which the profile and a run disagree, as 'key: profile vs run'."""
    differences = []
    for key in IDENTITY_KEYS:
        ours, theirs = profile.identity.get(key), run_identity.get(key)
        if ours is not None and theirs is not None and ours != theirs:
            differences.append(f"{key}: profile {ours!r} vs run {theirs!r}")
    return differences


def check_applies(
    profile: StepCostProfile, run_identity: Mapping[str, Any], *, anyway: bool = False
) -> list[str]:
    """Refuse (ConfigError) a profile measured for another machine, model, vLLM or settings;
    with `anyway`, return the differences instead (the manifest records them)."""
    differences = identity_differences(profile, run_identity)
    if differences and not anyway:
        raise ConfigError(
            "the step-cost profile was measured elsewhere ("
            + "; ".join(differences)
            + "): calibrate for this model and vLLM, or pass --clock-anyway to use it anyway"
        )
    return differences


def run_identity(config: RunConfig, model: ResolvedModel) -> dict[str, Any]:
    """What a profile must have been measured for to time this run: the model's shape, vLLM,
    and the engine settings a step's cost depends on. (The machine and dtype are what a
    replay's times are *for*: the manifest names them, no check needs them equal.)"""
    from vllm import __version__ as vllm_version

    from analysis.engines.vllm_args import SHARED_SETTINGS

    return {
        "model": {
            "name": model.asked or "tiny-llama",
            "num_layers": model.num_layers,
            "num_kv_heads": model.num_kv_heads,
            "head_size": model.head_size,
        },
        "vllm": vllm_version,
        "engine_settings": {
            "block_size": config.block_size,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "enforce_eager": SHARED_SETTINGS["enforce_eager"],
            "async_scheduling": SHARED_SETTINGS["async_scheduling"],
        },
    }


class VirtualClock:
    """Replay's time: it only moves when a step or an admission is charged to it."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def now(self) -> float:
        return self.seconds

    def advance(self, seconds: float) -> None:
        self.seconds += max(0.0, seconds)

    def wait_until(self, seconds: float) -> None:
        """Idle until `seconds` (nothing to run before the next arrival)."""
        self.seconds = max(self.seconds, seconds)
