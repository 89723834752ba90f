"""Trajectory hop throughput: rollout worker -> ZeroMQ TCP -> receiver -> ring -> trainer rank,
against the local shared-memory ring alone, same run, same records.

For 1k-, 8k- and 32k-token trajectories (``benchmarks.ring.make_trajectory``):

  * hop:   a producer process ``TrajectorySender.put(traj)`` (encode, XXH3-64, keep until acked,
           window 64) -> TCP over loopback -> a receiver process (``TrajectoryReceiver`` on its
           thread: digest verified, ``RingWriter.put``, cumulative acks; no journal) -> a 4 MiB
           ring -> this process, ``RingReader.get_view`` + ``decode_trajectory``;
  * local: ``benchmarks.ring.run_ring``: a producer process ``RingWriter.put_trajectory`` -> the
           same 4 MiB ring -> this process, same reader and decode (the ``ring`` benchmark's path).

The clock runs on the consumer from the end of a 200-record warm-up to the last record
(``benchmarks.ring._consume``), so both figures are end to end, encode to decode. The two paths
run interleaved in the same invocation. The local ring's sides are pinned to a core each, as in
``benchmarks.ring``; the hop's three processes (and libzmq's I/O threads) are not: on two cores
they cannot each have one, and the scheduler places them better than a fixed split. Loopback
TCP measures the hop's software cost (framing, two extra copies, one more digest, libzmq, the
kernel's TCP stack); a real link adds its own bandwidth limit (10-25 Gb/s = 1.2-3 GB/s) on top.
The hop also runs with the run's CURVE keys (``cluster.encrypt``, areal/curve.py: every message
encrypted and authenticated), against the plain hop in the same run.
Not measured: a journal (one ``write`` per record), reconnects, more than one sender.

    python -m benchmarks.ring_remote [--quick]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from multiprocessing.sharedctypes import SynchronizedArray
from multiprocessing.synchronize import Event
from typing import NamedTuple

from areal.protocol import encode_trajectory
from areal.ring.buffer import RingReader, RingWriter, ring_name, unlink_ring
from benchmarks.ring import RING_BYTES, WARMUP, _consume, make_trajectory, run_ring

SIZES = (1024, 8192, 32768)
WINDOW = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _receive(name: str, addr: str, stop: Event, cpu: SynchronizedArray, keys_json: str) -> None:
    from areal.curve import CurveKeys
    from areal.ring.remote import TrajectoryReceiver

    keys = CurveKeys.from_json(keys_json) if keys_json else None
    with RingWriter(name, RING_BYTES) as writer, TrajectoryReceiver(addr, writer, keys=keys).start() as receiver:
        started = time.process_time()  # every thread of the process: receiver and libzmq's I/O thread
        stop.wait(300)
        cpu[1] = (time.process_time() - started) / receiver.written
        deadline = time.monotonic() + 30
        while writer.free_bytes() < writer.capacity and time.monotonic() < deadline:
            time.sleep(0.001)  # keep the segment until the reader has committed everything


def _send(addr: str, tokens: int, count: int, cpu: SynchronizedArray, keys_json: str) -> None:
    from areal.curve import CurveKeys
    from areal.ring.remote import TrajectorySender

    traj = make_trajectory(tokens)
    keys = CurveKeys.from_json(keys_json).client_side() if keys_json else None
    with TrajectorySender(addr, window=WINDOW, keys=keys) as sender:
        for i in range(count):
            if i == WARMUP:
                started = time.process_time()
            sender.put(traj, timeout_s=60)
        sender.flush(timeout_s=60)
        cpu[0] = (time.process_time() - started) / (count - WARMUP)


class HopResult(NamedTuple):
    rate: float  # records/s, wall clock on the consumer
    sender_cpu_s: float  # CPU s per record: sender process (encode, digest, libzmq)
    receiver_cpu_s: float  # CPU s per record: receiver process (libzmq, digest, ring write), idle polls included
    reader_cpu_s: float  # CPU s per record: this process (get_view + decode)

    @property
    def cpu_bound_rate(self) -> float:
        """Records/s with a core per process: the busiest process bounds it."""
        return 1 / max(self.sender_cpu_s, self.receiver_cpu_s, self.reader_cpu_s)


def run_hop(tokens: int, count: int, encrypted: bool = False) -> HopResult:
    """Through the hop, end to end (three processes: sender, receiver, this reader); with a run's
    CURVE keys when ``encrypted``."""
    from areal.curve import CurveKeys

    keys_json = CurveKeys.generate().to_json() if encrypted else ""
    ctx = mp.get_context("spawn")
    name, addr = ring_name(f"hopbench{os.getpid()}", 0), f"tcp://127.0.0.1:{_free_port()}"
    stop = ctx.Event()
    cpu = ctx.Array("d", [float("nan"), float("nan")])  # sender, receiver: CPU s per record
    receiver = ctx.Process(target=_receive, args=(name, addr, stop, cpu, keys_json))
    sender = ctx.Process(target=_send, args=(addr, tokens, WARMUP + count, cpu, keys_json))
    receiver.start()
    try:
        with RingReader(name, timeout_s=60) as reader:
            sender.start()
            rate, reader_cpu, _ = _consume(lambda: reader.get_view(timeout_s=60), tokens, count)
        sender.join(timeout=60)
        assert sender.exitcode == 0, f"sender exited with {sender.exitcode}"
        stop.set()
        receiver.join(timeout=60)
        assert receiver.exitcode == 0, f"receiver exited with {receiver.exitcode}"
        return HopResult(rate, cpu[0], cpu[1], reader_cpu)
    finally:
        stop.set()
        for p in (sender, receiver):
            if p.is_alive():
                p.kill()
                p.join()
        unlink_ring(name)


def main(quick: bool) -> list[dict]:
    repeats = 2 if quick else 5
    rows = []
    for tokens in SIZES:
        record_bytes = len(encode_trajectory(make_trajectory(tokens)))
        count = max(300, (4 if quick else 64) * 2**20 // record_bytes)  # ~same bytes per size
        hops, curves, locals_ = [], [], []
        for _ in range(repeats):  # interleaved so that background load hits every path alike
            hops.append(run_hop(tokens, count))
            curves.append(run_hop(tokens, count, encrypted=True))
            locals_.append(run_ring(tokens, count))
        h = HopResult(*(statistics.median(getattr(r, f) for r in hops) for f in HopResult._fields))
        c = HopResult(*(statistics.median(getattr(r, f) for r in curves) for f in HopResult._fields))
        rate, bound = statistics.median(r.rate for r in locals_), statistics.median(r.cpu_bound_rate for r in locals_)
        writer_us = statistics.median(r.writer_cpu_s for r in locals_) * 1e6
        size = f"{tokens // 1024}k_tokens"
        common = {"benchmark": "ring_remote", "baseline": "local shared-memory ring (same records, same run)"}
        rows += [
            {**common, "metric": f"trajectories_per_s_{size}", "value": h.rate, "unit": "traj/s", "baseline_value": rate},
            {
                **common,
                "metric": f"payload_MBps_{size}",
                "value": h.rate * record_bytes / 1e6,
                "unit": "MB/s",
                "baseline_value": rate * record_bytes / 1e6,
            },
            # What the path sustains with a core per process: on a loaded machine the wall clock is the tenants'.
            {
                **common,
                "metric": f"cpu_bound_trajectories_per_s_{size}",
                "value": h.cpu_bound_rate,
                "unit": "traj/s",
                "baseline_value": bound,
            },
            # Producer-side CPU per record: sender + receiver against the local ring's writer.
            {
                **common,
                "metric": f"producer_cpu_us_per_record_{size}",
                "value": (h.sender_cpu_s + h.receiver_cpu_s) * 1e6,
                "unit": "us",
                "baseline_value": writer_us,
            },
            # CURVE (cluster.encrypt) against the plain hop: what encryption costs.
            {
                **common,
                "metric": f"encrypted_trajectories_per_s_{size}",
                "value": c.rate,
                "unit": "traj/s",
                "baseline": "the hop in clear (same records, same run)",
                "baseline_value": h.rate,
            },
            {
                **common,
                "metric": f"encrypted_producer_cpu_us_per_record_{size}",
                "value": (c.sender_cpu_s + c.receiver_cpu_s) * 1e6,
                "unit": "us",
                "baseline": "the hop in clear (same records, same run)",
                "baseline_value": (h.sender_cpu_s + h.receiver_cpu_s) * 1e6,
            },
        ]
    return rows


if __name__ == "__main__":
    for row in main(quick="--quick" in sys.argv[1:]):
        print(row)
