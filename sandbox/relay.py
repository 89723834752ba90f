"""The agent's only way out: HTTP on its own loopback, or httpx directly, relayed over ZeroMQ.

    other HTTP ──HTTP/1.1─► Relay (127.0.0.1:PORT, own thread + event loop) ─┐
    agent httpx.AsyncClient(transport=ZmqTransport) ──────────────────────────┤ GatewayChannel
    agent's own async httpx client to 127.0.0.1:PORT (route_own_clients) ─────┤
    agent's own sync httpx client to 127.0.0.1:PORT ── SyncZmqTransport ──────┤ a _SyncChannel per thread
                                                                              ▼ DEALER, ipc://
                                                               gateway ROUTER (GatewayRequest ⇄
                                                               GatewayReply, msgpack, one frame)

A ``GatewayChannel`` owns one DEALER connection in one event loop and demultiplexes replies by
``request_id``; a reply with ``more=True`` is one chunk of a streamed body (the first carries
status and headers), sent on to the client as it arrives (chunked transfer encoding on HTTP).
The DEALER is a pyzmq socket; its monitor tells the channel when the handshake with the gateway
is done and when the connection is lost.

Invariants: the libzmq context and its sockets are made lazily, in the episode process after the
fork (never in the zygote: a libzmq context does not survive a fork); a socket is used only from
the loop that made it (a sync channel's: from the thread that made it); if the gateway goes away,
the requests waiting on it get a 502 at once and the next request connects a new socket
(libzmq's own reconnecting is not used: a request never waits on a connection that is not
there); the relay runs its own loop in a daemon thread, so agents whose HTTP is not httpx's
(aiohttp, urllib, subprocesses) still reach the gateway while their loop is blocked.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator

import httpx
import httpx2
import msgspec
import zmq
import zmq.asyncio
from aiohttp import web
from zmq.utils.monitor import parse_monitor_message

from areal.protocol import BRANCH_ORDER_HEADER, GatewayReply, GatewayRequest
from sandbox import branch

# Connection-level headers belong to one HTTP hop, not to the relayed exchange.
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host", "proxy-connection", "content-length"})
MAX_BODY = 64 << 20
# Made at import, in the zygote: building a decoder resolves GatewayReply's annotations (~1 ms),
# which every episode would pay again. Decoding is safe from any thread.
_REPLY_DECODER = msgspec.msgpack.Decoder(GatewayReply)


class _Connection:
    """One DEALER socket and its monitor, read by two tasks of the loop that made them."""

    def __init__(self, channel: GatewayChannel) -> None:
        ctx = zmq.asyncio.Context.instance()  # per process (pyzmq makes a new one after a fork)
        self.sock = ctx.socket(zmq.DEALER)
        for option, value in (
            (zmq.LINGER, 0),
            (zmq.IMMEDIATE, 1),
            (zmq.RECONNECT_IVL, 10),
            (zmq.RCVHWM, 0),
            (zmq.MAXMSGSIZE, MAX_BODY + (1 << 20)),
        ):
            self.sock.setsockopt(option, value)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.sock.connect(channel.gateway_addr)
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = loop.create_future()  # the handshake with the gateway is done
        self.lost = False
        self.tasks = (loop.create_task(self._read(channel)), loop.create_task(self._watch(channel)))

    async def _read(self, channel: GatewayChannel) -> None:
        while True:
            channel._on_message(await self.sock.recv())

    async def _watch(self, channel: GatewayChannel) -> None:
        while True:
            event = parse_monitor_message(await self.monitor.recv_multipart())["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED and not self.ready.done():
                self.ready.set_result(None)
            elif event == zmq.EVENT_DISCONNECTED and self.ready.done():
                self.lost = True
                channel._on_lost()
                return

    def close(self) -> None:
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)


class GatewayChannel:
    """One DEALER connection to the gateway, usable from the event loop that first uses it; a
    second loop (a second ``asyncio.run``) gets a connection of its own."""

    def __init__(self, gateway_addr: str, connect_timeout_s: float = 10.0) -> None:
        self.gateway_addr = gateway_addr
        self.connect_timeout_s = connect_timeout_s  # how long a connect waits for the gateway to listen
        self._conn: _Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[int, asyncio.Queue[GatewayReply]] = {}
        self._ids = itertools.count(1)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = _REPLY_DECODER

    async def _connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._conn is None:
            self.close()  # first use, a new loop, or the last connection was lost: connect anew
            self._loop = loop
            self._conn = _Connection(self)
        conn = self._conn
        if not conn.ready.done():
            try:  # concurrent requests share one handshake
                await asyncio.wait_for(asyncio.shield(conn.ready), self.connect_timeout_s)
            except TimeoutError as e:
                if self._conn is conn:
                    self.close()  # the next request tries again
                raise ConnectionError(f"no handshake with {self.gateway_addr} within {self.connect_timeout_s} s") from e
        return conn

    def _on_message(self, frame: bytes) -> None:
        reply = self._decoder.decode(frame)
        queue = self._pending.get(reply.request_id)
        if queue is not None:  # replies to abandoned requests are dropped
            queue.put_nowait(reply)

    def _on_lost(self) -> None:
        """The gateway closed the connection: every request still waiting gets a 502 now (not a
        hang until the deadline); the next request connects again."""
        self.close()
        for request_id, queue in self._pending.items():
            queue.put_nowait(_unavailable(request_id, "the connection to the gateway was lost"))

    async def request(self, method: str, path: str, headers: dict[str, str], body: bytes) -> AsyncIterator[GatewayReply]:
        """Send one request; yields its replies, the last one with ``more=False`` (a 502 when the
        gateway cannot be reached or goes away meanwhile)."""
        request_id = next(self._ids)
        try:
            conn = await self._connection()
        except ConnectionError as e:
            yield _unavailable(request_id, f"the gateway cannot be reached: {e}")
            return
        queue: asyncio.Queue[GatewayReply] = asyncio.Queue()
        self._pending[request_id] = queue
        try:
            clean = {k.lower(): v for k, v in headers.items() if k.lower() not in HOP_HEADERS}
            if conn.lost:  # lost between the handshake and now
                yield _unavailable(request_id, "the connection to the gateway was lost")
                return
            try:
                await conn.sock.send(self._encoder.encode(GatewayRequest(request_id, method, path, clean, body)), zmq.NOBLOCK)
            except zmq.Again:  # the connection went between the handshake and now, or 1,000 requests wait on it
                yield _unavailable(request_id, "the connection to the gateway cannot take the request")
                return
            while True:
                reply = await queue.get()
                yield reply
                if not reply.more:
                    return
        finally:
            self._pending.pop(request_id, None)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn, self._loop = None, None


def _unavailable(request_id: int, message: str) -> GatewayReply:
    """The 502 a relayed request gets when there is no gateway to answer it (OpenAI's error shape)."""
    body = msgspec.json.encode({"error": {"message": message, "type": "gateway_unavailable"}})
    return GatewayReply(request_id=request_id, status=502, headers={"content-type": "application/json"}, body=body)


def _reply_headers(reply: GatewayReply) -> dict[str, str]:
    return {k: v for k, v in reply.headers.items() if k.lower() not in HOP_HEADERS}


class _ReplyStream(httpx.AsyncByteStream):
    def __init__(self, first: GatewayReply, rest: AsyncIterator[GatewayReply]) -> None:
        self._first, self._rest = first, rest

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._first.body:
            yield self._first.body
        if self._first.more:
            async for reply in self._rest:
                if reply.body:
                    yield reply.body

    async def aclose(self) -> None:
        await self._rest.aclose()  # type: ignore[attr-defined]


class ZmqTransport(httpx.AsyncBaseTransport):
    """httpx transport that sends each request straight to the gateway (no HTTP hop).

    Use as ``httpx.AsyncClient(transport=ZmqTransport(addr), base_url="http://gateway/v1")``;
    the host part of the URL is ignored, the path and query go to the gateway.
    """

    def __init__(self, gateway_addr: str) -> None:
        self.channel = GatewayChannel(gateway_addr)
        self.branch_refused = ""  # why the episode refused a branch order, sent with the call once more

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        path, headers = branch.outgoing(self, request.url.raw_path.decode("ascii"), dict(request.headers))
        replies = self.channel.request(request.method, path, headers, body)
        first = await anext(replies)
        if BRANCH_ORDER_HEADER in first.headers:  # the gateway holds this call: fork here
            await replies.aclose()
            return await branch.follow(self, request, first.body)
        return httpx.Response(first.status, headers=_reply_headers(first), stream=_ReplyStream(first, replies), request=request)

    async def aclose(self) -> None:
        self.channel.close()


class _SyncChannel:
    """One thread's DEALER connection to the gateway, for sync clients: a request at a time is
    sent and its replies read in the calling thread (a ZeroMQ socket is used from one thread).
    Replies to another open request of the thread (a stream not yet read) are kept for it."""

    def __init__(self, ctx: zmq.Context, gateway_addr: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        for option, value in ((zmq.LINGER, 0), (zmq.IMMEDIATE, 1), (zmq.RECONNECT_IVL, 10), (zmq.MAXMSGSIZE, MAX_BODY + (1 << 20))):
            self.sock.setsockopt(option, value)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.sock.connect(gateway_addr)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.thread, self.ready, self.lost, self.closed = threading.current_thread(), False, False, False
        self._open: dict[int, collections.deque[GatewayReply]] = {}
        self._ids = itertools.count(1)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = _REPLY_DECODER

    def _pump(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` for the socket or its monitor; take what came. False: nothing did."""
        events = dict(self.poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000))))
        if self.monitor in events:
            while True:
                try:
                    event = parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK))["event"]
                except zmq.Again:
                    break
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self.ready = True
                elif event == zmq.EVENT_DISCONNECTED and self.ready:
                    self.lost = True
        if self.sock in events:
            while True:
                try:
                    reply = self._decoder.decode(self.sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                queue = self._open.get(reply.request_id)
                if queue is not None:  # replies to abandoned requests are dropped
                    queue.append(reply)
        return bool(events)

    def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes, connect_s: float, read_s: float | None
    ) -> Iterator[GatewayReply]:
        """Send one request; yields its replies, the last with ``more=False`` (a 502 when the
        gateway cannot be reached or goes away meanwhile); TimeoutError after ``read_s`` without one."""
        request_id = next(self._ids)
        deadline = time.monotonic() + connect_s
        while not self.ready and not self.lost and time.monotonic() < deadline:
            self._pump(deadline - time.monotonic())
        if not self.ready or self.lost:
            self.lost = True  # the next request connects anew
            yield _unavailable(request_id, f"the gateway cannot be reached: no handshake with it within {connect_s} s")
            return
        queue = self._open[request_id] = collections.deque()
        try:
            clean = {k.lower(): v for k, v in headers.items() if k.lower() not in HOP_HEADERS}
            try:
                self.sock.send(self._encoder.encode(GatewayRequest(request_id, method, path, clean, body)), zmq.NOBLOCK)
            except zmq.Again:
                yield _unavailable(request_id, "the connection to the gateway cannot take the request")
                return
            while True:
                while not queue:
                    if self.lost:
                        queue.append(_unavailable(request_id, "the connection to the gateway was lost"))
                    elif not self._pump(read_s):
                        raise TimeoutError(f"no reply from the gateway within {read_s} s")
                reply = queue.popleft()
                yield reply
                if not reply.more:
                    return
        finally:
            self._open.pop(request_id, None)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.disable_monitor()
            self.monitor.close(0)
            self.sock.close(0)


class SyncZmqTransport(httpx.BaseTransport):
    """``ZmqTransport`` for sync clients (``httpx.Client``: the OpenAI SDK's ``OpenAI()``, LangChain's
    and CAMEL's sync calls): each request straight to the gateway over the calling thread's own
    connection, from a ZeroMQ context of its own, made on first use in each process. A call of
    the loop's thread can be a branch point (``branch.follow_sync``)."""

    def __init__(self, gateway_addr: str, connect_timeout_s: float = 10.0) -> None:
        self.gateway_addr, self.connect_timeout_s = gateway_addr, connect_timeout_s
        self.branch_refused = ""  # why the episode refused a branch order, sent with the call once more
        self._ctx: zmq.Context | None = None
        self._pid = 0
        self._channels: list[_SyncChannel] = []
        self._local = threading.local()
        self._lock = threading.Lock()

    def _channel(self) -> _SyncChannel:
        channel = getattr(self._local, "channel", None)
        if channel is not None and not channel.closed and self._pid == os.getpid():
            channel._pump(0)  # a connection lost since its last request is known now, not at the send
        if channel is None or channel.closed or channel.lost or self._pid != os.getpid():
            if channel is not None and not channel.closed and self._pid == os.getpid():
                channel.close()
            with self._lock:
                if self._ctx is None or self._pid != os.getpid():  # first use, or a forked process: a context of its own
                    self._ctx, self._pid, self._channels = zmq.Context(), os.getpid(), []
                self._channels = [c for c in self._channels if not c.closed]
                channel = self._local.channel = _SyncChannel(self._ctx, self.gateway_addr)
                self._channels.append(channel)
        return channel

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        path, headers = branch.outgoing(self, request.url.raw_path.decode("ascii"), dict(request.headers))
        read_s = request.extensions.get("timeout", {}).get("read")
        replies = self._channel().request(request.method, path, headers, body, self.connect_timeout_s, read_s)
        try:
            first = next(replies)
        except TimeoutError as e:
            raise httpx.ReadTimeout(str(e), request=request) from e
        if BRANCH_ORDER_HEADER in first.headers:  # the gateway holds this call: fork here
            replies.close()
            return branch.follow_sync(self, request, first.body)
        return httpx.Response(
            first.status, headers=_reply_headers(first), stream=_SyncReplyStream(first, replies, request), request=request
        )

    def close_channels(self) -> None:
        """Before a branch point (called on the loop's thread): close every connection of the
        process, the loop's async one too, and end this transport's context (no libzmq thread is
        forked); a connection of another live thread refuses it."""
        busy = [
            c.thread.name for c in self._channels if not c.closed and c.thread is not threading.current_thread() and c.thread.is_alive()
        ]
        if busy:
            raise branch.Refused(f"threads other than the main one hold connections to the gateway ({', '.join(busy[:5])})")
        loop_channel = _LOOP_TRANSPORTS.get(asyncio.get_running_loop())
        if loop_channel is not None:
            loop_channel.channel.close()  # its reader tasks end on the loop's next turn: in each branch
        for channel in self._channels:
            channel.close()
        if self._ctx is not None and self._pid == os.getpid():
            self._ctx.term()
        self._ctx, self._channels = None, []

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


class _SyncReplyStream(httpx.SyncByteStream):
    def __init__(self, first: GatewayReply, rest: Iterator[GatewayReply], request: httpx.Request) -> None:
        self._first, self._rest, self._request = first, rest, request

    def __iter__(self) -> Iterator[bytes]:
        if self._first.body:
            yield self._first.body
        if self._first.more:
            try:
                for reply in self._rest:
                    if reply.body:
                        yield reply.body
            except TimeoutError as e:
                raise httpx.ReadTimeout(str(e), request=self._request) from e

    def close(self) -> None:
        self._rest.close()  # type: ignore[attr-defined]


_LOOP_TRANSPORTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ZmqTransport] = weakref.WeakKeyDictionary()


def loop_transport(gateway_addr: str) -> ZmqTransport:
    """The running loop's one ZmqTransport to the gateway: the handed client's, and that of every
    client the agent builds itself (``route_own_clients``) in that loop. One per loop, because a
    channel's socket belongs to the loop that made it; one only, because a branch point forks
    with a single open socket (sandbox/branch.py) and a branch's key is the transport's to swap."""
    loop = asyncio.get_running_loop()
    transport = _LOOP_TRANSPORTS.get(loop)
    if transport is None:
        transport = _LOOP_TRANSPORTS[loop] = ZmqTransport(gateway_addr)
    return transport


def _to_relay(url: httpx.URL | httpx2.URL, port: int) -> bool:
    """Whether a request is for the episode's relay (``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``)."""
    return url.host == "127.0.0.1" and url.port == port


def route_own_clients(port: int, gateway_addr: str) -> None:
    """In the episode process, before the agent runs: an httpx client the agent builds itself
    (an SDK reading OPENAI_BASE_URL, LangChain's and CAMEL's OpenAI clients) sends its requests
    for the relay's address straight to the gateway instead of over TCP, as the handed client
    does: an async one over its loop's ZmqTransport, a sync one (``httpx.Client``) over the
    process's SyncZmqTransport; the same for httpx2's (anthropic's own clients). No HTTP hop,
    and the call can be a branch point. Requests elsewhere and other HTTP stacks (``exec:``
    programs, aiohttp, urllib) still go through the relay."""
    original = httpx.AsyncHTTPTransport.handle_async_request
    original_sync = httpx.HTTPTransport.handle_request
    sync = SyncZmqTransport(gateway_addr)

    async def handle_async_request(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        if not _to_relay(request.url, port):
            return await original(self, request)
        return await loop_transport(gateway_addr).handle_async_request(request)

    def handle_request(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        if not _to_relay(request.url, port):
            return original_sync(self, request)
        return sync.handle_request(request)

    httpx.AsyncHTTPTransport.handle_async_request = handle_async_request  # type: ignore[method-assign]
    httpx.HTTPTransport.handle_request = handle_request  # type: ignore[method-assign]
    _route_httpx2(port, gateway_addr, sync)


def _route_httpx2(port: int, gateway_addr: str, sync: SyncZmqTransport) -> None:
    """``route_own_clients`` for SDKs on httpx2, a fork of httpx (anthropic >= 2.11): their
    requests for the relay's address bridged onto the same transports (areal/agent/httpx2_bridge.py)."""
    from areal.agent.httpx2_bridge import Bridge, SyncBridge

    original = httpx2.AsyncHTTPTransport.handle_async_request
    original_sync = httpx2.HTTPTransport.handle_request
    bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Bridge] = weakref.WeakKeyDictionary()
    sync_bridge = SyncBridge(httpx.Client(transport=sync, timeout=None))

    async def handle_async_request(self: httpx2.AsyncHTTPTransport, request: httpx2.Request) -> httpx2.Response:
        if not _to_relay(request.url, port):
            return await original(self, request)
        loop = asyncio.get_running_loop()
        if loop not in bridges:
            bridges[loop] = Bridge(httpx.AsyncClient(transport=loop_transport(gateway_addr), timeout=None))
        return await bridges[loop].handle_async_request(request)

    def handle_request(self: httpx2.HTTPTransport, request: httpx2.Request) -> httpx2.Response:
        if not _to_relay(request.url, port):
            return original_sync(self, request)
        return sync_bridge.handle_request(request)

    httpx2.AsyncHTTPTransport.handle_async_request = handle_async_request  # type: ignore[method-assign]
    httpx2.HTTPTransport.handle_request = handle_request  # type: ignore[method-assign]


class Relay:
    """HTTP/1.1 server on 127.0.0.1:<free port> relaying every request to the gateway.

    The listening socket is bound in the caller's thread, so the port is known and connections
    queue in the backlog at once. The serving thread sets up aiohttp (an event loop, the app, a
    ZeroMQ context: milliseconds of CPU, and page copies of the zygote's memory) only when the
    first connection arrives, or at once with ``lazy=False``. Most Python agents never connect:
    they use the ``http_client`` handed to them, which goes straight to the gateway
    (``ZmqTransport``), so in a slot (``lazy=True``) the relay costs them one thread blocked in
    ``select``; agents that speak HTTP by other means than an async httpx client (sync clients,
    aiohttp, ``exec:`` programs: ``route_own_clients``) pay the set-up on their first request
    instead of ahead of it.
    """

    def __init__(self, gateway_addr: str) -> None:
        self.gateway_addr = gateway_addr
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(1024)
        self.port = self._sock.getsockname()[1]
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="sandbox-relay", daemon=True)
        self._lazy = False

    @classmethod
    def start(cls, gateway_addr: str, wait: bool = True, lazy: bool = False) -> Relay:
        """Start the relay thread; with ``wait``, return once it serves (else at once: requests
        wait in the listen backlog until it does). ``lazy``: the thread sets up the server when
        the first connection arrives (``wait`` is then ignored: nothing is set up to wait for)."""
        relay = cls(gateway_addr)
        relay._lazy = lazy
        relay._thread.start()
        if wait and not lazy:
            relay._started.wait()
            if relay._error is not None:
                raise RuntimeError(f"relay failed to start: {relay._error!r}") from relay._error
        return relay

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        if self._lazy:  # a pending connection makes the listening socket readable
            waiting = select.poll()  # not select.select: the fd may pass FD_SETSIZE
            waiting.register(self._sock, select.POLLIN)
            waiting.poll()
        loop = asyncio.new_event_loop()
        try:
            runner = loop.run_until_complete(self._listen())
        except BaseException as e:  # thread boundary: hand the failure to start(), and say it
            self._error = e
            self._started.set()
            self._sock.close()  # clients get "connection refused" rather than a hang
            raise
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())

    async def _listen(self) -> web.AppRunner:
        channel = GatewayChannel(self.gateway_addr)

        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            replies = channel.request(request.method, request.raw_path, dict(request.headers), body)
            try:
                first = await anext(replies)
                if not first.more:
                    return web.Response(status=first.status, headers=_reply_headers(first), body=first.body)
                response = web.StreamResponse(status=first.status, headers=_reply_headers(first))
                response.enable_chunked_encoding()
                await response.prepare(request)
                await response.write(first.body)
                async for reply in replies:
                    await response.write(reply.body)
                await response.write_eof()
                return response
            finally:
                await replies.aclose()  # forget the request id even if the client went away

        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, self._sock).start()
        return runner
