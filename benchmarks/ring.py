"""Trajectory transport throughput: shared-memory ring vs ``multiprocessing.Queue``, same run.

One producer process builds an 8k-token ``Trajectory`` and repeatedly encodes it and hands the
bytes over (``RingWriter.put`` or ``Queue.put``); this process receives and decodes each one
(``RingReader.get`` + ``decode_trajectory`` or ``Queue.get`` + ``decode_trajectory``). The clock
runs on the consumer from the end of a warm-up to the last record, so process start-up and
first-touch costs are excluded. Both paths move identical bytes; the ring additionally computes
and verifies a crc32 on each side.

    python -m benchmarks.ring [--quick]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from areal.buffer import RingReader, RingWriter, ring_name, unlink_ring
from areal.protocol import TokenRow, Trajectory, decode_trajectory, encode_trajectory

TOKENS = 8192
RING_BYTES = 16 << 20
WARMUP = 200


def make_trajectory(tokens: int = TOKENS) -> Trajectory:
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
        episode_id="bench-episode-0", group_id="bench-group", group_size=8, reward=1.0,
        status="ok", rows=rows, timings={"agent_s": 1.0},
    )


def _produce_ring(name: str, count: int) -> None:
    traj = make_trajectory()
    with RingWriter(name, RING_BYTES) as writer:
        for _ in range(count):
            writer.put(encode_trajectory(traj), timeout_s=60)
        while writer.free_bytes() < writer.capacity:  # keep the segment until it is drained
            time.sleep(0.001)


def _produce_queue(queue: mp.Queue, count: int) -> None:
    traj = make_trajectory()
    for _ in range(count):
        queue.put(encode_trajectory(traj))
    queue.close()
    queue.join_thread()


def _consume(receive: Callable[[], bytes | None], count: int) -> float:
    """Receive ``WARMUP + count`` records; return records/s over the last ``count``."""
    for _ in range(WARMUP):
        decode_trajectory(receive())
    start = time.perf_counter()
    tokens = 0
    for _ in range(count):
        tokens += decode_trajectory(receive()).num_tokens
    elapsed = time.perf_counter() - start
    assert tokens == count * TOKENS
    return count / elapsed


def run_ring(count: int) -> float:
    ctx = mp.get_context("spawn")  # no fork: the harness process may hold threads
    name = ring_name(f"bench{os.getpid()}", 0)
    proc = ctx.Process(target=_produce_ring, args=(name, WARMUP + count))
    proc.start()
    try:
        with RingReader(name, timeout_s=60) as reader:
            rate = _consume(lambda: reader.get(timeout_s=60), count)
        proc.join(timeout=60)
        assert proc.exitcode == 0, f"ring producer exited with {proc.exitcode}"
        return rate
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        unlink_ring(name)


def run_queue(count: int) -> float:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_produce_queue, args=(queue, WARMUP + count))
    proc.start()
    try:
        rate = _consume(lambda: queue.get(timeout=60), count)
        proc.join(timeout=60)
        assert proc.exitcode == 0, f"queue producer exited with {proc.exitcode}"
        return rate
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


def main(quick: bool) -> list[dict]:
    count, repeats = (3000, 1) if quick else (20000, 3)
    record_bytes = len(encode_trajectory(make_trajectory()))
    ring_rates, queue_rates = [], []
    for _ in range(repeats):  # interleaved so that background load hits both alike
        ring_rates.append(run_ring(count))
        queue_rates.append(run_queue(count))
    ring, queue = statistics.median(ring_rates), statistics.median(queue_rates)
    common = {"benchmark": "ring", "baseline": "multiprocessing.Queue"}
    return [
        {**common, "metric": f"trajectories_per_s_{TOKENS // 1024}k_tokens", "value": ring,
         "unit": "traj/s", "baseline_value": queue},
        {**common, "metric": f"payload_bandwidth_{TOKENS // 1024}k_tokens",
         "value": ring * record_bytes / 1e9, "unit": "GB/s", "baseline_value": queue * record_bytes / 1e9},
    ]


if __name__ == "__main__":
    for row in main(quick="--quick" in sys.argv[1:]):
        print(row)
