"""Shared-memory ring: the segment's byte layout, the record frame and its checksum, and naming.

Both ends of the ring (``areal.ring.buffer``: ``RingWriter``, ``RingReader``) share what is defined
here; the record state machine, waiting and crash handling are described there. This module
holds no state: constants, the frame's checksum, segment names, and the start-up reclaim of
segments left by crashed runs.

Segment: a plain file in ``/dev/shm`` mapped with ``mmap`` by both processes (not
``multiprocessing.shared_memory``: on Python 3.11 its resource tracker unlinks segments that a
process merely attached to). All integers are little-endian u64 words; each side's words sit on
their own cache lines, so a side's stores never invalidate the line the other side writes::

    offset 0     magic "AREALRNG" | layout version | capacity | (reserved)      set at creation
    offset 64    write_pos    monotonic byte offset, 8-aligned; the writer's ONLY publish point
    offset 128   next_seq     sequence number of the next record (hint, written after publish)
    offset 192   last_start   start of the newest record (written before its first byte)
    offset 256   writer_pid | writer_start | writer_waiting | writer_bell   (start = /proc
                 starttime, so pid reuse is seen; waiting/bell: the doorbell)
    offset 320   commit_pos   monotonic byte offset, 8-aligned; the reader's ONLY release point
    offset 384   commit_seq   sequence number of the first uncommitted record (hint)
    offset 448   reader_pid | reader_start | reader_waiting | reader_bell
    offset 4096  data[capacity]    byte position p lives at data[p % capacity]

Record frame (layout version 4): three u64 words, then the payload zero-padded to 8 bytes::

    +-------------+--------------------------+---------+----------------------+
    | digest u64  | kind u32 | length u32    | seq u64 | payload, zero pad    |
    +-------------+--------------------------+---------+----------------------+
    word 0          word 1                     word 2    words 3..
    digest = xxh3_64(frame bytes 8..24 + payload + padding): one hash checks the frame too.
    kind = REC2 (a record) or WRAP (the rest of this lap is unused; continue at the next lap).
    When fewer than 24 bytes remain before the end of the lap, the wrap is implicit.

Checksum choice: zlib.crc32 over a record costs more than the whole transfer; a numpy u64
wrap-around sum (layout 3) is cheap per byte but pays a ufunc's fixed cost per call, and it
misses permuted or cancelling words; XXH3-64 (the ``xxhash`` package, whose wheel uses the
widest SIMD the CPU has) has a small fixed cost, runs near memory speed and is a real hash.
Covering the frame's kind/length/seq words with the same call replaces layout 3's separate
crc32 of the frame. Detected: a torn write (an unwritten or stale tail differs from what was hashed),
truncation or a wrong length, a record overwritten by a later lap, any change of the frame or
the payload, damaged padding. Not detected: a collision of a 64-bit hash (2**-64 per damaged
record; the ring defends against crashes and bugs, not an adversary).

Native writer path: ``areal.ring._ringcopy`` (C, built by ``pip install -e .`` from setup.py; the
hash in ``areal/ring/native/_xxh3.h``) runs the writer's whole fast path in one call (``Writer.put`` and
``Writer.put_struct``, see ``areal.ring.buffer``) and computes the same XXH3-64 while it copies
(each 1 KiB block is hashed from the registers it was copied through, AVX2 where the CPU has
it), so the record's bytes are read once instead of twice (``mmap.write``, then ``xxhash``). It
writes the same bytes and the same digest (tests/unit/ring/test_ring_native.py), so either writer pairs
with any reader. Hashing alone, the ``xxhash`` wheel is the faster of the two, so the reader
keeps it; the C kernel wins only because the copy rides along (figures in benchmarks/README.md). ``NATIVE`` is
the module, or None where it was not built (no C compiler) or was built
from another layout (its ``LAYOUT`` differs from ``_NATIVE_LAYOUT``): then the ring uses the
pure-Python path and one warning is logged at import.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import time

import xxhash

SHM_DIR = "/dev/shm"
MAGIC = int.from_bytes(b"AREALRNG", "little")
LAYOUT_VERSION = 4  # 4: 24-byte frame, XXH3-64 over frame words 1-2 + payload + padding
HEADER_BYTES = 4096  # one page, so the data region is page aligned
# Byte offsets of the header words; each side's words on its own cache lines.
OFF_MAGIC, OFF_VERSION, OFF_CAPACITY = 0, 8, 16
OFF_WRITE_POS, OFF_NEXT_SEQ, OFF_LAST_START, OFF_WRITER_PID, OFF_WRITER_START = 64, 128, 192, 256, 264
OFF_COMMIT_POS, OFF_COMMIT_SEQ, OFF_READER_PID, OFF_READER_START = 320, 384, 448, 456
# Per side, on its pid line (which the peer reads once per record and the owner writes only
# around a sleep): WAITING is 1 while it sleeps on its doorbell, BELL the doorbell's address.
OFF_WRITER_WAITING, OFF_WRITER_BELL, OFF_READER_WAITING, OFF_READER_BELL = 272, 280, 464, 472

FRAME = struct.Struct("<QIIQ")  # digest, kind, payload length, seq
FRAME_WORDS = FRAME.size >> 3  # frames and payloads are whole u64 words
# Byte offsets inside a frame.
FRAME_OFF_DIGEST, FRAME_OFF_KIND, FRAME_OFF_LENGTH, FRAME_OFF_SEQ = 0, 8, 12, 16
DIGEST_FROM = 8  # the digest covers the frame from this byte through the padded payload
KIND_RECORD = int.from_bytes(b"REC2", "little")
KIND_WRAP = int.from_bytes(b"WRAP", "little")
NO_RECORD = (1 << 64) - 1  # last_start before the first record
MASK32 = (1 << 32) - 1
ZEROS = bytes(8)  # padding source

digest = xxhash.xxh3_64_intdigest  # (buffer) -> int; accepts any contiguous buffer, no copy

# The layout the C writer was compiled with; a build from another layout is not used.
_NATIVE_LAYOUT = {
    "version": LAYOUT_VERSION,
    "header_bytes": HEADER_BYTES,
    "off_write_pos": OFF_WRITE_POS,
    "off_next_seq": OFF_NEXT_SEQ,
    "off_last_start": OFF_LAST_START,
    "off_commit_pos": OFF_COMMIT_POS,
    "frame_bytes": FRAME.size,
    "kind_record": KIND_RECORD,
    "kind_wrap": KIND_WRAP,
}
try:
    from areal.ring import _ringcopy as NATIVE
except ImportError:  # an optional extension: a machine without a C compiler still runs the ring
    NATIVE = None
    logging.getLogger(__name__).warning(
        "areal.ring._ringcopy is not built (no C compiler at install?): the shared-memory ring uses its "
        "pure-Python writer, ~4 us more per 8k-token record; `pip install --no-deps -e .` builds it"
    )
else:
    if getattr(NATIVE, "LAYOUT", None) != _NATIVE_LAYOUT:  # a stale build from an older layout or API
        NATIVE = None
        logging.getLogger(__name__).warning(
            "areal.ring._ringcopy was built from another ring layout or API: the ring uses its pure-Python "
            "writer; rebuild it with `pip install --no-deps -e .`"
        )

_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
SPIN_CHECKS = 50  # re-checks before the first sleep while waiting for a segment to appear
SPIN_S = 100e-6  # a ring side spins (yielding) this long before it sleeps: 10 records at 8k tokens
_MIN_SLEEP_S, _MAX_SLEEP_S = 20e-6, 1e-3


class RingError(Exception):
    """Base class of the ring's errors."""


class RingCorrupted(RingError):
    """The segment's contents break the ring's invariants; no record past this point is trusted."""


class RingFull(RingError, TimeoutError):
    """``put`` waited ``timeout_s`` and the reader did not free enough space."""


class RecordTooLarge(RingError, ValueError):
    """The payload can never fit, however empty the ring is."""


def record_bytes(n: int) -> int:
    """Bytes a record with an ``n``-byte payload takes in the ring: frame + payload padded to 8."""
    return FRAME.size + ((n + 7) & ~7)


def ring_name(run_id: str, rank: int) -> str:
    """Name of the ring feeding trainer ``rank`` of run ``run_id``: ``areal-<run_id>-r<rank>``."""
    return check_name(f"areal-{run_id}-r{rank}")


def unlink_ring(name: str) -> None:
    """Remove a segment by name; a missing segment is not an error."""
    try:
        os.unlink(segment_path(name))
    except FileNotFoundError:
        pass


def reclaim_stale(prefix: str = "areal-") -> list[str]:
    """Unlink the segments named ``prefix*`` whose writer and reader are both dead; call at start.

    Also removes creation temp files (``.<prefix>*.<pid>.tmp``) of dead creators. Files whose
    header is not a ring's are left alone. Returns the names removed.
    """
    removed: list[str] = []
    for entry in sorted(os.listdir(SHM_DIR)):
        path = os.path.join(SHM_DIR, entry)
        if entry.startswith("." + prefix) and entry.endswith(".tmp"):
            pid = entry[: -len(".tmp")].rsplit(".", 1)[-1]
            if pid.isdigit() and not alive(int(pid), None):
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

        if not alive(word(OFF_WRITER_PID), word(OFF_WRITER_START)) and not alive(word(OFF_READER_PID), word(OFF_READER_START)):
            _remove(path, removed, entry)
    return removed


def _remove(path: str, removed: list[str], entry: str) -> None:
    try:
        os.unlink(path)
        removed.append(entry)
    except FileNotFoundError:
        pass


def proc_start(pid: int) -> int | None:
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


def alive(pid: int, start: int | None) -> bool:
    """Whether ``pid`` is a live process; with ``start``, also that it is the same process."""
    if pid == 0:
        return False
    now = proc_start(pid)
    return now is not None and (start is None or now == start)


def check_name(name: str) -> str:
    # Names are single path components under /dev/shm; a leading '.' is reserved for temp files.
    if not _NAME_RE.fullmatch(name) or len(name) > 200:
        raise ValueError(f"ring name {name!r} must match {_NAME_RE.pattern} (at most 200 chars)")
    return name


def segment_path(name: str) -> str:
    return os.path.join(SHM_DIR, check_name(name.lstrip("/")))


def pause(attempt: int) -> None:
    """One bounded wait step: spin first, then sleep 20 us doubling up to 1 ms."""
    if attempt >= SPIN_CHECKS:
        time.sleep(sleep_slice(attempt - SPIN_CHECKS))


def sleep_slice(attempt: int) -> float:
    return min(_MAX_SLEEP_S, _MIN_SLEEP_S * (1 << min(attempt, 10)))


def pack_address(address: bytes) -> int:
    """An autobound abstract socket address (``\\0`` + 5 hex digits) as one header word."""
    if len(address) > 7:
        raise RingError(f"doorbell address {address!r} longer than 7 bytes")
    return len(address) | int.from_bytes(address, "little") << 8


def unpack_address(word: int) -> bytes:
    return (word >> 8).to_bytes(word & 0xFF, "little")
