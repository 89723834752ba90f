"""Trajectory transport throughput: shared-memory ring vs ``multiprocessing.Queue`` vs ZeroMQ.

For 1k-, 8k- and 32k-token trajectories, one producer process builds a ``Trajectory`` once and
then, per record, encodes it and hands it over; this process receives and decodes each one.
Every path includes encode and decode, and every path moves every byte to the consumer's core:

  * ring:  ``RingWriter.put_trajectory`` (one C call frames the record, copies the token buffers
           once, straight into shared memory, hashing them with XXH3-64 as they go, and
           publishes it) ->
           ``RingReader.get_view`` (digest verified in place: this reads the whole record) +
           ``decode_trajectory`` (zero-copy);
  * queue: ``encode_trajectory`` + ``multiprocessing.Queue.put`` -> ``get`` + decode;
  * zmq:   ``encode_trajectory`` + PUSH ``send(copy=False)`` over ``ipc://`` -> PULL
           ``recv(copy=False)`` + decode of the frame's buffer.

The clock runs on the consumer from the end of a warm-up to the last record, so process start-up
and first-touch costs are excluded. Each side also measures its own CPU time per record
(``time.process_time`` over the same records, waits included), and the ring's sides their busy
CPU (the same, less what they spent spinning or sleeping on an empty or full ring:
``wait_cpu_s``). On this loaded shared 2-core machine wall-clock rates swing with other tenants;
``cpu_bound_trajectories_per_s`` = 1 / max(writer busy, reader busy) is the rate the path
sustains with a core per side (the baselines block without spinning: their CPU is all busy).
The baselines run in the same invocation, interleaved with the ring, so background load hits
all paths alike. The ring's writer and reader are pinned to a core each; the baselines are not
(see ``_run``: each path runs in its better setting).

Ring size: the main figures use a 4 MiB ring (37 8k-token records). A ring that stays in the
last-level cache lets the writer copy into lines that are already cached (~32 GB/s here: ~3.3
us per 106 KB record); in a 64 MiB ring every lap goes out to DRAM and the same copy takes ~13
us. The 8k rows ``*_64MiB_ring`` measure the production default (``ring_capacity_mb: 64``) in
the same run, for comparison.

Per-record cost split at 8k tokens (4 MiB ring, in-process, CPU time): writer =
``put_trajectory`` ~4.3 us = ``split_trajectory`` 0.45 (``astuple`` + two small msgspec
encodings) + one C call ~3.9 (copy + XXH3 digest in one pass ~3.3, AVX2; msgpack framing, frame
words, room check and publish ~0.5). Round 1 (Python framing around the C copy + digest):
``encode_trajectory_parts`` 2.0-2.6 + ``put_parts`` ~5.7 = ~8.6 us. Reader = ``get_view`` ~3.4
(the ``xxhash`` digest ~1.8 of it) + decode ~1.1. The pure-Python writer (``native=False``:
``encode_trajectory_parts``, one ``mmap.write`` per part, then ``xxhash`` over the record in
place) costs ~9 us; the 8k rows ``*_native_writer`` compare the two writer paths in the same
run (writer and reader in separate processes, where the copy's stores miss into lines the
reader's core last held, so both cost more than in-process). Cross-process, quick mode, each
side pinned to its core: 170-215k traj/s wall clock at 8k tokens, against 10-12k for
``multiprocessing.Queue`` and 84-102k for the pure-Python writer in the same runs (unpinned the
ring swung between 80k and 176k).

    python -m benchmarks.ring [--quick]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.sharedctypes import SynchronizedArray
from typing import NamedTuple

import numpy as np
import zmq

from areal.protocol import TokenRow, Trajectory, decode_trajectory, encode_trajectory
from areal.ring.buffer import RingReader, RingWriter, ring_name, unlink_ring
from areal.ring.layout import NATIVE

SIZES = (1024, 8192, 32768)
RING_BYTES = 4 << 20  # cache-resident (see the docstring); holds 37 8k-token records
DEFAULT_RING_BYTES = 64 << 20  # TrainConfig.ring_capacity_mb
WARMUP = 200


def make_trajectory(tokens: int = 8192) -> Trajectory:
    """Two rows (prompt + completion each) totalling ``tokens`` tokens, realistic dtypes."""
    rng = np.random.default_rng(0)
    rows = []
    for n in (tokens // 2, tokens - tokens // 2):
        mask = np.zeros(n, np.uint8)
        mask[n // 4 :] = 1  # first quarter is prompt
        rows.append(
            TokenRow(
                input_ids=rng.integers(0, 8192, n, dtype=np.int32),
                loss_mask=mask,
                logprobs=np.where(mask == 1, -rng.random(n), 0).astype(np.float32),
                versions=np.where(mask == 1, 5, -1).astype(np.int32),
                reward=1.0,
            )
        )
    return Trajectory.from_rows(
        episode_id="bench-episode-0",
        group_id="bench-group",
        group_size=8,
        reward=1.0,
        status="ok",
        rows=rows,
        timings={"agent_s": 1.0},
        interaction_ids=["i0", "i1"],
        row_turns=[1, 1],
    )


def _produce_ring(name: str, capacity: int, tokens: int, count: int, native: bool | None, cpu: SynchronizedArray) -> None:
    traj = make_trajectory(tokens)
    with RingWriter(name, capacity, native=native) as writer:
        for i in range(count):
            if i == WARMUP:
                started, waited = time.process_time(), writer.wait_cpu_s
            writer.put_trajectory(traj, timeout_s=60)  # native: framing + copy + digest in one C call
        cpu[0] = (time.process_time() - started) / (count - WARMUP)
        cpu[1] = (writer.wait_cpu_s - waited) / (count - WARMUP)
        deadline = time.monotonic() + 60
        while writer.free_bytes() < writer.capacity and time.monotonic() < deadline:
            time.sleep(0.001)  # keep the segment until the reader has committed everything


def _produce_queue(queue: mp.Queue, tokens: int, count: int, cpu: SynchronizedArray) -> None:
    traj = make_trajectory(tokens)
    for i in range(count):
        if i == WARMUP:
            started = time.process_time()
        queue.put(encode_trajectory(traj))
    queue.close()
    queue.join_thread()  # the feeder thread's pickling and writes are this side's cost too
    cpu[0] = (time.process_time() - started) / (count - WARMUP)


def _produce_zmq(addr: str, tokens: int, count: int, cpu: SynchronizedArray) -> None:
    traj = make_trajectory(tokens)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.connect(addr)
    for i in range(count):
        if i == WARMUP:
            started = time.process_time()
        sock.send(encode_trajectory(traj), copy=False)
    sock.close(linger=60_000)  # linger: deliver everything queued before exiting
    ctx.term()  # includes the I/O thread's sends
    cpu[0] = (time.process_time() - started) / (count - WARMUP)


class Result(NamedTuple):
    rate: float  # records/s, wall clock on the consumer
    writer_cpu_s: float  # producer CPU seconds per record
    reader_cpu_s: float  # consumer CPU seconds per record
    writer_busy_s: float  # the same, less CPU spent waiting for room (ring only)
    reader_busy_s: float  # the same, less CPU spent waiting for a record (ring only)

    @property
    def cpu_bound_rate(self) -> float:
        """Records/s with a core per side: the slower side's busy CPU per record bounds it."""
        return 1 / max(self.writer_busy_s, self.reader_busy_s)


def _consume(
    receive: Callable[[], object], tokens: int, count: int, waited: Callable[[], float] = lambda: 0.0
) -> tuple[float, float, float]:
    """Receive and decode ``WARMUP + count`` records; over the last ``count``: records/s, CPU s
    per record, and CPU s per record spent waiting (``waited``: cumulative wait CPU so far)."""
    for _ in range(WARMUP):
        decode_trajectory(receive())
    start, cpu, wait = time.perf_counter(), time.process_time(), waited()
    total = 0
    for _ in range(count):
        total += decode_trajectory(receive()).num_tokens
    elapsed, cpu, wait = time.perf_counter() - start, time.process_time() - cpu, waited() - wait
    assert total == count * tokens, f"received {total} tokens, expected {count * tokens}"
    return count / elapsed, cpu / count, wait / count


def _on_core(core: int | None, target: Callable[..., None], *args: object) -> None:
    """The producer's entry point: pinned to ``core`` (None: anywhere), then ``target(*args)``."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    target(*args)


def _cores() -> tuple[int, int] | None:
    """(producer core, consumer core): two different cores this process may use, or None."""
    allowed = sorted(os.sched_getaffinity(0))
    return (allowed[0], allowed[1]) if len(allowed) >= 2 else None


def _run(target: Callable[..., None], args: tuple, consume: Callable[[], tuple[float, float, float]], pin: bool = False) -> Result:
    """One producer process and this process as the consumer; with ``pin``, each on a core of
    its own. The ring's two sides are pinned: unpinned, the scheduler now and then stacked both
    on one core, and the same code's rate swung from 80k to 176k traj/s at 8k tokens between
    repeats; pinned (as the controller and a trainer rank would be on separate cores) it is what
    the code sustains. The baselines are not: their extra threads (a Queue's feeder, ZeroMQ's
    I/O threads) need the second core too, and pinned they measured 20-50% slower, so they run
    as the scheduler likes, which is their better case."""
    ctx = mp.get_context("spawn")  # no fork: the harness may hold threads
    cpu = ctx.Array("d", [float("nan"), 0.0])  # writer: CPU s per record, of which waiting
    cores = _cores() if pin else None
    proc = ctx.Process(target=_on_core, args=(cores[0] if cores else None, target, *args, cpu))
    before = os.sched_getaffinity(0)
    proc.start()
    try:
        if cores:
            os.sched_setaffinity(0, {cores[1]})
        rate, reader_cpu, reader_wait = consume()
        proc.join(timeout=60)
        assert proc.exitcode == 0, f"{target.__name__} exited with {proc.exitcode}"
        return Result(rate, cpu[0], reader_cpu, cpu[0] - cpu[1], reader_cpu - reader_wait)
    finally:
        os.sched_setaffinity(0, before)
        if proc.is_alive():
            proc.kill()
            proc.join()


def run_ring(tokens: int, count: int, capacity: int = RING_BYTES, native: bool | None = None) -> Result:
    name = ring_name(f"bench{os.getpid()}", 0)

    def consume() -> tuple[float, float, float]:
        with RingReader(name, timeout_s=60) as reader:
            return _consume(lambda: reader.get_view(timeout_s=60), tokens, count, lambda: reader.wait_cpu_s)

    try:
        return _run(_produce_ring, (name, capacity, tokens, WARMUP + count, native), consume, pin=True)
    finally:
        unlink_ring(name)


def run_queue(tokens: int, count: int) -> Result:
    queue = mp.get_context("spawn").Queue()
    return _run(_produce_queue, (queue, tokens, WARMUP + count), lambda: _consume(lambda: queue.get(timeout=60), tokens, count))


def run_zmq(tokens: int, count: int) -> Result:
    with tempfile.TemporaryDirectory(prefix="areal-bench-") as tmp:
        addr = f"ipc://{tmp}/ring-bench.sock"
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PULL)
        sock.bind(addr)
        sock.setsockopt(zmq.RCVTIMEO, 60_000)
        try:
            return _run(_produce_zmq, (addr, tokens, WARMUP + count), lambda: _consume(lambda: sock.recv(copy=False).buffer, tokens, count))
        finally:
            sock.close(linger=0)
            ctx.term()


def main(quick: bool) -> list[dict]:
    repeats = 3 if quick else 5  # each repeat runs every path; ~1 s each at quick counts
    rows = []
    for tokens in SIZES:
        # ~same bytes per size: 2,500 8k records in quick mode (at ~50k/s a run of 8 MiB lasted
        # ~10 ms, short enough for one scheduler hiccup to decide the figure)
        count = max(1000, (32 if quick else 128) * 2**20 * 8 // (tokens * 13))
        record_bytes = len(encode_trajectory(make_trajectory(tokens)))
        runs: dict[str, list[Result]] = {"ring": [], "ring64": [], "ring_py": [], "queue": [], "zmq": []}
        for _ in range(repeats):  # interleaved so that background load hits every path alike
            runs["ring"].append(run_ring(tokens, count))
            if tokens == 8192:
                runs["ring64"].append(run_ring(tokens, count, DEFAULT_RING_BYTES))
                if NATIVE is not None:  # the writer's pure-Python copy + digest, same ring
                    runs["ring_py"].append(run_ring(tokens, count, native=False))
            runs["queue"].append(run_queue(tokens, count // 4))  # the baselines are ~4x slower
            runs["zmq"].append(run_zmq(tokens, count // 2))
        med = {k: Result(*(statistics.median(getattr(r, f) for r in v) for f in Result._fields)) for k, v in runs.items() if v}
        ring = med["ring"]
        size = f"{tokens // 1024}k_tokens"
        for baseline, key in (("multiprocessing.Queue", "queue"), ("zmq ipc PUSH/PULL", "zmq")):
            common = {"benchmark": "ring", "baseline": baseline}
            other = med[key]
            rows.append(
                {**common, "metric": f"trajectories_per_s_{size}", "value": ring.rate, "unit": "traj/s", "baseline_value": other.rate}
            )
            rows.append(
                {
                    **common,
                    "metric": f"cpu_bound_trajectories_per_s_{size}",
                    "value": ring.cpu_bound_rate,
                    "unit": "traj/s",
                    "baseline_value": other.cpu_bound_rate,
                }
            )
            rows.append(
                {
                    **common,
                    "metric": f"payload_GBps_{size}",
                    "value": ring.rate * record_bytes / 1e9,
                    "unit": "GB/s",
                    "baseline_value": other.rate * record_bytes / 1e9,
                }
            )
            # CPU per record of each side (unit us: lower is better, ratio < 1 means the ring is cheaper).
            for side in ("writer", "reader"):
                rows.append(
                    {
                        **common,
                        "metric": f"{side}_cpu_us_per_record_{size}",
                        "value": getattr(ring, f"{side}_cpu_s") * 1e6,
                        "unit": "us",
                        "baseline_value": getattr(other, f"{side}_cpu_s") * 1e6,
                    }
                )
                rows.append(
                    {
                        **common,
                        "metric": f"{side}_busy_cpu_us_per_record_{size}",
                        "value": getattr(ring, f"{side}_busy_s") * 1e6,
                        "unit": "us",
                        "baseline_value": getattr(other, f"{side}_busy_s") * 1e6,
                    }
                )
            if "ring64" in med:
                big = med["ring64"]
                rows.append(
                    {
                        **common,
                        "metric": f"trajectories_per_s_{size}_64MiB_ring",
                        "value": big.rate,
                        "unit": "traj/s",
                        "baseline_value": other.rate,
                    }
                )
                rows.append(
                    {
                        **common,
                        "metric": f"cpu_bound_trajectories_per_s_{size}_64MiB_ring",
                        "value": big.cpu_bound_rate,
                        "unit": "traj/s",
                        "baseline_value": other.cpu_bound_rate,
                    }
                )
        if "ring_py" in med:  # the C copy + digest against the pure-Python writer path
            common = {"benchmark": "ring", "baseline": "ring, pure-Python writer (mmap.write + xxhash)"}
            py = med["ring_py"]
            rows.append(
                {
                    **common,
                    "metric": f"trajectories_per_s_{size}_native_writer",
                    "value": ring.rate,
                    "unit": "traj/s",
                    "baseline_value": py.rate,
                }
            )
            rows.append(
                {
                    **common,
                    "metric": f"cpu_bound_trajectories_per_s_{size}_native_writer",
                    "value": ring.cpu_bound_rate,
                    "unit": "traj/s",
                    "baseline_value": py.cpu_bound_rate,
                }
            )
            rows.append(
                {
                    **common,
                    "metric": f"writer_busy_cpu_us_per_record_{size}_native_writer",
                    "value": ring.writer_busy_s * 1e6,
                    "unit": "us",
                    "baseline_value": py.writer_busy_s * 1e6,
                }
            )
    return rows


if __name__ == "__main__":
    for row in main(quick="--quick" in sys.argv[1:]):
        print(row)
