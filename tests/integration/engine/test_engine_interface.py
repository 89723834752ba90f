"""Every engine client implements the interfaces the gateway and the controller are written
against (``areal/engine/interface.py``): each method is there, and accepts every argument the
interface passes (a client that dropped ``top_logprobs_num`` would fail only at run time); and
cancelling a generation aborts it at the engine (SGLang's protocol here, against a stand-in
that records what it is asked; vLLM's in tests/integration/vllm/test_vllm_client.py)."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable

import pytest
from aiohttp import web

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


# ---- cancelling a generation aborts it at the engine ------------------------------------------------


class _HoldingEngine:
    """SGLang's ``/generate`` holding every request until ``release`` (it never notices a client
    that went away), and ``/abort_request`` recording the rids it is asked to abort."""

    def __init__(self) -> None:
        self.generated: list[str] = []  # rids of the /generate requests received, in order
        self.aborted: list[str] = []
        self.release = asyncio.Event()

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.generated.append(body["rid"])
        answer = {"text": "", "output_ids": [7], "meta_info": {"finish_reason": None, "completion_tokens": 1, "prompt_tokens": 1}}
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: " + json.dumps(answer).encode() + b"\n\n")
            await self.release.wait()
            return resp
        await self.release.wait()
        answer["meta_info"]["finish_reason"] = {"type": "length", "length": 1}
        return web.json_response(answer)

    async def abort(self, request: web.Request) -> web.Response:
        self.aborted.append((await request.json())["rid"])
        return web.Response(status=200)

    async def start(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/abort_request", self.abort)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(600):  # bounded: a client that never does it fails here
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


@pytest.mark.parametrize("kind", ["sglang-protocol", "router"])
def test_cancelling_a_generation_aborts_it_at_the_engine_and_an_unsent_one_is_never_sent(kind: str) -> None:
    """One connection to an engine that holds every request: a generate on the wire and one
    waiting for the connection are cancelled. The engine is asked to abort the first by its rid
    (it would otherwise hold it: dropping the connection does not stop SGLang at once), never
    sees the second (a later call goes out next), and a stream closed by its reader is aborted
    the same way."""

    async def run() -> None:
        engine = _HoldingEngine()
        runner, url = await engine.start()

        def one_connection(u: str) -> EngineClient:
            return EngineClient(u, max_connections=1)

        client = one_connection(url) if kind == "sglang-protocol" else EngineRouter([url], client=one_connection)
        try:
            sent = asyncio.ensure_future(client.generate([1, 2], {"max_new_tokens": 8}))
            await _until(lambda: len(engine.generated) == 1, "the first generate reaches the engine")
            queued = asyncio.ensure_future(client.generate([3], {"max_new_tokens": 8}))
            await asyncio.sleep(0)  # it runs until it waits for the one connection
            sent.cancel()
            queued.cancel()
            await _until(lambda: engine.aborted == engine.generated, "the engine is asked to abort the sent one by its rid")
            stream = client.generate_stream([4], {"max_new_tokens": 8})
            await anext(stream)
            await stream.aclose()  # its reader stops before the end
            await _until(lambda: len(engine.aborted) == 2, "the engine is asked to abort the abandoned stream")
            assert engine.aborted == engine.generated  # the stream's rid, in order
            engine.release.set()
            await client.generate([5], {"max_new_tokens": 8})
            assert len(engine.generated) == 3, "the cancelled call that waited for a connection was sent"
            assert sent.cancelled() and queued.cancelled()
        finally:
            engine.release.set()
            await client.close()
            await runner.cleanup()

    asyncio.run(run())
