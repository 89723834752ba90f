"""Keep-alive HTTP/1.1 connections to one engine, on raw asyncio protocols: the transport of
``EngineClient``'s non-streamed requests.

    EngineClient._request ─► Pool.request ─► (wait for a free slot, FIFO) ─► Connection.send
                                 └─ one watchdog timer per pool: answers overdue by ``timeout_s`` fail

aiohttp's client spends most of its CPU per call on machinery a fixed JSON POST does not need
(cookies, middleware, header objects), and this client is on every gateway call; streams (SSE,
chunked) stay on aiohttp.

Invariants:
- A connection answers one request at a time; one whose answer was cut short (timed out, reset,
  cancelled) is closed, never reused.
- A request on a reused connection that the server had closed while idle (no byte of an answer
  received) is retried once on a fresh connection.
- ``on_send`` is called when a request is written: a request cancelled while it waited for a
  connection never reached the server.

Not covered: TLS (https URLs go over aiohttp), pipelining, trailers, HTTP/2.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 client connection; answers one request at a time.

    Parses a status line, headers, and a body framed by Content-Length or chunked encoding
    (what aiohttp's and uvicorn's servers send). ``Connection: close`` marks it not reusable.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future | None = None
        self.status = 0
        self.body_start = -1  # index in buf after the head, once parsed
        self.length = -1  # Content-Length; -1 chunked or unknown
        self.chunked = False
        self.reusable = True
        self.got_bytes = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost, self.reusable = True, False
        if self.waiter is None or self.waiter.done():
            return
        if exc is None and self.body_start >= 0 and not self.chunked and self.length < 0:
            self.waiter.set_result((self.status, bytes(self.buf[self.body_start :])))  # body ended by close
        else:
            self.waiter.set_exception(ConnectionResetError(f"engine closed the connection: {exc!r}"))

    def send(self, head: bytes, body: bytes) -> asyncio.Future:
        assert self.transport is not None and self.waiter is None
        self.buf.clear()
        self.status, self.body_start, self.length, self.chunked, self.got_bytes = 0, -1, -1, False, False
        self.waiter = self.loop.create_future()
        self.transport.write(head + body)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self.buf += data
        if self.body_start < 0 and not self._parse_head():
            return
        body = self._body()
        if body is not None and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((self.status, body))

    def _parse_head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = bytes(self.buf[:end]).split(b"\r\n")
        self.status = int(lines[0].split(b" ", 2)[1])
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                self.length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
            elif name == b"connection" and value.strip().lower() == b"close":
                self.reusable = False
        if self.status in (204, 304) or self.status < 200:
            self.length = 0
        self.body_start = end + 4
        return True

    def _body(self) -> bytes | None:
        """The whole body once it has arrived, else None."""
        start = self.body_start
        if self.chunked:
            out, pos = bytearray(), start
            while True:
                eol = self.buf.find(b"\r\n", pos)
                if eol < 0:
                    return None
                size = int(bytes(self.buf[pos:eol]).split(b";", 1)[0], 16)
                if size == 0:  # last chunk; no trailers are sent by the servers we talk to
                    return bytes(out) if self.buf.find(b"\r\n", eol + 2) >= 0 else None
                if len(self.buf) < eol + 2 + size + 2:
                    return None
                out += self.buf[eol + 2 : eol + 2 + size]
                pos = eol + 2 + size + 2
        if self.length >= 0:
            return bytes(self.buf[start : start + self.length]) if len(self.buf) >= start + self.length else None
        self.reusable = False  # no framing: the body ends when the server closes
        return None


class Pool:
    """Keep-alive HTTP/1.1 connections to one host, created on demand, bound to one loop.

    At most ``limit`` connections are open; further requests wait for one to come back (FIFO).
    Timeouts: one watchdog timer per pool, running only while answers are awaited, checks their
    deadlines every ``tick`` s (a timer per request cost a heap push and a cancel per call), so
    an answer times out between ``timeout_s`` and ``timeout_s + tick`` after its request was sent.
    """

    def __init__(self, host: str, port: int, headers: dict[str, str], timeout_s: float, limit: int = 256) -> None:
        self.loop = asyncio.get_running_loop()
        self.host, self.port, self.timeout_s, self.limit = host, port, timeout_s, limit
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._fixed = f"Host: {host}:{port}\r\nContent-Type: application/json\r\n{extra}".encode()
        self.idle: list[Connection] = []
        self.open = 0  # connections open, idle or busy
        self.waiting: collections.deque[asyncio.Future] = collections.deque()
        self.deadlines: dict[Connection, float] = {}  # connections awaiting an answer -> when it is overdue
        self.tick = min(1.0, timeout_s / 4)
        self._watchdog: asyncio.TimerHandle | None = None

    async def request(self, method: str, path: str, body: bytes, on_send: Callable[[], None] | None = None) -> tuple[int, bytes]:
        """One exchange; ``on_send`` is called when the request is written, after any wait for a
        connection (a request cancelled before that never reached the server)."""
        head = b"%s %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n" % (method.encode(), path.encode(), self._fixed, len(body))
        while self.open >= self.limit and not self.idle:
            waiter = self.loop.create_future()
            self.waiting.append(waiter)
            await waiter  # woken when a connection comes back or closes
        while self.idle:
            conn = self.idle.pop()
            if conn.lost:
                self.open -= 1
                continue
            try:
                return await self._exchange(conn, head, body, on_send)
            except ConnectionResetError:
                if conn.got_bytes:
                    raise
                # the server closed this idle connection before reading the request: retry fresh
        self.open += 1
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: Connection(self.loop), self.host, self.port), self.timeout_s
            )
        except BaseException:
            self._released()
            raise
        return await self._exchange(conn, head, body, on_send)

    def _released(self) -> None:
        """A connection closed: its slot may go to a waiting request."""
        self.open -= 1
        self._wake()

    def _wake(self) -> None:
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _exchange(self, conn: Connection, head: bytes, body: bytes, on_send: Callable[[], None] | None) -> tuple[int, bytes]:
        waiter = conn.send(head, body)
        if on_send is not None:
            on_send()
        self.deadlines[conn] = self.loop.time() + self.timeout_s
        if self._watchdog is None:
            self._watchdog = self.loop.call_later(self.tick, self._check_deadlines)
        try:
            answer = await waiter
        except BaseException:  # timed out, reset or cancelled mid-answer: the stream is unusable
            conn.reusable = False
            if conn.transport is not None:
                conn.transport.close()
            self._released()
            raise
        finally:
            del self.deadlines[conn]
            conn.waiter = None
        if conn.reusable:
            self.idle.append(conn)
            self._wake()
        else:
            if conn.transport is not None:
                conn.transport.close()
            self._released()
        return answer

    def _check_deadlines(self) -> None:
        now = self.loop.time()
        for conn, deadline in self.deadlines.items():
            if deadline <= now and conn.waiter is not None:
                _expire(conn.waiter)  # the exchange's own except/finally clean up, after this loop
        self._watchdog = self.loop.call_later(self.tick, self._check_deadlines) if self.deadlines else None

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        self.open -= len(self.idle)
        self.idle.clear()


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
