"""Ring records whose content is a function of their sequence number, so a reader checks every
byte; a fresh ring name per test that must leave nothing in /dev/shm; and the writer process the
cross-process ring tests start:

    python tests/support/ring_records.py NAME COUNT CAPACITY     # COUNT < 0: write until killed
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Iterator

from areal.ring.buffer import SHM_DIR, RingWriter, ring_name

_counter = itertools.count()


def payload_for(seq: int, span: int = 20011) -> bytes:
    """Deterministic record content for sequence number ``seq``: varying sizes, 0 to ``span`` bytes."""
    size = (seq * 7919) % span
    return (seq.to_bytes(8, "little") * (size // 8 + 1))[:size]


def fresh_ring(prefix: str) -> Iterator[str]:
    """A fresh ring name (a fixture's body); after the test, anything of it left in /dev/shm is
    removed and the test fails naming it."""
    name = ring_name(f"{prefix}{os.getpid()}x{next(_counter)}", 0)
    yield name
    leftovers = [e for e in os.listdir(SHM_DIR) if name in e]
    for e in leftovers:
        os.unlink(os.path.join(SHM_DIR, e))
    assert not leftovers, f"test left {leftovers} in {SHM_DIR}"


def write_records(name: str, count: int, capacity: int) -> None:
    with RingWriter(name, capacity) as w:
        for seq in itertools.count() if count < 0 else range(count):
            assert w.put(payload_for(seq), timeout_s=30) == seq
        if count >= 0:  # keep the segment until the reader has drained it, then unlink on exit
            while w.free_bytes() < w.capacity:
                time.sleep(0.001)


if __name__ == "__main__":
    write_records(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
