"""The gateway's two front doors: a ZeroMQ ROUTER (agents in sandboxes) and HTTP (aiohttp).

    DEALER ──GatewayRequest──► ROUTER ─► Gateway.dispatch ─► Reply ─► GatewayReply frames ─► DEALER
    HTTP client ─────────────► aiohttp ─► Gateway.dispatch ─► Reply ─► Response | StreamResponse

Invariants:
- A JSON reply is one GatewayReply (``more=False``). A streamed reply is a first frame with the
  status and headers and no body, one frame per SSE chunk as the core yields it, and a last
  empty frame with ``more=False`` (the relay forwards chunks as they arrive).
- A stream that fails midway (the engine died) ends with an SSE ``error`` event, then the last
  frame: the status was already sent.
- Each ZeroMQ request is served in its own task, so a slow engine call never blocks the socket;
  receives are drained non-blocking after each poll (several times faster than one awaited recv).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator

import msgspec
import zmq
import zmq.asyncio
from aiohttp import web

from areal.engine.client import EngineError
from areal.gateway.contract import RequestError
from areal.gateway.core import Gateway
from areal.gateway.routes import openai_error
from areal.protocol import GatewayMessage, GatewayReply, GatewayRequest

_JSON = {"content-type": "application/json"}


async def _guarded(stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The stream's chunks; a failure after the status was sent becomes a final SSE error event."""
    try:
        async for chunk in stream:
            yield chunk
    except (RequestError, EngineError) as e:
        payload = openai_error(getattr(e, "status", 502) or 502, str(e), "engine_error")
        yield b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"


async def reply_frames(gateway: Gateway, req: GatewayRequest) -> AsyncIterator[GatewayReply]:
    reply = await gateway.dispatch(req)
    if reply.stream is None:
        body = msgspec.json.encode(reply.body)
        yield GatewayReply(request_id=req.request_id, status=reply.status, headers={**_JSON, **reply.headers}, body=body)
        return
    yield GatewayReply(request_id=req.request_id, status=reply.status, headers=reply.headers, body=b"", more=True)
    async for chunk in _guarded(reply.stream):
        yield GatewayReply(request_id=req.request_id, status=reply.status, headers={}, body=chunk, more=True)
    yield GatewayReply(request_id=req.request_id, status=reply.status, headers={}, body=b"", more=False)


_decoder = msgspec.msgpack.Decoder(GatewayMessage)
_encoder = msgspec.msgpack.Encoder()


async def serve_zmq(gateway: Gateway, address: str, ready: asyncio.Event | None = None) -> None:
    """Serve GatewayRequests on a ROUTER socket until cancelled."""
    ctx = zmq.asyncio.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    tasks: set[asyncio.Task] = set()

    async def answer(identity: bytes, payload: bytes) -> None:
        try:
            req = _decoder.decode(payload)
        except msgspec.DecodeError as e:
            body = msgspec.json.encode(openai_error(400, f"bad frame: {e}", "invalid_request_error"))
            await sock.send_multipart([identity, _encoder.encode(GatewayReply(request_id=-1, status=400, headers=_JSON, body=body))])
            return
        if not isinstance(req, GatewayRequest):
            return
        async for frame in reply_frames(gateway, req):
            await sock.send_multipart([identity, _encoder.encode(frame)])

    if ready is not None:
        ready.set()
    try:
        while True:
            await sock.poll(zmq.POLLIN)
            while True:
                try:  # an asyncio socket's non-blocking recv resolves at once or raises Again
                    frames = await sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if len(frames) != 2:
                    continue  # not a DEALER with one payload frame; nothing to answer
                task = asyncio.ensure_future(answer(frames[0], frames[1]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
    finally:
        for t in tasks:
            t.cancel()
        sock.close(0)


async def serve_http(gateway: Gateway, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Start the HTTP front door; returns the runner (call ``cleanup()``) and its base URL."""
    counter = itertools.count()

    async def any_route(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        req = GatewayRequest(request_id=next(counter), method=request.method, path=request.path_qs,
                             headers={k.lower(): v for k, v in request.headers.items()}, body=body)
        reply = await gateway.dispatch(req)
        if reply.stream is None:
            return web.Response(status=reply.status, body=msgspec.json.encode(reply.body), headers={**_JSON, **reply.headers})
        resp = web.StreamResponse(status=reply.status, headers=reply.headers)
        await resp.prepare(request)
        async for chunk in _guarded(reply.stream):
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    app = web.Application(client_max_size=gateway.config.max_body_bytes + 1024)
    app.router.add_route("*", "/{tail:.*}", any_route)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # aiohttp exposes no public accessor
    return runner, f"http://{host}:{bound}"
