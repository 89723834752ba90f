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
  reports both, instead of libzmq dropping silently);
- memory: the process's growth past ``memory_budget`` (the memory guard, below).
Each cut is logged (WARNING, naming the owner and the limit; an owner's 1st, 2nd, 4th, 8th, ...
of each kind, so a flood of connections writes a few lines, not thousands).

The memory guard. libzmq checks ``ZMQ_MAXMSGSIZE`` per frame and keeps the frames of a message
it has not finished reading in the connection's pipe, out of the application's sight: the
high-water marks count whole messages, every frame resets the heartbeat, and libzmq 4.3 has no
option that bounds a message's frames. A peer streaming frames flagged MORE grows the process by
hundreds of MiB a second (64 bytes of pipe per 2-byte empty frame). libzmq reports no bytes per
connection either, so the guard watches the whole process and finds the holder by elimination,
from the one thing the door knows: a connection holding an unfinished message has completed no
message since that message began.

    every _GUARD_S:  anon = resident - shared pages (/proc/self/statm: shared-memory rings and
                     mapped files do not count); malloc_trim first when over, and for _SETTLE_S
                     after a cut (what libzmq frees stays in malloc's arenas until trimmed)
    anon <= reference + memory_budget ─► calm; reference = min(reference, anon)
    over, first step ─► cut every suspect with no request in flight
    over, grown by memory_budget/8 since the last step ─► the same, and the next 0, 1, 2, 4, ...
                     suspects with requests in flight, the longest silent first
    over, not growing ─► nothing: what is held stays bounded
    over, _SETTLE_S after the last cut, every connection older than the excess gone
                     ─► the excess is not the door's: reference = anon (logged)
    suspect: a connection that has completed no message (nor had its last answer) for _RECENT_S

``reference`` starts as anon when the door opens. An idle relay that is cut connects again at
its next request; a request in flight on a cut connection is lost (the relay answers 502).

Covered: fd exhaustion by idle connections from one process or many (per-owner and door-wide
caps, and the handshake timeout), oversized frames, partial frames left to hold memory (bounded
per connection by ``max_frame`` and in time by the heartbeat), peers that never read,
never-ending multipart messages on one connection or several, with requests in flight on them
or not, and one that stops growing while it holds what it sent (the memory guard).
Not covered:
- an exact bound: the guard holds the process to ``reference`` + ``memory_budget`` plus what
  the abusers add until a cut takes effect (a tick, the loop's delay, and, behind requests in
  flight, one step of budget/8 per doubling), not each connection to a share of it.
- innocent connections: elimination cuts them too. Idle ones at each step (they connect again),
  and, while an abuser hides behind a request in flight, as many served connections that were
  silent for longer as the doubling reaches before it (their requests fail). A request still
  being transmitted when its connection is cut is lost likewise.
- growth that is not the door's (the rest of the controller) past the budget gets the same cuts
  until every older connection is gone and the door takes the new level as its reference:
  ``memory_budget`` must stay above what the rest of the process may grow by.
- without glibc's ``malloc_trim`` (musl), memory libzmq freed counts as held until malloc
  reuses it: the guard stays over its budget meanwhile, so later growth is cut sooner.
- bytes held in partial frames are not counted against ``max_buffered_bytes*``: libzmq does not
  expose them. They are bounded by connections x ``max_frame`` for the heartbeat's time, and by
  the memory guard.
- the window between libzmq's accept and the loop's cut: libzmq accepts on its own thread, so an
  owner may hold more than its cap for as long as the loop takes to read the ACCEPTED events;
  the door-wide cap leaves half the nofile limit for that slack and for the rest of the process.
- an owner's fair share of the loop's CPU (the gateway bounds request work itself).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import resource
import socket
import struct
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger(__name__)

_EVENTS = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_FLUSH_S = 0.2  # a connection cut after its error reply: time for libzmq to write that reply first
_BATCH = 256  # messages taken per turn of the loop before yielding to other callbacks
_GUARD_S = 0.05  # the memory guard's period: an abuser adds at most its rate x this between two looks
_RECENT_S = 0.1  # a connection that completed a message this recently holds no unfinished one (yet)
_SETTLE_S = 1.0  # after the guard's last cut, time for libzmq to free what it held: trimmed, not re-baselined
_PAGE = os.sysconf("SC_PAGE_SIZE")
_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only


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
    memory_budget: int = 1 << 30  # growth of the process's anonymous memory before the guard cuts connections

    def __post_init__(self) -> None:
        if self.max_connections < 0:
            raise ValueError(f"max_connections must be >= 0 (0: from RLIMIT_NOFILE), got {self.max_connections}")
        for name in (
            "max_connections_per_session",
            "handshake_s",
            "heartbeat_s",
            "heartbeat_timeout_s",
            "snd_hwm",
            "rcv_hwm",
            "backlog",
            "memory_budget",
        ):
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


def _newer(a: bytes, b: bytes) -> bool:
    """Whether routing id ``a`` was given after ``b``: libzmq's own ids (a zero byte, then a
    big-endian counter) are numbered in order; ids a peer chose itself are not compared."""
    if len(a) == len(b) == 5 and a[0] == b[0] == 0:
        return int.from_bytes(a[1:], "big") > int.from_bytes(b[1:], "big")
    return False


class Conn:
    """One accepted connection: its fd and socket inode (to tell a reused fd number from it), the
    ROUTER identity of its peer (from its first message), and its owner. ``inflight``: its
    requests being served (``Door.begin``/``finish``, called by the application)."""

    __slots__ = ("born", "cut", "delivered", "fd", "identity", "inflight", "ino", "last", "owner")

    def __init__(self, fd: int, ino: int, owner: Owner) -> None:
        self.fd, self.ino, self.owner = fd, ino, owner
        self.identity: bytes | None = None
        self.cut = False  # cut by the door: uncounted already, its messages are not served
        self.delivered = False  # a message came from it
        self.inflight = 0
        self.born = self.last = time.monotonic()  # accepted; when it last completed a message or had its last answer


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
    one-frame message and answers with ``door.send(conn, payload)``; ``on_closed(conn)`` once a
    connection is gone (closed by its peer or libzmq, or cut), so that the application stops the
    work its requests started. ``await Door.bind(...)``, then ``close()``."""

    def __init__(
        self,
        address: str,
        on_message: Callable[[Conn, bytes], None],
        max_frame: int,
        limits: DoorLimits | None = None,
        on_closed: Callable[[Conn], None] | None = None,
    ) -> None:
        self.address = address
        self.on_message = on_message
        self.on_closed = on_closed
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
        self.memory_cuts = 0  # of which for the memory guard
        self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        self.reference = self.anon_bytes()  # the memory guard's zero (module docstring)
        self._mark = 0  # anon at the guard's last step (0: calm)
        self._round = 0  # connections with requests in flight cut at its next step: 0, 1, 2, 4, ...
        self._over_since = 0.0  # when it went over the budget
        self._last_cut = float("-inf")
        self._failure: str | None = None  # a handshake failure, reported with the DISCONNECTED after it
        self._scheduled = False
        self._loop = asyncio.get_running_loop()
        self.ctx = zmq.Context(io_threads=1)  # the door's own I/O thread: no other socket waits behind it
        self.sock = self.ctx.socket(zmq.ROUTER)
        lim = self.limits
        for option, value in (
            (zmq.LINGER, 0),
            (zmq.MAXMSGSIZE, max_frame),
            (zmq.ROUTER_MANDATORY, 1),
            (zmq.SNDHWM, lim.snd_hwm),
            (zmq.RCVHWM, lim.rcv_hwm),
            (zmq.BACKLOG, lim.backlog),
            (zmq.HANDSHAKE_IVL, int(lim.handshake_s * 1000)),
            (zmq.HEARTBEAT_IVL, int(lim.heartbeat_s * 1000)),
            (zmq.HEARTBEAT_TIMEOUT, int(lim.heartbeat_timeout_s * 1000)),
        ):
            self.sock.setsockopt(option, value)
        monitor_addr = f"inproc://door-monitor-{id(self):x}"
        self.sock.monitor(monitor_addr, _EVENTS)
        self.monitor = self.ctx.socket(zmq.PAIR)
        self.monitor.setsockopt(zmq.RCVHWM, 0)  # never block libzmq's I/O thread on a lagging loop
        self.monitor.connect(monitor_addr)
        self.sock.bind(address)
        self.address = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()  # tcp://host:0 becomes its port
        self._loop.add_reader(self.sock.getsockopt(zmq.FD), self._drain)
        self._loop.add_reader(self.monitor.getsockopt(zmq.FD), self._watch)
        self._guard_timer = self._loop.call_later(_GUARD_S, self._guard)
        # libzmq signals its fd only for a queue the reader has found empty: read both once now
        self._watch()
        self._drain()

    @classmethod
    async def bind(
        cls,
        address: str,
        on_message: Callable[[Conn, bytes], None],
        *,
        max_frame: int = 16 << 20,
        limits: DoorLimits | None = None,
        on_closed: Callable[[Conn], None] | None = None,
    ) -> Door:
        return cls(address, on_message, max_frame, limits, on_closed)

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
            conn.last = time.monotonic()
            self.on_message(conn, frames[1].bytes)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def _attach(self, identity: bytes, fd: int) -> Conn | None:
        """The connection a new peer identity's first message came from (by its fd).

        A message can outlive its connection in libzmq's queue, and its fd number then belongs
        to the next connection: a closed peer's last message may be read after the new peer's
        ACCEPTED, and be taken for the new peer's. libzmq numbers the peers it names in order
        (``_newer``), so an identity newer than the one a connection holds is that connection's
        real peer (the one it holds was a closed connection's), and an older one is a closed
        connection's (dropped: its replies have nowhere to go).

        The monitor's events are taken first, always: the new peer's ACCEPTED precedes its first
        message, and so does the DISCONNECTED of the connection that held its fd number before.
        Left queued, that DISCONNECTED would later close the connection this message was charged
        to, and stop its work (its request never answered)."""
        self._watch()
        conn = self.peers.get(fd)
        if conn is not None and conn.identity is not None and _newer(identity, conn.identity):
            self.by_identity.pop(conn.identity, None)
            conn.identity = None
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

    def begin(self, conn: Conn) -> None:
        """The application serves a request from ``conn`` (the memory guard suspects it last)."""
        conn.inflight += 1

    def finish(self, conn: Conn) -> None:
        """A request from ``conn`` has been answered. Once it has none left, its next request gets
        ``_RECENT_S`` to arrive before the memory guard counts it silent."""
        conn.inflight -= 1
        if not conn.inflight:
            conn.last = time.monotonic()

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
                self.cut_off(
                    victim,
                    f"evicted for a new connection: the door holds its {self.cap} connections "
                    f"(max_connections) and this one never carried a session key",
                )

    def _closed(self, fd: int) -> None:
        conn = self.peers.pop(fd, None)
        failure, self._failure = self._failure, None
        if conn is None:
            return
        if conn.identity is not None:
            self.by_identity.pop(conn.identity, None)
        if self.on_closed is not None:
            self.on_closed(conn)
        if not conn.cut:
            if failure is not None:
                self.report(conn.owner, "closed by libzmq", f"the ZMTP handshake failed: {failure}")
            elif not conn.delivered:
                self.report(
                    conn.owner,
                    "closed by libzmq",
                    "it sent no complete request (an unfinished handshake or frame ran out of time, an oversized frame, or it hung up)",
                )
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

    # ---- memory guard (module docstring) ---------------------------------------------------

    def anon_bytes(self) -> int:
        """The process's resident memory less its shared pages (mapped files, shared memory)."""
        _, resident, shared = os.pread(self._statm, 128, 0).split(maxsplit=3)[:3]
        return (int(resident) - int(shared)) * _PAGE

    def _guard(self) -> None:
        """One look of the memory guard, every ``_GUARD_S`` (the module docstring's diagram)."""
        self._guard_timer = self._loop.call_later(_GUARD_S, self._guard)
        budget = self.limits.memory_budget
        anon = self.anon_bytes()
        recent_cut = time.monotonic() - self._last_cut < _SETTLE_S
        if (anon > self.reference + budget or recent_cut) and _malloc_trim is not None:
            _malloc_trim(0)  # frames libzmq freed on a cut stay in malloc's arenas until trimmed
            anon = self.anon_bytes()
        if anon <= self.reference + budget:
            self.reference = min(self.reference, anon)
            self._mark, self._round = 0, 0
            return
        self._watch()  # connections closed meanwhile are not suspects, nor their fds' new owners
        now = time.monotonic()
        if not self._mark:
            self._over_since = now
        elif not recent_cut and not any(not c.cut and c.born < self._over_since for c in self.peers.values()):
            log.warning(
                "zmq door %s: the process holds %d MiB over the door's reference, and every connection it "
                "had when it went over memory_budget=%d MiB is gone: the memory is not the door's; the "
                "reference is now %d MiB",
                self.address,
                (anon - self.reference) >> 20,
                budget >> 20,
                anon >> 20,
            )
            self.reference, self._mark, self._round = anon, 0, 0
            return
        elif anon < self._mark + budget // 8:
            return  # not growing since the last step: what is held stays bounded; cut nothing more
        self._mark = anon
        held = f"the process holds {(anon - self.reference) >> 20} MiB over its reference, past memory_budget={budget >> 20} MiB"
        suspects = [c for c in self.peers.values() if not c.cut and now - c.last >= _RECENT_S]
        for conn in (c for c in suspects if not c.inflight):
            self._cut_for_memory(
                conn,
                f"{held}; cut as a connection with nothing being served that has completed "
                f"no message for {now - conn.last:.1f} s (an unfinished message holds memory)",
            )
        served = sorted((c for c in suspects if c.inflight), key=lambda c: c.last)
        for conn in served[: self._round]:
            self._cut_for_memory(
                conn,
                f"{held}, and growing; cut with its requests in flight, as the longest silent "
                f"connection: no message completed for {now - conn.last:.1f} s",
            )
        self._round = max(1, 2 * self._round)  # the first step cuts no request in flight

    def _cut_for_memory(self, conn: Conn, reason: str) -> None:
        self.memory_cuts += 1
        self._last_cut = time.monotonic()
        self.cut_off(conn, reason)

    def close(self) -> None:
        self._guard_timer.cancel()
        os.close(self._statm)
        self._loop.remove_reader(self.sock.getsockopt(zmq.FD))
        self._loop.remove_reader(self.monitor.getsockopt(zmq.FD))
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)  # libzmq removes the ipc:// socket file with it
        self.ctx.term()
