"""Shared-memory trajectory ring: one producer (the controller), one consumer (a trainer rank).

The segment is a plain file in ``/dev/shm`` mapped with ``mmap`` by both processes. We do not use
``multiprocessing.shared_memory``: on Python 3.11 its resource tracker unlinks segments that a
process merely attached to. The writer creates the file under a temporary name, sizes it,
pre-faults every page (first writes into fresh shared memory run at ~1.8 GB/s, warm ones at
7-11 GB/s), writes the header with the magic last, then links it to its final name, so a reader
never sees a half-initialised segment.

Layout (all integers little-endian; every header word on its own 64-byte cache line)::

    offset 0      magic "AREALRNG" u64 | layout version u32 | capacity u64 | writer pid u64
    offset 64     write_pos   u64   monotonic byte offset, 8-aligned; the ONLY publish point
    offset 128    read_pos    u64   monotonic byte offset, 8-aligned; committed by the reader
    offset 192    next_seq    u64   sequence number of the next record (written after publish)
    offset 256    last_start  u64   start of the newest record (written before its first byte)
    offset 4096   data[capacity]    record i lives at data[pos % capacity]

    record frame (24 bytes) + payload, padded to a multiple of 8:
    +-----------+-----------+---------+-----------+----------+----------------------+
    | kind u32  | length u32| seq u64 | crc32 u32 | rsvd u32 | payload ... pad to 8 |
    +-----------+-----------+---------+-----------+----------+----------------------+
    kind = REC1 (a record) or WRAP (rest of this lap is unused; continue at the next lap).
    When fewer than 24 bytes remain before the end, the wrap is implicit (no marker fits).

Record state machine (a byte range of data, seen from both sides)::

    FREE --writer: last_start, payload, then frame--> WRITTEN (invisible: beyond write_pos)
    WRITTEN --writer: write_pos += size, then next_seq--> PUBLISHED (reader may read it)
    PUBLISHED --reader: copy, verify crc, then read_pos += size--> FREE (writer may reuse it)

Invariants: ``read_pos <= write_pos <= read_pos + capacity``; every byte in
``[read_pos, write_pos)`` belongs to a complete record whose checksum matches and whose sequence
numbers are consecutive. Each side writes only its own position, so no locks are needed; waits
sleep in bounded, growing steps and re-read the other side's position from shared memory.

What is covered:
  * a writer killed at any instant (SIGKILL included): nothing it published is lost, nothing
    half-written is ever returned; ``RingWriter.attach`` resumes with consecutive sequence
    numbers (``next_seq`` is recovered from the frame at ``last_start`` when the writer died
    between publishing and bumping it);
  * a reader killed at any instant: a new ``RingReader`` resumes at the committed ``read_pos``;
    a record copied but not yet committed is delivered again (at-least-once);
  * corruption of a published record or of the positions: ``RingCorrupted``, never bad data.
What is not covered:
  * more than one writer or reader per ring (one ring per trainer rank; fan out above this);
  * weakly ordered CPUs (ARM): CPython gives no store-ordering guarantee across processes; the
    publish order relies on x86's total store order and aligned 8-byte stores being atomic;
  * a reader that is dead forever: the writer blocks in ``put`` and raises ``RingFull``.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import time
import zlib

SHM_DIR = "/dev/shm"
MAGIC = int.from_bytes(b"AREALRNG", "little")
LAYOUT_VERSION = 1
HEADER_BYTES = 4096  # one page, so the data region is page aligned
# Byte offsets of the header words; each on its own cache line so the two sides never share one.
OFF_MAGIC, OFF_VERSION, OFF_CAPACITY, OFF_WRITER_PID = 0, 8, 16, 24
OFF_WRITE_POS, OFF_READ_POS, OFF_NEXT_SEQ, OFF_LAST_START = 64, 128, 192, 256

FRAME = struct.Struct("<IIQII")  # kind, payload length, seq, crc32(payload), reserved
KIND_RECORD = int.from_bytes(b"REC1", "little")
KIND_WRAP = int.from_bytes(b"WRAP", "little")
NO_RECORD = (1 << 64) - 1  # last_start before the first record

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


def _check_name(name: str) -> str:
    # Names are single path components under /dev/shm; a leading '.' is reserved for temp files.
    if not _NAME_RE.fullmatch(name) or len(name) > 200:
        raise ValueError(f"ring name {name!r} must match {_NAME_RE.pattern} (at most 200 chars)")
    return name


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, _check_name(name.lstrip("/")))


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def _pause(attempt: int) -> None:
    """One bounded wait step: spin first, then sleep 20 µs doubling up to 1 ms."""
    if attempt >= _SPIN_CHECKS:
        time.sleep(min(_MAX_SLEEP_S, _MIN_SLEEP_S * (1 << min(attempt - _SPIN_CHECKS, 10))))


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

    def _validate_header(self) -> None:
        if self._word(OFF_MAGIC) != MAGIC:
            raise RingCorrupted(f"ring {self.name}: bad magic {self._word(OFF_MAGIC):#x}")
        version = self._word(OFF_VERSION) & 0xFFFFFFFF
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

    def _positions(self) -> tuple[int, int]:
        """(read_pos, write_pos) after checking the invariants that bind them."""
        r, w = self._word(OFF_READ_POS), self._word(OFF_WRITE_POS)
        if r > w or w - r > self.capacity or (r | w) & 7:
            raise RingCorrupted(f"ring {self.name}: read_pos={r} write_pos={w} capacity={self.capacity}")
        return r, w

    def _unmap(self) -> None:
        # Every exported view must be released before the mmap can close.
        for view in (self._u64, self._data, self._buf):
            view.release()
        self._mm.close()

    @property
    def writer_pid(self) -> int:
        return self._word(OFF_WRITER_PID)


class RingWriter(_Segment):
    """The single producer. ``RingWriter(name)`` creates the segment; ``attach`` reopens it."""

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
            self._set_word(OFF_WRITER_PID, os.getpid())
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
        self._write_pos = self._positions()[1]
        self._next_seq = self._recover_next_seq()
        self._set_word(OFF_NEXT_SEQ, self._next_seq)
        self._set_word(OFF_WRITER_PID, os.getpid())
        return self

    def _recover_next_seq(self) -> int:
        # next_seq is bumped after write_pos; a writer killed between the two left it one behind.
        # last_start is set before a record's first byte, so if it lies below write_pos it is the
        # newest published record, untouched since, and its own sequence number is authoritative.
        last = self._word(OFF_LAST_START)
        if last == NO_RECORD or last >= self._write_pos:
            return self._word(OFF_NEXT_SEQ)
        kind, _, seq, _, _ = FRAME.unpack_from(self._data, last % self.capacity)
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
        return min((self.capacity // 2) & ~7, 0xFFFFFFF8) - FRAME.size

    def free_bytes(self) -> int:
        """Bytes not holding unread records (a record may also need the rest of the lap)."""
        return self.capacity - (self._write_pos - self._word(OFF_READ_POS))

    def put(self, payload: bytes | memoryview, timeout_s: float | None = None) -> int:
        """Append one record and return its sequence number; wait for space up to ``timeout_s``."""
        view = memoryview(payload)
        if not view.c_contiguous:
            raise ValueError("payload must be a C-contiguous buffer")
        view = view.cast("B")
        n = len(view)
        if n > self.max_payload:
            raise RecordTooLarge(
                f"record of {n} bytes does not fit ring {self.name}: at most {self.max_payload} "
                f"bytes per record (half the capacity of {self.capacity} bytes, less a "
                f"{FRAME.size}-byte frame)"
            )
        size = FRAME.size + _pad8(n)
        crc = zlib.crc32(view)  # before waiting: overlaps the checksum with the reader's progress
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        attempt = 0
        while True:
            w = self._write_pos
            room = self.capacity - w % self.capacity
            skip = room if room < size else 0  # the record goes to the start of the next lap
            read_pos = self._word(OFF_READ_POS)  # re-read every time: the reader moves it
            if w + skip + size - read_pos <= self.capacity:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise RingFull(
                    f"ring {self.name}: no room for {size} bytes after {timeout_s}s "
                    f"({self.capacity - (w - read_pos)} of {self.capacity} free)"
                )
            _pause(attempt)
            attempt += 1
        seq = self._next_seq
        # last_start moves before any byte is written: while it is >= write_pos, attach() knows
        # the record there is unpublished and may already overwrite the previous one.
        self._set_word(OFF_LAST_START, w + skip)
        if skip >= FRAME.size:
            FRAME.pack_into(self._data, w % self.capacity, KIND_WRAP, 0, seq, 0, 0)
        w += skip
        off = w % self.capacity
        self._data[off + FRAME.size : off + FRAME.size + n] = view
        FRAME.pack_into(self._data, off, KIND_RECORD, n, seq, crc, 0)
        self._write_pos = w + size
        self._set_word(OFF_WRITE_POS, self._write_pos)  # publish: the reader may now read it
        self._next_seq = seq + 1
        self._set_word(OFF_NEXT_SEQ, self._next_seq)
        return seq

    def close(self, unlink: bool = False) -> None:
        """Unmap; with ``unlink`` also remove the segment (unread records are then lost)."""
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
    """The single consumer: attaches to a ring (waiting for it to appear) and reads records."""

    def __init__(self, name: str, timeout_s: float = 30) -> None:
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
        self._read_pos = self._positions()[0]
        self.last_seq: int | None = None  # sequence number of the record most recently returned

    def get(self, timeout_s: float | None = None) -> bytes | None:
        """Copy of the next record's payload, or None if none is published within ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        attempt = 0
        while self._word(OFF_WRITE_POS) == self._read_pos:  # re-read: the writer moves it
            if deadline is not None and time.monotonic() >= deadline:
                return None
            _pause(attempt)
            attempt += 1
        _, w = self._positions()
        r = self._read_pos
        room = self.capacity - r % self.capacity
        if room < FRAME.size or FRAME.unpack_from(self._data, r % self.capacity)[0] == KIND_WRAP:
            r += room
        off = r % self.capacity
        kind, n, seq, crc, _ = FRAME.unpack_from(self._data, off) if r < w else (0, 0, 0, 0, 0)
        size = FRAME.size + _pad8(n)
        if kind != KIND_RECORD or off + size > self.capacity or r + size > w:
            raise RingCorrupted(
                f"ring {self.name}: no valid record at position {r} (kind={kind:#x} length={n} "
                f"write_pos={w} capacity={self.capacity})"
            )
        if self.last_seq is not None and seq != self.last_seq + 1:
            raise RingCorrupted(f"ring {self.name}: sequence {seq} follows {self.last_seq}")
        payload = bytes(self._data[off + FRAME.size : off + FRAME.size + n])
        if zlib.crc32(payload) != crc:  # checked on the copy: exactly what the caller receives
            raise RingCorrupted(f"ring {self.name}: checksum mismatch in record {seq} at position {r}")
        self._read_pos = r + size
        self._set_word(OFF_READ_POS, self._read_pos)  # release: the writer may reuse the space
        self.last_seq = seq
        return payload

    def writer_alive(self) -> bool:
        """Whether the process recorded as the writer still exists (a zombie counts as alive)."""
        try:
            os.kill(self.writer_pid, 0)  # signal 0: existence check only (EPERM still means alive)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def close(self) -> None:
        self._unmap()

    def __enter__(self) -> RingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
