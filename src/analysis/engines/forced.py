"""Teacher forcing in the real engine: a logits processor that emits given tokens, in order.

A request whose `SamplingParams.extra_args["forced_token_ids"]` is set can only sample, at
output position i, the i-th of those tokens (every other logit is -inf). With greedy sampling
the real engine then "generates" the recorded reply, so the next turn's prompt extends what
it really cached, as in serving. Imported only by the vllm engine (it imports torch and vLLM).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

FORCED_KEY = "forced_token_ids"


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
