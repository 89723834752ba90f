"""The ring's C extension ``areal.ring._ringcopy``: built wherever a compiler exists, bit-identical to
the ``xxhash`` package for every length and kernel, writing exactly the bytes the pure-Python
writer path writes (so either writer pairs with the one reader), framing a Trajectory exactly
as msgspec does (``put_trajectory``), and leaving its slow paths (no room, too large, corrupted
commit_pos) to Python with nothing published."""

import os
import random
import shlex
import shutil
import sysconfig

import numpy as np
import pytest
import xxhash

from areal.protocol import TokenRow, Trajectory, decode_trajectory, encode_trajectory
from areal.ring import buffer
from areal.ring import layout as ring_layout
from areal.ring.buffer import (
    HEADER_BYTES,
    SHM_DIR,
    RecordTooLarge,
    RingCorrupted,
    RingError,
    RingFull,
    RingReader,
    RingWriter,
    ring_name,
    unlink_ring,
)
from areal.ring.layout import NATIVE

needs_native = pytest.mark.skipif(NATIVE is None, reason="areal.ring._ringcopy not built")


def _compiler() -> str | None:
    cc = sysconfig.get_config_var("CC")
    configured = shutil.which(shlex.split(cc)[0]) if cc else None
    return shutil.which("cc") or configured


def test_native_module_is_built_where_a_compiler_exists():
    """CI must not silently lose the fast path: with a C compiler, the extension must import."""
    if _compiler() is None:
        pytest.skip("no C compiler: the pure-Python ring path is expected")
    assert NATIVE is not None, (
        "a C compiler exists but areal.ring._ringcopy did not build or import; run "
        "`python -m pip install --no-deps -e .` and read its build output"
    )


@pytest.fixture(params=NATIVE.implementations() if NATIVE is not None else [])
def kernel(request):
    previous = NATIVE.use(request.param)
    yield request.param
    NATIVE.use(previous)


@needs_native
def test_xxh3_equals_xxhash_for_every_length_offset_and_kernel(kernel):
    rng = random.Random(kernel)
    data = rng.randbytes(300_000)
    lengths = list(range(0, 2200)) + [rng.randrange(2200, 290_000) for _ in range(60)]
    lengths += [k * 1024 + d for k in (1, 2, 104) for d in (-65, -64, -63, -1, 0, 1, 63, 64, 65)]
    for n in lengths:
        start = rng.randrange(0, 64)  # every alignment of the input
        assert NATIVE.xxh3_64(data, start, start + n) == xxhash.xxh3_64_intdigest(data[start : start + n]), n
    assert NATIVE.xxh3_64(b"") == xxhash.xxh3_64_intdigest(b"")
    with pytest.raises(ValueError):
        NATIVE.xxh3_64(b"abc", 2, 4)


def _random_parts(rng: random.Random, data: bytes) -> list:
    """Bytes, memoryviews and numpy arrays (len != nbytes) of assorted sizes, some empty."""
    parts = []
    for _ in range(rng.randrange(0, 12)):
        size = rng.choice([0, rng.randrange(1, 300), rng.randrange(300, 5000), rng.randrange(5000, 40000)])
        at = rng.randrange(0, len(data) - size)
        chunk = data[at : at + size]
        kind = rng.randrange(3)
        if kind == 1:
            chunk = memoryview(chunk)
        elif kind == 2:
            chunk = np.frombuffer(chunk[: size - size % 4], dtype="<i4")
        parts.append(chunk)
    return parts


@needs_native
def test_copy_digest_writes_the_parts_and_returns_the_xxh3_of_the_range(kernel):
    rng = random.Random(f"copy-{kernel}")
    data = rng.randbytes(200_000)
    for _ in range(400):
        parts = _random_parts(rng, data)
        payload = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
        n, padded = len(payload), (len(payload) + 7) & ~7
        head = rng.choice([0, 16, rng.randrange(0, 40), rng.randrange(0, 3000)])  # digest bytes before
        before, after = rng.randrange(0, 70), rng.randrange(0, 70)
        dest = bytearray(rng.randbytes(before + head + padded + after))
        original = bytes(dest)
        offset = before + head
        digest = NATIVE.copy_digest(dest, offset, parts, before, n)
        assert dest[offset : offset + n] == payload
        assert dest[offset + n : offset + padded] == bytes(padded - n)  # zero padding
        assert dest[:offset] == original[:offset] and dest[offset + padded :] == original[offset + padded :]
        assert digest == xxhash.xxh3_64_intdigest(bytes(dest[before : offset + padded])), (n, head)


@needs_native
def test_copy_digest_with_a_wrong_length_or_bad_part_writes_nothing():
    dest = bytearray(64)
    assert NATIVE.copy_digest(dest, 8, [b"abc", memoryview(b"de")], 0, 6) is None
    assert NATIVE.copy_digest(dest, 8, [b"abc", memoryview(b"de")], 0, 4) is None
    strided = np.arange(10, dtype=np.int32)[::2]  # not contiguous: refused before any write
    with pytest.raises(ValueError, match="not C-contiguous"):  # numpy's refusal
        NATIVE.copy_digest(dest, 8, [b"abc", strided], 0, 3 + strided.nbytes)
    with pytest.raises(BufferError):  # a strided memoryview's
        NATIVE.copy_digest(dest, 8, [b"abc", memoryview(bytes(40))[::2]], 0, 23)
    with pytest.raises(ValueError):  # the padded record would run past the end
        NATIVE.copy_digest(dest, 60, [b"abcde"], 0, 5)
    with pytest.raises(ValueError):  # the digest cannot start after the payload
        NATIVE.copy_digest(dest, 8, [b"abc"], 9, 3)
    with pytest.raises(BufferError, match="not writable"):  # a read-only destination
        NATIVE.copy_digest(bytes(64), 8, [b"abc"], 0, 3)
    assert dest == bytearray(64)


@pytest.fixture
def names():
    """Two fresh ring names; the test must leave nothing behind in /dev/shm."""
    pair = [ring_name(f"n{os.getpid()}x{i}{random.randrange(1 << 30)}", 0) for i in range(2)]
    yield pair
    leftovers = [e for e in os.listdir(SHM_DIR) if any(n in e for n in pair)]
    for n in pair:
        unlink_ring(n)
    assert not leftovers, f"test left {leftovers} in {SHM_DIR}"


def _data_region(name: str) -> bytes:
    with open(os.path.join(SHM_DIR, name), "rb") as f:
        return f.read()[HEADER_BYTES:]


@needs_native
def test_native_and_python_writers_write_identical_rings(names):
    """Same records through each writer path, wrapping several times: byte-identical data
    regions, and each ring read back (digests verified) by the one reader."""
    rng = random.Random(7)
    records = [rng.randbytes(rng.choice([0, 5, 200, 241, 1500, 3000])) for _ in range(120)]
    capacity = 16384
    rings = {}
    for name, native in zip(names, (True, False)):
        got = []
        with RingWriter(name, capacity, native=native) as w, RingReader(name) as r:
            for i, payload in enumerate(records):
                parts = [payload[:7], memoryview(payload[7:])]  # scatter-gather across a boundary
                assert w.put_parts(parts) == i
                got.append(r.get(timeout_s=0))
                if i == len(records) - 1:
                    rings[native] = _data_region(name)
        assert got == records
    assert rings[True] == rings[False]


@needs_native
@pytest.mark.parametrize("first,second", [(True, False), (False, True)])
def test_a_ring_written_by_one_path_continues_with_the_other(names, first, second):
    name = names[0]
    w = RingWriter(name, 8192, native=first)
    for i in range(10):
        w.put(bytes([i]) * (300 + i))
    w.close()  # the writer goes away, its records stay
    with RingWriter.attach(name, native=second) as w2, RingReader(name) as r:
        for i in range(10, 40):
            assert r.get(timeout_s=0) == bytes([i - 10]) * (290 + i)
            w2.put(bytes([i]) * (300 + i))
        got = [r.get(timeout_s=0) for _ in range(10)]
        assert got[-1] == bytes([39]) * 339


def test_without_the_extension_the_ring_falls_back_to_python(names, monkeypatch):
    monkeypatch.setattr(buffer, "NATIVE", None)
    with pytest.raises(RingError, match="not built"):
        RingWriter(names[0], 4096, native=True)
    assert not os.path.exists(os.path.join(SHM_DIR, names[0]))
    with RingWriter(names[0], 4096) as w, RingReader(names[0]) as r:  # default: whatever is built
        assert w._native is None
        w.put_parts([b"abc", memoryview(b"defgh")])
        assert r.get(timeout_s=0) == b"abcdefgh"
    assert ring_layout.digest is xxhash.xxh3_64_intdigest  # the reader's digest needs no extension


def _trajectory(tokens: tuple[int, ...], seed: int = 0) -> Trajectory:
    """Rows of the given lengths: buffers from empty to > 64 KiB (msgpack bin 8, 16 and 32)."""
    rng = np.random.default_rng(seed)
    rows = [
        TokenRow(
            input_ids=rng.integers(0, 8192, n, dtype=np.int32),
            loss_mask=np.ones(n, np.uint8),
            logprobs=-rng.random(n).astype(np.float32),
            versions=np.full(n, 3, np.int32),
            reward=0.5,
        )
        for n in tokens
    ]
    return Trajectory.from_rows(
        episode_id=f"ep-{seed}",
        group_id="g",
        group_size=2,
        reward=0.5,
        status="ok",
        rows=rows,
        timings={"agent_s": 0.5},
        interaction_ids=[f"i{k}" for k in range(len(rows))],
        row_turns=[1] * len(rows),
    )


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_native), False])
def test_put_trajectory_stores_exactly_the_encoding(names, native):
    """put_trajectory (native: msgpack framing emitted in C) stores encode_trajectory's bytes for
    every bin header size, and the reader decodes them."""
    trajs = [_trajectory(t, seed) for seed, t in enumerate([(), (0,), (10,), (40, 30), (1000,), (17_000,), (9, 20_000)])]
    with RingWriter(names[0], 1 << 20, native=native) as w, RingReader(names[0]) as r:
        for i, traj in enumerate(trajs):
            assert w.put_trajectory(traj) == i
            assert r.get(timeout_s=0) == encode_trajectory(traj)
        w.put_trajectory(trajs[-1])
        back = decode_trajectory(r.get_view(timeout_s=0))
        assert bytes(back.input_ids) == bytes(trajs[-1].input_ids) and back.interaction_ids == ["i0", "i1"]
        del back


@needs_native
def test_native_put_trajectory_and_python_put_parts_write_identical_rings(names):
    """The C framing and the Python parts, wrapping a small ring: byte-identical data regions."""
    trajs = [_trajectory((n, 300), n) for n in (5, 700, 2000, 90, 1500)] * 12
    rings = {}
    for name, native in zip(names, (True, False)):
        with RingWriter(name, 1 << 17, native=native) as w, RingReader(name) as r:
            for traj in trajs:
                w.put_trajectory(traj)
                assert r.get(timeout_s=0) == encode_trajectory(traj)
            rings[native] = _data_region(name)
    assert rings[True] == rings[False]


@needs_native
def test_native_put_slow_paths_publish_nothing(names):
    big = _trajectory((3000,))
    with RingWriter(names[0], 1 << 14, native=True) as w, RingReader(names[0]) as r:
        with pytest.raises(RecordTooLarge, match=f"{len(encode_trajectory(big))} bytes"):
            w.put_trajectory(big)
        small = _trajectory((200,))
        puts = 0
        with pytest.raises(RingFull):
            while True:
                w.put_trajectory(small, timeout_s=0.02)
                puts += 1
        assert puts > 3 and w.next_seq == puts
        assert r.get(timeout_s=0) == encode_trajectory(small)  # room for one more
        assert w.put_trajectory(small, timeout_s=0) == puts
        # A commit_pos beyond write_pos is corruption, never a reason to overwrite.
        u64 = memoryview(w._buf).cast("Q")
        saved = u64[buffer.OFF_COMMIT_POS >> 3]
        u64[buffer.OFF_COMMIT_POS >> 3] = w._native.write_pos + 8
        with pytest.raises(RingCorrupted, match="commit_pos"):
            w.put(b"x" * 5000)
        u64[buffer.OFF_COMMIT_POS >> 3] = saved
        u64.release()
        got = [r.get(timeout_s=0) for _ in range(puts)]
        assert got == [encode_trajectory(small)] * puts and r.get(timeout_s=0) is None


@needs_native
def test_native_writer_checks_its_arguments_and_closes():
    dest = bytearray(HEADER_BYTES + 4096)
    assert NATIVE.LAYOUT == ring_layout._NATIVE_LAYOUT  # built from this layout, else not used
    with pytest.raises(ValueError, match="does not hold a ring"):
        NATIVE.Writer(dest, 8192, 1000, 0, 0, 0)
    w = NATIVE.Writer(dest, 4096, 2024, 0, 0, 0)
    values = (1, b"\x01\x02", 3)
    with pytest.raises(ValueError, match="fixarray"):  # head must encode exactly values[:1]
        w.put_struct(values, b"\x92\x01\x02", b"\x91\x03", 1, 2)
    with pytest.raises(TypeError):
        w.put_struct(list(values), b"\x91\x01", b"\x91\x03", 1, 2)
    assert w.put_struct(values, b"\x91\x01", b"\x91\x03", 1, 2) == 0
    assert bytes(dest[HEADER_BYTES + 24 : HEADER_BYTES + 24 + 6]) == b"\x93\x01\xc4\x02\x01\x02"
    assert w.write_pos == 32 and w.next_seq == 1
    w.close()
    w.close()  # idempotent; the buffer is released
    dest.append(0)  # a bytearray with an export cannot be resized
    with pytest.raises(ValueError, match="closed"):
        w.put([b"x"], 1)
