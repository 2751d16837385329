"""Forced outputs follow the model runner vLLM resolves: a logits processor under V1 (a CPU),
vLLM's trace replay under V2 (the CUDA default). The choice reads vLLM's own resolution; here it
is checked against vLLM's real config code on this CPU, with Triton's presence faked where a
CUDA machine would have it (vLLM's resolution itself is not faked)."""

from __future__ import annotations

import types

import pytest

from analysis.engines import RunConfig
from analysis.engines.vllm_args import config_model, engine_kwargs
from analysis.platform.errors import ConfigError

forced = pytest.importorskip("analysis.engines.forced")


@pytest.fixture
def runner_env(monkeypatch):
    """Set VLLM_USE_V2_MODEL_RUNNER (None: unset) with vLLM's env cache off."""
    import vllm.envs as envs

    def set_to(value: str | None) -> None:
        envs.disable_envs_cache()
        if value is None:
            monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
        else:
            monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", value)

    yield set_to
    envs.disable_envs_cache()


def cpu_kwargs() -> dict:
    config = RunConfig(engine="vllm", block_size=32, num_blocks=64, max_model_len=1024)
    return engine_kwargs(config, config_model(config))


def test_the_choice_per_model_runner():
    assert forced.choose_forcing("v1", has_trace_replay=True) == forced.LOGITS_PROCESSOR
    assert forced.choose_forcing("v1", has_trace_replay=False) == forced.LOGITS_PROCESSOR
    assert forced.choose_forcing("v2", has_trace_replay=True) == forced.TRACE_REPLAY
    with pytest.raises(ConfigError, match="Model Runner V2.*VLLM_USE_V2_MODEL_RUNNER=0") as err:
        forced.choose_forcing("v2", has_trace_replay=False)
    assert "\n" not in str(err.value)


def test_this_vllm_has_trace_replay():
    assert forced.trace_replay_available()


def test_each_mechanism_gives_vllm_what_it_takes():
    from vllm import SamplingParams

    replay = SamplingParams(max_tokens=3, **forced.forced_params(forced.TRACE_REPLAY, [5, 6, 7]))
    assert replay.trace_decode_token_ids == [5, 6, 7]
    assert replay.extra_args is None
    processor = SamplingParams(
        max_tokens=3, **forced.forced_params(forced.LOGITS_PROCESSOR, [5, 6, 7])
    )
    assert processor.extra_args == {forced.FORCED_KEY: [5, 6, 7]}
    assert processor.trace_decode_token_ids is None
    assert forced.forcing_engine_kwargs(forced.TRACE_REPLAY) == {"enable_trace_replay": True}
    assert forced.forcing_engine_kwargs(forced.LOGITS_PROCESSOR) == {
        "logits_processors": [forced.ForcedTokensLogitsProcessor]
    }


@pytest.mark.engine
@pytest.mark.parametrize(
    "env, triton, runner, mechanism",
    [
        (None, False, "v1", forced.LOGITS_PROCESSOR),  # this CPU as it is: no Triton
        (None, True, "v2", forced.TRACE_REPLAY),  # a CUDA machine: V2 by default
        ("0", True, "v1", forced.LOGITS_PROCESSOR),  # V1 asked for
        ("1", True, "v2", forced.TRACE_REPLAY),  # V2 asked for
    ],
)
def test_vllm_resolution_drives_the_choice_and_vllm_accepts_it(
    runner_env, monkeypatch, env, triton, runner, mechanism
):
    """vLLM's own resolution (VllmConfig.use_v2_model_runner) runs; only Triton's presence is
    faked where a CUDA machine would have it."""
    import vllm.config.vllm as vllm_config_module
    from vllm.engine.arg_utils import EngineArgs

    runner_env(env)
    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", triton)
    kwargs = cpu_kwargs()
    assert forced.resolved_model_runner(kwargs) == runner
    chosen = forced.choose_forcing(runner, forced.trace_replay_available())
    assert chosen == mechanism
    kwargs.update(forced.forcing_engine_kwargs(chosen))
    vllm_config = EngineArgs(**kwargs).create_engine_config()
    assert forced.runner_name(vllm_config) == runner
    assert vllm_config.model_config.enable_trace_replay == (chosen == forced.TRACE_REPLAY)


@pytest.mark.engine
def test_trace_replay_is_what_v1_cannot_take(runner_env):
    """Why the choice matters: vLLM refuses trace replay under V1 (and V2 refuses our
    processor, ../facts/gpu.md), so forcing one mechanism everywhere fails somewhere."""
    from vllm.engine.arg_utils import EngineArgs

    runner_env("0")
    with pytest.raises(ValueError, match="trace replay requires Model Runner V2"):
        EngineArgs(**cpu_kwargs(), enable_trace_replay=True).create_engine_config()


def test_build_engine_follows_a_v2_resolution(monkeypatch):
    """With vLLM's resolution faked to V2, the engine is built with trace replay and no
    logits processor, and the manifest's mechanism says so."""
    import vllm

    from analysis.engines import vllm_engine

    seen: dict = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            seen.update(kwargs)
            config = types.SimpleNamespace(use_v2_model_runner=True)
            self.llm_engine = types.SimpleNamespace(vllm_config=config)

    monkeypatch.setattr(forced, "resolved_model_runner", lambda kwargs: "v2")
    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    config = RunConfig(engine="vllm", block_size=32, num_blocks=64, max_model_len=1024)
    model = config_model(config)
    _, forcing = vllm_engine.build_engine(config, model, forced=True)
    assert forcing == {"mechanism": forced.TRACE_REPLAY, "model_runner": "v2"}
    assert seen["enable_trace_replay"] is True
    assert "logits_processors" not in seen

    monkeypatch.setattr(forced, "resolved_model_runner", lambda kwargs: "v1")
    with pytest.raises(ConfigError, match="started v2"):
        vllm_engine.build_engine(config, model, forced=True)
