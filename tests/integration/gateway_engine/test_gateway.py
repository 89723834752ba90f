"""Gateway: real embedded engine subprocess, real tokenizer, real ZeroMQ and HTTP front doors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.asyncio
from openai import AsyncOpenAI
from transformers import AutoTokenizer

from areal.engine.client import EngineClient
from areal.gateway import Gateway, GatewayConfig, serve_http, serve_zmq
from areal.gateway.server import handle
from areal.protocol import GatewayMessage, GatewayReply, GatewayRequest


def _gateway(engine_url: str, model_dir: Path, **cfg) -> Gateway:
    tok = AutoTokenizer.from_pretrained(model_dir)
    return Gateway(EngineClient(engine_url), tok, GatewayConfig(**cfg))


@contextlib.asynccontextmanager
async def _over_http(engine_url: str, model_dir: Path) -> AsyncIterator[tuple[Gateway, str]]:
    """(gateway, its URL): a gateway on the engine at ``engine_url`` served over HTTP; on leaving,
    the HTTP server is stopped and the engine client closed."""
    gw = _gateway(engine_url, model_dir)
    runner, url = await serve_http(gw)
    try:
        yield gw, url
    finally:
        await runner.cleanup()
        await gw.engine.close()


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
        reply = await handle(gw, _req(key, _chat(messages, temperature=0.0, max_tokens=32)))
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
        async with _over_http(engine_url, model_dir) as (gw, url):
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
        (_chat([{"role": "user", "content": "hi"}], stream="yes"), 400, "stream"),
        (_chat([{"role": "user", "content": "hi"}], top_logprobs=3), 400, "logprobs"),
        (_chat([{"role": "user", "content": "hi"}], tool_choice="required", tools=[]), 400, "tool_choice"),
        (_chat([{"role": "user", "content": "hi"}], logit_bias={"1": 2}), 400, "logit_bias"),
        (_chat([{"role": "user", "content": "hi"}], n=0), 400, "n must be"),
    ],
)
def test_bad_requests_get_openai_shaped_4xx(engine_url, model_dir, body, status, needle):
    async def go():
        gw = _gateway(engine_url, model_dir)
        key = gw.open_session("e2")
        reply = await handle(gw, _req(key, body))
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
        assert (await handle(gw, _req(None, ok))).status == 401
        assert (await handle(gw, _req("sk-forged", ok))).status == 401
        assert (await handle(gw, _req(key, b"", path="/v1/nope", method="GET"))).status == 404
        long = _chat([{"role": "user", "content": "count " * 200}], max_tokens=4)
        reply = await handle(gw, _req(key, long))
        assert reply.status == 400 and "context length of 64" in json.loads(reply.body)["error"]["message"]
        other = gw.open_session("e4")
        gw.close_session(key)
        assert (await handle(gw, _req(key, ok))).status == 401  # a closed session's key is dead
        assert (await handle(gw, _req(other, ok))).status == 200
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
            reply = await handle(gw, _req(key, _chat([{"role": "user", "content": "hi"}], max_tokens=4)))
            assert reply.status == 503
            assert json.loads(reply.body)["error"]["type"] == "engine_unavailable"
        assert (await handle(gw, _req(None, b"", path="/health", method="GET"))).status == 200
        await gw.engine.close()

    asyncio.run(go())


def test_streaming_over_http_matches_recorded_tokens(engine_url, model_dir):
    """SSE chunks in OpenAI's shape; their text is exactly the recorded interaction's text."""

    async def go():
        async with _over_http(engine_url, model_dir) as (gw, url):
            key = gw.open_session("s1")
            client = AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "What is 12 + 30?"}],
                max_tokens=24,
                stream=True,
                stream_options={"include_usage": True},
                temperature=0.0,
            )
            pieces, finish, usage, ids = [], None, None, set()
            async for chunk in stream:
                ids.add(chunk.id)
                if chunk.usage is not None:
                    usage = chunk.usage
                for c in chunk.choices:
                    pieces.append(c.delta.content or "")
                    finish = c.finish_reason or finish
            (inter,) = gw.sessions[key].interactions.values()
            assert ids == {inter.id}
            assert "".join(pieces) == gw.tokenizer.decode(inter.output_ids, skip_special_tokens=True)
            assert finish in ("stop", "length") and usage.completion_tokens == len(inter.output_ids)
            assert len(pieces) >= 3  # role chunk, then content as it is produced, then finish

    asyncio.run(go())


def test_streaming_over_zmq_sends_several_frames(engine_url, model_dir):
    async def go():
        gw = _gateway(engine_url, model_dir)
        addr = f"ipc://{tempfile.mkdtemp()}/gw.sock"
        server = asyncio.create_task(serve_zmq(gw, addr))
        key = gw.open_session("s2")
        dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        dealer.connect(addr)
        body = _chat([{"role": "user", "content": "What is 5 + 1?"}], max_tokens=12, stream=True, temperature=0.0)
        await dealer.send(msgspec.msgpack.encode(_req(key, body)))
        dec = msgspec.msgpack.Decoder(GatewayMessage)
        frames = [dec.decode(await asyncio.wait_for(dealer.recv(), 60))]
        while frames[-1].more:
            frames.append(dec.decode(await asyncio.wait_for(dealer.recv(), 60)))
        assert frames[0].status == 200 and frames[0].headers["content-type"] == "text/event-stream"
        data = b"".join(f.body for f in frames)
        assert len(frames) > 4 and data.endswith(b"data: [DONE]\n\n")
        assert len(gw.sessions[key].interactions) == 1
        dealer.close(0)
        server.cancel()
        await gw.engine.close()

    asyncio.run(go())


def test_n_choices_logprobs_seed_and_stop(engine_url, model_dir):
    async def go():
        gw = _gateway(engine_url, model_dir)
        key = gw.open_session("s3")
        msgs = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}]
        body = _chat(msgs, n=3, max_tokens=16, seed=7, logprobs=True, top_logprobs=2)
        out = json.loads((await handle(gw, _req(key, body))).body)
        assert [c["index"] for c in out["choices"]] == [0, 1, 2]
        inters = list(gw.sessions[key].interactions.values())
        assert len(inters) == 3 and inters[0].id == out["id"]
        assert out["usage"]["completion_tokens"] == sum(len(i.output_ids) for i in inters)
        for c, inter in zip(out["choices"], inters):
            lp = c["logprobs"]["content"]
            content_ids = [t for t in inter.output_ids if t not in gw.stop_token_ids]
            assert [x["logprob"] for x in lp] == pytest.approx(inter.output_logprobs[: len(content_ids)], abs=1e-6)
            assert all(len(x["top_logprobs"]) == 2 for x in lp)
        again = json.loads((await handle(gw, _req(key, body))).body)
        assert [c["message"]["content"] for c in again["choices"]] == [c["message"]["content"] for c in out["choices"]]

        # stop: the answer ends before the stop string; recorded ids end with the token completing it
        text = out["choices"][0]["message"]["content"]
        assert len(text) > 2
        stop = text[1:3]
        cut = json.loads((await handle(gw, _req(key, _chat(msgs, n=1, max_tokens=16, seed=7, stop=[stop])))).body)
        choice = cut["choices"][0]
        assert choice["finish_reason"] == "stop" and stop not in choice["message"]["content"]
        inter = gw.sessions[key].interactions[cut["id"]]
        decoded = gw.tokenizer.decode(inter.output_ids, skip_special_tokens=True)
        assert stop in decoded and stop not in gw.tokenizer.decode(inter.output_ids[:-1], skip_special_tokens=True)
        assert len(inter.output_logprobs) == len(inter.output_ids)
        await gw.engine.close()

    asyncio.run(go())


def test_rewards_and_session_isolation_over_http_routes(engine_url, model_dir):
    async def go():
        gw = _gateway(engine_url, model_dir)
        a, b = gw.open_session("a"), gw.open_session("b")
        ok = _chat([{"role": "user", "content": "hi"}], max_tokens=4)
        ida = json.loads((await handle(gw, _req(a, ok))).body)["id"]
        idb = json.loads((await handle(gw, _req(b, ok))).body)["id"]
        reward = lambda key, **kw: handle(gw, _req(key, json.dumps(kw).encode(), path="/v1/rewards"))  # noqa: E731
        assert (await reward(b, interaction_id=ida, reward=1.0)).status == 404  # cannot reward another's
        get = lambda key, iid: handle(gw, _req(key, b"", path=f"/v1/interactions/{iid}", method="GET"))  # noqa: E731
        assert (await get(b, ida)).status == 404  # cannot read another's
        assert json.loads((await get(a, ida)).body)["output_ids"] == gw.sessions[a].interactions[ida].output_ids
        assert (await reward(a, interaction_id=ida, reward=0.5)).status == 200
        assert (await reward(b, reward=2)).status == 200  # final reward
        assert (await reward(a, reward="x")).status == 400
        assert gw.sessions[a].interactions[ida].reward == 0.5 and gw.sessions[b].interactions[idb].reward == 2.0
        assert (await handle(gw, _req(a, b"", path="/admin/metrics", method="GET"))).status == 401

        adm = gw.admin_key
        opened = await handle(gw, _req(adm, json.dumps({"episode_id": "x"}).encode(), path="/admin/sessions"))
        new_key = json.loads(opened.body)["key"]
        assert (await handle(gw, _req(new_key, ok))).status == 200
        closed = json.loads((await handle(gw, _req(adm, json.dumps({"key": a}).encode(), path="/admin/sessions/close"))).body)
        assert closed["episode_id"] == "a" and closed["interactions"][0]["reward"] == 0.5
        assert (await handle(gw, _req(a, ok))).status == 401
        metrics = json.loads((await handle(gw, _req(adm, b"", path="/admin/metrics", method="GET"))).body)
        assert metrics["sessions"] == 2 and metrics["drift"] == 0
        await gw.engine.close()

    asyncio.run(go())


def test_idle_sessions_expire_and_are_reported(engine_url, model_dir):
    async def go():
        gw = _gateway(engine_url, model_dir, session_idle_s=30)
        key = gw.open_session("idle")
        ok = _chat([{"role": "user", "content": "hi"}], max_tokens=4)
        assert (await handle(gw, _req(key, ok))).status == 200
        gone = gw.expire_idle(now=gw.sessions[key].last_used + 31)
        assert [s.episode_id for s in gone] == ["idle"]
        reply = await handle(gw, _req(key, ok))
        assert reply.status == 401 and "expired" in json.loads(reply.body)["error"]["message"]
        listing = json.loads((await handle(gw, _req(gw.admin_key, b"", path="/admin/sessions", method="GET"))).body)
        assert [s["episode_id"] for s in listing["expired"]] == ["idle"]
        session = gw.close_session(key)  # the controller still collects what it recorded
        assert session.expired and len(session.interactions) == 1
        await gw.engine.close()

    asyncio.run(go())


def test_engine_client_keeps_alive_and_survives_a_server_closing_idle_connections():
    """EngineClient's HTTP/1.1 pool: one connection serves sequential calls; when the server
    closes it while idle (as keep-alive timeouts do), the next call is retried on a fresh one;
    chunked bodies are read whole; a refused connection is EngineUnavailable."""
    from areal.engine.client import EngineUnavailable

    async def go() -> None:
        conns: list[asyncio.StreamWriter] = []
        answer = json.dumps(
            {
                "output_ids": [5, 6],
                "meta_info": {
                    "finish_reason": {"type": "stop"},
                    "completion_tokens": 2,
                    "prompt_tokens": 3,
                    "output_token_logprobs": [[-0.1, 5, None], [-0.2, 6, None]],
                },
            }
        ).encode()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conns.append(writer)
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
                await reader.readexactly(length)
                if len(conns) % 2:  # odd connections answer with Content-Length, even ones chunked
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
                else:
                    half = len(answer) // 2
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n"
                        % (half, answer[:half], len(answer) - half, answer[half:])
                    )
                await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = EngineClient(f"http://127.0.0.1:{port}")
        try:
            for _ in range(3):
                r = await client.generate([1, 2, 3], {"max_new_tokens": 4})
                assert r.output_ids == [5, 6] and r.output_logprobs == [-0.1, -0.2] and r.finish_reason == "stop"
            assert len(conns) == 1  # kept alive
            conns[0].close()  # the server drops the idle connection
            await asyncio.sleep(0.05)
            r = await client.generate([1, 2, 3], {"max_new_tokens": 4})  # retried on a fresh (chunked) one
            assert r.output_ids == [5, 6] and len(conns) == 2
            results = await asyncio.gather(*(client.generate([1], {"max_new_tokens": 4}) for _ in range(5)))
            assert all(x.output_ids == [5, 6] for x in results)
        finally:
            await client.close()
            server.close()
            await server.wait_closed()
        with pytest.raises(EngineUnavailable):
            await EngineClient(f"http://127.0.0.1:{port}").generate([1], {"max_new_tokens": 1})

    asyncio.run(go())


def test_engine_client_times_out_a_silent_engine_and_keeps_rids_distinct() -> None:
    """The pool's watchdog fails an answer that never comes (EngineUnavailable, the connection
    dropped), and the client's generated rids are distinct and none is a prefix of another
    (aborts match rids by prefix)."""
    from areal.engine.client import EngineUnavailable

    async def go() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)
            await reader.read(65536)  # reads the request, never answers

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = EngineClient(f"http://127.0.0.1:{port}", timeout_s=0.4)
        try:
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(EngineUnavailable):
                await client.generate([1, 2], {"max_new_tokens": 2})
            waited = asyncio.get_running_loop().time() - t0
            assert waited >= 0.4  # never before the timeout
            pool = client._pool
            assert pool is not None and pool.open == 0 and not pool.idle and not pool.deadlines
        finally:
            await client.close()
            server.close()
            for w in accepted:
                w.close()
        rids = [client._new_rid() for _ in range(300)]
        assert len(set(rids)) == 300 and all(len(r) == 32 for r in rids)
        assert not any(a != b and b.startswith(a) for a in rids[:50] for b in rids)

    asyncio.run(go())
