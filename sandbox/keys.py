"""Keeping other episodes' session keys out of a forked episode's memory.

Every SpawnEpisode the zygote reads carries one session key. A forked episode inherits the
zygote's whole address space, so any key still in the zygote's memory at fork time (a frame
not yet handled, a decoded message, a freed buffer that was never cleared) could be read by
the agent and used to post requests into another episode's session. Therefore:

    controller ──stdin──► ControlBuffer (one fixed bytearray, never reallocated)
                            frames decoded from a memoryview, no copies
                            a consumed frame's bytes are zeroed before the space is reused
      zygote, at handover: the frame is copied into the slot's own bytearray and written to its
                           spawn pipe, then zero(); wipe_str(spawn.api_key) (the decoded copy)
      slot, after fork:    ControlBuffer.wipe() + wipe_str() of every pending key + zero() of
                           every other slot's unwritten frame; its own key arrives by its pipe

Invariant: when an episode process starts user code, its memory holds no session key but its
own. A warm slot is forked before its spawn exists, so it holds none until its frame arrives. Not covered: keys in the kernel's pipe buffer (never mapped into the child) and copies
made by code other than the zygote's control path (there are none today).
"""

from __future__ import annotations

import ctypes
import os
import sys

from areal.protocol import FRAME_HEADER

INITIAL_BYTES = 1 << 20


def wipe_str(s: str) -> None:
    """Overwrite the characters of an ASCII ``str`` in place with NULs.

    Strings are immutable by contract; this breaks the contract on purpose for a secret that
    must not outlive its use. Only for strings nothing else references (a str just decoded by
    msgspec from a buffer is a fresh object unless it is shorter than 2 characters).
    """
    if len(s) < 2:  # CPython shares "" and every 1-character str: wiping one would corrupt all
        return
    if not s.isascii():
        raise ValueError("wipe_str handles compact ASCII strings only")
    header = sys.getsizeof(s) - len(s) - 1  # compact ASCII: the characters follow the header
    ctypes.memset(id(s) + header, 0, len(s))


def _address(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def zero(buf: bytearray) -> None:
    """Overwrite a bytearray with NULs in place (no copy, no reallocation)."""
    if buf:
        ctypes.memset(_address(buf), 0, len(buf))


class ControlBuffer:
    """Length-prefixed frames read from a file descriptor into one buffer that is zeroed as it
    is consumed (a growing ``bytearray`` would leave copies behind in freed memory)."""

    def __init__(self, size: int = INITIAL_BYTES) -> None:
        self.buf = bytearray(size)
        self.start = self.end = 0

    def read_from(self, fd: int) -> int:
        """One ``readv`` into the free tail; returns the byte count (0 at EOF)."""
        if self.end == len(self.buf):
            self._make_room()
        view = memoryview(self.buf)
        try:
            n = os.readv(fd, [view[self.end:]])
        finally:
            view.release()
        self.end += n
        return n

    def _make_room(self) -> None:
        # ctypes.memmove, not slice assignment: a slice would make a temporary copy of the keys
        live = self.end - self.start
        if self.start == 0:  # a frame larger than the buffer: move to a bigger one, zero the old
            bigger = bytearray(2 * len(self.buf))
            ctypes.memmove(_address(bigger), _address(self.buf), live)
            zero(self.buf)
            self.buf = bigger
        else:  # slide the unconsumed bytes to the front, zero what they left behind
            ctypes.memmove(_address(self.buf), _address(self.buf) + self.start, live)
            self.buf[live:self.end] = bytes(self.end - live)
        self.start, self.end = 0, live

    def frames(self) -> list[memoryview]:
        """Complete frames not yet consumed, as views; call ``consume`` once done with them."""
        out, pos, view = [], self.start, memoryview(self.buf)
        while self.end - pos >= 4:
            (n,) = FRAME_HEADER.unpack_from(self.buf, pos)
            if self.end - pos - 4 < n:
                break
            out.append(view[pos + 4:pos + 4 + n])
            pos += 4 + n
        self._pending = pos
        return out

    def consume(self) -> None:
        """Zero the frames returned by the last ``frames`` call and drop them."""
        self.buf[self.start:self._pending] = bytes(self._pending - self.start)
        self.start = self._pending
        if self.start == self.end:
            self.start = self.end = 0

    def wipe(self) -> None:
        """Zero everything (in a forked episode: frames meant for later episodes)."""
        zero(self.buf)
        self.start = self.end = 0
