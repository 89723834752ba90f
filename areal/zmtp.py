"""ZeroMQ's wire protocol (ZMTP 3.0, NULL mechanism) for the agent ⇄ gateway hop, on asyncio.

The gateway's ROUTER and the sandbox relay's DEALER speak ZMTP themselves on the ipc:// (Unix
socket) or tcp:// stream instead of going through libzmq. Why: libzmq moves every message
through a background I/O thread on each side, so one request/reply crosses four threads; on a
2-vCPU KVM guest, where waking a thread on an idle vCPU costs ~20 µs, a libzmq DEALER → ROUTER
echo measured 120-170 µs p50 against ~40-60 µs for the same bytes over a bare socket
(``benchmarks/gateway.py`` measures both in the same run). Speaking the protocol on the event
loop's own socket removes those hand-offs. The wire format is ZeroMQ's: libzmq peers interoperate
(tests connect a pyzmq DEALER to this ROUTER, and this DEALER to a pyzmq ROUTER).

    connection := greeting greeting-reply handshake traffic
    greeting   := %xFF 8*%x00 %x7F  %x03 %x00  "NULL" 16*%x00  as-server(1)  31*%x00     (64 bytes)
    handshake  := command(READY, Socket-Type=DEALER|ROUTER [, Identity]) from each side
    traffic    := *(frame | command)
    frame      := flags(1) size(1 | 8, big-endian) body     flags: 1 MORE, 2 LONG, 4 COMMAND
    command    := frame with COMMAND set; body := name-len(1) name data

Past 600 lines on purpose: both ends of the hop (ROUTER, asyncio and blocking DEALERs), the one
parser they share and the door's budgets are one boundary, and each part is ~100-200 lines.

Scope: DEALER ⇄ ROUTER only (the one pattern the agent hop uses), NULL security (the hop stays
on one machine; sessions are authenticated by their API keys above it), PING answered with
PONG. A message is a list of frames; these peers send one-frame messages.

Invariants:
- Everything a peer sends is bounded before it is buffered: a frame over ``max_frame`` bytes, a
  message of more than ``MAX_PARTS`` frames, a bad greeting, a wrong socket type or traffic
  before the handshake is a ``ProtocolError`` and the connection is dropped at once (the other
  connections are untouched). Agents are untrusted: this parser is attack surface.
- A ROUTER answers on the connection a request came from; an answer for a peer that has gone is
  dropped, as libzmq's ROUTER does. A peer that does not read its answers is not read from
  either (its transport's high-water mark pauses reading), so it cannot grow the gateway's
  buffers without bound.

Budgets (``DoorLimits``): the ROUTER is the sandboxes' one way out and lives in the controller,
so no peer may take it for everyone. Each connection is charged to an owner:

    accept ─► owner = the peer process (SO_PEERCRED pid over ipc://, the host over tcp://)
           └► first request carrying a live session key ─► Router.claim ─► owner = that session

and each owner, and the door as a whole, has a budget of connections and of bytes held (partial
frames being received, plus the bodies of its requests being served, which the application adds
to ``Owner.inflight_bytes``). A connection over its owner's budget is closed; at the door's
connection cap a new connection evicts the oldest one that never carried a session key (a
healthy relay sends its request right after the handshake), else it is refused; over the door's
byte budget the largest buffer of the owner holding the most goes. Each cut is logged (WARNING,
naming the owner and the limit; an owner's 1st, 2nd, 4th, 8th, ... refusal of each kind, so a
flood of connections writes a few lines, not thousands).
Covered: fd exhaustion by idle connections, memory held in partial frames, by one process or by
many (the door-wide caps). Not covered: an owner's fair share of the loop's CPU (the gateway
bounds request work itself: in-flight requests per session, tokenisation off the loop).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import select
import socket
import stat
import struct
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

GREETING_SIZE = 64
_MECHANISM = b"NULL".ljust(20, b"\x00")
_FLAG_MORE, _FLAG_LONG, _FLAG_COMMAND = 1, 2, 4
MAX_PARTS = 16  # frames per message; ours send one


class ProtocolError(Exception):
    """The peer broke ZMTP (or this module's limits); its connection is closed."""


def greeting(as_server: bool) -> bytes:
    """Our 64-byte greeting: ZMTP 3.0, NULL mechanism."""
    return b"\xff" + bytes(8) + b"\x7f\x03\x00" + _MECHANISM + (b"\x01" if as_server else b"\x00") + bytes(31)


def frame_header(size: int, more: bool = False, command: bool = False) -> bytes:
    flags = (_FLAG_MORE if more else 0) | (_FLAG_COMMAND if command else 0)
    if size < 256:
        return bytes((flags, size))
    return bytes((flags | _FLAG_LONG,)) + size.to_bytes(8, "big")


def command(name: bytes, data: bytes = b"") -> bytes:
    body = bytes((len(name),)) + name + data
    return frame_header(len(body), command=True) + body


def ready(socket_type: bytes) -> bytes:
    """READY with the one property a peer must send: its socket type."""
    return command(b"READY", b"\x0bSocket-Type" + len(socket_type).to_bytes(4, "big") + socket_type)


def parse_properties(data: bytes) -> dict[str, bytes]:
    """READY's metadata: name-len(1) name value-len(4, big-endian) value, repeated. Names are
    case-insensitive (lower-cased here)."""
    props, i = {}, 0
    while i < len(data):
        n = data[i]
        if i + 1 + n + 4 > len(data):
            raise ProtocolError("READY metadata is truncated")
        name = data[i + 1 : i + 1 + n].decode("ascii", "replace").lower()
        j = i + 1 + n
        size = int.from_bytes(data[j : j + 4], "big")
        if j + 4 + size > len(data):
            raise ProtocolError(f"READY property {name!r} is truncated")
        props[name] = data[j + 4 : j + 4 + size]
        i = j + 4 + size
    return props


class Parser:
    """Incremental ZMTP reader for one connection: ``feed(bytes)`` returns the complete messages
    (each a list of frames) and leaves anything owed to the peer (PONG) in ``replies``."""

    __slots__ = ("buf", "greeted", "ready", "own_type", "peer_types", "max_frame", "parts", "replies", "peer_type")

    def __init__(self, own_type: bytes, peer_types: frozenset[bytes], max_frame: int) -> None:
        self.buf = bytearray()
        self.own_type = own_type  # sent in our READY
        self.greeted = False
        self.ready = False
        self.peer_types = peer_types  # socket types we accept as the other end
        self.peer_type = b""
        self.max_frame = max_frame
        self.parts: list[bytes] = []  # frames of a message whose last frame has not come
        self.replies: list[bytes] = []

    def _greeting(self) -> None:
        g = self.buf
        if g[0] != 0xFF or g[9] & 1 != 1:
            raise ProtocolError("not a ZMTP 3 greeting (bad signature)")
        if g[10] < 3:
            raise ProtocolError(f"ZMTP version {g[10]}.{g[11]} is not supported (3.x needed)")
        if bytes(g[12:32]) != _MECHANISM:
            raise ProtocolError(f"security mechanism {bytes(g[12:32]).rstrip(bytes(1))!r} is not supported (NULL only)")
        del g[:GREETING_SIZE]
        self.greeted = True
        # READY goes out only now: libzmq 4.3 drops a peer whose READY arrives in the same read
        # as its greeting (seen as PROTOCOL_ERROR_ZMTP_UNEXPECTED_COMMAND), so greet, wait, then READY.
        self.replies.append(ready(self.own_type))

    def _command(self, body: bytes) -> None:
        if not body or len(body) < 1 + body[0]:
            raise ProtocolError("empty or truncated command")
        name, data = body[1 : 1 + body[0]], body[1 + body[0] :]
        if name == b"READY":
            if self.ready:
                raise ProtocolError("a second READY")
            props = parse_properties(data)
            kind = props.get("socket-type", b"")
            if kind not in self.peer_types:
                raise ProtocolError(f"socket type {kind!r} cannot talk to this socket "
                                    f"(expected {b' or '.join(sorted(self.peer_types)).decode()})")
            self.peer_type, self.ready = kind, True
        elif name == b"ERROR":
            reason = data[1 : 1 + data[0]] if data else b""
            raise ProtocolError(f"peer reported an error: {reason.decode('ascii', 'replace')}")
        elif not self.ready:
            raise ProtocolError(f"command {name!r} before READY")
        elif name == b"PING":  # ttl(2) context(0-16): answer PONG with the context
            self.replies.append(command(b"PONG", data[2:18]))
        # anything else (PONG, SUBSCRIBE of other patterns) carries nothing for DEALER/ROUTER

    def feed(self, data: bytes) -> list[list[bytes]]:
        buf = self.buf
        buf += data
        if not self.greeted:
            if buf and buf[0] != 0xFF:
                raise ProtocolError("not a ZMTP 3 greeting (bad signature)")
            if len(buf) < GREETING_SIZE:
                return []
            self._greeting()
        out: list[list[bytes]] = []
        pos, n = 0, len(buf)
        while n - pos >= 2:
            flags = buf[pos]
            if flags & _FLAG_LONG:
                if n - pos < 9:
                    break
                size, head = int.from_bytes(buf[pos + 1 : pos + 9], "big"), 9
            else:
                size, head = buf[pos + 1], 2
            if flags > 7:
                raise ProtocolError(f"reserved frame flag bits set ({flags:#04x})")
            if size > self.max_frame:
                raise ProtocolError(f"frame of {size} bytes exceeds the limit of {self.max_frame}")
            end = pos + head + size
            if end > n:
                break
            body = bytes(buf[pos + head : end])
            pos = end
            if flags & _FLAG_COMMAND:
                if flags & _FLAG_MORE:
                    raise ProtocolError("a command frame cannot have MORE set")
                self._command(body)
                continue
            if not self.ready:
                raise ProtocolError("message before the READY handshake")
            self.parts.append(body)
            if len(self.parts) > MAX_PARTS:
                raise ProtocolError(f"message of more than {MAX_PARTS} frames")
            if not flags & _FLAG_MORE:
                out.append(self.parts)
                self.parts = []
        del buf[:pos]
        return out


# ---- addresses ------------------------------------------------------------------------------------


def _endpoint(address: str) -> tuple[str, Any]:
    """("unix", path) or ("tcp", (host, port)) for ``ipc://path`` (``@name``: abstract) or
    ``tcp://host:port``; anything else is a ValueError naming it."""
    if address.startswith("ipc://"):
        path = address[len("ipc://") :]
        if not path:
            raise ValueError(f"ZeroMQ address {address!r} has no path")
        return "unix", "\0" + path[1:] if path.startswith("@") else path
    if address.startswith("tcp://"):
        host, _, port = address[len("tcp://") :].rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"ZeroMQ address {address!r} must be tcp://host:port")
        return "tcp", (host.strip("[]"), int(port))
    raise ValueError(f"ZeroMQ address {address!r}: only ipc:// and tcp:// are served here")


# ---- ROUTER (the gateway's side) ----------------------------------------------------------------


@dataclass(frozen=True)
class DoorLimits:
    """What a ROUTER lets its peers hold (module docstring, "Budgets"). A "session" here is a
    connection's owner: its peer process until the application ``claim``s the connection for a
    session. The names are the gateway's config fields (``GatewayConfig``), which fill these."""

    max_connections: int = 0  # open connections in all; 0: half the process's soft RLIMIT_NOFILE
    max_connections_per_session: int = 64
    max_buffered_bytes: int = 256 << 20  # partial frames + bodies being served, all owners together
    max_buffered_bytes_per_session: int = 32 << 20

    def __post_init__(self) -> None:
        if self.max_connections < 0:
            raise ValueError(f"max_connections must be >= 0 (0: from RLIMIT_NOFILE), got {self.max_connections}")
        for name in ("max_connections_per_session", "max_buffered_bytes", "max_buffered_bytes_per_session"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_buffered_bytes < self.max_buffered_bytes_per_session:
            raise ValueError(f"max_buffered_bytes ({self.max_buffered_bytes}) must be at least "
                             f"max_buffered_bytes_per_session ({self.max_buffered_bytes_per_session})")

    def connection_cap(self) -> int:
        """``max_connections``, or half the soft RLIMIT_NOFILE: the other half stays for what the
        process needs besides this door (engine and HTTP connections, sandbox pipes, files)."""
        if self.max_connections:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return 1 << 16 if soft == resource.RLIM_INFINITY else max(8, soft // 2)


class Owner:
    """Who a connection's usage is charged to, with the counters its budgets are checked against.
    ``inflight`` and ``inflight_bytes`` are kept by the application for the requests it serves."""

    __slots__ = ("buffered", "connections", "inflight", "inflight_bytes", "key", "name", "refused", "session")

    def __init__(self, key: Hashable, name: str, session: bool) -> None:
        self.key, self.name, self.session = key, name, session
        self.connections = 0
        self.buffered = 0  # bytes in its connections' partial frames
        self.inflight = 0  # requests being served
        self.inflight_bytes = 0  # their frames' bytes
        self.refused: dict[str, int] = {}  # connections cut off / requests refused, by kind, for the log

    @property
    def held(self) -> int:
        return self.buffered + self.inflight_bytes


def _peer_identity(transport: asyncio.BaseTransport) -> tuple[Hashable, str]:
    """(owner key, name for the log) of the process at the other end: its pid from SO_PEERCRED
    over a Unix socket (the host's pid even for a peer in its own PID namespace), its host over
    TCP. Where neither is known, the connection is its own owner."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX and hasattr(socket, "SO_PEERCRED"):
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if pid > 0:
            return ("pid", pid), f"pid {pid} (uid {uid})"
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return ("host", peer[0]), f"host {peer[0]}"
    return ("connection", id(transport)), f"connection {id(transport):#x}"


class RouterPeer(asyncio.Protocol):
    """One connected DEALER. ``send(payload)`` writes a one-frame message to it."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.parser = Parser(b"ROUTER", frozenset((b"DEALER",)), router.max_frame)
        self.transport: asyncio.Transport | None = None
        self.owner: Owner = router.nobody
        self.held = 0  # bytes of partial frames in ``parser``, as charged to ``owner``

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.router.admit(self, transport):
            transport.write(greeting(as_server=True))  # type: ignore[attr-defined]  (READY follows the peer's greeting)

    def data_received(self, data: bytes) -> None:
        router = self.router
        try:
            messages = self.parser.feed(data)
        except ProtocolError as e:
            router.refused += 1
            log.warning("zmtp: dropping a connection of %s to %s: %s", self.owner.name, router.address, e)
            assert self.transport is not None
            self.transport.abort()
            router.forget(self)
            return
        parts = self.parser.parts
        held = len(self.parser.buf) + (sum(map(len, parts)) if parts else 0)
        if held != self.held:
            grown = held - self.held
            self.held = held
            self.owner.buffered += grown
            router.buffered += grown
            if grown > 0 and router.over_budget(self):
                return
        if self.parser.replies:
            assert self.transport is not None
            self.transport.write(b"".join(self.parser.replies))
            self.parser.replies.clear()
        for message in messages:
            if self.transport is None or self.transport.is_closing():
                break  # cut off by the answer to an earlier message of this read: the rest is not served
            router.on_message(self, message)

    def send(self, payload: bytes) -> bool:
        """Queue one single-frame message; False (dropped) when the peer has gone."""
        t = self.transport
        if t is None or t.is_closing():
            return False
        if len(payload) < 1 << 16:
            t.write(frame_header(len(payload)) + payload)
        else:  # no copy of a large body into a joined buffer
            t.writelines((frame_header(len(payload)), payload))
        return True

    # Back-pressure: a peer that does not read what it is sent is not read from either.
    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.router.forget(self)
        self.transport = None


class Router:
    """A ROUTER bound to ``address``; ``on_message(peer, frames)`` is called for every message, on
    the loop, and answers with ``peer.send(payload)``. ``await Router.bind(...)``, then ``close()``."""

    def __init__(self, address: str, on_message: Callable[[RouterPeer, list[bytes]], None], max_frame: int,
                 limits: DoorLimits | None = None) -> None:
        self.address = address
        self.on_message = on_message
        self.max_frame = max_frame
        self.limits = limits or DoorLimits()
        if self.limits.max_buffered_bytes_per_session < max_frame:
            raise ValueError(f"max_buffered_bytes_per_session ({self.limits.max_buffered_bytes_per_session}) must hold "
                             f"one largest frame ({max_frame} bytes), or the largest request could never arrive")
        self.cap = self.limits.connection_cap()
        self.peers: dict[RouterPeer, None] = {}  # insertion order = age: eviction takes the oldest
        self.owners: dict[Hashable, Owner] = {}
        self.nobody = Owner(("nobody",), "no one", False)  # a peer's owner before it is admitted
        self.buffered = 0  # bytes in all peers' partial frames
        self.inflight_bytes = 0  # bytes of the requests being served (kept by the application)
        self.refused = 0  # connections dropped for breaking the protocol
        self.cut = 0  # connections closed for going over a budget
        self._server: asyncio.AbstractServer | None = None
        self._path: str | None = None

    @classmethod
    async def bind(cls, address: str, on_message: Callable[[RouterPeer, list[bytes]], None], *,
                   max_frame: int = 16 << 20, limits: DoorLimits | None = None) -> Router:
        router = cls(address, on_message, max_frame, limits)
        kind, where = _endpoint(address)
        loop = asyncio.get_running_loop()
        if kind == "unix":
            router._server = await loop.create_unix_server(lambda: RouterPeer(router), where)
            router._path = where if not where.startswith("\0") else None
        else:
            router._server = await loop.create_server(lambda: RouterPeer(router), *where)
        return router

    # ---- budgets ------------------------------------------------------------------------------

    def _owner(self, key: Hashable, name: str, session: bool) -> Owner:
        owner = self.owners.get(key)
        if owner is None:
            owner = self.owners[key] = Owner(key, name, session)
        return owner

    def settle(self, owner: Owner) -> None:
        """Forget an owner that holds nothing any more (its refusal counts go with it)."""
        idle = owner.connections == 0 and owner.inflight == 0 and owner.buffered == 0 and owner.inflight_bytes == 0
        if idle and self.owners.get(owner.key) is owner:
            del self.owners[owner.key]

    def admit(self, peer: RouterPeer, transport: asyncio.BaseTransport) -> bool:
        """Charge a new connection to its peer process; False when it was cut off at once."""
        key, name = _peer_identity(transport)
        owner = peer.owner = self._owner(key, name, False)
        owner.connections += 1
        self.peers[peer] = None
        limit = self.limits.max_connections_per_session
        if owner.connections > limit:
            self.cut_off(peer, f"{owner.connections} open connections exceed max_connections_per_session={limit}")
            return False
        if len(self.peers) > self.cap:
            victim = next((p for p in self.peers if not p.owner.session and p.owner is not owner), None)
            if victim is None:
                self.cut_off(peer, f"all {self.cap} connections of the door are in use (max_connections)")
                return False
            self.cut_off(victim, f"evicted for a new connection: the door holds its {self.cap} connections "
                                 f"(max_connections) and this one never carried a session key")
        return True

    def claim(self, peer: RouterPeer, key: Hashable, name: str) -> Owner | None:
        """Charge ``peer`` to the session ``key`` from now on (its request carried that session's
        key; a claimed connection stays with its session). Returns that session's owner when it
        already holds its limit of connections, ``peer`` untouched: the caller queues an error
        reply and then ``cut_off(peer, ..., flush=True, against=owner)``."""
        old = peer.owner
        if old.session or peer not in self.peers:
            return None
        new = self._owner(key, name, True)  # a refused claim leaves it non-empty: it is at its limit
        if new.connections >= self.limits.max_connections_per_session:
            return new
        old.connections -= 1
        old.buffered -= peer.held
        new.connections += 1
        new.buffered += peer.held
        peer.owner = new
        self.settle(old)
        return None

    def over_budget(self, peer: RouterPeer) -> bool:
        """After ``peer``'s buffer grew: cut what is over its owner's or the door's byte budget;
        True when ``peer`` itself was cut."""
        owner, limits = peer.owner, self.limits
        if owner.held > limits.max_buffered_bytes_per_session:
            self.cut_off(peer, f"it holds {owner.held} bytes in partial frames and requests being served, over "
                               f"max_buffered_bytes_per_session={limits.max_buffered_bytes_per_session}")
            return True
        while self.buffered + self.inflight_bytes > limits.max_buffered_bytes and self.buffered > 0:
            # the largest buffer of the owner holding the most: whoever is filling the door
            top = max((p.owner for p in self.peers if p.held), key=lambda o: o.held)
            victim = max((p for p in self.peers if p.owner is top), key=lambda p: p.held)
            self.cut_off(victim, f"the door holds {self.buffered + self.inflight_bytes} bytes, over "
                                 f"max_buffered_bytes={limits.max_buffered_bytes}, and this owner holds the most "
                                 f"({top.held} bytes)")
            if victim is peer:
                return True
        return False

    def report(self, owner: Owner, kind: str, detail: str) -> None:
        """Count a refusal of ``kind`` against ``owner`` and log it: the 1st, 2nd, 4th, 8th, ... one."""
        n = owner.refused[kind] = owner.refused.get(kind, 0) + 1
        if n & (n - 1) == 0:
            log.warning("zmtp %s: %s: %s: %s (%d so far)", self.address, owner.name, kind, detail, n)

    def cut_off(self, peer: RouterPeer, reason: str, *, flush: bool = False, against: Owner | None = None) -> None:
        """Close ``peer`` for going over a budget, logged against its owner (or ``against``: the
        session it tried to join); ``flush`` lets what was queued to it (an error reply) go out first."""
        self.cut += 1
        self.report(against or peer.owner, "cut off a connection", reason)
        if peer.transport is not None:
            if flush:
                peer.transport.close()
            else:
                peer.transport.abort()
        self.forget(peer)

    def forget(self, peer: RouterPeer) -> None:
        """Release what ``peer`` was charged with (idempotent: a cut peer's connection_lost comes later)."""
        if peer not in self.peers:
            return
        del self.peers[peer]
        owner = peer.owner
        owner.connections -= 1
        owner.buffered -= peer.held
        self.buffered -= peer.held
        peer.held = 0
        self.settle(owner)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for peer in list(self.peers):
            if peer.transport is not None:
                peer.transport.abort()
        if self._path is not None:  # as libzmq does: the socket file goes with the socket
            try:
                if stat.S_ISSOCK(os.stat(self._path).st_mode):
                    os.unlink(self._path)
            except FileNotFoundError:
                pass


# ---- DEALER (the agent's side) -------------------------------------------------------------------


def _connect_socket(address: str, timeout_s: float) -> socket.socket:
    """A connected blocking stream socket; retries while the peer is not listening yet (libzmq
    connects lazily, so callers may start before the gateway binds)."""
    kind, where = _endpoint(address)
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket(socket.AF_UNIX if kind == "unix" else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.connect(where)
            if kind == "tcp":
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as e:
            sock.close()
            if e.errno not in (errno.ENOENT, errno.ECONNREFUSED) or time.monotonic() > deadline:
                raise ConnectionError(f"cannot connect to {address}: {e}") from e
        time.sleep(0.01)


class DealerProtocol(asyncio.Protocol):
    """The asyncio DEALER: ``on_message(frames)`` per message; ``send(payload)``."""

    def __init__(self, on_message: Callable[[list[bytes]], None], on_lost: Callable[[Exception | None], None],
                 max_frame: int) -> None:
        self.on_message, self.on_lost = on_message, on_lost
        self.parser = Parser(b"DEALER", frozenset((b"ROUTER",)), max_frame)
        self.transport: asyncio.Transport | None = None
        self.handshaken = asyncio.get_running_loop().create_future()  # done once both READYs passed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(greeting(as_server=False))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        try:
            messages = self.parser.feed(data)
        except ProtocolError as e:
            log.warning("zmtp: the gateway connection broke the protocol: %s", e)
            if not self.handshaken.done():
                self.handshaken.set_exception(ConnectionError(f"handshake with the gateway failed: {e}"))
            self.transport.abort()
            return
        if self.parser.replies:
            self.transport.write(b"".join(self.parser.replies))
            self.parser.replies.clear()
        if self.parser.ready and not self.handshaken.done():
            self.handshaken.set_result(None)
        for message in messages:
            self.on_message(message)

    def send(self, payload: bytes) -> None:
        t = self.transport
        if t is None or t.is_closing():
            raise ConnectionError("the connection to the gateway is closed")
        if len(payload) < 1 << 16:
            t.write(frame_header(len(payload)) + payload)
        else:
            t.writelines((frame_header(len(payload)), payload))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.handshaken.done():
            self.handshaken.set_exception(ConnectionError("the gateway closed the connection during the handshake"))
        self.on_lost(exc)


async def connect_dealer(address: str, on_message: Callable[[list[bytes]], None],
                         on_lost: Callable[[Exception | None], None], *, max_frame: int = 64 << 20,
                         timeout_s: float = 10.0) -> DealerProtocol:
    """An asyncio DEALER connected to ``address``, retrying for up to ``timeout_s`` while nothing
    listens there yet (libzmq connects lazily, so callers may start before the gateway binds)."""
    kind, where = _endpoint(address)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s

    def factory() -> DealerProtocol:
        return DealerProtocol(on_message, on_lost, max_frame)

    while True:
        try:
            if kind == "unix":
                _, protocol = await loop.create_unix_connection(factory, where)
            else:
                _, protocol = await loop.create_connection(factory, *where)  # asyncio sets TCP_NODELAY
            # nothing may be sent before both READYs have passed
            await asyncio.wait_for(protocol.handshaken, max(0.1, deadline - loop.time()))
            return protocol
        except (FileNotFoundError, ConnectionRefusedError) as e:
            if loop.time() > deadline:
                raise ConnectionError(f"cannot connect to {address}: {e}") from e
        await asyncio.sleep(0.01)


class Dealer:
    """A blocking DEALER (benchmarks, scripts): ``send(payload)``, ``recv() -> frames``.

    It waits for replies in ``poll()`` (POLLIN), then reads, as the relay's event loop does
    (epoll). A reader blocked in ``recv()`` on a Unix stream socket is woken whenever the peer
    reads what this side sent (the kernel's ``unix_write_space`` wakes the socket's whole wait
    queue for the freed send space), so each request cost a spurious wake-up, and the peer that
    read it paid for waking this process, on another vCPU an interprocessor interrupt; ``poll()``
    is woken for input only.
    """

    def __init__(self, address: str, *, max_frame: int = 64 << 20, timeout_s: float = 10.0) -> None:
        self.sock = _connect_socket(address, timeout_s)
        self.sock.sendall(greeting(as_server=False))
        self.parser = Parser(b"DEALER", frozenset((b"ROUTER",)), max_frame)
        self.pending: list[list[bytes]] = []
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)
        while not self.parser.ready:  # nothing may be sent before both READYs have passed
            self._read(timeout_s)

    def send(self, payload: bytes) -> None:
        self.sock.sendall(frame_header(len(payload)) + payload)

    def _read(self, timeout_s: float | None = None) -> None:
        if not self._poll.poll(None if timeout_s is None else timeout_s * 1000):
            raise TimeoutError(f"no answer from the peer within {timeout_s} s")
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the peer closed the connection")
        self.pending += self.parser.feed(data)
        if self.parser.replies:
            self.sock.sendall(b"".join(self.parser.replies))
            self.parser.replies.clear()

    def recv(self) -> list[bytes]:
        while not self.pending:
            self._read()
        return self.pending.pop(0)

    def close(self) -> None:
        self.sock.close()
