"""Shared-memory ring: ordering, wrap-around, back-pressure, commits and resume, zero-copy views,
checksums, doorbell wake-ups, stale-segment reclaim, cross-process use. (Repeated SIGKILLs:
test_ring_crash.py.)

The cross-process tests' writer is tests/support/ring_records.py, in a process of its own.
"""

import collections
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paths import ROOT, SUPPORT
from ring_records import fresh_ring, payload_for
from run_checks import run_in_repo

from areal.protocol import TokenRow, Trajectory, decode_trajectory, encode_trajectory, encode_trajectory_parts
from areal.ring.buffer import (
    FRAME,
    FRAME_OFF_DIGEST,
    FRAME_OFF_KIND,
    FRAME_OFF_LENGTH,
    FRAME_OFF_SEQ,
    HEADER_BYTES,
    OFF_NEXT_SEQ,
    OFF_READER_BELL,
    OFF_READER_WAITING,
    OFF_WRITER_BELL,
    OFF_WRITER_WAITING,
    SHM_DIR,
    RecordTooLarge,
    RingCorrupted,
    RingError,
    RingFull,
    RingReader,
    RingWriter,
    reclaim_stale,
    ring_name,
    unlink_ring,
)
from areal.ring.layout import NATIVE

_counter = itertools.count()
# native=True where areal.ring._ringcopy is built (test_ring_native.py fails where it should be and is not)
NATIVE_OR_SKIP = pytest.param(True, marks=pytest.mark.skipif(NATIVE is None, reason="areal.ring._ringcopy not built"))


@pytest.fixture
def name():
    """A fresh ring name; the test must leave no segment (or temp file) behind in /dev/shm."""
    yield from fresh_ring("t")


def start_writer(name: str, count: int, capacity: int) -> subprocess.Popen:
    """support/ring_records.py writing ``count`` records (< 0: until killed) in its own process."""
    return subprocess.Popen(
        [sys.executable, SUPPORT / "ring_records.py", name, str(count), str(capacity)], cwd=ROOT, stdin=subprocess.DEVNULL
    )


def test_put_get_round_trip(name):
    with RingWriter(name, 1 << 16) as w, RingReader(name, timeout_s=1) as r:
        assert r.get(timeout_s=0) is None
        assert w.put(b"hello") == 0
        assert w.put(memoryview(b"\x00" * 13)) == 1
        assert w.put(b"") == 2
        assert r.get(timeout_s=0) == b"hello"
        assert r.get(timeout_s=0) == b"\x00" * 13
        assert r.get(timeout_s=0) == b""
        assert r.last_seq == 2
        assert r.get(timeout_s=0.01) is None
        assert w.free_bytes() == 1 << 16
        assert r.writer_pid == os.getpid() and r.writer_alive()


@pytest.mark.parametrize("native", [NATIVE_OR_SKIP, False])  # the C copy + digest, and pure Python
def test_many_records_wrap_in_order(name, native):
    rng = random.Random(0)
    capacity = 4096
    sent: collections.deque[bytes] = collections.deque()
    received = []
    with RingWriter(name, capacity, native=native) as w, RingReader(name) as r:
        for i in range(600):
            payload = rng.randbytes(rng.randrange(0, 900))
            while True:  # drain just enough to make room; exercises partial-fill wrap points
                try:
                    assert w.put(payload, timeout_s=0) == i
                    break
                except RingFull:
                    received.append(r.get(timeout_s=0))
            sent.append(payload)
        while (p := r.get(timeout_s=0)) is not None:
            received.append(p)
        assert r.last_seq == 599
        assert received == list(sent)
        total = sum(FRAME.size + (len(p) + 7) // 8 * 8 for p in sent)
        assert total > 5 * capacity  # really went around the ring several times


@pytest.mark.parametrize("native", [NATIVE_OR_SKIP, False])
def test_full_ring_raises_then_recovers(name, native):
    with RingWriter(name, 4096, native=native) as w, RingReader(name) as r:
        puts = 0
        with pytest.raises(RingFull, match=name):
            while True:
                w.put(b"x" * 1000, timeout_s=0.05)
                puts += 1
        assert puts == 4096 // (FRAME.size + 1000)
        assert w.free_bytes() < FRAME.size + 1000
        for _ in range(puts):
            assert r.get(timeout_s=0) == b"x" * 1000
        assert r.get(timeout_s=0) is None
        assert w.put(b"y" * 1000, timeout_s=0.05) == puts
        assert r.get(timeout_s=0) == b"y" * 1000


@pytest.mark.parametrize("native", [NATIVE_OR_SKIP, False])
def test_largest_record_fits_and_larger_is_refused(name, native):
    with RingWriter(name, 4096, native=native) as w, RingReader(name) as r:
        w.put(b"a" * 100)  # the maximal record must wrap to the next lap once this is read
        assert r.get(timeout_s=0) == b"a" * 100
        biggest = b"b" * w.max_payload
        w.put(biggest, timeout_s=1)
        assert r.get(timeout_s=0) == biggest
        with pytest.raises(RecordTooLarge, match=f"{w.max_payload + 1} bytes.*at most {w.max_payload}"):
            w.put(b"c" * (w.max_payload + 1))


@pytest.mark.parametrize("native", [NATIVE_OR_SKIP, False])
@pytest.mark.parametrize("error", [-1, +1])
def test_wrong_parts_nbytes_publishes_nothing(name, error, native):
    class Parts(list):
        nbytes = 0

    parts = Parts([b"abc", memoryview(b"defgh")])
    parts.nbytes = 8 + error
    with RingWriter(name, 4096, native=native) as w, RingReader(name) as r:
        with pytest.raises(RingError, match="not published"):
            w.put_parts(parts)
        assert r.get(timeout_s=0) is None
        parts.nbytes = 8
        assert w.put_parts(parts) == 0  # the sequence number was not used up
        assert r.get(timeout_s=0) == b"abcdefgh"


def test_cross_process(name):
    count = 300
    proc = start_writer(name, count, 1 << 16)
    try:
        with RingReader(name, timeout_s=20) as r:
            for seq in range(count):
                assert r.get(timeout_s=20) == payload_for(seq)
                assert r.last_seq == seq
            assert r.get(timeout_s=0.1) is None
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()
        unlink_ring(name)


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.one_of(st.integers(0, 1500), st.none()), max_size=120))
def test_ring_equals_queue(ops):
    """Any interleaving of puts (a size) and gets (None) gives the same output as a deque."""
    n = ring_name(f"t{os.getpid()}q{next(_counter)}", 0)
    model: collections.deque[bytes] = collections.deque()
    out_ring, out_model = [], []
    with RingWriter(n, 2048) as w, RingReader(n) as r:
        for i, op in enumerate(ops):
            if op is None:
                out_ring.append(r.get(timeout_s=0))
                out_model.append(model.popleft() if model else None)
                continue
            payload = bytes([i % 251]) * op
            try:
                w.put(payload, timeout_s=0)
            except (RingFull, RecordTooLarge):
                continue
            model.append(payload)
        out_ring.extend(iter(lambda: r.get(timeout_s=0), None))
        out_model.extend(model)
    assert out_ring == out_model
    assert not os.path.exists(os.path.join(SHM_DIR, n))


def test_writer_sigkilled_mid_stream(name):
    rng = random.Random(1)
    for trial in range(4):
        proc = start_writer(name, -1, 1 << 16)
        try:
            with RingReader(name, timeout_s=20) as r:
                got = 0
                kill_at = time.monotonic() + rng.uniform(0.05, 0.3)
                while time.monotonic() < kill_at:
                    p = r.get(timeout_s=0.01)
                    if p is not None:
                        assert p == payload_for(got)
                        got += 1
                os.kill(proc.pid, signal.SIGKILL)
                assert proc.wait(timeout=10) == -signal.SIGKILL
                # Everything published before the kill arrives complete, in order, then nothing.
                while (p := r.get(timeout_s=0.2)) is not None:
                    assert p == payload_for(got)
                    assert r.last_seq == got
                    got += 1
                assert got > 0
                assert not r.writer_alive()
                # A new writer resumes the sequence where the dead one stopped.
                w = RingWriter.attach(name)
                assert w.put(payload_for(got)) == got
                assert r.get(timeout_s=1) == payload_for(got)
                w.close(unlink=True)
        finally:
            proc.kill()
            proc.wait()
            unlink_ring(name)


def test_attach_recovers_sequence_after_crash_between_publish_and_seq_bump(name):
    with RingWriter(name, 4096) as w, RingReader(name) as r:
        for i in range(3):
            w.put(b"%d" % i)
        # Simulate a writer killed after advancing write_pos but before bumping next_seq.
        with open(os.path.join(SHM_DIR, name), "r+b") as f:
            f.seek(OFF_NEXT_SEQ)
            f.write((2).to_bytes(8, "little"))
        w2 = RingWriter.attach(name)
        assert w2.put(b"3") == 3
        w2.close()
        assert [r.get(timeout_s=0) for _ in range(4)] == [b"0", b"1", b"2", b"3"]
        assert r.last_seq == 3


def test_reader_restart_resumes_at_committed_position(name):
    with RingWriter(name, 4096) as w:
        for i in range(5):
            w.put(b"%d" % i)
        with RingReader(name) as r:
            assert r.get(timeout_s=0) == b"0"
            assert r.get(timeout_s=0) == b"1"
        with RingReader(name) as r:
            assert [r.get(timeout_s=0) for _ in range(4)] == [b"2", b"3", b"4", None]


def test_corrupted_payload_is_never_returned(name):
    with RingWriter(name, 4096) as w, RingReader(name) as r:
        w.put(b"good record")
        w.put(b"to be damaged")
        assert r.get(timeout_s=0) == b"good record"
        offset = HEADER_BYTES + FRAME.size + 16 + FRAME.size + 3  # inside the second payload
        with open(os.path.join(SHM_DIR, name), "r+b") as f:
            f.seek(offset)
            f.write(b"!")
        with pytest.raises(RingCorrupted, match="checksum"):
            r.get(timeout_s=0)


def test_manual_commit_holds_space_and_redelivers_after_reader_restart(name):
    with RingWriter(name, 4096) as w:
        r = RingReader(name, auto_commit=False)
        puts = 0
        while True:  # fill the ring
            try:
                w.put(b"r" * 500 + bytes([puts]), timeout_s=0)
                puts += 1
            except RingFull:
                break
        got = [r.get(timeout_s=0) for _ in range(puts)]
        assert [g[-1] for g in got] == list(range(puts))
        # Everything was read but nothing committed: the writer still may not overwrite it.
        with pytest.raises(RingFull, match="is the reader alive"):
            w.put(b"x" * 500, timeout_s=0.02)
        r.commit(1)
        assert r.committed_seq == 2
        r.commit(0)  # already committed: a no-op
        with pytest.raises(ValueError, match="beyond the last delivered"):
            r.commit(puts)
        r.close()  # a "crash" after reading everything: only seqs 0 and 1 were committed
        with RingReader(name, auto_commit=False, resume=True) as again:
            assert again.committed_seq == 2
            assert again.get(timeout_s=0)[-1] == 2 and again.last_seq == 2  # re-delivered
        with pytest.raises(RingError, match="resume=False but records up to seq 1"):
            RingReader(name, resume=False)
        with RingReader(name) as auto:  # auto-commit drains the rest
            while auto.get(timeout_s=0) is not None:
                pass
        assert w.free_bytes() == w.capacity


def test_get_view_is_zero_copy_and_commits_on_the_next_call(name):
    traj = Trajectory.from_rows(
        episode_id="e",
        group_id="g",
        group_size=1,
        reward=1.0,
        status="ok",
        rows=[
            TokenRow(np.arange(1000, dtype=np.int32), np.ones(1000, np.uint8), np.zeros(1000, np.float32), np.zeros(1000, np.int32), 1.0)
        ],
    )
    with RingWriter(name, 1 << 16) as w, RingReader(name) as r:
        assert w.put_parts(encode_trajectory_parts(traj)) == 0
        assert w.put(encode_trajectory(traj)) == 1
        view = r.get_view(timeout_s=0)
        out = decode_trajectory(view)
        assert out == traj
        assert np.shares_memory(out.array("input_ids"), np.frombuffer(r._mm, np.uint8))  # in the ring
        assert r.committed_seq == 0  # still held: the view is in use
        del out, view
        assert r.get(timeout_s=0) == encode_trajectory(traj)  # commits record 0, then record 1
        assert r.committed_seq == 2 and w.free_bytes() == w.capacity
        assert r.get_view(timeout_s=0) is None


def test_second_live_reader_is_refused(name):
    with RingWriter(name, 4096), RingReader(name):
        proc = run_in_repo(
            [sys.executable, "-c", f"from areal.ring.buffer import RingReader; RingReader({name!r}, timeout_s=1)"], timeout_s=60
        )
        assert proc.returncode != 0 and "already has a live reader" in proc.stderr


@pytest.mark.parametrize("length, error", [(6, "checksum mismatch"), (4000, "no valid record")])
def test_corrupted_frame_header_is_never_trusted(name, length, error):
    # A plausible wrong length fails the digest (it covers the frame); an impossible one the bounds.
    with RingWriter(name, 4096) as w, RingReader(name) as r:
        w.put(b"payload")
        with open(os.path.join(SHM_DIR, name), "r+b") as f:
            f.seek(HEADER_BYTES + FRAME_OFF_LENGTH)  # the length field: a torn or garbled frame
            f.write(length.to_bytes(4, "little"))
        with pytest.raises(RingCorrupted, match=error):
            r.get(timeout_s=0)
    unlink_ring(name)


@pytest.mark.parametrize("offset", [FRAME_OFF_DIGEST, FRAME_OFF_KIND + 8 - 1, FRAME_OFF_SEQ, FRAME.size + 8, FRAME.size + 14])
def test_any_damaged_word_of_a_record_is_caught_by_get_view(name, offset):
    # Every word of the record is covered: digest, kind/length, seq, payload and its zero padding.
    with RingWriter(name, 4096) as w, RingReader(name) as r:
        w.put(b"0123456789abc")  # 13 bytes: 3 bytes of padding
        with open(os.path.join(SHM_DIR, name), "r+b") as f:
            f.seek(HEADER_BYTES + offset)
            f.write(b"\x01")
        with pytest.raises(RingCorrupted):
            r.get_view(timeout_s=0)
    unlink_ring(name)


def test_reclaim_stale_removes_dead_segments_only(name):
    dead = ring_name(f"t{os.getpid()}dead{next(_counter)}", 0)
    code = f"from areal.ring.buffer import RingWriter; RingWriter({dead!r}, 4096)"  # dies without unlinking
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
    tmp = os.path.join(SHM_DIR, f".{dead}.999999999.tmp")  # a creator that died mid-creation
    open(tmp, "wb").close()
    try:
        with RingWriter(name, 4096):  # alive: must survive
            removed = reclaim_stale(f"areal-t{os.getpid()}")
            assert sorted(removed) == sorted([dead, os.path.basename(tmp)])
            assert os.path.exists(os.path.join(SHM_DIR, name))
    finally:
        unlink_ring(dead)
        if os.path.exists(tmp):
            os.unlink(tmp)


def test_reader_times_out_waiting_for_missing_segment(name):
    with pytest.raises(TimeoutError, match=name):
        RingReader(name, timeout_s=0.05)


def test_names():
    assert ring_name("run7", 3) == "areal-run7-r3"
    with pytest.raises(ValueError, match="ring name"):
        ring_name("a/b", 0)
    unlink_ring("areal-does-not-exist-r0")  # a missing segment is not an error


def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.001)


def test_sleeping_reader_is_woken_by_the_writers_doorbell(name):
    """A reader past its spin phase announces itself and sleeps on its doorbell; a ring wakes it
    (the shared words still decide: a ring alone returns nothing), and a put delivers."""
    with RingWriter(name, 4096) as w, RingReader(name) as r:
        got = []
        t = threading.Thread(target=lambda: got.append(r.get(timeout_s=30)))
        t.start()
        _wait_for(lambda: w._word(OFF_READER_WAITING) == 1, "the reader to announce its sleep")
        w._ring_peer(OFF_READER_BELL)  # a ring with no record: the reader wakes, re-checks, sleeps on
        _wait_for(lambda: r.bell_wakeups >= 1, "the doorbell to wake the reader")
        assert t.is_alive() and not got
        w.put(b"wake up")  # sees the flag and rings again
        t.join(timeout=30)
        assert got == [b"wake up"] and r.wait_cpu_s > 0
        assert w._word(OFF_READER_WAITING) == 0  # cleared once awake


def test_writer_blocked_by_a_full_ring_is_woken_by_the_readers_commit(name):
    with RingWriter(name, 4096) as w, RingReader(name) as r:
        record = b"x" * w.max_payload  # two fill the ring
        w.put(record)
        w.put(record)
        seqs = []
        t = threading.Thread(target=lambda: seqs.append(w.put(record, timeout_s=30)))
        t.start()
        _wait_for(lambda: r._word(OFF_WRITER_WAITING) == 1, "the writer to announce its sleep")
        r._ring_peer(OFF_WRITER_BELL)
        _wait_for(lambda: w.bell_wakeups >= 1, "the doorbell to wake the writer")
        assert t.is_alive() and not seqs  # back-pressure: still no room, so it sleeps on
        assert r.get(timeout_s=0) == record  # the commit frees room and rings the writer
        t.join(timeout=30)
        assert seqs == [2]
        assert r.get(timeout_s=5) == r.get(timeout_s=5) == record
