"""Keeping other episodes' session keys out of a forked episode's memory.

A session key (``areal/gateway/core.py``: ``"sk-areal-" + secrets.token_urlsafe(24)``) is the
only credential an episode holds. Whoever has one can, until its session closes: post chat
completions, responses and messages into that session (POST /v1/chat/completions, /v1/responses,
/v1/messages: recorded as that episode's interactions and trained on), set the rewards of its
interactions (POST /v1/rewards), read its interactions' ids, logprobs and rewards
(GET /v1/interactions/{id}) and list the model (GET /v1/models); the connection's budgets are
charged to that session (areal/gateway/routes.py). A closed key is useless: ``close_session``
removes the session and ``session_for`` answers 401 for any key not live (an expired one too),
and the controller closes every episode's session as soon as its outcome arrives
(areal/controller/loop.py). So a key is worth stealing while its episode runs; a finished episode's
key in another's memory breaks the invariant below but opens nothing, as long as the caller of
``Zygote.run_episode`` closes the session when it returns.

A forked episode inherits the zygote's whole address space, so any key still in the zygote's
memory at fork time (a frame not yet handled, a decoded message, a freed buffer that was never
cleared) could be read by the agent. Keys reach the zygote both ways:

    controller ──stdin──► ControlBuffer (one fixed bytearray, never reallocated)
                            frames decoded from a memoryview, no copies
                            a consumed frame's bytes are zeroed before the space is reused
      zygote, at handover: the frame is copied into the slot's own bytearray and written to its
                           spawn pipe, then zero(); wipe_str(spawn.api_key) (the decoded copy)
    episode ──result pipe──► the slot's ControlBuffer (never a bytes object, never decoded here)
      its log file (the agent's stdout and stderr, anything it printed) is never read here
      reporter (run_apart: a child per batch of finished episodes, never forked from): decodes
                           each result, reads each log tail, encodes the outcomes ──pipe──►
                           the zygote's ControlBuffer ──► controller; both buffers zeroed at once
      slot, after fork:    ControlBuffer.wipe() of the control buffer, of every other slot's
                           result and of the reporter's; wipe_str() of every pending key;
                           zero() of every other slot's unwritten frame; its own key arrives
                           by its pipe, and mask() takes it out of the result it sends back

The zygote never turns what an episode sent back into Python objects: an outcome's error text
holds whatever the agent wrote, its own key included, and CPython cannot be made to forget a
decoded str (the UTF-8 decoder widens non-ASCII text through intermediate buffers that are freed
as they are, and encoding caches a second UTF-8 copy), so every later fork would inherit it.
Checked and holding no other key: the SDK warm-up (its key is "warm"), the relay, httpx and h11
(started in the slot after its fork: they see its own key only), the zygote's logging (no
episode bytes), msgspec's string cache (decoded dict keys of at most 32 ASCII characters only;
a key is a 41-character value).

Invariant: when an episode process starts user code, its memory holds no session key but its
own. A warm slot is forked before its spawn exists, so it holds none until its frame arrives.
Not covered: keys in the kernel's pipe buffers and in the log files on disk (never mapped into
a child; the log directory is masked from episodes by the readonly_root layer, so without that
layer an episode can read other episodes' logs), a key an agent sends back in another form than
its own bytes (``mask`` and ``SESSION_KEY`` only keep honest mistakes out of the controller's
records; the invariant does not rest on them), and copies made by code other than the zygote's
control and result paths (there are none today).
"""

from __future__ import annotations

import ctypes
import os
import re
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable

from areal.protocol import FRAME_HEADER

INITIAL_BYTES = 1 << 20
# The gateway's key format (areal/gateway/core.py, Gateway.open_session): masked in the log tails
# the zygote's reporter attaches to outcomes, where the sandbox knows no key to mask verbatim.
SESSION_KEY = re.compile(r"sk-areal-[A-Za-z0-9_-]{32}")
MIN_SECRET_BYTES = 16  # shortest session key the zygote accepts (``mask`` needs it)


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
            n = os.readv(fd, [view[self.end :]])
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
            self.buf[live : self.end] = bytes(self.end - live)
        self.start, self.end = 0, live

    def frames(self) -> list[memoryview]:
        """Complete frames not yet consumed, as views; call ``consume`` once done with them."""
        out, pos, view = [], self.start, memoryview(self.buf)
        while self.end - pos >= 4:
            (n,) = FRAME_HEADER.unpack_from(self.buf, pos)
            if self.end - pos - 4 < n:
                break
            out.append(view[pos + 4 : pos + 4 + n])
            pos += 4 + n
        self._pending = pos
        return out

    def consume(self) -> None:
        """Zero the frames returned by the last ``frames`` call and drop them."""
        self.buf[self.start : self._pending] = bytes(self._pending - self.start)
        self.start = self._pending
        if self.start == self.end:
            self.start = self.end = 0

    def wipe(self) -> None:
        """Zero everything ever written (in a forked episode: what was meant for others). Only
        ``[0, end)`` can hold bytes (consumed and moved ones are zeroed), so only that is written:
        a fork's copy-on-write pages stay shared."""
        if self.end:
            ctypes.memset(_address(self.buf), 0, self.end)
        self.start = self.end = 0


def mask(buf: bytearray, secret: bytes) -> int:
    """Overwrite every occurrence of ``secret`` in ``buf`` with ``*`` in place; returns how many.
    Same length, so an encoded message stays valid (a msgpack string keeps its length)."""
    if len(secret) < MIN_SECRET_BYTES:  # a short one could match an encoded message's own bytes
        raise ValueError(f"mask needs a secret of at least {MIN_SECRET_BYTES} bytes, got {len(secret)}")
    n, at, stars = 0, buf.find(secret), b"*" * len(secret)
    while at != -1:
        buf[at : at + len(secret)] = stars
        n += 1
        at = buf.find(secret, at + len(secret))
    return n


def run_apart(work: Callable[[int], None], into: ControlBuffer, limit_s: float) -> str:
    """Run ``work(fd)`` in a forked child that writes its output to ``fd`` and exits; read that
    output into ``into`` (zeroed as it is consumed). What the child decodes dies with it: this
    is how a process that others are forked from handles episode bytes without keeping them.

    Returns "" once the child exited 0, else what went wrong; past ``limit_s`` it is killed.
    Blocks the caller until then.
    """
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as e:  # EAGAIN, ENOMEM: the caller goes on without the child's output
        os.close(r)
        os.close(w)
        return f"could not be started: {e!r}"
    if pid == 0:
        code = 1
        try:
            os.close(r)
            signal.set_wakeup_fd(-1)
            work(w)
            code = 0
        except BaseException:  # process boundary: the parent says it failed; the why goes to stderr
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(w)
    try:
        deadline = time.monotonic() + limit_s
        poll = select.poll()  # not select.select: the caller's fds may pass FD_SETSIZE
        poll.register(r, select.POLLIN)
        while True:
            if not poll.poll(max(0.0, deadline - time.monotonic()) * 1000):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return f"took longer than {limit_s}s and was killed"
            if not into.read_from(r):
                break
    finally:
        os.close(r)
    status = os.waitpid(pid, 0)[1]
    return "" if status == 0 else f"failed (wait status {status}; its traceback is on stderr)"
