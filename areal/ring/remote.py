"""The trajectory hop: encoded ``Trajectory`` records from a rollout worker on one node into the
shared-memory ring of a trainer rank on another, over ZeroMQ TCP, exactly once.

    rollout worker (CPU node)                           trainer node
    TrajectorySender                                    TrajectoryReceiver (its own thread)
      put(traj): encode, XXH3-64,   DEALER ──tcp──►  ROUTER ─► verify digest ─► journal line ─► RingWriter.put
      keep it until acked                                                                       │ published
      (window of unacked records)   ◄── HopAck(through) ───── after the ring holds it ◄─────────┘
                                                                       ring ─► RingReader (trainer rank)

API: ``TrajectorySender(addr).put(traj)`` (or ``put_bytes(encoded)``) returns the record's hop
sequence number; ``.flush(timeout_s)`` waits until the receiver acked everything; ``.close()``
flushes, then closes. ``TrajectoryReceiver(bind_addr, ring_writer, journal_path=...)`` binds at
once (``.address`` is the bound endpoint, port 0 resolved); ``.start()`` serves on a thread of its
own (``.run()`` serves on the caller's thread until ``.stop()``); ``.close()`` stops and closes the
socket. One receiver per ring (it is the ring's single writer); a sender per (worker, rank).
Messages: ``HopHello``, ``HopRecord`` + payload frame, ``HopAck``, ``HopRefused``
(``areal/protocol.py``); one typed decoder per socket.

Exactly once. Each record carries (sender id, seq, XXH3-64 of the payload); seqs of a sender run
0, 1, 2, ... The receiver keeps, per sender, the high-water mark ``hwm``: the newest seq published
in the ring. A record with ``seq == hwm + 1`` whose digest matches is written to the ring, then
acked (acks are cumulative, one per batch of received messages); ``seq <= hwm`` is a duplicate,
acked again and dropped; ``seq > hwm + 1`` (something before it was lost with an old connection)
is dropped unacked. A digest mismatch is answered with ``HopRefused`` and nothing is written; the
sender then raises ``TrajectoryRefused`` from its next call. The sender keeps every unacked
record; on each (re)connection (libzmq reconnects by itself; the socket monitor reports the
finished handshake) it sends ``HopHello(sender, next_unacked)``, which the receiver answers with
an ack of its ``hwm``, then resends everything unacked, in order. Records that reach a receiver
before that connection's Hello are dropped unacked (they come again after it). With no ack for
``resend_s`` while records are outstanding, it says Hello again (a lost message is not silent);
the wait doubles, up to a minute, while no ack comes (a full ring is the usual cause, and each
round queues a window of duplicates for the receiver to drop).
``ZMQ_IMMEDIATE`` keeps messages off connections that are not up, so a new connection never
carries stale queued records ahead of its Hello.

The journal (``journal_path``; one per ring) makes dedup survive a receiver restart. Before each
ring write it appends one line ``sender seq ring_seq`` (``ring_seq``: the ring's ``next_seq``,
which that write will get). On start it replays the file against the ring itself: the writer
handles one record at a time, so only the last line can be unfinished, and the ring decides it
(``RingWriter.attach`` recovers ``next_seq`` exactly): if ``ring_seq < next_seq`` the record is
in the ring, else it is not and that sender's hwm is the line before. The file is then rewritten
compacted (temp name, rename). The line is a plain ``write`` into the page cache: it survives a
killed process, not a lost machine (neither does ``/dev/shm``).

Back-pressure: while the ring is full the receiver retries ``put`` in 50 ms waits and reads
nothing more, so it acks nothing; libzmq's queues and TCP stop the sender, whose window
(``window`` unacked records) makes ``put`` wait, then raise ``HopTimeout``. Nothing is dropped.

Threads: each object's socket is used by one thread at a time. The sender does its socket work
inside ``put``/``flush``/``close`` (no thread of its own): an idle sender resends after a
reconnection at its next call. The receiver serves on one thread (``start``) or the caller's.

What is covered:
  * a receiver killed at any instant (SIGKILL) and restarted on the same address with the same
    journal: nothing acked is lost, nothing is written twice (``tests/integration/ring/test_ring_remote.py``);
  * connections that drop and come back (a link down past the heartbeat timeout): unacked
    records are resent;
  * a payload damaged between the sender's digest and the ring: refused, never written; so is a
    record over the ring's ``max_payload`` and a message that is not a hop message;
  * a full ring: the sender waits, then times out; a slow ring never loses records.
What is not covered:
  * a sender that dies: its unacked records die with it (the caller's in-flight episodes, to be
    re-admitted). Seqs restart at 0, so a restarted sender needs a new ``sender_id`` (the default
    is unique per object); reusing one makes its records count as duplicates;
  * no journal (``journal_path=None``): a restarted receiver learns a sender's hwm from its
    Hello, so a record written to the ring whose ack was lost in the crash is written again;
  * a lost machine on the trainer side: the ring and the journal live in memory and page cache;
  * a hop without ``keys``: in clear, and any process that reaches the port may send (with
    ``keys``, CURVE encrypts it and admits only senders holding the run's client key: areal/curve.py);
  * several receivers per ring, or several threads per sender.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable

import msgspec
import zmq
from zmq.utils.monitor import parse_monitor_message

from areal.curve import CurveKeys, connect_curve, serve_curve
from areal.protocol import HopAck, HopHello, HopInbound, HopOutbound, HopRecord, HopRefused, Trajectory, encode_trajectory
from areal.ring.buffer import RingError, RingFull, RingWriter
from areal.ring.layout import digest

log = logging.getLogger(__name__)

_SENDER_RE = re.compile(r"[A-Za-z0-9_.:-]{1,200}")  # one journal field: no whitespace
_BATCH = 256  # messages the receiver takes before it sends its acks
_POLL_S = 0.05  # longest sleep of a waiting side; stop() and deadlines are seen this often
_HEARTBEAT_MS, _HEARTBEAT_TIMEOUT_MS = 1000, 5000  # a peer silent for 5 s is gone (lost node, cut cable)
_COMPACT_LINES = 1 << 16  # journal lines before it is rewritten compacted


class TrajectoryRefused(RingError):
    """The receiver refused a record (checksum mismatch or a malformed message); nothing was written."""


class HopTimeout(RingError, TimeoutError):
    """The receiver did not ack in time: it is down, or its ring is full."""


def _tune(sock: zmq.Socket) -> None:
    for opt, value in (
        (zmq.HEARTBEAT_IVL, _HEARTBEAT_MS),
        (zmq.HEARTBEAT_TIMEOUT, _HEARTBEAT_TIMEOUT_MS),
        (zmq.RECONNECT_IVL, 100),
        (zmq.RECONNECT_IVL_MAX, 2000),
    ):
        sock.setsockopt(opt, value)


class TrajectorySender:
    """The rollout worker's end: one per (worker, trainer rank). Not thread-safe."""

    def __init__(
        self, addr: str, *, sender_id: str | None = None, window: int = 64, resend_s: float = 5.0, keys: CurveKeys | None = None
    ) -> None:
        self.sender_id = sender_id or f"{socket.gethostname()}-{os.getpid()}-{os.urandom(4).hex()}"
        if not _SENDER_RE.fullmatch(self.sender_id):
            raise ValueError(f"sender_id={self.sender_id!r} must match {_SENDER_RE.pattern}")
        if window < 1:
            raise ValueError(f"window={window} must be >= 1")
        self.addr, self.window, self.resend_s = addr, window, resend_s
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.DEALER)
        _tune(self._sock)
        self._sock.setsockopt(zmq.IMMEDIATE, 1)  # queue only on a finished connection: no stale records after a reconnect
        self._sock.setsockopt(zmq.LINGER, 0)  # close() decides what is lost, not libzmq
        self._sock.setsockopt(zmq.SNDHWM, 2 * window + 2)  # a resend on top of a full window still fits
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        if keys is not None:  # encrypted, and admitted only with the run's client key (areal/curve.py)
            connect_curve(self._sock, keys)
        self._sock.connect(addr)
        self._decoder = msgspec.msgpack.Decoder(HopOutbound)
        self._encode = msgspec.msgpack.Encoder().encode
        self._unacked: collections.deque[tuple[int, bytes, bytes]] = collections.deque()  # (seq, header, payload)
        self._next_seq = 0  # seq of the next put
        self._send_from = 0  # seq of the next record to hand to libzmq
        self._greet = False  # a Hello is due (a connection finished its handshake)
        self._progress = time.monotonic()  # last ack that moved, or last (re)send
        self._resend_after = resend_s  # doubles while no ack moves
        self._error: TrajectoryRefused | None = None
        self.reconnects = 0  # handshakes after the first
        self.resent = 0  # records sent more than once
        self._handshakes = 0

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    def put(self, traj: Trajectory, timeout_s: float | None = None) -> int:
        """Send one trajectory; waits up to ``timeout_s`` (None: forever) while the window is full."""
        return self.put_bytes(encode_trajectory(traj), timeout_s)

    def put_bytes(self, payload: bytes, timeout_s: float | None = None) -> int:
        """Send one encoded record; returns its seq. Raises ``HopTimeout`` (record not taken) when
        the window stays full for ``timeout_s``, ``TrajectoryRefused`` after a refusal."""
        self._pump()
        if len(self._unacked) >= self.window:
            self._wait(lambda: len(self._unacked) < self.window, timeout_s, "the window is full")
        if type(payload) is not bytes:  # kept until acked: it must not change under us
            payload = bytes(payload)
        if not self._unacked:
            self._progress = time.monotonic()  # the resend timer runs from the oldest outstanding record
        seq = self._next_seq
        self._unacked.append((seq, self._encode(HopRecord(self.sender_id, seq, digest(payload))), payload))
        self._next_seq = seq + 1
        self._pump()
        return seq

    def flush(self, timeout_s: float | None = 30.0) -> None:
        """Wait until the receiver acked every record put so far."""
        self._pump()
        self._wait(lambda: not self._unacked, timeout_s, "flush")

    def close(self, timeout_s: float | None = 30.0) -> None:
        """Flush (``timeout_s`` 0: do not wait), then close; unacked records are lost, and a flush
        that timed out raises after the socket is closed."""
        try:
            if timeout_s != 0 and self._error is None:
                self.flush(timeout_s)
        finally:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._sock.close(linger=0)
            self._ctx.term()

    def __enter__(self) -> TrajectorySender:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(timeout_s=None if exc_type is None else 0)

    def _wait(self, done: Callable[[], bool], timeout_s: float | None, what: str) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        poller = zmq.Poller()
        poller.register(self._monitor, zmq.POLLIN)
        while not done():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise HopTimeout(
                    f"trajectory hop to {self.addr}: {what} after {timeout_s}s, {len(self._unacked)} records unacked "
                    f"(window {self.window}); is the receiver up and its ring draining?"
                )
            want_out = self._greet or self._send_from < self._next_seq
            poller.register(self._sock, zmq.POLLIN | (zmq.POLLOUT if want_out else 0))
            slice_s = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - now))
            poller.poll(slice_s * 1000)
            self._pump()

    def _pump(self) -> None:
        """Take monitor events and acks, then hand libzmq what is due; never blocks."""
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._greet = True
                self.reconnects += self._handshakes > 0
                self._handshakes += 1
        while True:
            try:
                raw = self._sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            match self._decoder.decode(raw.buffer):
                case HopAck(through=through):
                    self._acked(through)
                case HopRefused(seq=seq, error=error):
                    self._error = TrajectoryRefused(f"trajectory hop to {self.addr}: record {seq} of {self.sender_id} refused: {error}")
        if self._error is not None:
            raise self._error
        if self._unacked and not self._greet and time.monotonic() - self._progress > self._resend_after:
            self._greet = True  # no ack for a while: say Hello again, resend all unacked
            self._progress = time.monotonic()
            self._resend_after = min(2 * self._resend_after, max(60.0, self.resend_s))
        if self._greet:
            oldest = self._unacked[0][0] if self._unacked else self._next_seq
            try:
                self._sock.send(self._encode(HopHello(self.sender_id, oldest)), zmq.NOBLOCK)
            except zmq.Again:  # no finished connection yet: retried at the next call
                return
            self._greet = False
            self.resent += self._send_from - oldest
            self._send_from = oldest
        unacked, send = self._unacked, self._sock.send_multipart
        while self._send_from < self._next_seq:
            _, header, payload = unacked[self._send_from - unacked[0][0]]
            try:
                send((header, payload), zmq.NOBLOCK, copy=len(payload) < zmq.COPY_THRESHOLD)
            except zmq.Again:  # libzmq's queue is full (receiver slow or away): later
                return
            self._send_from += 1

    def _acked(self, through: int) -> None:
        unacked = self._unacked
        moved = False
        while unacked and unacked[0][0] <= through:
            unacked.popleft()
            moved = True
        if moved:
            self._progress = time.monotonic()
            self._resend_after = self.resend_s
        if self._send_from <= through:
            self._send_from = through + 1


class _Journal:
    """Per sender, the newest seq published in the ring; an append-only file of
    ``sender seq ring_seq`` lines (``ring_seq`` -1: nothing written, the hwm came from a Hello)."""

    def __init__(self, path: str, ring_next_seq: int) -> None:
        self.path = path
        hwm: dict[str, int] = {}
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            text = ""
        lines = text.split("\n")[:-1]  # a torn last line (no newline) was never acted on
        before: int | None = None
        for n, line in enumerate(lines):
            sender, seq, ring_seq = line.split(" ")
            before = hwm.get(sender)
            hwm[sender] = int(seq)
            if int(ring_seq) >= ring_next_seq and (n < len(lines) - 1 or int(ring_seq) > ring_next_seq):
                raise RingError(
                    f"journal {path} line {n + 1} names ring seq {ring_seq}, but the ring's next seq is {ring_next_seq}: "
                    "a journal from another ring or run; remove it"
                )
        if lines:
            sender, seq, ring_seq = lines[-1].split(" ")
            if int(ring_seq) >= ring_next_seq:  # the last write did not land: the ring is the authority
                if before is None:
                    del hwm[sender]
                else:
                    hwm[sender] = before
        self.hwm = hwm
        self._fd = -1
        self._compact()

    def _compact(self) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.writelines(f"{s} {seq} -1\n" for s, seq in self.hwm.items())
        os.replace(tmp, self.path)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._lines = len(self.hwm)

    def append(self, sender: str, seq: int, ring_seq: int) -> None:
        """Log an intent; ``hwm`` (the receiver's own dict) moves only once the write landed."""
        if self._lines >= _COMPACT_LINES:
            self._compact()
        os.write(self._fd, f"{sender} {seq} {ring_seq}\n".encode())
        self._lines += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class TrajectoryReceiver:
    """The trainer node's end: writes each sender's records, in order and once, into ``ring_writer``."""

    def __init__(
        self,
        bind_addr: str,
        ring_writer: RingWriter,
        *,
        journal_path: str | None = None,
        max_frame: int = 1 << 30,
        keys: CurveKeys | None = None,
    ) -> None:
        self.ring = ring_writer
        self._journal = _Journal(journal_path, ring_writer.next_seq) if journal_path else None
        self.hwm: dict[str, int] = self._journal.hwm if self._journal else {}  # one dict: compaction writes what landed
        self._greeted: dict[bytes, str] = {}  # connection identity -> sender, once its Hello came
        self._decoder = msgspec.msgpack.Decoder(HopInbound)
        self._encode = msgspec.msgpack.Encoder().encode
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.ROUTER)
        _tune(self._sock)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_frame)
        self._auth = serve_curve(self._sock, keys) if keys is not None else None  # CURVE: only the run's senders
        self._sock.bind(bind_addr)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.written = self.duplicates = self.refused = self.dropped = 0
        self.full_waits = 0  # 50 ms waits on a full ring

    def start(self) -> TrajectoryReceiver:
        """Serve on a daemon thread of its own until ``stop``/``close``."""
        self._thread = threading.Thread(target=self.run, name=f"hop-receiver-{self.address}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """Stop serving (a record waiting for ring space stays unwritten and unacked), then close."""
        self.stop()
        if self._thread is not None:
            self._thread.join()
        self._sock.close(linger=200)  # the last acks
        if self._auth is not None:
            self._auth.stop()  # its ZAP socket, before the context ends
        self._ctx.term()
        if self._journal is not None:
            self._journal.close()

    def __enter__(self) -> TrajectoryReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self) -> None:
        """Serve until ``stop()``: receive, verify, write to the ring, ack."""
        sock, stop = self._sock, self._stop
        while not stop.is_set():
            if not sock.poll(_POLL_S * 1000, zmq.POLLIN):
                continue
            acks: dict[bytes, str] = {}
            for _ in range(_BATCH):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if not self._handle(frames, acks):
                    break  # stopped while waiting for ring space
            self._send_acks(acks)

    def _send_acks(self, acks: dict[bytes, str]) -> None:
        for identity, sender in acks.items():
            try:  # a peer that is gone or does not read: the next ack covers this one
                self._sock.send_multipart((identity, self._encode(HopAck(sender, self.hwm[sender]))), zmq.NOBLOCK)
            except zmq.Again:
                pass
        acks.clear()

    def _refuse(self, identity: bytes, sender: str, seq: int, error: str) -> None:
        self.refused += 1
        log.error("trajectory hop: refused record %s of %r: %s; nothing written", seq, sender, error)
        try:
            self._sock.send_multipart((identity, self._encode(HopRefused(sender, seq, error))), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _handle(self, frames: list[zmq.Frame], acks: dict[bytes, str]) -> bool:
        """One message; False when ``stop`` came while it waited for ring space."""
        identity = frames[0].bytes
        try:
            msg = self._decoder.decode(frames[1].buffer) if len(frames) >= 2 else None
        except msgspec.DecodeError as e:  # a bad peer gets an error reply, never a crash
            self._refuse(identity, "", -1, f"undecodable header: {e}")
            return True
        match msg:
            case HopHello(sender=sender, next_unacked=next_unacked):
                if not _SENDER_RE.fullmatch(sender):
                    self._refuse(identity, sender[:200], -1, f"sender id must match {_SENDER_RE.pattern}")
                    return True
                hwm = self.hwm.get(sender)
                if hwm is None or hwm < next_unacked - 1:
                    if hwm is not None:  # the sender saw acks this receiver has no record of
                        log.warning("trajectory hop: %r was acked through %d, the journal says %d", sender, next_unacked - 1, hwm)
                    if self._journal is not None:
                        self._journal.append(sender, next_unacked - 1, -1)
                    self.hwm[sender] = next_unacked - 1
                self._greeted[identity] = sender
                acks[identity] = sender
            case HopRecord(sender=sender, seq=seq, digest=expected):
                if self._greeted.get(identity) != sender:  # before this connection's Hello: resent after it
                    self.dropped += 1
                    return True
                if len(frames) != 3:
                    self._refuse(identity, sender, seq, f"{len(frames) - 1} frames, expected a header and a payload")
                    return True
                hwm = self.hwm[sender]
                if seq <= hwm:
                    self.duplicates += 1
                    acks[identity] = sender
                    return True
                if seq > hwm + 1:  # a gap: its predecessors come again after a Hello
                    self.dropped += 1
                    return True
                payload = frames[2].buffer
                got = digest(payload)
                if got != expected:
                    self._refuse(identity, sender, seq, f"checksum mismatch: XXH3-64 {got:#018x}, header says {expected:#018x}")
                    return True
                if payload.nbytes > self.ring.max_payload:  # checked before the journal: RingWriter.put would raise
                    self._refuse(
                        identity, sender, seq, f"{payload.nbytes} bytes: over the ring's {self.ring.max_payload}-byte record limit"
                    )
                    return True
                if not self._publish(sender, seq, payload, acks):
                    return False
                acks[identity] = sender
            case _:
                self._refuse(identity, "", -1, f"{len(frames)} frames: not a hop message")
        return True

    def _publish(self, sender: str, seq: int, payload: memoryview, acks: dict[bytes, str]) -> bool:
        if self._journal is not None:
            self._journal.append(sender, seq, self.ring.next_seq)  # before the write: see the module docstring
        while True:
            try:
                self.ring.put(payload, timeout_s=_POLL_S)
                break
            except RingFull:  # back-pressure: ack what is in, read nothing more
                self.full_waits += 1
                self._send_acks(acks)
                if self._stop.is_set():
                    return False
        self.hwm[sender] = seq
        self.written += 1
        return True
