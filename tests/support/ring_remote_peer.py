"""A peer of the trajectory hop in a process of its own, for tests/integration/ring/test_ring_remote.py.

    python tests/support/ring_remote_peer.py receiver RING BIND_ADDR JOURNAL
        attaches to ring RING as its writer, serves the hop on BIND_ADDR, prints "READY <address>",
        runs until SIGTERM (or is killed); JOURNAL "-": none;
    python tests/support/ring_remote_peer.py sender ADDR COUNT [PAUSE_S]
        sends trajectories 0..COUNT-1 (``trajectory_for``), PAUSE_S apart, flushes, prints
        "DONE <reconnects>".

Record ``i`` is derived from ``i`` alone, so the reading side can check every byte.
"""

from __future__ import annotations

import signal
import sys
import time

import numpy as np

from areal.protocol import TokenRow, Trajectory


def trajectory_for(i: int) -> Trajectory:
    """Trajectory ``i``: 1 to 3 rows, 16 to ~2k tokens, content a function of ``i``."""
    rng = np.random.default_rng(i)
    rows = []
    for _ in range(1 + i % 3):
        n = 16 + (i * 7919) % 2000
        mask = (np.arange(n) >= n // 4).astype(np.uint8)
        rows.append(
            TokenRow(
                input_ids=rng.integers(0, 8192, n, dtype=np.int32),
                loss_mask=mask,
                logprobs=np.where(mask == 1, -rng.random(n), 0).astype(np.float32),
                versions=np.where(mask == 1, i % 7, -1).astype(np.int32),
                reward=float(i % 2),
            )
        )
    return Trajectory.from_rows(
        episode_id=f"ep{i}", group_id=f"g{i // 4}", group_size=4, reward=float(i % 2), status="ok", rows=rows, created=1.0
    )


def _receiver(ring: str, bind: str, journal: str) -> None:
    from areal.ring.buffer import RingWriter
    from areal.ring.remote import TrajectoryReceiver

    writer = RingWriter.attach(ring)
    receiver = TrajectoryReceiver(bind, writer, journal_path=None if journal == "-" else journal)
    signal.signal(signal.SIGTERM, lambda *_: receiver.stop())
    print(f"READY {receiver.address}", flush=True)
    receiver.run()
    receiver.close()
    writer.close()


def _sender(addr: str, count: int, pause_s: float) -> None:
    from areal.ring.remote import TrajectorySender

    sender = TrajectorySender(addr, window=16)
    for i in range(count):
        sender.put(trajectory_for(i), timeout_s=60)
        time.sleep(pause_s)
    sender.flush(timeout_s=60)
    print(f"DONE {sender.reconnects}", flush=True)
    sender.close()


if __name__ == "__main__":
    match sys.argv[1:]:
        case ["receiver", ring, bind, journal]:
            _receiver(ring, bind, journal)
        case ["sender", addr, count]:
            _sender(addr, int(count), 0.0)
        case ["sender", addr, count, pause_s]:
            _sender(addr, int(count), float(pause_s))
        case _:
            raise SystemExit(__doc__)
