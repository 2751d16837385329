"""Teacher forcing in the real engine: the engine emits the workload's tokens, in order.

vLLM 0.32 has two model runners and each forces outputs its own way:

- Model Runner V1 (what a CPU resolves to: V2 needs Triton) takes custom logits processors.
  `ForcedTokensLogitsProcessor` lets a request whose `extra_args["forced_token_ids"]` is set
  sample, at output position i, only the i-th of those tokens; with greedy sampling the engine
  "generates" the recorded reply.
- Model Runner V2 (the CUDA default) rejects such processors ("is not a subclass of
  vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor") but has native trace replay:
  engine arg `enable_trace_replay=True` and `SamplingParams(trace_decode_token_ids=[...])`.

Which runner runs is decided by vLLM (`VllmConfig.use_v2_model_runner`: the
VLLM_USE_V2_MODEL_RUNNER variable, Triton, unsupported features), so the choice here reads what
vLLM resolved, never the device name. Either way the next turn's prompt extends what the engine
really cached, as in serving. Imported only by the vllm engine (it imports torch and vLLM).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from analysis.platform.errors import ConfigError

FORCED_KEY = "forced_token_ids"
LOGITS_PROCESSOR = "logits-processor"
TRACE_REPLAY = "trace-replay"


def _forcing(tokens: Sequence[int]) -> Callable[[list[int], torch.Tensor], torch.Tensor]:
    def force(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        position = len(output_ids)
        if position >= len(tokens):
            return logits
        logits.fill_(float("-inf"))
        logits[tokens[position]] = 0.0
        return logits

    return force


class ForcedTokensLogitsProcessor(AdapterLogitsProcessor):
    """Per-request forcing for requests that carry `forced_token_ids`; others untouched."""

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: SamplingParams):
        extra = params.extra_args or {}
        tokens = extra.get(FORCED_KEY)
        if not tokens:
            return None
        return _forcing(tuple(int(t) for t in tokens))


def resolved_model_runner(engine_kwargs: dict[str, Any]) -> str:
    """ "v2" or "v1": the model runner vLLM resolves for these engine arguments."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    vllm_config = EngineArgs(**engine_kwargs).create_engine_config(
        usage_context=UsageContext.LLM_CLASS
    )
    return runner_name(vllm_config)


def runner_name(vllm_config: Any) -> str:
    return "v2" if vllm_config.use_v2_model_runner else "v1"


def trace_replay_available() -> bool:
    """This vLLM has native trace replay (engine arg and SamplingParams field)."""
    from vllm.engine.arg_utils import EngineArgs

    engine_fields = {f.name for f in dataclasses.fields(EngineArgs)}
    params_fields = set(getattr(SamplingParams, "__struct_fields__", ()))
    return "enable_trace_replay" in engine_fields and "trace_decode_token_ids" in params_fields


def choose_forcing(model_runner: str, has_trace_replay: bool) -> str:
    """The forcing mechanism for a resolved model runner, or a one-line ConfigError."""
    if model_runner == "v1":
        return LOGITS_PROCESSOR
    if model_runner == "v2" and has_trace_replay:
        return TRACE_REPLAY
    if model_runner == "v2":
        raise ConfigError(
            "vLLM resolved Model Runner V2, which rejects custom logits processors, and this "
            "vLLM has no trace replay (enable_trace_replay): install vllm==0.32.0, or set "
            "VLLM_USE_V2_MODEL_RUNNER=0, or run with --outputs free"
        )
    raise ConfigError(f"unknown model runner {model_runner!r}: expected 'v1' or 'v2'")


def forcing_engine_kwargs(mechanism: str) -> dict[str, Any]:
    """The engine arguments a mechanism needs."""
    if mechanism == TRACE_REPLAY:
        return {"enable_trace_replay": True}
    return {"logits_processors": [ForcedTokensLogitsProcessor]}


def forced_params(mechanism: str, outputs: Sequence[int]) -> dict[str, Any]:
    """The SamplingParams arguments that force `outputs` under a mechanism."""
    tokens = [int(t) for t in outputs]
    if mechanism == TRACE_REPLAY:
        return {"trace_decode_token_ids": tokens}
    return {"extra_args": {FORCED_KEY: tokens}}
