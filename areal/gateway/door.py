"""The gateway's ZeroMQ door: a libzmq ROUTER (pyzmq) on the gateway's event loop, budgeted so
that no sandboxed episode can take it for everyone.

    relay DEALER ─ipc://─► libzmq I/O thread (parses ZMTP) ─► ROUTER queue ─► Door._drain ─► on_message(conn, payload)
                                 └─ monitor (inproc PAIR): ACCEPTED fd, DISCONNECTED fd, HANDSHAKE_FAILED_*
                                      ─► Door._watch: owner by SO_PEERCRED, connection caps, cuts

libzmq reads the untrusted bytes (greeting, handshake, frames); this module never parses ZMTP.
It sees a connection twice: the monitor's ACCEPTED event carries its fd, and each message's
payload frame carries the fd it was read from (``zmq.SRCFD``), which ties the ROUTER's peer
identity to that connection at its first message. A connection is cut by ``shutdown(2)`` on a
duplicate of its fd (never ``close``, which would pull the fd from under libzmq): libzmq reads
end-of-file, closes it and reports DISCONNECTED.

Each connection is charged to an owner:

    accept ─► owner = the peer process (SO_PEERCRED pid over ipc://, the host over tcp://)
           └► first request carrying a live session key ─► Door.claim ─► owner = that session

Budgets (``DoorLimits``; the gateway's names, ``GatewayConfig``):
- a frame over ``max_frame`` bytes: libzmq drops the connection at the frame's header
  (``ZMQ_MAXMSGSIZE``), before buffering it;
- connections: an owner over ``max_connections_per_session`` has the new connection cut; at the
  door's ``max_connections`` (half the soft RLIMIT_NOFILE by default: libzmq spends one fd per
  connection) a new connection evicts the oldest one of another owner that never carried a
  session key (a healthy relay sends its request right after the handshake), else it is cut;
- time: a connection that has not finished the ZMTP handshake after ``handshake_s`` is closed
  by libzmq (``ZMQ_HANDSHAKE_IVL``), and so is one that completes no frame, not even the PONG
  to libzmq's PING, for ``heartbeat_s`` + ``heartbeat_timeout_s``: an idle raw socket holds an
  fd, and a partial frame holds memory, that long at most;
- requests: in flight per owner, and their bytes per owner and door-wide
  (``Owner.inflight``/``inflight_bytes``, kept and checked by ``server.serve_zmq``);
- replies: at most ``snd_hwm`` queued per connection (``ZMQ_SNDHWM``); a peer that does not read
  them past that is cut; a reply for a peer that has gone is dropped (``ZMQ_ROUTER_MANDATORY``
  reports both, instead of libzmq dropping silently).
Each cut is logged (WARNING, naming the owner and the limit; an owner's 1st, 2nd, 4th, 8th, ...
of each kind, so a flood of connections writes a few lines, not thousands).

Covered: fd exhaustion by idle connections from one process or many (per-owner and door-wide
caps, and the handshake timeout), oversized frames, partial frames left to hold memory (bounded
per connection by ``max_frame`` and in time by the heartbeat), peers that never read.
Not covered:
- one never-ending multipart message: libzmq checks ``ZMQ_MAXMSGSIZE`` per frame and keeps the
  frames of an unfinished message in the connection's queue, out of the application's sight;
  high-water marks count whole messages and every frame resets the heartbeat. A peer streaming
  small frames flagged MORE grows the gateway's memory at the speed it writes until the episode
  ends (its deadline closes the connection). libzmq 4.3 has no option for it.
- bytes held in partial frames are not counted against ``max_buffered_bytes*``: libzmq does not
  expose them. They are bounded by connections x ``max_frame`` for the heartbeat's time.
- the window between libzmq's accept and the loop's cut: libzmq accepts on its own thread, so an
  owner may hold more than its cap for as long as the loop takes to read the ACCEPTED events;
  the door-wide cap leaves half the nofile limit for that slack and for the rest of the process.
- an owner's fair share of the loop's CPU (the gateway bounds request work itself).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import struct
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger(__name__)

_EVENTS = (zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_FLUSH_S = 0.2  # a connection cut after its error reply: time for libzmq to write that reply first
_BATCH = 256  # messages taken per turn of the loop before yielding to other callbacks


@dataclass(frozen=True)
class DoorLimits:
    """What the door lets its peers hold (module docstring, "Budgets"). A "session" here is a
    connection's owner: its peer process until the application ``claim``s the connection."""

    max_connections: int = 0  # open connections in all; 0: half the process's soft RLIMIT_NOFILE
    max_connections_per_session: int = 64
    handshake_s: float = 5.0  # a connection must finish the ZMTP handshake within this
    heartbeat_s: float = 1.0  # libzmq PINGs every peer this often ...
    heartbeat_timeout_s: float = 5.0  # ... and closes one from which no frame came for this long
    snd_hwm: int = 4096  # replies queued per connection; a peer that lets more pile up is cut
    rcv_hwm: int = 1024  # complete requests queued per connection before libzmq stops reading it
    backlog: int = 1024  # connections waiting in the kernel for libzmq to accept them

    def __post_init__(self) -> None:
        if self.max_connections < 0:
            raise ValueError(f"max_connections must be >= 0 (0: from RLIMIT_NOFILE), got {self.max_connections}")
        for name in ("max_connections_per_session", "handshake_s", "heartbeat_s", "heartbeat_timeout_s", "snd_hwm",
                     "rcv_hwm", "backlog"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

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

    __slots__ = ("connections", "inflight", "inflight_bytes", "key", "name", "refused", "session")

    def __init__(self, key: Hashable, name: str, session: bool) -> None:
        self.key, self.name, self.session = key, name, session
        self.connections = 0
        self.inflight = 0  # requests being served
        self.inflight_bytes = 0  # their frames' bytes
        self.refused: dict[str, int] = {}  # cuts and refusals by kind, for the log's 1st, 2nd, 4th, ...

    @property
    def held(self) -> int:
        return self.inflight_bytes


class Conn:
    """One accepted connection: its fd and socket inode (to tell a reused fd number from it), the
    ROUTER identity of its peer (from its first message), and its owner."""

    __slots__ = ("cut", "delivered", "fd", "identity", "ino", "owner")

    def __init__(self, fd: int, ino: int, owner: Owner) -> None:
        self.fd, self.ino, self.owner = fd, ino, owner
        self.identity: bytes | None = None
        self.cut = False  # cut by the door: uncounted already, its messages are not served
        self.delivered = False  # a message came from it


def _peer_identity(fd: int) -> tuple[Hashable, str]:
    """(owner key, name for the log) of the process at the other end of ``fd``: its pid from
    SO_PEERCRED over a Unix socket (the host's pid even for a peer in its own PID namespace), its
    host over TCP. Where neither is known, the connection is its own owner."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        if sock.family == socket.AF_UNIX and hasattr(socket, "SO_PEERCRED"):
            pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if pid > 0:
                return ("pid", pid), f"pid {pid} (uid {uid})"
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            host = sock.getpeername()[0]
            return ("host", host), f"host {host}"
    return ("connection", fd), f"connection on fd {fd}"


class Door:
    """A ROUTER bound to ``address``; ``on_message(conn, payload)`` is called on the loop for every
    one-frame message and answers with ``door.send(conn, payload)``. ``await Door.bind(...)``,
    then ``close()``."""

    def __init__(self, address: str, on_message: Callable[[Conn, bytes], None], max_frame: int,
                 limits: DoorLimits | None = None) -> None:
        self.address = address
        self.on_message = on_message
        self.max_frame = max_frame
        self.limits = limits or DoorLimits()
        self.cap = self.limits.connection_cap()
        self.peers: dict[int, Conn] = {}  # by fd, insertion order = age: eviction takes the oldest
        self.by_identity: dict[bytes, Conn] = {}
        self.owners: dict[Hashable, Owner] = {}
        self.open = 0  # connections not cut
        self.inflight_bytes = 0  # bytes of the requests being served (kept by the application)
        self.refused = 0  # connections libzmq dropped for breaking the protocol
        self.cut = 0  # connections the door cut for going over a budget
        self._failure: str | None = None  # a handshake failure, reported with the DISCONNECTED after it
        self._scheduled = False
        self._loop = asyncio.get_running_loop()
        self.ctx = zmq.Context(io_threads=1)  # the door's own I/O thread: no other socket waits behind it
        self.sock = self.ctx.socket(zmq.ROUTER)
        lim = self.limits
        for option, value in ((zmq.LINGER, 0), (zmq.MAXMSGSIZE, max_frame), (zmq.ROUTER_MANDATORY, 1),
                              (zmq.SNDHWM, lim.snd_hwm), (zmq.RCVHWM, lim.rcv_hwm), (zmq.BACKLOG, lim.backlog),
                              (zmq.HANDSHAKE_IVL, int(lim.handshake_s * 1000)),
                              (zmq.HEARTBEAT_IVL, int(lim.heartbeat_s * 1000)),
                              (zmq.HEARTBEAT_TIMEOUT, int(lim.heartbeat_timeout_s * 1000))):
            self.sock.setsockopt(option, value)
        monitor_addr = f"inproc://door-monitor-{id(self):x}"
        self.sock.monitor(monitor_addr, _EVENTS)
        self.monitor = self.ctx.socket(zmq.PAIR)
        self.monitor.setsockopt(zmq.RCVHWM, 0)  # never block libzmq's I/O thread on a lagging loop
        self.monitor.connect(monitor_addr)
        self.sock.bind(address)
        self._loop.add_reader(self.sock.getsockopt(zmq.FD), self._drain)
        self._loop.add_reader(self.monitor.getsockopt(zmq.FD), self._watch)
        # libzmq signals its fd only for a queue the reader has found empty: read both once now
        self._watch()
        self._drain()

    @classmethod
    async def bind(cls, address: str, on_message: Callable[[Conn, bytes], None], *, max_frame: int = 16 << 20,
                   limits: DoorLimits | None = None) -> Door:
        return cls(address, on_message, max_frame, limits)

    # ---- messages ---------------------------------------------------------------------------

    def _drain(self) -> None:
        """Take the queued messages (libzmq's fd is edge-triggered: read until EAGAIN)."""
        self._scheduled = False
        for _ in range(_BATCH):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) != 2:
                continue  # identity + one payload frame is a DEALER's request; anything else is not ours
            conn = self.by_identity.get(frames[0].bytes)
            if conn is None:
                conn = self._attach(frames[0].bytes, frames[1].get(zmq.SRCFD))
            if conn is None or conn.cut:
                continue  # gone, or cut: its requests are not served
            conn.delivered = True
            self.on_message(conn, frames[1].bytes)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def _attach(self, identity: bytes, fd: int) -> Conn | None:
        """The connection a new peer identity's first message came from (by its fd)."""
        conn = self.peers.get(fd)
        if conn is None:
            self._watch()  # its ACCEPTED event precedes its first message: take it now
            conn = self.peers.get(fd)
        if conn is None or conn.identity is not None:
            return None  # closed meanwhile (its fd reused, or not ours any more)
        conn.identity = identity
        self.by_identity[identity] = conn
        return conn

    def send(self, conn: Conn, payload: bytes) -> bool:
        """Queue one single-frame message to ``conn``; False (dropped) when it has gone or was cut."""
        if conn.cut or conn.identity is None:
            return False
        try:
            self.sock.send_multipart((conn.identity, payload), zmq.NOBLOCK, copy=len(payload) < zmq.COPY_THRESHOLD)
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                return False  # the peer has gone
            if e.errno != zmq.EAGAIN:
                raise
            self.cut_off(conn, f"it does not read its replies ({self.limits.snd_hwm} queued)")
            return False
        finally:
            if self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._schedule()  # a send can consume the edge that said requests are waiting
        return True

    # ---- connections ------------------------------------------------------------------------

    def _watch(self) -> None:
        """Apply the monitor's events, in order. An ACCEPTED whose DISCONNECTED is in the same
        batch is skipped: its fd number may already belong to a newer connection."""
        events = []
        while True:
            try:
                events.append(parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK)))
            except zmq.Again:
                break
        last_close = {e["value"]: i for i, e in enumerate(events) if e["event"] == zmq.EVENT_DISCONNECTED}
        for i, e in enumerate(events):
            kind, value = e["event"], e["value"]
            if kind == zmq.EVENT_ACCEPTED:
                if last_close.get(value, -1) < i:
                    self._accepted(value)
            elif kind == zmq.EVENT_DISCONNECTED:
                self._closed(value)
            else:  # a handshake failure: the DISCONNECTED of the same connection comes next
                self.refused += kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                self._failure = f"{zmq.Event(kind).name} ({value})"

    def _accepted(self, fd: int) -> None:
        try:
            ino = os.fstat(fd).st_ino
            key, name = _peer_identity(fd)
        except OSError:  # closed by libzmq between the event and now; its DISCONNECTED follows
            return
        owner = self._owner(key, name, False)
        conn = self.peers[fd] = Conn(fd, ino, owner)
        owner.connections += 1
        self.open += 1
        limit = self.limits.max_connections_per_session
        if owner.connections > limit:
            self.cut_off(conn, f"{owner.connections} open connections exceed max_connections_per_session={limit}")
        elif self.open > self.cap:
            victim = next((c for c in self.peers.values() if not c.cut and not c.owner.session and c.owner is not owner), None)
            if victim is None:
                self.cut_off(conn, f"all {self.cap} connections of the door are in use (max_connections)")
            else:
                self.cut_off(victim, f"evicted for a new connection: the door holds its {self.cap} connections "
                                     f"(max_connections) and this one never carried a session key")

    def _closed(self, fd: int) -> None:
        conn = self.peers.pop(fd, None)
        failure, self._failure = self._failure, None
        if conn is None:
            return
        if conn.identity is not None:
            self.by_identity.pop(conn.identity, None)
        if not conn.cut:
            if failure is not None:
                self.report(conn.owner, "closed by libzmq", f"the ZMTP handshake failed: {failure}")
            elif not conn.delivered:
                self.report(conn.owner, "closed by libzmq", "it sent no complete request (an unfinished handshake or "
                            "frame ran out of time, an oversized frame, or it hung up)")
            self._release(conn)

    def _owner(self, key: Hashable, name: str, session: bool) -> Owner:
        owner = self.owners.get(key)
        if owner is None:
            owner = self.owners[key] = Owner(key, name, session)
        return owner

    def _release(self, conn: Conn) -> None:
        conn.owner.connections -= 1
        self.open -= 1
        self.settle(conn.owner)

    def settle(self, owner: Owner) -> None:
        """Forget an owner that holds nothing any more (its refusal counts go with it)."""
        if owner.connections == 0 and owner.inflight == 0 and self.owners.get(owner.key) is owner:
            del self.owners[owner.key]

    def claim(self, conn: Conn, key: Hashable, name: str) -> Owner | None:
        """Charge ``conn`` to the session ``key`` from now on (its request carried that session's
        key; a claimed connection stays with its session). Returns that session's owner when it
        already holds its limit of connections, ``conn`` untouched: the caller queues an error
        reply and then ``cut_off(conn, ..., flush=True, against=owner)``."""
        old = conn.owner
        if old.session or conn.cut:
            return None
        new = self._owner(key, name, True)  # a refused claim leaves it non-empty: it is at its limit
        if new.connections >= self.limits.max_connections_per_session:
            return new
        old.connections -= 1
        new.connections += 1
        conn.owner = new
        self.settle(old)
        return None

    def report(self, owner: Owner, kind: str, detail: str) -> None:
        """Count a refusal of ``kind`` against ``owner`` and log it: the 1st, 2nd, 4th, 8th, ... one."""
        n = owner.refused[kind] = owner.refused.get(kind, 0) + 1
        if n & (n - 1) == 0:
            log.warning("zmq door %s: %s: %s: %s (%d so far)", self.address, owner.name, kind, detail, n)

    def cut_off(self, conn: Conn, reason: str, *, flush: bool = False, against: Owner | None = None) -> None:
        """Cut ``conn`` for going over a budget, logged against its owner (or ``against``: the
        session it tried to join); ``flush`` gives a queued error reply time to go out first."""
        if conn.cut:
            return
        self.cut += 1
        self.report(against or conn.owner, "cut off a connection", reason)
        conn.cut = True
        self._release(conn)
        if flush:
            self._loop.call_later(_FLUSH_S, self._shutdown, conn)
        else:
            self._shutdown(conn)

    def _shutdown(self, conn: Conn) -> None:
        """shutdown(2) on a duplicate of the fd, if it is still this connection's: libzmq then
        reads end-of-file, closes the fd and reports DISCONNECTED."""
        if self.peers.get(conn.fd) is not conn:
            return  # closed already
        try:
            if os.fstat(conn.fd).st_ino != conn.ino:
                return
            with socket.socket(fileno=os.dup(conn.fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed by libzmq meanwhile
            pass

    def close(self) -> None:
        self._loop.remove_reader(self.sock.getsockopt(zmq.FD))
        self._loop.remove_reader(self.monitor.getsockopt(zmq.FD))
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)  # libzmq removes the ipc:// socket file with it
        self.ctx.term()
