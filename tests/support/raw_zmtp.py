"""A hand-driven ZMTP 3.0 peer for the door's tests: the attacker who writes bytes libzmq's own
DEALER never would (partial frames, oversized headers, raw idle sockets, a never-ending message),
and a DEALER whose connection closing can be seen (libzmq's reconnects behind the application's
back); and the memory sampler the tests bound the gateway's process with.

    greeting := %xFF 8*%x00 %x7F %x03 %x00 "NULL" 16*%x00 as-server(1) 31*%x00   (64 bytes)
    frame    := flags(1: 1 MORE, 2 LONG, 4 COMMAND) size(1 | 8, big-endian) body
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Self

GREETING = b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + bytes(31)


def frame_header(size: int, more: bool = False, command: bool = False) -> bytes:
    flags = (1 if more else 0) | (4 if command else 0)
    return bytes((flags, size)) if size < 256 else bytes((flags | 2,)) + size.to_bytes(8, "big")


def command(name: bytes, data: bytes = b"") -> bytes:
    body = bytes((len(name),)) + name + data
    return frame_header(len(body), command=True) + body


READY = command(b"READY", b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER")


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return data


def handshake(path: str) -> socket.socket:
    """A Unix socket to ``path`` past the greeting exchange; the caller sends READY (with whatever
    follows it) next. libzmq wants the peer's greeting read before READY arrives."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(GREETING)
    _read_exactly(sock, 64)
    return sock


class RawDealer:
    """A blocking DEALER: ``send_raw(bytes)``, ``send(payload)``, ``recv() -> payload`` (answering
    the ROUTER's PINGs on the way, so the heartbeat does not close it); ``recv`` raises
    ConnectionError once the ROUTER has closed the connection."""

    def __init__(self, address: str, timeout_s: float = 30.0) -> None:
        self.sock = handshake(address[len("ipc://") :])
        self.sock.settimeout(timeout_s)
        self.sock.sendall(READY)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, payload: bytes) -> None:
        self.sock.sendall(frame_header(len(payload)) + payload)

    def recv(self) -> bytes:
        while True:
            flags, size = _read_exactly(self.sock, 2)
            if flags & 2:
                size = int.from_bytes(bytes((size,)) + _read_exactly(self.sock, 7), "big")
            body = _read_exactly(self.sock, size)
            if not flags & 4:
                return body
            name = body[1 : 1 + body[0]]
            if name == b"PING":  # ttl(2) context: answer PONG with the context
                self.sock.sendall(command(b"PONG", body[1 + body[0] + 2 :]))

    def close(self) -> None:
        self.sock.close()


def endless_message(path: str, wire_bytes: int, first: bytes | None = None) -> tuple[int, bool]:
    """The never-ending message: READY, ``first`` as a one-frame message if given (a request the
    gateway keeps in flight), then empty frames flagged MORE (2 bytes on the wire, 64 in libzmq's
    pipe) until ``wire_bytes`` are written or the door cuts the connection. Returns (bytes
    written, cut)."""
    sock = handshake(path)
    sock.sendall(READY + (frame_header(len(first)) + first if first is not None else b""))
    chunk = frame_header(0, more=True) * (1 << 15)
    sent = 0
    try:
        while sent < wire_bytes:
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        return sent, True
    finally:
        sock.close()
    return sent, False


def anon_bytes(pid: int | str = "self") -> int:
    """A process's resident memory less its shared pages (what the door's memory guard watches)."""
    with open(f"/proc/{pid}/statm") as f:
        _, resident, shared = f.read().split()[:3]
    return (int(resident) - int(shared)) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """This process's peak ``anon_bytes`` while the ``with`` block runs, sampled from a thread of
    its own (the loop that runs the door's guard may be the one that is late)."""

    def __enter__(self) -> Self:
        self.peak = anon_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, anon_bytes())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
