"""Every engine client implements the interfaces the gateway and the controller are written
against (``areal/engine/interface.py``): each method is there, and accepts every argument the
interface passes (a client that dropped ``top_logprobs_num`` would fail only at run time)."""

from __future__ import annotations

import inspect

import pytest

from areal.engine.client import EngineClient
from areal.engine.interface import InferenceEngine, WeightUpdatable
from areal.engine.router import EngineRouter
from areal.engine.vllm import VLLMClient


def _clients() -> dict[str, object]:
    return {
        "sglang-protocol": EngineClient("http://127.0.0.1:9"),
        "router": EngineRouter(["http://127.0.0.1:9", "http://127.0.0.1:10"]),
        "vllm": VLLMClient("http://127.0.0.1:9"),
    }


def _accepts(impl: object, proto: type, name: str) -> None:
    """``impl.name`` can be called with every parameter of ``proto.name``, by the same kind."""
    want = inspect.signature(getattr(proto, name))
    have = inspect.signature(getattr(impl, name))
    args, kwargs = [], {}
    for p in list(want.parameters.values())[1:]:  # without self
        value = object()
        if p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = value
        else:
            args.append(value)
    have.bind(*args, **kwargs)  # raises TypeError naming what does not fit


@pytest.mark.parametrize("kind", ["sglang-protocol", "router", "vllm"])
def test_every_engine_client_is_an_inference_engine(kind):
    client = _clients()[kind]
    assert isinstance(client, InferenceEngine)
    for name in ("generate", "generate_stream", "abort_request", "health", "model_info", "close"):
        _accepts(client, InferenceEngine, name)
    assert inspect.iscoroutinefunction(client.generate)


@pytest.mark.parametrize("kind", ["sglang-protocol", "router", "vllm"])
def test_engines_that_load_weights_are_weight_updatable(kind):
    client = _clients()[kind]
    assert isinstance(client, WeightUpdatable)
    for name in ("update_weights_from_disk", "pause_generation", "continue_generation"):
        _accepts(client, WeightUpdatable, name)


def test_the_interface_check_fails_on_a_client_missing_a_parameter():
    class Partial:
        async def generate(self, input_ids, sampling_params):  # no return_logprob, rid, ...
            return None

    with pytest.raises(TypeError):
        _accepts(Partial(), InferenceEngine, "generate")
