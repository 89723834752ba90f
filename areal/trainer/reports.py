"""The trainer's report socket, both ends: the ranks PUSH, the controller PULLs.

    trainer rank 0 ── TrainerReport after each step, TrainerDone after the last ──┐
    any trainer rank ── TrainerFailed before it exits on an error ─────────────────┴─► PULL ─► trainer_messages
    the trainer process exits before TrainerDone ─► TrainerExited (its exit code, where it ran, its log's tail)

One typed decoder (``TrainerMessage``, areal/protocol.py) reads the socket. The controller polls
it every half second from the trainer's start, so a trainer that dies without a word is noticed
whatever the controller is doing. What each message does to the run is the controller's to
decide; this module only carries and words. On Ray nodes with ``cluster.encrypt`` the PUSH side
is CURVE-encrypted (keys from the environment, areal/curve.py).
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import zmq
import zmq.asyncio

from areal.curve import CurveKeys, connect_curve
from areal.process import log_tail
from areal.protocol import TrainerDone, TrainerMessage


class ReportUndelivered(ConnectionError):
    """A report the controller's socket did not take in time."""


class Reporter:
    """PUSH socket to the controller; close() lingers so the last message is delivered.

    A send waits at most ``send_timeout_s`` for room to queue the message: a PUSH whose
    handshakes all failed (a CURVE key the controller refuses) has no pipe left to queue on, and
    would otherwise block the rank for ever. Past it the send raises ``ReportUndelivered``, so
    the rank exits with an error its launcher reports instead of hanging."""

    def __init__(self, addr: str, send_timeout_s: float = 120.0) -> None:
        self.addr = addr
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDTIMEO, int(send_timeout_s * 1000))
        keys = CurveKeys.from_env()  # set by a run on Ray nodes with cluster.encrypt (areal/curve.py)
        if keys is not None:
            connect_curve(self.sock, keys)
        self.sock.connect(addr)
        self.encoder = msgspec.msgpack.Encoder()

    def send(self, msg: TrainerMessage) -> None:
        try:
            self.sock.send(self.encoder.encode(msg))
        except zmq.Again:
            raise ReportUndelivered(
                f"the controller's report socket at {self.addr} took no {type(msg).__name__} within "
                f"{self.sock.getsockopt(zmq.SNDTIMEO) / 1000:g} s (unreachable, or it refused this rank's CURVE key)"
            ) from None

    def close(self, linger_s: float = 10.0) -> None:
        self.sock.close(linger=int(linger_s * 1000))
        self.ctx.term()


@dataclasses.dataclass(frozen=True)
class TrainerExited:
    """The trainer process exited before it sent ``TrainerDone``; ``reason`` says how, for the run's failure."""

    reason: str


async def trainer_messages(
    pull: zmq.asyncio.Socket, proc: subprocess.Popen, run_dir: Path
) -> AsyncIterator[TrainerMessage | TrainerExited]:
    """What the trainer sends on ``pull``, in order; then ``TrainerExited``, last, if its process
    exits before ``TrainerDone``. After ``TrainerDone`` it waits on until cancelled."""
    decoder = msgspec.msgpack.Decoder(TrainerMessage)
    done = False
    while True:
        if await pull.poll(500) == 0:
            if proc.poll() is not None and not done:
                where = getattr(proc, "error", "")  # a RemoteTrainer (cluster.kind=ray) names the node, and its log
                log = run_dir / getattr(proc, "log_name", "trainer.log")
                yield TrainerExited(
                    f"trainer process exited with code {proc.returncode} without finishing{'; ' + where if where else ''}; "
                    f"log tail ({log.name}):\n{log_tail(log) or '(empty log)'}"
                )
                return
            continue
        message = decoder.decode(await pull.recv())
        done = done or isinstance(message, TrainerDone)
        yield message
