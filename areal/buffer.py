"""Shared-memory trajectory ring: one producer (the controller), one consumer (a trainer rank).

API: ``RingWriter(ring_name(run_id, rank), capacity_bytes)`` creates a ring, ``.put(bytes)`` or
``.put_parts(encode_trajectory_parts(traj))`` appends a record and returns its sequence number,
``RingWriter.attach(name)`` takes over after a writer crash. ``RingReader(name, resume=True,
auto_commit=...)`` reads with ``.get()`` (a copy) or ``.get_view()`` (zero-copy, valid until
committed) and releases space with ``.commit(seq)``. ``reclaim_stale("areal-")`` at start-up
removes the segments of crashed runs. (About 800 lines: both ends of one shared layout and
its doorbell stay in one module, per the one-module-per-boundary rule; a sixth is docstring.)

The segment is a plain file in ``/dev/shm`` mapped with ``mmap`` by both processes. We do not use
``multiprocessing.shared_memory``: on Python 3.11 its resource tracker unlinks segments that a
process merely attached to. The writer creates the file under a temporary name, sizes it,
pre-faults every page (first writes into fresh shared memory run at ~1.8 GB/s, warm ones at
7-11 GB/s), writes the header with the magic last, then links it to its final name, so a reader
never sees a half-initialised segment.

Layout (all integers little-endian u64 words; each side's words on their own cache lines)::

    offset 0     magic "AREALRNG" | layout version | capacity | (reserved)      set at creation
    offset 64    write_pos    monotonic byte offset, 8-aligned; the writer's ONLY publish point
    offset 128   next_seq     sequence number of the next record (hint, written after publish)
    offset 192   last_start   start of the newest record (written before its first byte)
    offset 256   writer_pid | writer_start | writer_waiting | writer_bell   (start = /proc
                 starttime, so pid reuse is seen; waiting/bell: the doorbell, see Waiting)
    offset 320   commit_pos   monotonic byte offset, 8-aligned; the reader's ONLY release point
    offset 384   commit_seq   sequence number of the first uncommitted record (hint)
    offset 448   reader_pid | reader_start | reader_waiting | reader_bell
    offset 4096  data[capacity]    byte position p lives at data[p % capacity]

    record frame (32 bytes) + payload, padded to a multiple of 8:
    +---------+-----------+---------+------------+-------------+----------+---------------+
    | kind u32| length u32| seq u64 | sum64 u64  | crc32 u32   | rsvd u32 | payload, pad  |
    +---------+-----------+---------+------------+-------------+----------+---------------+
    crc32 covers the first 24 frame bytes; sum64 is the payload checksum (below).
    kind = REC2 (a record) or WRAP (rest of this lap is unused; continue at the next lap).
    When fewer than 32 bytes remain before the end of the lap, the wrap is implicit.

Record state machine (a byte range of data, seen from both sides)::

    FREE --writer: last_start, payload, then frame--> WRITTEN   (beyond write_pos: invisible)
    WRITTEN --writer: write_pos += size, then next_seq--> PUBLISHED  (reader may read it)
    PUBLISHED --reader: verify, hand out--> DELIVERED    (reader-private read position moves)
    DELIVERED --reader: commit(seq): commit_pos = end--> FREE   (writer may overwrite it)
    A reader that dies moves DELIVERED back to PUBLISHED: a new reader starts at commit_pos.

Invariants: ``commit_pos <= read <= write_pos <= commit_pos + capacity``; every byte in
``[commit_pos, write_pos)`` belongs to a complete record whose checksums match and whose
sequence numbers are consecutive. Each side writes only its own words, so no locks are needed.
Stores happen in program order (payload, then frame, then the position word); on x86 (total
store order, aligned 8-byte stores atomic) the other side therefore never sees a position
before the bytes it covers.

Delivery is exactly once into training when the consumer commits only what a checkpoint holds:
``RingReader(name, auto_commit=False)`` hands out records, and the trainer calls
``reader.commit(seq)`` after the checkpoint of the optimizer step that used every record up to
``seq`` is durable (with partial groups pending, ``seq`` is one below the oldest pending
record's). After a trainer crash, ``RingReader(name, resume=True)`` re-delivers everything after
the last commit. The default ``auto_commit=True`` commits each record as it is handed out
(at-least-once across reader crashes: a record copied but not yet committed comes again).

Checksum choice: zlib.crc32 over a 100 KB payload costs ~25 us, more than the whole transfer.
The payload is instead summed as little-endian u64 words with wrap-around (``np.add.reduce``,
~0.8 us fixed + ~1.5 us per 100 KB hot, the trailing partial word zero-extended), and the frame
header carries a crc32 of its own 24 bytes. The writer zeroes the padding after the payload
(layout version 3), so both sides sum whole words (no tail to special-case) and damaged
padding is caught too. Detected: a torn write (an unwritten or stale tail differs from what
was summed), truncation or a wrong length, a record overwritten by a later lap, any change
confined to one 8-byte word (every bit flip), a stale or garbled frame (header crc, sequence
continuity). Not detected: permutations of 8-byte words and changes that cancel in the sum
(+1 in one word, -1 in another); the ring defends against crashes and bugs, not an adversary.

Hot path: each side caches the other side's position word (``_seen_commit`` in the writer,
``_seen_write`` in the reader) and re-reads the shared word only when the cached value no
longer shows room or a record. Positions only grow, so a cached value is merely behind, never
wrong, and every decision that could block re-reads the authoritative word; this saves a
cross-core cache miss per record. Parts are copied with one ``mmap.write`` each (faster here
than memoryview or numpy slice assignment), straight from the caller's arrays: each payload
byte is written once and read once more by each side's checksum, and nothing else touches it.
The frame is packed in place. Per 8k-token record (106 KB, incl. encode/decode; 2-core EPYC,
loaded): writer ~9.5-12 us = encode ~2 + copy ~4 + sum ~2.5 + frame and bookkeeping ~1.5;
reader ~5-6 us = checksum ~2.5-3 (the record crosses cores here) + frame ~1.5 + decode ~0.9.
The ring's size matters as much: in a ring that stays in the last-level cache (a few MiB) the
writer copies into cached lines (~26 GB/s); in a 16-64 MiB ring each lap goes out to DRAM and
the copy costs ~2.5x as much (``benchmarks/ring.py`` measures both).

Waiting: a waiting side spins 50 re-checks, then sleeps 20 us doubling to 1 ms, re-reading the
other side's word each time; every wait has a timeout, and the shared words decide. A doorbell
shortens the sleeps: before its first sleep a side binds a datagram socket in the abstract
Unix namespace (autobound: unique, no file to clean up), stores its address in its ``bell``
word, sets its ``waiting`` word, re-checks, and sleeps in ``select`` on the socket. The peer
loads ``waiting`` once per record and, if set, sends one byte. A hint only: x86 may order the
re-check before the flag store is visible ("set flag then check" loses wake-ups), and a peer
in another network namespace is unreachable; either costs at most one sleep slice.

What is covered:
  * a writer killed at any instant (SIGKILL included): nothing it published is lost, nothing
    half-written is ever returned; ``RingWriter.attach`` resumes with consecutive sequence
    numbers (``next_seq`` is recovered from the frame at ``last_start`` when the writer died
    between publishing and bumping it);
  * a reader killed at any instant: a new ``RingReader`` resumes at ``commit_pos``; records
    delivered but not committed are delivered again, and the writer never overwrites them;
  * corruption of a published record or of the positions: ``RingCorrupted``, never bad data;
  * back-pressure: a full ring makes ``put`` wait, then raise ``RingFull``; nothing is dropped;
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
import re
import select
import socket
import struct
import time
import zlib
from collections.abc import Callable, Sequence

import numpy as np

SHM_DIR = "/dev/shm"
MAGIC = int.from_bytes(b"AREALRNG", "little")
LAYOUT_VERSION = 3  # 3: record padding is zeroed and covered by the payload sum
HEADER_BYTES = 4096  # one page, so the data region is page aligned
# Byte offsets of the header words; each side's words on its own cache lines.
OFF_MAGIC, OFF_VERSION, OFF_CAPACITY = 0, 8, 16
OFF_WRITE_POS, OFF_NEXT_SEQ, OFF_LAST_START, OFF_WRITER_PID, OFF_WRITER_START = 64, 128, 192, 256, 264
OFF_COMMIT_POS, OFF_COMMIT_SEQ, OFF_READER_PID, OFF_READER_START = 320, 384, 448, 456
# Per side, on its pid line (which the peer reads once per record and the owner writes only
# around a sleep): WAITING is 1 while it sleeps on its doorbell, BELL the doorbell's address.
OFF_WRITER_WAITING, OFF_WRITER_BELL, OFF_READER_WAITING, OFF_READER_BELL = 272, 280, 464, 472

FRAME = struct.Struct("<IIQQII")  # kind, payload length, seq, sum64(payload), crc32(bytes 0..24), reserved
_FRAME_HEAD = struct.Struct("<IIQQ")  # the frame bytes its crc32 covers
_KIND = struct.Struct("<I")
_ZEROS = bytes(8)
_add_reduce = np.add.reduce  # (words,) u64 -> wrap-around sum; one C call, ~48 GB/s on hot data
KIND_RECORD = int.from_bytes(b"REC2", "little")
KIND_WRAP = int.from_bytes(b"WRAP", "little")
NO_RECORD = (1 << 64) - 1  # last_start before the first record
_MASK64 = (1 << 64) - 1

_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_SPIN_CHECKS = 50  # re-checks before the first sleep: a busy peer usually answers within µs
_MIN_SLEEP_S, _MAX_SLEEP_S = 20e-6, 1e-3


class RingError(Exception):
    """Base class of the ring's errors."""


class RingCorrupted(RingError):
    """The segment's contents break the ring's invariants; no record past this point is trusted."""


class RingFull(RingError, TimeoutError):
    """``put`` waited ``timeout_s`` and the reader did not free enough space."""


class RecordTooLarge(RingError, ValueError):
    """The payload can never fit, however empty the ring is."""


def ring_name(run_id: str, rank: int) -> str:
    """Name of the ring feeding trainer ``rank`` of run ``run_id``: ``areal-<run_id>-r<rank>``."""
    return _check_name(f"areal-{run_id}-r{rank}")


def unlink_ring(name: str) -> None:
    """Remove a segment by name; a missing segment is not an error."""
    try:
        os.unlink(_path(name))
    except FileNotFoundError:
        pass


def reclaim_stale(prefix: str = "areal-") -> list[str]:
    """Unlink the segments named ``prefix*`` whose writer and reader are both dead; call at start.

    Also removes creation temp files (``.<prefix>*.<pid>.tmp``) of dead creators. Files whose
    header is not a ring's are left alone. Returns the names removed.
    """
    removed = []
    for entry in sorted(os.listdir(SHM_DIR)):
        path = os.path.join(SHM_DIR, entry)
        if entry.startswith("." + prefix) and entry.endswith(".tmp"):
            pid = entry[: -len(".tmp")].rsplit(".", 1)[-1]
            if pid.isdigit() and not _alive(int(pid), None):
                _remove(path, removed, entry)
            continue
        if not entry.startswith(prefix):
            continue
        try:
            with open(path, "rb") as f:
                head = f.read(OFF_READER_START + 8)
        except FileNotFoundError:  # removed by its owner meanwhile
            continue
        if len(head) < OFF_READER_START + 8 or int.from_bytes(head[:8], "little") != MAGIC:
            continue

        def word(off: int) -> int:
            return int.from_bytes(head[off : off + 8], "little")

        if not _alive(word(OFF_WRITER_PID), word(OFF_WRITER_START)) and not _alive(
            word(OFF_READER_PID), word(OFF_READER_START)
        ):
            _remove(path, removed, entry)
    return removed


def _remove(path: str, removed: list[str], entry: str) -> None:
    try:
        os.unlink(path)
        removed.append(entry)
    except FileNotFoundError:
        pass


def _proc_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot; None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # the command name may contain spaces
    if fields[0] in (b"Z", b"X"):  # a zombie can no longer touch the segment
        return None
    return int(fields[19])  # field 22 of proc(5); fields[0] is field 3


def _alive(pid: int, start: int | None) -> bool:
    """Whether ``pid`` is a live process; with ``start``, also that it is the same process."""
    if pid == 0:
        return False
    now = _proc_start(pid)
    return now is not None and (start is None or now == start)


def _check_name(name: str) -> str:
    # Names are single path components under /dev/shm; a leading '.' is reserved for temp files.
    if not _NAME_RE.fullmatch(name) or len(name) > 200:
        raise ValueError(f"ring name {name!r} must match {_NAME_RE.pattern} (at most 200 chars)")
    return name


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, _check_name(name.lstrip("/")))


def _pause(attempt: int) -> None:
    """One bounded wait step: spin first, then sleep 20 µs doubling up to 1 ms."""
    if attempt >= _SPIN_CHECKS:
        time.sleep(_sleep_slice(attempt - _SPIN_CHECKS))


def _sleep_slice(attempt: int) -> float:
    return min(_MAX_SLEEP_S, _MIN_SLEEP_S * (1 << min(attempt, 10)))


def _pack_address(address: bytes) -> int:
    """An autobound abstract socket address (``\\0`` + 5 hex digits) as one header word."""
    if len(address) > 7:
        raise RingError(f"doorbell address {address!r} longer than 7 bytes")
    return len(address) | int.from_bytes(address, "little") << 8


def _unpack_address(word: int) -> bytes:
    return (word >> 8).to_bytes(word & 0xFF, "little")


def payload_sum(buf: bytes | memoryview | mmap.mmap, offset: int, n: int) -> int:
    """Wrap-around sum of ``buf[offset:offset+n]`` as little-endian u64 words (tail zero-extended)."""
    words = n >> 3
    total = int(np.add.reduce(np.frombuffer(buf, "<u8", words, offset))) if words else 0
    tail = offset + (words << 3)
    return (total + int.from_bytes(buf[tail : offset + n], "little")) & _MASK64


class _Segment:
    """A mapped ring segment: the header words and the data region, for either side."""

    def __init__(self, name: str, fd: int) -> None:
        self.name = name
        size = os.fstat(fd).st_size
        if size < HEADER_BYTES:
            raise RingCorrupted(f"ring {name}: segment is {size} bytes, smaller than its header")
        self._mm = mmap.mmap(fd, size)
        self._buf = memoryview(self._mm)
        # Aligned 8-byte loads/stores through a 'Q' view are single machine instructions.
        self._u64 = self._buf[:HEADER_BYTES].cast("Q")
        self._data = self._buf[HEADER_BYTES:]
        self.capacity = len(self._data)
        self._max_payload = min((self.capacity // 2) & ~7, 0xFFFFFFF8) - FRAME.size
        self._words = np.frombuffer(self._mm, "<u8")  # (size / 8,) for payload sums, made once
        self._bell: socket.socket | None = None  # this side's doorbell, bound on first use
        self._bell_pid = 0  # the process that bound it (a forked child binds its own)
        self.wait_cpu_s = 0.0  # CPU seconds spent waiting (spinning included): busy = total - this
        self.bell_wakeups = 0  # sleeps ended by the peer's doorbell rather than by the time slice

    _bell_off = 0  # OFF_WRITER_BELL or OFF_READER_BELL: where this side publishes its doorbell

    def _validate_header(self) -> None:
        if self._word(OFF_MAGIC) != MAGIC:
            raise RingCorrupted(f"ring {self.name}: bad magic {self._word(OFF_MAGIC):#x}")
        version = self._word(OFF_VERSION)
        if version != LAYOUT_VERSION:
            raise RingCorrupted(f"ring {self.name}: layout version {version}, expected {LAYOUT_VERSION}")
        if self._word(OFF_CAPACITY) != self.capacity:
            raise RingCorrupted(
                f"ring {self.name}: header capacity {self._word(OFF_CAPACITY)} != mapped {self.capacity}"
            )

    def _word(self, offset: int) -> int:
        return self._u64[offset >> 3]

    def _set_word(self, offset: int, value: int) -> None:
        self._u64[offset >> 3] = value

    def _claim(self, pid_off: int, role: str) -> None:
        """Record this process as the ring's ``role``; refuse if another live process holds it."""
        pid, start = self._word(pid_off), self._word(pid_off + 8)
        if pid not in (0, os.getpid()) and _alive(pid, start):
            raise RingError(f"ring {self.name} already has a live {role} (pid {pid}); one per ring")
        self._set_word(pid_off + 8, _proc_start(os.getpid()) or 0)
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
            self._u64[self._bell_off >> 3] = _pack_address(bell.getsockname())
            self._bell, self._bell_pid = bell, pid
        return self._bell

    def _ring_peer(self, peer_bell_off: int) -> None:
        """Wake the peer, which announced that it sleeps on its doorbell."""
        word = self._u64[peer_bell_off >> 3]
        if not word:  # no doorbell published: the flag is stale or garbled; the sleep is bounded
            return
        try:
            self._bell_socket().sendto(b"\1", _unpack_address(word))
        except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
            # A hint only: the bell is already ringing (queue full), or the peer is gone or lives
            # in another network namespace; its sleep is bounded and re-checks the shared words.
            pass

    def _wait_until(self, ready: Callable[[], bool], flag_off: int, timeout_s: float | None) -> bool:
        """Bounded wait for ``ready()``; False on timeout.

        Spins ``_SPIN_CHECKS`` re-checks, then announces itself at ``flag_off``, re-checks once
        more, and sleeps on the doorbell in slices of 20 µs doubling to 1 ms, re-checking after
        every wake-up. The announcement can race with the peer's publish (x86 may order our load
        of the peer's word before our flag store becomes visible), so a wake-up can be lost, but
        then the slice bounds the delay: the doorbell shortens waits, it never decides them.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        cpu = time.process_time()
        attempt = 0
        try:
            while not ready():
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                if attempt == _SPIN_CHECKS:
                    self._bell_socket()  # its address is stored before the flag that leads to it
                    self._u64[flag_off >> 3] = 1  # then loop: re-check before the first sleep
                elif attempt > _SPIN_CHECKS:
                    slice_s = _sleep_slice(attempt - _SPIN_CHECKS - 1)
                    if deadline is not None:
                        slice_s = max(0.0, min(slice_s, deadline - time.monotonic()))
                    bell = self._bell_socket()
                    if select.select([bell], [], [], slice_s)[0]:
                        self.bell_wakeups += 1
                        while True:  # drain: several rings while asleep are one wake-up
                            try:
                                bell.recv(64)
                            except BlockingIOError:
                                break
                attempt += 1
            return True
        finally:
            if attempt > _SPIN_CHECKS:
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
        if self._bell is not None:
            self._bell.close()
            self._bell = None
        for view in (self._u64, self._data, self._buf):
            view.release()
        del self._words
        try:
            self._mm.close()
        except BufferError:
            raise RingError(
                f"ring {self.name}: closed while zero-copy views into it are alive; drop records "
                "decoded from get_view() first"
            ) from None

    @property
    def writer_pid(self) -> int:
        return self._word(OFF_WRITER_PID)

    def writer_alive(self) -> bool:
        """Whether the process recorded as the writer still runs (a zombie counts as dead)."""
        return _alive(self.writer_pid, self._word(OFF_WRITER_START))


class RingWriter(_Segment):
    """The single producer. ``RingWriter(name)`` creates the segment; ``attach`` reopens it."""

    _bell_off = OFF_WRITER_BELL

    def __init__(self, name: str, capacity_bytes: int = 64 << 20) -> None:
        if capacity_bytes < 128 or capacity_bytes % 8:
            raise ValueError(f"capacity_bytes={capacity_bytes} must be a multiple of 8 and >= 128")
        final = _path(name)
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

    @classmethod
    def attach(cls, name: str) -> RingWriter:
        """Reopen an existing ring as its (new) writer, e.g. after the previous writer died."""
        self = cls.__new__(cls)
        fd = os.open(_path(name), os.O_RDWR)
        try:
            _Segment.__init__(self, os.path.basename(_path(name)), fd)
        finally:
            os.close(fd)
        self._validate_header()
        self._claim(OFF_WRITER_PID, "writer")
        self._seen_commit, self._write_pos = self._positions()
        self._next_seq = self._recover_next_seq()
        self._set_word(OFF_NEXT_SEQ, self._next_seq)
        return self

    def _recover_next_seq(self) -> int:
        # next_seq is bumped after write_pos; a writer killed between the two left it one behind.
        # last_start is set before a record's first byte, so if it lies below write_pos it is the
        # newest published record, untouched since, and its own sequence number is authoritative.
        last = self._word(OFF_LAST_START)
        if last == NO_RECORD or last >= self._write_pos:
            return self._word(OFF_NEXT_SEQ)
        kind, _, seq, _, _, _ = FRAME.unpack_from(self._data, last % self.capacity)
        if kind != KIND_RECORD:
            raise RingCorrupted(f"ring {self.name}: last_start={last} does not point at a record")
        return seq + 1

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
        return self._next_seq

    def free_bytes(self) -> int:
        """Bytes not holding uncommitted records (a record may also need the rest of the lap).

        The controller admits new episodes only while this exceeds a few records' worth."""
        return self.capacity - (self._write_pos - self._word(OFF_COMMIT_POS))

    def put(self, payload: bytes | memoryview, timeout_s: float | None = None) -> int:
        """Append one record and return its sequence number; wait for space up to ``timeout_s``."""
        return self.put_parts((payload,), timeout_s)

    def put_parts(self, parts: Sequence[bytes | memoryview], timeout_s: float | None = None) -> int:
        """Append the concatenation of ``parts`` as one record (scatter-gather, one copy each).

        Waits up to ``timeout_s`` (None: forever) for the reader to commit enough space, then
        raises ``RingFull``; a payload that could never fit raises ``RecordTooLarge`` at once.
        """
        # Hot path (~100k calls/s): locals instead of attribute lookups and method calls, one
        # mmap.write per part; the frame is packed here rather than through _write_frame.
        n = 0
        for p in parts:  # byte lengths; any C-contiguous buffer (non-contiguous fails on copy)
            n += p.nbytes if type(p) is memoryview else len(p) if type(p) is bytes else memoryview(p).nbytes
        if n > self._max_payload:
            raise RecordTooLarge(
                f"record of {n} bytes does not fit ring {self.name}: at most {self._max_payload} "
                f"bytes per record (half the capacity of {self.capacity} bytes, less a "
                f"{FRAME.size}-byte frame)"
            )
        padded = (n + 7) & ~7
        size = FRAME.size + padded
        u64, cap, mm = self._u64, self.capacity, self._mm
        w = self._write_pos
        room = cap - w % cap
        skip = room if room < size else 0  # the record goes to the start of the next lap
        # commit_pos only grows, so a cached value that already shows room is still true; the
        # shared word (a cache line the reader writes) is re-read only when it might not be.
        if w + skip + size - self._seen_commit > cap:
            self._seen_commit = u64[OFF_COMMIT_POS >> 3]
            if w + skip + size - self._seen_commit > cap:
                self._wait_for_room(w + skip + size - cap, size, timeout_s)
        seq = self._next_seq
        # last_start moves before any byte is written: while it is >= write_pos, attach() knows
        # the record there is unpublished and may already overwrite the previous one.
        u64[OFF_LAST_START >> 3] = w + skip
        if skip >= FRAME.size:
            self._write_frame(HEADER_BYTES + w % cap, KIND_WRAP, 0, seq, 0)
        w += skip
        start = HEADER_BYTES + w % cap  # frame offset in the mmap
        mm.seek(start + FRAME.size)
        write = mm.write
        for p in parts:
            write(p)
        if padded != n:
            write(_ZEROS[: padded - n])  # zero padding: the padded words sum like the zero-extended tail
        # The checksum is taken over what the ring now holds (hot in this core's cache), so a
        # copy that went wrong is caught too, not only later damage.
        first = (start + FRAME.size) >> 3
        checksum = int(_add_reduce(self._words[first : first + (padded >> 3)])) & _MASK64
        crc = zlib.crc32(_FRAME_HEAD.pack(KIND_RECORD, n, seq, checksum))
        FRAME.pack_into(mm, start, KIND_RECORD, n, seq, checksum, crc, 0)
        self._write_pos = w = w + size
        u64[OFF_WRITE_POS >> 3] = w  # publish: the reader may now read it
        self._next_seq = seq + 1
        u64[OFF_NEXT_SEQ >> 3] = seq + 1
        if u64[OFF_READER_WAITING >> 3]:  # one load per record; the reader rarely writes this line
            self._ring_peer(OFF_READER_BELL)
        return seq

    def _wait_for_room(self, commit_needed: int, size: int, timeout_s: float | None) -> None:
        """Back-pressure: wait until the reader has committed up to ``commit_needed``."""
        u64, i = self._u64, OFF_COMMIT_POS >> 3
        if not self._wait_until(lambda: u64[i] >= commit_needed, OFF_WRITER_WAITING, timeout_s):
            raise RingFull(
                f"ring {self.name}: no room for {size} bytes after {timeout_s}s "
                f"({self.free_bytes()} of {self.capacity} free; is the reader alive?)"
            )
        self._seen_commit = u64[i]  # re-read: the reader moves it

    def _write_frame(self, start: int, kind: int, n: int, seq: int, checksum: int) -> None:
        head = _FRAME_HEAD.pack(kind, n, seq, checksum)
        FRAME.pack_into(self._mm, start, kind, n, seq, checksum, zlib.crc32(head), 0)

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
        path = _path(name)
        deadline = time.monotonic() + timeout_s
        attempt = 0
        while True:
            try:
                fd = os.open(path, os.O_RDWR)
                break
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"ring {name}: segment {path} did not appear in {timeout_s}s")
                _pause(_SPIN_CHECKS + attempt)
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
        """Copy of the next record's payload, or None if none is published within ``timeout_s``."""
        found = self._next(timeout_s)
        if found is None:
            return None
        seq, start, n, checksum, end = found
        payload = self._mm[start : start + n]
        if payload_sum(payload, 0, n) != checksum:  # checked on the copy: exactly what we return
            raise RingCorrupted(f"ring {self.name}: checksum mismatch in record {seq} at {start}")
        self._deliver(seq, end)
        if self.auto_commit:
            self.commit(seq)
        return payload

    def get_view(self, timeout_s: float | None = None) -> memoryview | None:
        """Zero-copy view of the next record's payload, or None on timeout.

        The view (and anything decoded from it) is valid until the record is committed: with
        ``auto_commit`` that is the next ``get``/``get_view``/``close``, otherwise ``commit``.
        """
        found = self._next(timeout_s)
        if found is None:
            return None
        seq, start, n, checksum, end = found
        first = start >> 3  # the payload sum over whole words, and _deliver, inlined: hot path
        if int(_add_reduce(self._words[first : first + ((n + 7) >> 3)])) & _MASK64 != checksum:
            raise RingCorrupted(f"ring {self.name}: checksum mismatch in record {seq} at {start}")
        self._read_pos = end
        self.last_seq = seq
        self._delivered.append((seq, end))
        return self._buf[start : start + n]

    def _deliver(self, seq: int, end: int) -> None:
        self._read_pos = end
        self.last_seq = seq
        self._delivered.append((seq, end))

    def _next(self, timeout_s: float | None) -> tuple[int, int, int, int, int] | None:
        """Wait for the next published record and check its frame.

        Returns (seq, payload offset in the mapping, length, sum64, end position)."""
        delivered = self._delivered
        if delivered and self.auto_commit:  # the view handed out last time is now consumed
            seq, end = delivered[-1]
            delivered.clear()
            self._commit_pos = end  # _commit_through, inlined
            self._u64[OFF_COMMIT_POS >> 3] = end  # release: the writer may now reuse the space
            self._u64[OFF_COMMIT_SEQ >> 3] = seq + 1
            if self._u64[OFF_WRITER_WAITING >> 3]:
                self._ring_peer(OFF_WRITER_BELL)
        cap, r = self.capacity, self._read_pos
        # write_pos only grows, so records below the last value read are still published; the
        # shared word (a cache line the writer keeps writing) is re-read only once they are used.
        w = self._seen_write
        if w == r:
            w = self._u64[OFF_WRITE_POS >> 3]
            if w == r:
                w = self._wait_for_record(timeout_s)
                if w is None:
                    return None
            if w < r or w - self._commit_pos > cap or w & 7:
                raise RingCorrupted(
                    f"ring {self.name}: write_pos={w} read={r} commit_pos={self._commit_pos} capacity={cap}"
                )
            self._seen_write = w
        mm = self._mm
        room = cap - r % cap
        if room < FRAME.size or _KIND.unpack_from(mm, HEADER_BYTES + r % cap)[0] == KIND_WRAP:
            r += room
        start = HEADER_BYTES + r % cap
        kind, n, seq, checksum, crc, _ = FRAME.unpack_from(mm, start) if r < w else (0,) * 6
        end = r + FRAME.size + ((n + 7) & ~7)
        if kind != KIND_RECORD or end > w or start + end - r > HEADER_BYTES + cap or crc != zlib.crc32(mm[start : start + 24]):
            raise RingCorrupted(
                f"ring {self.name}: no valid record at position {r} (kind={kind:#x} length={n} "
                f"write_pos={w} capacity={cap})"
            )
        last = self.last_seq
        if last is None:
            if seq < self._min_seq:
                raise RingCorrupted(f"ring {self.name}: sequence {seq} where {self._min_seq} was expected")
        elif seq != last + 1:
            raise RingCorrupted(f"ring {self.name}: sequence {seq} where {last + 1} was expected")
        return seq, start + FRAME.size, n, checksum, end

    def _wait_for_record(self, timeout_s: float | None) -> int | None:
        """Wait until write_pos moves past the read position; the new write_pos, or None."""
        u64, i, r = self._u64, OFF_WRITE_POS >> 3, self._read_pos
        if not self._wait_until(lambda: u64[i] != r, OFF_READER_WAITING, timeout_s):
            return None
        return u64[i]

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
        u64[OFF_COMMIT_POS >> 3] = end  # release: the writer may now reuse the space
        u64[OFF_COMMIT_SEQ >> 3] = seq + 1
        if u64[OFF_WRITER_WAITING >> 3]:
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
