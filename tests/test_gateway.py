"""Gateway: real embedded engine subprocess, real tokenizer, real ZeroMQ and HTTP front doors."""

from __future__ import annotations

import asyncio
import json
import socket
import tempfile
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.asyncio
from openai import AsyncOpenAI
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.engine.client import EngineClient, launch_embedded_engine
from areal.gateway import Gateway, GatewayConfig, serve_http, serve_zmq
from areal.protocol import GatewayMessage, GatewayReply, GatewayRequest


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return ensure_embedded_model()


@pytest.fixture(scope="module")
def engine_url(model_dir):
    proc = launch_embedded_engine(str(model_dir))
    yield proc.url
    proc.stop()


def _gateway(engine_url: str, model_dir: Path, **cfg) -> Gateway:
    tok = AutoTokenizer.from_pretrained(model_dir)
    return Gateway(EngineClient(engine_url), tok, GatewayConfig(**cfg))


def _chat(messages, **kw) -> bytes:
    return json.dumps({"model": "m", "messages": messages, **kw}).encode()


def _req(key: str | None, body: bytes, path: str = "/v1/chat/completions", method: str = "POST") -> GatewayRequest:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return GatewayRequest(request_id=1, method=method, path=path, headers=headers, body=body)


def test_gateway_path_equals_direct_engine_call(engine_url, model_dir):
    """Greedy through the gateway records exactly what a direct /generate call returns."""

    async def go():
        gw = _gateway(engine_url, model_dir)
        key = gw.open_session("e0")
        messages = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}]
        reply = await gw.handle(_req(key, _chat(messages, temperature=0.0, max_tokens=32)))
        assert reply.status == 200, reply.body
        body = json.loads(reply.body)
        (inter,) = gw.close_session(key).interactions.values()
        assert body["id"] == inter.id
        text = gw.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert inter.prompt_ids == gw.tokenizer.encode(text, add_special_tokens=False)
        direct = await gw.engine.generate(
            inter.prompt_ids, {"max_new_tokens": 32, "temperature": 0.0, "stop_token_ids": gw.stop_token_ids}, return_logprob=True
        )
        assert inter.output_ids == direct.output_ids
        assert inter.output_logprobs == pytest.approx(direct.output_logprobs, abs=1e-5)
        assert len(inter.output_logprobs) == len(inter.output_ids) == body["usage"]["completion_tokens"]
        assert body["choices"][0]["message"]["content"] == gw.tokenizer.decode(direct.output_ids, skip_special_tokens=True)
        assert inter.version == 0  # the engine's "default" weight_version
        await gw.engine.close()

    asyncio.run(go())


def test_openai_sdk_over_http_and_zmq_front_doors(engine_url, model_dir):
    async def go():
        gw = _gateway(engine_url, model_dir)
        runner, url = await serve_http(gw)
        addr = f"ipc://{tempfile.mkdtemp()}/gw.sock"
        server = asyncio.create_task(serve_zmq(gw, addr))
        key = gw.open_session("e1")
        client = AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        out = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=16)
        assert out.choices[0].message.role == "assistant"
        assert out.usage.completion_tokens >= 1

        ctx = zmq.asyncio.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(addr)
        await dealer.send(msgspec.msgpack.encode(_req(key, _chat([{"role": "user", "content": "What is 5 + 1?"}], max_tokens=16))))
        reply = msgspec.msgpack.Decoder(GatewayMessage).decode(await asyncio.wait_for(dealer.recv(), 60))
        assert isinstance(reply, GatewayReply) and reply.status == 200, reply
        dealer.close(0)

        session = gw.close_session(key)
        assert len(session.interactions) == 2
        assert [i.id for i in session.interactions.values()][0] == out.id
        server.cancel()
        await runner.cleanup()
        await gw.engine.close()

    asyncio.run(go())


@pytest.mark.parametrize(
    "body, status, needle",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (_chat([]), 400, "messages"),
        (_chat([{"role": "user", "content": "hi"}], tools=[{"type": "function"}]), 400, "tools"),
        (_chat([{"role": "user", "content": "hi"}], temperature="hot"), 400, "temperature"),
        (_chat([{"role": "user", "content": "hi"}], max_tokens=10**6), 400, "max_tokens"),
        (_chat([{"role": "wizard", "content": "hi"}]), 400, "role"),
        (_chat([{"role": "user", "content": "hi"}], stream=True), 400, "stream"),
    ],
)
def test_bad_requests_get_openai_shaped_4xx(engine_url, model_dir, body, status, needle):
    async def go():
        gw = _gateway(engine_url, model_dir)
        key = gw.open_session("e2")
        reply = await gw.handle(_req(key, body))
        assert reply.status == status
        err = json.loads(reply.body)["error"]
        assert needle in err["message"]
        assert gw.sessions[key].interactions == {}  # nothing recorded for a refused request
        await gw.engine.close()

    asyncio.run(go())


def test_auth_routes_and_limits(engine_url, model_dir):
    async def go():
        gw = _gateway(engine_url, model_dir, context_length=64, default_max_tokens=16, max_tokens_cap=32)
        key = gw.open_session("e3")
        ok = _chat([{"role": "user", "content": "hi"}], max_tokens=4)
        assert (await gw.handle(_req(None, ok))).status == 401
        assert (await gw.handle(_req("sk-forged", ok))).status == 401
        assert (await gw.handle(_req(key, b"", path="/v1/nope", method="GET"))).status == 404
        long = _chat([{"role": "user", "content": "count " * 200}], max_tokens=4)
        reply = await gw.handle(_req(key, long))
        assert reply.status == 400 and "context length of 64" in json.loads(reply.body)["error"]["message"]
        other = gw.open_session("e4")
        gw.close_session(key)
        assert (await gw.handle(_req(key, ok))).status == 401  # a closed session's key is dead
        assert (await gw.handle(_req(other, ok))).status == 200
        await gw.engine.close()

    asyncio.run(go())


def test_engine_down_is_503_and_gateway_keeps_serving(model_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed

    async def go():
        gw = _gateway(dead, model_dir)
        key = gw.open_session("e5")
        for _ in range(2):
            reply = await gw.handle(_req(key, _chat([{"role": "user", "content": "hi"}], max_tokens=4)))
            assert reply.status == 503
            assert json.loads(reply.body)["error"]["type"] == "engine_unavailable"
        assert (await gw.handle(_req(None, b"", path="/health", method="GET"))).status == 200
        await gw.engine.close()

    asyncio.run(go())
