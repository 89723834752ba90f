"""The gateway's two front doors: a ZeroMQ ROUTER (agents in sandboxes) and HTTP (aiohttp).

    DEALER ──GatewayRequest──► ROUTER ─► Gateway.dispatch ─► Reply ─► GatewayReply frames ─► DEALER
    HTTP client ─────────────► aiohttp ─► Gateway.dispatch ─► Reply ─► Response | StreamResponse

Invariants:
- A JSON reply is one GatewayReply (``more=False``). A streamed reply is a first frame with the
  status and headers and no body, one frame per SSE chunk as the core yields it, and a last
  empty frame with ``more=False`` (the relay forwards chunks as they arrive).
- A stream that fails midway (the engine died) ends with an SSE ``error`` event, then the last
  frame: the status was already sent.
- Each ZeroMQ request is served in its own task, so a slow engine call never blocks the socket.
  The ROUTER is libzmq's (pyzmq), driven from this loop (``door.Door``): libzmq parses the
  agents' bytes on its I/O thread, the loop takes whole messages.
- Every ZeroMQ request gets a reply, whatever it is: a frame that does not decode a 400, a
  request over its session's budget a 429, and an exception that escapes the core (a bug) a
  500 in the API's error shape, logged with its traceback; never silence until the deadline.
- The ZeroMQ door is the sandboxes' and it is budgeted (``GatewayConfig``: connections, bytes
  held, requests in flight per session; ``door`` for the connection budgets and the bounds): a
  connection counts against its peer process until a request on it carries a live session
  key, then against that session. The HTTP door serves the controller's own clients (inline
  agents, admin) and is bounded by aiohttp's body limit only (``max_body_bytes``; a body over it
  gets the API's own 413 JSON error, as on the ZeroMQ door). A session's lifetime budgets
  hold on both (``core``).
- A request whose connection goes (the agent died, or the door cut it) is cancelled, on either
  door: its engine calls are aborted at the engine (``core``), no answer is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator

import msgspec
from aiohttp import web

from areal.engine.client import EngineError
from areal.gateway.contract import Reply, RequestError
from areal.gateway.core import Gateway
from areal.gateway.door import Conn, Door, DoorLimits, Owner
from areal.gateway.routes import error_reply, openai_error, request_key, route, split_session_path
from areal.protocol import GatewayMessage, GatewayReply, GatewayRequest

log = logging.getLogger(__name__)
_JSON = {"content-type": "application/json"}


async def _guarded(stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The stream's chunks; a failure after the status was sent becomes a final SSE error event.
    Closing this closes the stream at once (its engine streams with it)."""
    try:
        async with contextlib.aclosing(stream):  # the front-ends' streams are async generators
            async for chunk in stream:
                yield chunk
    except (RequestError, EngineError) as e:
        payload = openai_error(getattr(e, "status", 502) or 502, str(e), "engine_error")
        yield b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"


async def reply_frames(gateway: Gateway, req: GatewayRequest) -> AsyncIterator[GatewayReply]:
    reply = await route(gateway, req)
    if reply.stream is None:
        yield json_frame(req, reply)
        return
    async for frame in stream_frames(req, reply):
        yield frame


def json_frame(req: GatewayRequest, reply: Reply) -> GatewayReply:
    """The one frame of a JSON reply (body encoded once, here)."""
    headers = {**_JSON, **reply.headers} if reply.headers else _JSON
    return GatewayReply(request_id=req.request_id, status=reply.status, headers=headers, body=msgspec.json.encode(reply.body))


async def stream_frames(req: GatewayRequest, reply: Reply) -> AsyncIterator[GatewayReply]:
    """A streamed reply: a head frame (status, headers), one frame per SSE chunk, an empty last frame."""
    assert reply.stream is not None
    yield GatewayReply(request_id=req.request_id, status=reply.status, headers=reply.headers, body=b"", more=True)
    async for chunk in _guarded(reply.stream):
        yield GatewayReply(request_id=req.request_id, status=reply.status, headers={}, body=chunk, more=True)
    yield GatewayReply(request_id=req.request_id, status=reply.status, headers={}, body=b"", more=False)


_decoder = msgspec.msgpack.Decoder(GatewayMessage)
_encoder = msgspec.msgpack.Encoder()


async def serve_zmq(gateway: Gateway, address: str, ready: asyncio.Event | None = None) -> None:
    """Serve GatewayRequests on a ZeroMQ ROUTER (``door.Door``: libzmq's, budgeted) until cancelled.

    Each request is answered in its own task, on the connection it came from. A frame that is
    not a GatewayRequest gets a 400 frame (request_id -1); a message of several frames is not
    ours and is ignored, as before. A frame may be up to ``GatewayConfig.zmq_frame_bytes`` (twice
    ``max_body_bytes`` + 1 MiB) so that an oversized body still reaches the core and gets its
    413; past that libzmq drops the connection at the frame's header.

    The first request on a connection that carries a live session key charges the connection to
    that session (``Door.claim``); a session at ``max_connections_per_session`` gets a 429 and
    the connection is closed. A request is answered 429 at once when its owner already has
    ``max_inflight_per_session`` requests being served, or when its bytes would take its owner
    past ``max_buffered_bytes_per_session`` (or the door past ``max_buffered_bytes``): bytes of
    requests being served (libzmq does not expose those of partial frames; ``door`` bounds them).
    """
    config = gateway.config
    server = _ZmqServer(gateway)
    limits = DoorLimits(
        max_connections=config.max_connections,
        max_connections_per_session=config.max_connections_per_session,
        memory_budget=config.door_memory_bytes,
    )
    door = server.door = await Door.bind(
        address, server.on_message, max_frame=config.zmq_frame_bytes, limits=limits, on_closed=server.on_closed
    )
    gateway.doors.append(door)
    if ready is not None:
        ready.set()
    try:
        await server.loop.create_future()  # until cancelled
    finally:
        gateway.doors.remove(door)
        door.close()
        for t in server.tasks:
            t.cancel()


class _ZmqServer:
    """``serve_zmq``'s callbacks and what they share: the door, and the requests being answered."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.config = gateway.config
        self.loop = asyncio.get_running_loop()
        self.door: Door  # set by serve_zmq once bound, before any message arrives
        self.tasks: set[asyncio.Task] = set()
        self.serving: dict[Conn, set[asyncio.Task]] = {}  # the requests being answered, by the connection they came on

    async def answer(self, peer: Conn, req: GatewayRequest) -> None:
        try:
            reply = await route(self.gateway, req)
            if reply.stream is None:
                self.door.send(peer, _encoder.encode(json_frame(req, reply)))
                return
            async for frame in stream_frames(req, reply):
                self.door.send(peer, _encoder.encode(frame))
        except Exception:  # the process boundary: a bug in the core still gets the client an answer
            log.exception("gateway: request %d (%s %s) failed", req.request_id, req.method, split_session_path(req.path)[1])
            self.refuse(peer, req, 500, "internal error in the gateway (logged)", "internal_error")

    def refuse(self, peer: Conn, req: GatewayRequest, status: int, message: str, kind: str) -> None:
        body = msgspec.json.encode(error_reply(split_session_path(req.path)[1], status, message, kind).body)
        self.door.send(peer, _encoder.encode(GatewayReply(request_id=req.request_id, status=status, headers=_JSON, body=body)))

    def on_message(self, peer: Conn, frame: bytes) -> None:
        """One whole message from ``peer``: decoded, charged to its owner, answered in a task (or refused)."""
        try:
            req = _decoder.decode(frame)
        except (msgspec.DecodeError, RecursionError) as e:  # msgpack nested past ~1,000 levels: the latter
            body = msgspec.json.encode(openai_error(400, f"bad frame: {e}", "invalid_request_error"))
            self.door.send(peer, _encoder.encode(GatewayReply(request_id=-1, status=400, headers=_JSON, body=body)))
            return
        if not isinstance(req, GatewayRequest) or not self._claim(peer, req):
            return
        why = self._over_budget(peer.owner, len(frame))
        if why:
            self.door.report(peer.owner, "refused a request", why)
            self.refuse(peer, req, 429, why, "rate_limit_error")
            return
        self._start(peer, req, len(frame))

    def _claim(self, peer: Conn, req: GatewayRequest) -> bool:
        """Charge ``peer`` to the live session ``req``'s key names, if it is not yet a session's;
        False when that session holds all the connections it may (the request refused, the
        connection cut)."""
        if peer.owner.session:
            return True
        session = self.gateway.sessions.get(request_key(req))
        if session is None:
            return True
        full = self.door.claim(peer, ("session", session.key), f"session {session.episode_id!r}")
        if full is None:
            return True
        why = f"{full.name} already holds {full.connections} connections (gateway.max_connections_per_session)"
        self.refuse(peer, req, 429, why, "rate_limit_error")
        self.door.cut_off(peer, why, flush=True, against=full)
        return False

    def _over_budget(self, owner: Owner, size: int) -> str:
        """Why a request of ``size`` bytes would take ``owner`` (or the door) past its budgets; "" if it would not."""
        config, door = self.config, self.door
        if owner.inflight >= config.max_inflight_per_session:
            return (
                f"{owner.name} has {owner.inflight} requests being served, the limit "
                f"(gateway.max_inflight_per_session={config.max_inflight_per_session})"
            )
        if owner.held + size > config.max_buffered_bytes_per_session:
            return (
                f"{owner.name} holds {owner.held} bytes of requests; {size} more exceed "
                f"gateway.max_buffered_bytes_per_session={config.max_buffered_bytes_per_session}"
            )
        if door.inflight_bytes + size > config.max_buffered_bytes:
            return (
                f"the door holds {door.inflight_bytes} bytes of requests; {size} more exceed "
                f"gateway.max_buffered_bytes={config.max_buffered_bytes}"
            )
        return ""

    def _start(self, peer: Conn, req: GatewayRequest, size: int) -> None:
        """Answer ``req`` in a task, its owner and the door charged for it until the task ends."""
        owner, door = peer.owner, self.door
        owner.inflight += 1
        door.begin(peer)
        owner.inflight_bytes += size
        door.inflight_bytes += size
        task = self.loop.create_task(self.answer(peer, req))
        self.tasks.add(task)
        self.serving.setdefault(peer, set()).add(task)

        def done(task: asyncio.Task) -> None:
            self.tasks.discard(task)
            mine = self.serving.get(peer)
            if mine is not None:
                mine.discard(task)
                if not mine:
                    del self.serving[peer]
            owner.inflight -= 1
            door.finish(peer)
            owner.inflight_bytes -= size
            door.inflight_bytes -= size
            door.settle(owner)

        task.add_done_callback(done)

    def on_closed(self, peer: Conn) -> None:
        # nobody is left to read the answers: stop the work (and the engine's) of its requests
        for task in self.serving.pop(peer, ()):
            task.cancel()


async def serve_http(gateway: Gateway, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Start the HTTP front door; returns the runner (call ``cleanup()``) and its base URL."""
    counter = itertools.count()

    async def any_route(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:  # aiohttp's own answer is plain text: answer in the API's shape
            limit = gateway.config.max_body_bytes
            reply = error_reply(
                split_session_path(request.path)[1], 413, f"request body exceeds the limit of {limit} bytes", "request_too_large"
            )
            return web.Response(status=413, body=msgspec.json.encode(reply.body), headers=_JSON)
        req = GatewayRequest(
            request_id=next(counter),
            method=request.method,
            path=request.path_qs,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
        )
        try:
            reply = await route(gateway, req)
        except Exception:  # the process boundary: a bug in the core still gets an answer in the API's shape
            log.exception("gateway: HTTP request %s %s failed", req.method, split_session_path(req.path)[1])
            reply = error_reply(split_session_path(request.path)[1], 500, "internal error in the gateway (logged)", "internal_error")
        if reply.stream is None:
            return web.Response(status=reply.status, body=msgspec.json.encode(reply.body), headers={**_JSON, **reply.headers})
        resp = web.StreamResponse(status=reply.status, headers=reply.headers)
        await resp.prepare(request)
        async with contextlib.aclosing(_guarded(reply.stream)) as chunks:  # a client gone mid-write closes the engine streams
            async for chunk in chunks:
                await resp.write(chunk)
        await resp.write_eof()
        return resp

    app = web.Application(client_max_size=gateway.config.max_body_bytes + 1024)
    app.router.add_route("*", "/{tail:.*}", any_route)
    # handler_cancellation: a client that hangs up cancels its request, and with it the engine's work
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # aiohttp exposes no public accessor
    return runner, f"http://{host}:{bound}"


async def handle(gateway: Gateway, req: GatewayRequest) -> GatewayReply:
    """One ``GatewayReply`` with the whole body (a stream is collected): for callers that want one."""
    frames = [f async for f in reply_frames(gateway, req)]
    return msgspec.structs.replace(frames[0], body=b"".join(f.body for f in frames), more=False)
