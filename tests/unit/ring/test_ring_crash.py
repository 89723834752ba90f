"""Crash safety of the shared-memory ring: SIGKILL the writer (and the reader) at random points.

The writer is a forked child of the test process (fork is ~1 ms here, a fresh interpreter
~0.5 s, so 200 kills stay within seconds). Record content is derived from the sequence number,
so the reader can check every byte, and contiguity across writer generations shows that no
published record was lost or duplicated. The child reports each sequence number that ``put``
returned through a pipe (after publishing): every reported one must reach the reader.
Writer generations alternate between the C writer (``areal.ring._ringcopy``, where built) and the
pure-Python one, so both are killed mid-record and each attaches after the other's crash.
Each test checks that it leaves nothing of its own in /dev/shm.
"""

import itertools
import os
import random
import signal
import time

import pytest
import ring_records

from areal.ring.buffer import RingFull, RingReader, RingWriter, unlink_ring
from areal.ring.layout import NATIVE


def payload_for(seq: int) -> bytes:
    """Deterministic content for ``seq``: 0 to ~6 KB, so records end at varied lap offsets."""
    return ring_records.payload_for(seq, span=6007)


@pytest.fixture
def name():
    yield from ring_records.fresh_ring("crash")


def _fork(child: "callable") -> int:
    pid = os.fork()
    if pid == 0:  # child: never return into pytest, whatever happens
        code = 1
        try:
            child()
            code = 0
        finally:
            os._exit(code)
    return pid


def _read_reports(fd: int) -> list[int]:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    assert len(data) % 8 == 0, "a report is written whole (8 bytes < PIPE_BUF)"
    return [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8)]


def test_writer_sigkilled_200_times_loses_nothing_and_never_tears(name):
    rng = random.Random(5)
    RingWriter(name, 1 << 16).close()  # created once; every writer generation attaches
    report_r, report_w = os.pipe()
    os.set_blocking(report_r, False)
    expected = 0  # next sequence number the reader must see
    reported_max = -1
    mid_stream_kills = 0
    try:
        with RingReader(name, timeout_s=5) as reader:

            def write_forever() -> None:
                os.close(report_r)
                writer = RingWriter.attach(name, native=NATIVE is not None and generation % 2 == 0)
                while True:
                    seq = writer.put(payload_for(writer.next_seq), timeout_s=30)
                    os.write(report_w, seq.to_bytes(8, "little"))

            def receive(timeout_s: float) -> bool:
                nonlocal expected
                payload = reader.get(timeout_s=timeout_s)
                if payload is None:
                    return False
                assert reader.last_seq == expected, "records arrive contiguously across writer generations"
                assert payload == payload_for(expected), f"record {expected} is torn or wrong"
                expected += 1
                return True

            for generation in range(200):
                before = expected
                pid = _fork(write_forever)
                started = time.monotonic()
                while expected == before and time.monotonic() < started + 5:
                    receive(0.001)  # the child is writing: now pick the random point
                kill_at = time.monotonic() + rng.uniform(0, 0.003)
                while time.monotonic() < kill_at:
                    receive(0)
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
                while receive(0):  # drain what the dead writer published
                    pass
                reports = _read_reports(report_r)
                if reports:
                    reported_max = max(reported_max, *reports)
                # Every record whose put() returned was delivered; nothing beyond write_pos was.
                assert reported_max < expected
                assert reader.get(timeout_s=0) is None
                mid_stream_kills += expected > before
            assert not reader.writer_alive()
            # A last writer generation continues the sequence.
            writer = RingWriter.attach(name)
            assert writer.put(payload_for(expected)) == expected
            assert receive(1)
            writer.close()
    finally:
        os.close(report_r)
        os.close(report_w)
        unlink_ring(name)
    assert mid_stream_kills == 200, f"only {mid_stream_kills} of 200 kills hit a writing writer"
    assert expected > 1000


def test_reader_sigkilled_resumes_from_committed_position(name):
    rng = random.Random(7)
    report_r, report_w = os.pipe()
    os.set_blocking(report_r, False)
    try:
        with RingWriter(name, 1 << 15) as writer:

            def fill() -> None:
                while True:  # keep the ring full: the writer must never pass uncommitted records
                    try:
                        writer.put(payload_for(writer.next_seq), timeout_s=0)
                    except RingFull:
                        return

            def read_and_commit() -> None:
                os.close(report_r)
                reader = RingReader(name, timeout_s=5, auto_commit=False)
                first = reader.committed_seq
                for i in itertools.count():
                    payload = reader.get(timeout_s=30)
                    if reader.last_seq != first + i or payload != payload_for(first + i):
                        os.write(report_w, (1 << 63).to_bytes(8, "little"))  # marks a failure
                        return
                    if i % 3 == 2:  # a "checkpoint" every third record
                        reader.commit(reader.last_seq)
                        os.write(report_w, reader.last_seq.to_bytes(8, "little"))

            committed = -1
            for _ in range(60):
                fill()
                pid = _fork(read_and_commit)
                reports = []
                started = time.monotonic()
                while not reports and time.monotonic() < started + 5:
                    fill()  # until the child has committed once: then pick the random point
                    reports += _read_reports(report_r)
                kill_at = time.monotonic() + rng.uniform(0, 0.003)
                while time.monotonic() < kill_at:
                    fill()
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                reports += _read_reports(report_r)
                assert reports, "the reader child never committed"
                assert all(r < 1 << 63 for r in reports), "a reader saw a wrong or non-contiguous record"
                committed = max([committed, *reports])
                fill()  # the dead reader may have committed everything there was
                # The restarted reader starts right after the last commit the dead one made
                # (or a later one it made but had no time to report), re-delivering the rest.
                # A commit writes two words, commit_pos then commit_seq: a reader killed between
                # them leaves commit_seq behind by the records of that one commit (3 here), and
                # the restarted reader starts at commit_pos, after them.
                with RingReader(name, timeout_s=5, auto_commit=False) as again:
                    assert again.committed_seq >= committed + 1
                    payload = again.get(timeout_s=1)
                    assert again.committed_seq <= again.last_seq <= again.committed_seq + 3
                    assert payload == payload_for(again.last_seq)
                    committed = again.last_seq - 1
            assert committed > 100
            with RingReader(name, timeout_s=5) as drain:  # auto-commit the rest: clean exit
                while drain.get(timeout_s=0) is not None:
                    pass
                assert drain.last_seq == writer.next_seq - 1
    finally:
        os.close(report_r)
        os.close(report_w)
        unlink_ring(name)
