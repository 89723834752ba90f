"""The shared-memory trajectory ring between the controller (one writer per ring) and a trainer
rank (its one reader).

    buffer.py   RingWriter / RingReader: the two ends, the doorbell, crash handling
    layout.py   the segment's byte layout, the record frame and its checksum (XXH3-64)
    remote.py   the hop across nodes: TrajectorySender (rollout worker) -> ZeroMQ TCP ->
                TrajectoryReceiver (trainer node, the ring's writer), exactly once
    native/     the writer's optional C fast path (``areal.ring._ringcopy``, built by
                ``pip install -e .`` where a compiler exists; the pure-Python writer is its twin)

``RecordSource`` is what a trainer rank reads from: a ``RingReader``, or anything that hands
out encoded ``Trajectory`` records in sequence (tests use an in-process queue).
"""

from __future__ import annotations

from typing import Protocol


class RecordSource(Protocol):
    """Encoded records in sequence, each released once the consumer has made it durable."""

    last_seq: int | None  # sequence number of the record most recently returned (None: none yet)

    def get(self, timeout_s: float | None = None) -> bytes | None:
        """The next record, or None when ``timeout_s`` passed without one."""
        ...

    def writer_alive(self) -> bool:
        """Whether the producer still runs: a rank waits for records only while it does."""
        ...

    def commit(self, seq: int) -> None:
        """Release every record up to ``seq``: a later reader will not be given them again."""
        ...

    def close(self) -> None: ...
