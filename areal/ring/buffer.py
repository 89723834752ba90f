"""Shared-memory trajectory ring: one producer (the controller), one consumer (a trainer rank).

API: ``RingWriter(ring_name(run_id, rank), capacity_bytes, native=None)`` creates a ring;
``.put_trajectory(traj)``, ``.put(bytes)`` or ``.put_parts(parts)`` appends a record and returns
its sequence number; ``RingWriter.attach(name)`` takes over after a writer crash. ``RingReader(name, resume=True,
auto_commit=...)`` reads with ``.get()`` (a copy) or ``.get_view()`` (zero-copy, valid until
committed) and releases space with ``.commit(seq)``. ``reclaim_stale("areal-")`` at start-up
removes the segments of crashed runs. The segment's byte layout, the record frame and its
checksum (XXH3-64 over frame and payload) are in ``areal.ring.layout``; this module holds the
two ends that share them (one module per boundary), the doorbell and the crash handling. (Past
600 lines on purpose: the hot paths are inlined, see Hot path, the writer keeps a pure-Python
twin of its C fast path, and splitting writer from reader would separate the two halves of one
protocol.)

The writer creates the segment under a temporary name, sizes it, pre-faults every page (a first
write into fresh shared memory takes a page fault, so the first lap would run far slower than
the later ones), writes the header
with the magic last, then links it to its final name, so a reader never sees a half-initialised
segment.

Record state machine (a byte range of data, seen from both sides)::

    FREE --writer: last_start, frame words 1-2, payload, digest--> WRITTEN  (beyond write_pos)
    WRITTEN --writer: write_pos += size, then next_seq--> PUBLISHED  (reader may read it)
    PUBLISHED --reader: verify digest + seq, hand out--> DELIVERED    (reader-private position)
    DELIVERED --reader: commit(seq): commit_pos = end--> FREE   (writer may overwrite it)
    A reader that dies moves DELIVERED back to PUBLISHED: a new reader starts at commit_pos.

Invariants: ``commit_pos <= read <= write_pos <= commit_pos + capacity``; every byte in
``[commit_pos, write_pos)`` belongs to a complete record whose digest matches and whose
sequence numbers are consecutive. Each side writes only its own words, so no locks are needed.
Stores happen in program order (frame, payload, digest, then the position word); on x86 (total
store order, aligned 8-byte stores atomic) the other side therefore never sees a position
before the bytes it covers. The C writer keeps that order against its compiler with a release
store of ``write_pos`` and a compiler barrier after ``last_start`` (``areal/ring/native/_ringcopy.c``,
``writer_publish``); CPython's memoryview stores are opaque calls, so the compiler cannot
reorder the Python path's.

Delivery is exactly once into training when the consumer commits only what a checkpoint holds:
``RingReader(name, auto_commit=False)`` hands out records, and the trainer calls
``reader.commit(seq)`` after the checkpoint of the optimizer step that used every record up to
``seq`` is durable. After a trainer crash, ``RingReader(name, resume=True)`` re-delivers
everything after the last commit. The default ``auto_commit=True`` commits each record as it
is handed out (at-least-once across reader crashes: a record copied but not yet committed
comes again).

Hot path (8k-token records of about 106 KB, at a target of over 100k records/s): each side caches the other side's
position word (``_seen_commit``, ``_seen_write``) and re-reads the shared word only when the
cached value no longer shows room or a record (positions only grow: a cached value is merely
behind, never wrong, and every decision that could block re-reads the authoritative word).
The writer's whole fast path is one C call (``areal.ring._ringcopy.Writer``): room check against
the cached commit position, wrap marker, frame words, the copy straight from the caller's
arrays with each 1 KiB block hashed from the registers it was copied through (so a copy that
went wrong is caught too), then the publish. ``put_trajectory`` also lets it emit the msgpack
framing (array and ``bin`` headers) around the Trajectory's buffers, from two small msgspec
encodings of the other fields. Python keeps the slow paths (waiting for room, the doorbell,
errors). Emitting the framing in C saves the Python-side framing of ``encode_trajectory_parts``
and one pass over the parts. Without the extension (``native=False``, or no C compiler at
install) the writer frames in Python (``encode_trajectory_parts``), copies with one
``mmap.write`` per part and hashes the record in place with ``xxhash``: slower, same bytes,
same digest. Frame words are loaded and stored through one u64 view of the whole mapping. The
reader hashes the record in place before handing out a view; most of ``get_view``'s cost is that
digest. Each payload byte is written once and read once per side.
Ring size matters as much as the code: in a ring that stays in the caches (a few MiB) the
writer copies into cached lines; in a 16-64 MiB ring each lap goes out to DRAM and the copy
costs several times as much (``benchmarks/ring.py`` measures both).

Waiting: a waiting side spins for 100 us, calling ``sched_yield`` between re-checks, then
sleeps 20 us doubling to 1 ms, re-reading the other side's word each time; every wait has a
timeout, and the shared words decide. The spin is timed, not counted, and long enough to bridge
the gap between two streamed records: a side that falls asleep between records makes its peer
ring the doorbell (a ``sendto`` system call) for every record, which costs the peer about as much
CPU as the record itself (a reader that spun a fixed count of re-checks did exactly that).
Yielding keeps the spin cheap for other work on a shared core (CPU time is charged only while
nothing else is runnable). A doorbell shortens the sleeps: before its first sleep a side binds
a datagram socket in the abstract Unix namespace (autobound: unique, no file to clean up),
stores its address in its ``bell`` word, sets its ``waiting`` word, re-checks, and sleeps in
``select`` on the socket. The peer loads ``waiting`` once per record and, if set, sends one
byte. A hint only: x86 may order the re-check before the flag store is visible ("set flag then
check" loses wake-ups), and a peer in another network namespace is unreachable; either costs
at most one sleep slice.

What is covered:
  * a writer killed at any instant (SIGKILL included): nothing it published is lost, nothing
    half-written is ever returned; ``RingWriter.attach`` resumes with consecutive sequence
    numbers (``next_seq`` is recovered from the frame at ``last_start`` when the writer died
    between publishing and bumping it);
  * a reader killed at any instant: a new ``RingReader`` resumes at ``commit_pos``; records
    delivered but not committed are delivered again, and the writer never overwrites them;
  * corruption of a published record or of the positions: ``RingCorrupted``, never bad data;
  * back-pressure: a full ring makes ``put`` wait, then raise ``RingFull``; nothing is dropped;
  * a record that can never fit (over half the capacity): ``RecordTooLarge`` at once;
  * stale segments of crashed runs: ``reclaim_stale`` removes those whose writer and reader
    are both dead.
What is not covered:
  * more than one writer or reader per ring (one ring per trainer rank; fan out above this);
  * weakly ordered CPUs (ARM): CPython gives no store-ordering guarantee across processes; the
    publish order relies on x86's total store order and aligned 8-byte stores being atomic;
  * a reader that is dead forever: the writer blocks in ``put`` and raises ``RingFull``;
  * zero-copy views (``get_view``) kept past their commit: they may then show newer records.
"""

from __future__ import annotations

import collections
import mmap
import os
import select
import socket
import time
from collections.abc import Callable, Sequence

from areal.protocol import TRAJECTORY_BULK, Trajectory, encode_trajectory_parts, split_trajectory
from areal.ring.layout import (
    DIGEST_FROM,
    FRAME,
    FRAME_OFF_DIGEST,
    FRAME_OFF_KIND,
    FRAME_OFF_LENGTH,
    FRAME_OFF_SEQ,
    HEADER_BYTES,
    KIND_RECORD,
    KIND_WRAP,
    LAYOUT_VERSION,
    MAGIC,
    MASK32,
    NATIVE,
    NO_RECORD,
    OFF_CAPACITY,
    OFF_COMMIT_POS,
    OFF_COMMIT_SEQ,
    OFF_LAST_START,
    OFF_MAGIC,
    OFF_NEXT_SEQ,
    OFF_READER_BELL,
    OFF_READER_PID,
    OFF_READER_WAITING,
    OFF_VERSION,
    OFF_WRITE_POS,
    OFF_WRITER_BELL,
    OFF_WRITER_PID,
    OFF_WRITER_START,
    OFF_WRITER_WAITING,
    SHM_DIR,
    SPIN_CHECKS,
    SPIN_S,
    ZEROS,
    RecordTooLarge,
    RingCorrupted,
    RingError,
    RingFull,
    alive,
    digest,
    pack_address,
    pause,
    proc_start,
    reclaim_stale,
    record_bytes,
    ring_name,
    segment_path,
    sleep_slice,
    unlink_ring,
    unpack_address,
)

# Re-exported: callers import the ring's whole surface from here.
__all__ = [
    "FRAME",
    "FRAME_OFF_DIGEST",
    "FRAME_OFF_KIND",
    "FRAME_OFF_LENGTH",
    "FRAME_OFF_SEQ",
    "HEADER_BYTES",
    "LAYOUT_VERSION",
    "OFF_NEXT_SEQ",
    "OFF_READER_BELL",
    "OFF_READER_WAITING",
    "OFF_WRITER_BELL",
    "OFF_WRITER_WAITING",
    "SHM_DIR",
    "RecordTooLarge",
    "RingCorrupted",
    "RingError",
    "RingFull",
    "RingReader",
    "RingWriter",
    "reclaim_stale",
    "record_bytes",
    "ring_name",
    "unlink_ring",
]

_FRAME_SIZE = FRAME.size
# u64 indices of the header words (the whole mapping is one u64 view).
_I_WRITE_POS, _I_NEXT_SEQ, _I_LAST_START = OFF_WRITE_POS >> 3, OFF_NEXT_SEQ >> 3, OFF_LAST_START >> 3
_I_COMMIT_POS, _I_COMMIT_SEQ = OFF_COMMIT_POS >> 3, OFF_COMMIT_SEQ >> 3
_I_WRITER_WAITING, _I_READER_WAITING = OFF_WRITER_WAITING >> 3, OFF_READER_WAITING >> 3


_BULK_FROM, _BULK_TO = TRAJECTORY_BULK
# areal.ring._ringcopy.Writer.put results that publish nothing (a sequence number is >= 0).
_PUT_NO_ROOM, _PUT_WRONG_NBYTES, _PUT_TOO_LARGE, _PUT_CORRUPTED = -1, -2, -3, -4


def _use_native(native: bool | None) -> bool:
    """Whether a writer runs its hot path in ``areal.ring._ringcopy`` (``native`` None: where it was
    built; True: required; False: the pure-Python path)."""
    if native is None:
        return NATIVE is not None
    if native and NATIVE is None:
        raise RingError("native=True but areal.ring._ringcopy is not built (run `pip install --no-deps -e .`)")
    return native


class _Segment:
    """A mapped ring segment: the header words and the data region, for either side."""

    def __init__(self, name: str, fd: int) -> None:
        self.name = name
        size = os.fstat(fd).st_size
        if size < HEADER_BYTES or size % 8:
            raise RingCorrupted(f"ring {name}: segment is {size} bytes, not a header plus whole words")
        self._mm = mmap.mmap(fd, size)
        self._buf = memoryview(self._mm)
        # Aligned 8-byte loads/stores through a 'Q' view are single machine instructions; one
        # view of the whole mapping serves the header words and the frame words alike.
        self._u64 = self._buf.cast("Q")
        self.capacity = size - HEADER_BYTES
        self._max_payload = min((self.capacity // 2) & ~7, 0xFFFFFFF8) - _FRAME_SIZE
        self._bell: socket.socket | None = None  # this side's doorbell, bound on first use
        self._bell_pid = 0  # the process that bound it (a forked child binds its own)
        self.wait_cpu_s = 0.0  # CPU seconds spent waiting (spinning included): busy = total - this
        self.bell_wakeups = 0  # sleeps ended by the peer's doorbell rather than by the time slice

    _bell_off = 0  # OFF_WRITER_BELL or OFF_READER_BELL: where this side publishes its doorbell
    _native = None  # the writer's areal.ring._ringcopy.Writer (it holds a view of the mapping)

    def _validate_header(self) -> None:
        if self._word(OFF_MAGIC) != MAGIC:
            raise RingCorrupted(f"ring {self.name}: bad magic {self._word(OFF_MAGIC):#x}")
        version = self._word(OFF_VERSION)
        if version != LAYOUT_VERSION:
            raise RingCorrupted(f"ring {self.name}: layout version {version}, expected {LAYOUT_VERSION}")
        if self._word(OFF_CAPACITY) != self.capacity:
            raise RingCorrupted(f"ring {self.name}: header capacity {self._word(OFF_CAPACITY)} != mapped {self.capacity}")

    def _word(self, offset: int) -> int:
        return self._u64[offset >> 3]

    def _set_word(self, offset: int, value: int) -> None:
        self._u64[offset >> 3] = value

    def _claim(self, pid_off: int, role: str) -> None:
        """Record this process as the ring's ``role``; refuse if another live process holds it."""
        pid, start = self._word(pid_off), self._word(pid_off + 8)
        if pid not in (0, os.getpid()) and alive(pid, start):
            raise RingError(f"ring {self.name} already has a live {role} (pid {pid}); one per ring")
        self._set_word(pid_off + 8, proc_start(os.getpid()) or 0)
        self._set_word(pid_off + 16, 0)  # a predecessor killed asleep left its waiting flag set
        self._set_word(pid_off, os.getpid())

    def _bell_socket(self) -> socket.socket:
        """This process's doorbell: a datagram socket autobound in the abstract namespace (unique,
        nothing to clean up), its address published in this side's BELL word before any sleep."""
        pid = os.getpid()
        if self._bell is None or self._bell_pid != pid:
            if self._bell is not None:
                self._bell.close()  # inherited through fork: the parent's doorbell, not ours
            bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            bell.setblocking(False)
            bell.bind("")  # autobind
            self._u64[self._bell_off >> 3] = pack_address(bell.getsockname())
            self._bell, self._bell_pid = bell, pid
        return self._bell

    def _ring_peer(self, peer_bell_off: int) -> None:
        """Wake the peer, which announced that it sleeps on its doorbell."""
        word = self._u64[peer_bell_off >> 3]
        if not word:  # no doorbell published: the flag is stale or garbled; the sleep is bounded
            return
        try:
            self._bell_socket().sendto(b"\1", unpack_address(word))
        except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
            # A hint only: the bell is already ringing (queue full), or the peer is gone or lives
            # in another network namespace; its sleep is bounded and re-checks the shared words.
            pass

    def _wait_until(self, ready: Callable[[], bool], flag_off: int, timeout_s: float | None) -> bool:
        """Bounded wait for ``ready()``; False on timeout.

        Spins (yielding) for ``SPIN_S``, then announces itself at ``flag_off``, re-checks once
        more, and sleeps on the doorbell in slices of 20 us doubling to 1 ms, re-checking after
        every wake-up (see the module docstring, Waiting). The announcement can race with the
        peer's publish, so a wake-up can be lost, but then the slice bounds the delay: the
        doorbell shortens waits, it never decides them.
        """
        monotonic, yield_cpu = time.monotonic, os.sched_yield
        now = monotonic()
        deadline = None if timeout_s is None else now + timeout_s
        spin_until = now + SPIN_S
        cpu = time.process_time()
        sleeps = -1  # -1: spinning; 0: announced, one re-check before the first sleep
        try:
            while not ready():
                now = monotonic()
                if deadline is not None and now >= deadline:
                    return False
                if sleeps < 0:
                    yield_cpu()  # spin politely: other runnable work on this core goes first
                    if now >= spin_until:
                        self._bell_socket()  # its address is stored before the flag that leads to it
                        self._u64[flag_off >> 3] = 1  # then loop: re-check before the first sleep
                        sleeps = 0
                    continue
                slice_s = sleep_slice(sleeps)
                if deadline is not None:
                    slice_s = max(0.0, min(slice_s, deadline - now))
                bell = self._bell_socket()
                if select.select([bell], [], [], slice_s)[0]:
                    self.bell_wakeups += 1
                    while True:  # drain: several rings while asleep are one wake-up
                        try:
                            bell.recv(64)
                        except BlockingIOError:
                            break
                sleeps += 1
            return True
        finally:
            if sleeps >= 0:
                self._u64[flag_off >> 3] = 0
            self.wait_cpu_s += time.process_time() - cpu

    def _positions(self) -> tuple[int, int]:
        """(commit_pos, write_pos) after checking the invariants that bind them."""
        c, w = self._word(OFF_COMMIT_POS), self._word(OFF_WRITE_POS)
        if c > w or w - c > self.capacity or (c | w) & 7:
            raise RingCorrupted(f"ring {self.name}: commit_pos={c} write_pos={w} capacity={self.capacity}")
        return c, w

    def _unmap(self) -> None:
        # Every exported view must be released before the mmap can close.
        if self._native is not None:
            self._native.close()
            self._native = None
        if self._bell is not None:
            self._bell.close()
            self._bell = None
        for view in (self._u64, self._buf):
            view.release()
        try:
            self._mm.close()
        except BufferError:
            raise RingError(
                f"ring {self.name}: closed while zero-copy views into it are alive; drop records decoded from get_view() first"
            ) from None

    @property
    def writer_pid(self) -> int:
        return self._word(OFF_WRITER_PID)

    def writer_alive(self) -> bool:
        """Whether the process recorded as the writer still runs (a zombie counts as dead)."""
        return alive(self.writer_pid, self._word(OFF_WRITER_START))


class RingWriter(_Segment):
    """The single producer. ``RingWriter(name)`` creates the segment; ``attach`` reopens it."""

    _bell_off = OFF_WRITER_BELL

    def __init__(self, name: str, capacity_bytes: int = 64 << 20, *, native: bool | None = None) -> None:
        use_native = _use_native(native)
        if capacity_bytes < 128 or capacity_bytes % 8:
            raise ValueError(f"capacity_bytes={capacity_bytes} must be a multiple of 8 and >= 128")
        final = segment_path(name)
        tmp = os.path.join(SHM_DIR, f".{os.path.basename(final)}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        mapped = published = False
        try:
            size = HEADER_BYTES + capacity_bytes
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)  # out of /dev/shm space fails here, not as SIGBUS later
            super().__init__(os.path.basename(final), fd)
            mapped = True
            self._prefault()
            self._set_word(OFF_VERSION, LAYOUT_VERSION)
            self._set_word(OFF_CAPACITY, capacity_bytes)
            self._set_word(OFF_LAST_START, NO_RECORD)
            self._claim(OFF_WRITER_PID, "writer")
            self._set_word(OFF_MAGIC, MAGIC)  # last: a segment with magic is fully initialised
            os.link(tmp, final)  # atomic publish of the name; raises FileExistsError if taken
            published = True
        finally:
            os.close(fd)
            os.unlink(tmp)
            if mapped and not published:
                self._unmap()
        self._write_pos = 0
        self._next_seq = 0
        self._seen_commit = 0  # the last commit_pos read; only ever behind the shared word
        if use_native:
            self._native = NATIVE.Writer(self._buf, self.capacity, self._max_payload, 0, 0, 0)

    @classmethod
    def attach(cls, name: str, *, native: bool | None = None) -> RingWriter:
        """Reopen an existing ring as its (new) writer, e.g. after the previous writer died."""
        self = cls.__new__(cls)
        use_native = _use_native(native)
        fd = os.open(segment_path(name), os.O_RDWR)
        try:
            _Segment.__init__(self, os.path.basename(segment_path(name)), fd)
        finally:
            os.close(fd)
        self._validate_header()
        self._claim(OFF_WRITER_PID, "writer")
        self._seen_commit, self._write_pos = self._positions()
        self._next_seq = self._recover_next_seq()
        self._set_word(OFF_NEXT_SEQ, self._next_seq)
        if use_native:
            self._native = NATIVE.Writer(self._buf, self.capacity, self._max_payload, self._write_pos, self._next_seq, self._seen_commit)
        return self

    def _recover_next_seq(self) -> int:
        # next_seq is bumped after write_pos; a writer killed between the two left it one behind.
        # last_start is set before a record's first byte, so if it lies below write_pos it is the
        # newest published record, untouched since, and its own sequence number is authoritative.
        last = self._word(OFF_LAST_START)
        if last == NO_RECORD or last >= self._write_pos:
            return self._word(OFF_NEXT_SEQ)
        i = (HEADER_BYTES + last % self.capacity) >> 3
        if self._u64[i + 1] & MASK32 != KIND_RECORD:
            raise RingCorrupted(f"ring {self.name}: last_start={last} does not point at a record")
        return self._u64[i + 2] + 1

    def _prefault(self) -> None:
        zeros = bytes(1 << 20)
        for start in range(0, len(self._buf), len(zeros)):
            end = min(start + len(zeros), len(self._buf))
            self._buf[start:end] = zeros[: end - start]

    @property
    def max_payload(self) -> int:
        """Largest payload accepted: one that fits an empty ring wherever the lap boundary falls.

        A record never straddles the end of the data region, so it may have to skip up to its
        own size at the end of a lap; only records of at most half the capacity are sure to
        fit once the reader has drained the ring.
        """
        return self._max_payload

    @property
    def next_seq(self) -> int:
        """Sequence number the next ``put`` will return."""
        return self._native.next_seq if self._native is not None else self._next_seq

    def free_bytes(self) -> int:
        """Bytes not holding uncommitted records (a record may also need the rest of the lap).

        The controller admits new episodes only while this exceeds a few records' worth."""
        written = self._native.write_pos if self._native is not None else self._write_pos
        return self.capacity - (written - self._word(OFF_COMMIT_POS))

    def put(self, payload: bytes | memoryview, timeout_s: float | None = None) -> int:
        """Append one record and return its sequence number; wait for space up to ``timeout_s``."""
        return self.put_parts((payload,), timeout_s)

    def put_trajectory(self, traj: Trajectory, timeout_s: float | None = None) -> int:
        """Append ``encode_trajectory(traj)`` as one record; as ``put``, but the native writer
        emits the msgpack framing itself and copies the token buffers straight from ``traj``
        (``protocol.split_trajectory``), without building a list of parts in Python."""
        native = self._native
        if native is None:
            return self.put_parts(encode_trajectory_parts(traj), timeout_s)
        values, head, tail = split_trajectory(traj)
        seq = native.put_struct(values, head, tail, _BULK_FROM, _BULK_TO)
        if seq < 0:
            seq = self._put_slow(lambda: native.put_struct(values, head, tail, _BULK_FROM, _BULK_TO), seq, timeout_s)
        if self._u64[_I_READER_WAITING]:  # one load per record; the reader rarely writes this line
            self._ring_peer(OFF_READER_BELL)
        return seq

    def put_parts(self, parts: Sequence[bytes | memoryview], timeout_s: float | None = None) -> int:
        """Append the concatenation of ``parts`` as one record (scatter-gather, one copy each).

        A ``parts`` object with an ``nbytes`` attribute (``protocol.RecordParts``) gives the
        total length; a wrong one raises ``RingError`` before anything is published (the
        native path then writes nothing; the Python path's bytes past the reserved space may have
        damaged unread records, which their digests reveal).

        Waits up to ``timeout_s`` (None: forever) for the reader to commit enough space, then
        raises ``RingFull``; a payload that could never fit raises ``RecordTooLarge`` at once.
        """
        native = self._native
        if native is None:
            return self._put_parts_python(parts, timeout_s)
        # The whole fast path in one C call; the slow paths stay here.
        declared = getattr(parts, "nbytes", -1)  # -1: the C side measures the parts
        seq = native.put(parts, declared)
        if seq < 0:
            seq = self._put_slow(lambda: native.put(parts, declared), seq, timeout_s, declared)
        if self._u64[_I_READER_WAITING]:  # one load per record; the reader rarely writes this line
            self._ring_peer(OFF_READER_BELL)
        return seq

    def _put_parts_python(self, parts: Sequence[bytes | memoryview], timeout_s: float | None) -> int:
        """``put_parts`` without the extension (the fallback, and the benchmarks' same-run
        baseline): locals instead of attribute lookups and method calls, frame words stored
        through the u64 view, one mmap.write per part."""
        n = getattr(parts, "nbytes", -1)  # RecordParts carries its total; checked after the copy
        if n < 0:
            n = 0
            for p in parts:  # byte lengths; any C-contiguous buffer (non-contiguous fails on copy)
                n += p.nbytes if type(p) is memoryview else len(p) if type(p) is bytes else memoryview(p).nbytes
        if n > self._max_payload:
            raise self._too_large(n)
        padded = (n + 7) & ~7
        size = _FRAME_SIZE + padded
        seq = self._next_seq
        w = self._reserve(size, seq, timeout_s)
        u64, mm = self._u64, self._mm
        start = HEADER_BYTES + w % self.capacity  # frame offset in the mapping
        i = start >> 3
        u64[i + 1] = KIND_RECORD | n << 32
        u64[i + 2] = seq
        mm.seek(start + _FRAME_SIZE)
        write = mm.write
        for p in parts:
            write(p)
        if mm.tell() != start + _FRAME_SIZE + n:  # parts.nbytes was wrong: publish nothing
            raise RingError(
                f"ring {self.name}: parts.nbytes={n} but {mm.tell() - start - _FRAME_SIZE} bytes were written; the record is not published"
            )
        if padded != n:
            write(ZEROS[: padded - n])  # zero padding: covered by the digest like the payload
        # The digest is taken over what the ring now holds (hot in this core's cache), so a
        # copy that went wrong is caught too, not only later damage.
        u64[i] = digest(self._buf[start + DIGEST_FROM : start + size])
        self._write_pos = w = w + size
        u64[_I_WRITE_POS] = w  # publish: the reader may now read it
        self._next_seq = seq + 1
        u64[_I_NEXT_SEQ] = seq + 1
        if u64[_I_READER_WAITING]:  # one load per record; the reader rarely writes this line
            self._ring_peer(OFF_READER_BELL)
        return seq

    def _reserve(self, size: int, seq: int, timeout_s: float | None) -> int:
        """The Python path's room for a record of ``size`` bytes (waiting for the reader to commit
        it): skips to the next lap where the rest of this one is too short (a wrap marker where
        it holds one) and moves ``last_start`` there; returns the record's position (a byte count
        since the ring's start, as ``write_pos``)."""
        u64, cap = self._u64, self.capacity
        w = self._write_pos
        room = cap - w % cap
        skip = room if room < size else 0  # the record goes to the start of the next lap
        # commit_pos only grows, so a cached value that already shows room is still true; the
        # shared word (a cache line the reader writes) is re-read only when it might not be.
        if w + skip + size - self._seen_commit > cap:
            self._seen_commit = u64[_I_COMMIT_POS]
            if w + skip + size - self._seen_commit > cap:
                self._wait_for_room(w + skip + size - cap, size, timeout_s)
        # last_start moves before any byte is written: while it is >= write_pos, attach() knows
        # the record there is unpublished and may already overwrite the previous one.
        u64[_I_LAST_START] = w + skip
        if skip >= _FRAME_SIZE:  # an explicit wrap marker; the reader reads only its kind word
            i = (HEADER_BYTES + w % cap) >> 3
            u64[i + 1] = KIND_WRAP
            u64[i + 2] = seq
            u64[i] = 0
        return w + skip

    def _put_slow(self, retry: Callable[[], int], code: int, timeout_s: float | None, declared: int = -1) -> int:
        """The native put's slow paths: ``code`` is what it returned (nothing was published);
        raise its error, or wait for room and ``retry()`` until a sequence number comes back."""
        native = self._native
        while True:
            n = native.pending_nbytes  # the payload's bytes, as the C side measured them
            if code == _PUT_TOO_LARGE:
                raise self._too_large(n)
            if code == _PUT_WRONG_NBYTES:
                raise RingError(f"ring {self.name}: parts.nbytes={declared} but the parts hold {n} bytes; the record is not published")
            if code == _PUT_CORRUPTED:
                raise RingCorrupted(
                    f"ring {self.name}: commit_pos={self._word(OFF_COMMIT_POS)} is beyond write_pos={native.write_pos} or not 8-aligned"
                )
            if code != _PUT_NO_ROOM:
                raise RingError(f"ring {self.name}: areal.ring._ringcopy returned {code}, which this module does not know")
            size, w, cap = record_bytes(n), native.write_pos, self.capacity
            room = cap - w % cap
            self._wait_for_room(w + (room if room < size else 0) + size - cap, size, timeout_s)
            code = retry()  # the C side re-reads commit_pos itself
            if code >= 0:
                return code

    def _too_large(self, n: int) -> RecordTooLarge:
        return RecordTooLarge(
            f"record of {n} bytes does not fit ring {self.name}: at most {self._max_payload} "
            f"bytes per record (half the capacity of {self.capacity} bytes, less a "
            f"{_FRAME_SIZE}-byte frame)"
        )

    def _wait_for_room(self, commit_needed: int, size: int, timeout_s: float | None) -> None:
        """Back-pressure: wait until the reader has committed up to ``commit_needed``."""
        u64 = self._u64
        if not self._wait_until(lambda: u64[_I_COMMIT_POS] >= commit_needed, OFF_WRITER_WAITING, timeout_s):
            raise RingFull(
                f"ring {self.name}: no room for {size} bytes after {timeout_s}s "
                f"({self.free_bytes()} of {self.capacity} free; is the reader alive?)"
            )
        self._seen_commit = u64[_I_COMMIT_POS]  # re-read: the reader moves it

    def close(self, unlink: bool = False) -> None:
        """Unmap; with ``unlink`` also remove the segment (unread records are then lost)."""
        self._set_word(OFF_WRITER_PID, 0)  # a clean exit: reclaim_stale need not wait for us
        self._unmap()
        if unlink:
            unlink_ring(self.name)

    def __enter__(self) -> RingWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # Unlink only on a normal exit: after an error the published records stay readable
        # (the run's teardown removes the segment with ``unlink_ring``).
        self.close(unlink=exc_type is None)


class RingReader(_Segment):
    """The single consumer: attaches to a ring (waiting for it to appear) and reads records.

    ``resume=True`` starts at the ring's committed position (everything after the last commit
    is delivered again); ``resume=False`` insists on a ring nothing was ever committed from,
    which catches a fresh trainer pointed at an old run's ring. ``auto_commit=True`` commits
    each record as it is handed out; with ``False`` the caller commits with ``commit(seq)``.
    """

    _bell_off = OFF_READER_BELL

    def __init__(self, name: str, timeout_s: float = 30, *, resume: bool = True, auto_commit: bool = True) -> None:
        path = segment_path(name)
        deadline = time.monotonic() + timeout_s
        attempt = 0
        while True:
            try:
                fd = os.open(path, os.O_RDWR)
                break
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"ring {name}: segment {path} did not appear in {timeout_s}s") from None
                pause(SPIN_CHECKS + attempt)
                attempt += 1
        try:
            super().__init__(os.path.basename(path), fd)
        finally:
            os.close(fd)
        self._validate_header()
        self._claim(OFF_READER_PID, "reader")
        self._read_pos = self._commit_pos = self._positions()[0]
        if not resume and (self._commit_pos or self._word(OFF_COMMIT_SEQ)):
            raise RingError(
                f"ring {self.name}: resume=False but records up to seq "
                f"{self._word(OFF_COMMIT_SEQ) - 1} were already committed by an earlier reader"
            )
        self.auto_commit = auto_commit
        # The first record must not precede the committed sequence (it may follow it: a reader
        # that died between moving commit_pos and commit_seq left commit_seq behind).
        self._min_seq = self._word(OFF_COMMIT_SEQ)
        self.last_seq: int | None = None  # sequence number of the record most recently returned
        self._delivered: collections.deque[tuple[int, int]] = collections.deque()  # (seq, end), uncommitted
        self._seen_write = self._read_pos  # the last write_pos read; only ever behind the shared word

    @property
    def committed_seq(self) -> int:
        """Sequence number of the first record not yet committed (0 on a fresh ring)."""
        return self._word(OFF_COMMIT_SEQ)

    def get(self, timeout_s: float | None = None) -> bytes | None:
        """Copy of the next record's payload, or None if none is published within ``timeout_s``.

        The digest is verified in place before the copy; the writer cannot touch a record
        before it is committed, which happens here only after the copy."""
        view = self.get_view(timeout_s)
        if view is None:
            return None
        payload = bytes(view)
        view.release()
        if self.auto_commit:
            self.commit(self.last_seq)
        return payload

    def get_view(self, timeout_s: float | None = None) -> memoryview | None:
        """Zero-copy view of the next record's payload, or None on timeout.

        The view (and anything decoded from it) is valid until the record is committed: with
        ``auto_commit`` that is the next ``get``/``get_view``/``close``, otherwise ``commit``.
        """
        # Hot path: one function, locals, frame words loaded through the u64 view.
        delivered, u64 = self._delivered, self._u64
        if delivered and self.auto_commit:  # the view handed out last time is now consumed
            seq, end = delivered[-1]
            delivered.clear()
            self._commit_pos = end  # _commit_through, inlined
            u64[_I_COMMIT_POS] = end  # release: the writer may now reuse the space
            u64[_I_COMMIT_SEQ] = seq + 1
            if u64[_I_WRITER_WAITING]:
                self._ring_peer(OFF_WRITER_BELL)
        cap, r = self.capacity, self._read_pos
        # write_pos only grows, so records below the last value read are still published; the
        # shared word (a cache line the writer keeps writing) is re-read only once they are used.
        w = self._seen_write
        if w == r:
            w = u64[_I_WRITE_POS]
            if w == r:
                w = self._wait_for_record(timeout_s)
                if w is None:
                    return None
            if w < r or w - self._commit_pos > cap or w & 7:
                raise RingCorrupted(f"ring {self.name}: write_pos={w} read={r} commit_pos={self._commit_pos} capacity={cap}")
            self._seen_write = w
        room = cap - r % cap
        if room < _FRAME_SIZE or u64[((HEADER_BYTES + r % cap) >> 3) + 1] & MASK32 == KIND_WRAP:
            r += room
        start = HEADER_BYTES + r % cap
        i = start >> 3
        kind_len = u64[i + 1] if r < w else 0
        n = kind_len >> 32
        end = r + _FRAME_SIZE + ((n + 7) & ~7)
        stop = start + end - r  # end of the padded payload in the mapping
        if kind_len & MASK32 != KIND_RECORD or end > w or stop > HEADER_BYTES + cap:
            raise RingCorrupted(
                f"ring {self.name}: no valid record at position {r} (kind={kind_len & MASK32:#x} length={n} write_pos={w} capacity={cap})"
            )
        buf = self._buf
        if digest(buf[start + DIGEST_FROM : stop]) != u64[i]:
            raise RingCorrupted(f"ring {self.name}: checksum mismatch in the record at position {r}")
        seq = u64[i + 2]
        last = self.last_seq
        if last is None:
            if seq < self._min_seq:
                raise RingCorrupted(f"ring {self.name}: sequence {seq} where {self._min_seq} was expected")
        elif seq != last + 1:
            raise RingCorrupted(f"ring {self.name}: sequence {seq} where {last + 1} was expected")
        self._read_pos = end
        self.last_seq = seq
        delivered.append((seq, end))
        return buf[start + _FRAME_SIZE : start + _FRAME_SIZE + n]

    def _wait_for_record(self, timeout_s: float | None) -> int | None:
        """Wait until write_pos moves past the read position; the new write_pos, or None."""
        u64, r = self._u64, self._read_pos
        if not self._wait_until(lambda: u64[_I_WRITE_POS] != r, OFF_READER_WAITING, timeout_s):
            return None
        return u64[_I_WRITE_POS]

    def commit(self, seq: int) -> None:
        """Release every delivered record up to and including ``seq`` to the writer.

        Call it once the records are durably used (the trainer: after the checkpoint of the
        step that consumed them); views from ``get_view`` of these records become invalid.
        Committing an already committed ``seq`` is a no-op; one not yet delivered is an error.
        """
        if self.last_seq is None or seq > self.last_seq:
            raise ValueError(f"ring {self.name}: commit({seq}) beyond the last delivered record {self.last_seq}")
        delivered = self._delivered
        newest = None
        while delivered and delivered[0][0] <= seq:
            newest = delivered.popleft()
        if newest is not None:
            self._commit_through(newest)

    def _commit_through(self, newest: tuple[int, int]) -> None:
        """Publish the release of every record up to ``newest`` = (seq, end); the caller has
        already dropped them from ``_delivered``."""
        seq, end = newest
        self._commit_pos = end
        u64 = self._u64
        u64[_I_COMMIT_POS] = end  # release: the writer may now reuse the space
        u64[_I_COMMIT_SEQ] = seq + 1
        if u64[_I_WRITER_WAITING]:
            self._ring_peer(OFF_WRITER_BELL)

    def close(self) -> None:
        """Unmap (with ``auto_commit``, the last view handed out counts as consumed)."""
        if self.auto_commit and self._delivered:
            newest = self._delivered[-1]
            self._delivered.clear()
            self._commit_through(newest)
        if self._word(OFF_READER_PID) == os.getpid():
            self._set_word(OFF_READER_PID, 0)
        self._unmap()

    def __enter__(self) -> RingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
