"""Wire types: Trajectory codec (zero-copy, little-endian, schema evolution) and control unions."""

import os

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from old_schemas import TrajectoryV1

from areal.protocol import (
    FRAME_HEADER,
    TRAJECTORY_SCHEMA,
    EpisodeOutcome,
    GatewayMessage,
    GatewayReply,
    GatewayRequest,
    Shutdown,
    SpawnEpisode,
    TokenRow,
    TrainerDone,
    TrainerFailed,
    TrainerMessage,
    TrainerReport,
    Trajectory,
    ZygoteInbound,
    ZygoteOutbound,
    ZygoteReady,
    decode_trajectory,
    encode_trajectory,
    encode_trajectory_parts,
    frame,
)
from areal.ring.buffer import RingReader, RingWriter, ring_name, unlink_ring

BUFFER_FIELDS = ("input_ids", "loss_mask", "logprobs", "versions", "row_lens", "row_rewards")


def make_rows(seed: int = 0, lens: tuple[int, ...] = (7, 0, 300)) -> list[TokenRow]:
    rng = np.random.default_rng(seed)
    rows = []
    for i, n in enumerate(lens):
        mask = (rng.random(n) < 0.6).astype(np.uint8)
        rows.append(
            TokenRow(
                input_ids=rng.integers(0, 151_000, n, dtype=np.int32),
                loss_mask=mask,
                logprobs=np.where(mask == 1, -rng.random(n), 0.0).astype(np.float32),
                versions=np.where(mask == 1, i + 3, -1).astype(np.int32),
                reward=float(i) - 0.5,
            )
        )
    return rows


def make_trajectory(**overrides) -> Trajectory:
    kwargs = dict(
        episode_id="ep-1",
        group_id="g-9",
        group_size=4,
        reward=0.75,
        status="ok",
        rows=make_rows(),
        timings={"agent_s": 1.5, "reward_s": 0.01},
        error="",
    )
    kwargs.update(overrides)
    return Trajectory.from_rows(**kwargs)


def test_trajectory_round_trip_every_field():
    rows = make_rows()
    traj = make_trajectory(rows=rows, error="partial: tool timeout")
    buf = encode_trajectory(traj)
    out = decode_trajectory(buf)
    assert out.schema_version == TRAJECTORY_SCHEMA
    assert (out.episode_id, out.group_id, out.group_size) == ("ep-1", "g-9", 4)
    assert (out.reward, out.status, out.error) == (0.75, "ok", "partial: tool timeout")
    assert out.timings == {"agent_s": 1.5, "reward_s": 0.01}
    assert out.num_tokens == sum(len(r.input_ids) for r in rows) == 307
    got = out.rows()
    assert len(got) == len(rows)
    for a, b in zip(got, rows):
        for field in ("input_ids", "loss_mask", "logprobs", "versions"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
        assert a.reward == b.reward
    np.testing.assert_array_equal(out.array("row_lens"), [7, 0, 300])
    assert out == traj


def test_schema_2_fields_round_trip():
    traj = make_trajectory(
        status="timeout",
        error="deadline 30s passed",
        drift=2,
        failure_kind="timeout",
        policy_version_start=3,
        policy_version_end=5,
        created=1_700_000_000.25,
        interaction_ids=["c-1", "c-2", "c-3"],
        row_turns=[1, 1, 4],
    )
    out = decode_trajectory(encode_trajectory(traj))
    assert out.schema_version == TRAJECTORY_SCHEMA == 4
    assert (out.drift, out.failure_kind, out.error) == (2, "timeout", "deadline 30s passed")
    assert (out.policy_version_start, out.policy_version_end) == (3, 5)
    assert out.created == 1_700_000_000.25
    assert out.interaction_ids == ["c-1", "c-2", "c-3"]
    np.testing.assert_array_equal(out.array("row_turns"), [1, 1, 4])
    assert out.array("row_turns").dtype == np.dtype("<i4")
    assert out.version_span() == (3, 5)  # rows sample at versions 3, 4 and 5; derived, not stored
    assert out == traj


def test_defaults_of_a_fresh_record():
    before = __import__("time").time()
    traj = make_trajectory()
    assert before <= traj.created
    assert (traj.drift, traj.failure_kind, traj.interaction_ids) == (0, "", [])
    assert (traj.policy_version_start, traj.policy_version_end) == (-1, -1)
    assert len(traj.row_turns) == 0
    assert make_trajectory(rows=[]).version_span() == (-1, -1)
    with pytest.raises(ValueError, match="interaction_ids has 1 entries for 3 rows"):
        make_trajectory(interaction_ids=["x"])
    with pytest.raises(ValueError, match="row_turns has 2 entries for 3 rows"):
        make_trajectory(row_turns=[1, 2])


def test_schema_1_record_decodes_with_defaults():
    new = make_trajectory()
    v1 = TrajectoryV1(
        1,
        "ep-old",
        "g-old",
        2,
        0.5,
        "ok",
        new.input_ids,
        new.loss_mask,
        new.logprobs,
        new.versions,
        new.row_lens,
        new.row_rewards,
        {"wall_s": 3.0},
        "",
    )
    buf = msgspec.msgpack.encode(v1)
    out = decode_trajectory(buf)
    assert out.schema_version == 1
    assert (out.episode_id, out.group_id, out.group_size, out.reward) == ("ep-old", "g-old", 2, 0.5)
    assert out.timings == {"wall_s": 3.0}
    for field in BUFFER_FIELDS:
        assert bytes(getattr(out, field)) == bytes(getattr(new, field)), field
    assert (out.drift, out.failure_kind, out.created, out.interaction_ids) == (0, "", 0.0, [])
    assert (out.policy_version_start, out.policy_version_end, len(out.row_turns)) == (-1, -1, 0)
    assert out.version_span() == new.version_span()
    # And a schema-1 reader still reads the leading fields of a schema-2 record.
    old = msgspec.msgpack.decode(encode_trajectory(new), type=TrajectoryV1)
    assert (old.episode_id, bytes(old.input_ids)) == ("ep-1", bytes(new.input_ids))


@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.integers(0, 20_000), max_size=4), turns=st.booleans())
def test_parts_concatenate_to_the_encoding(lens, turns):
    """Scatter-gather parts are byte-identical to encode_trajectory (bin headers 8/16/32-bit)."""
    traj = make_trajectory(rows=make_rows(1, tuple(lens)), row_turns=[1] * len(lens) if turns else None)
    parts = encode_trajectory_parts(traj)
    assert b"".join(parts) == encode_trajectory(traj)
    assert parts.nbytes == len(encode_trajectory(traj))  # the total put_parts trusts, then checks
    big = [p for p in parts if isinstance(p, memoryview)]
    assert all(p.nbytes >= 256 for p in big)  # small buffers are merged, big ones never copied
    assert any(p is traj.input_ids for p in big) == (len(traj.input_ids) >= 256)


def test_parts_measure_typed_buffers_in_bytes():
    """A buffer field set to an int32 memoryview or a numpy array (len = elements, not bytes)
    still gets the right bin header, and the ring stores exactly the encoding."""
    ids = np.arange(1000, dtype="<i4")
    traj = msgspec.structs.replace(make_trajectory(rows=make_rows(2, (1000,))), input_ids=memoryview(ids))
    parts = encode_trajectory_parts(traj)
    assert b"".join(parts) == encode_trajectory(traj)
    assert bytes(decode_trajectory(b"".join(parts)).input_ids) == ids.tobytes()
    assert any(p is traj.input_ids for p in parts)  # the typed view itself, uncopied
    as_array = [ids if p is traj.input_ids else p for p in parts]  # and a numpy array as a part
    name = ring_name(f"parts{os.getpid()}", 0)
    try:
        with RingWriter(name, 1 << 16) as writer, RingReader(name, timeout_s=5) as reader:
            writer.put_parts(parts)
            writer.put_parts(as_array)
            assert reader.get() == reader.get() == encode_trajectory(traj)
    finally:
        unlink_ring(name)


def test_trajectory_buffers_are_little_endian_zero_copy_views():
    buf = encode_trajectory(make_trajectory())
    out = decode_trajectory(buf)
    frame_bytes = np.frombuffer(buf, dtype=np.uint8)
    expected = {"input_ids": "<i4", "loss_mask": "u1", "logprobs": "<f4", "versions": "<i4", "row_lens": "<i4", "row_rewards": "<f4"}
    for field in BUFFER_FIELDS:
        view = getattr(out, field)
        assert isinstance(view, memoryview)
        assert view.obj is buf, field  # a view into the received frame, not a copy
        arr = out.array(field)
        assert arr.dtype == np.dtype(expected[field]) == arr.dtype.newbyteorder("<"), field
        assert arr.size == 0 or np.shares_memory(arr, frame_bytes), field
    # The bytes on the wire are little-endian regardless of the host: check one value by hand.
    first_id = int(make_rows()[0].input_ids[0])
    assert first_id.to_bytes(4, "little") in buf


def test_empty_trajectory_round_trips():
    traj = make_trajectory(rows=[], status="crashed", reward=0.0, timings=None)
    out = decode_trajectory(encode_trajectory(traj))
    assert out.rows() == [] and out.num_tokens == 0 and out.status == "crashed"


def test_newer_schema_is_refused():
    traj = msgspec.structs.replace(make_trajectory(), schema_version=TRAJECTORY_SCHEMA + 1)
    with pytest.raises(ValueError, match="newer than this reader"):
        decode_trajectory(encode_trajectory(traj))


def test_older_record_without_appended_fields_decodes_with_defaults():
    # A writer from before `timings`/`error` existed sends only the leading array positions.
    full = msgspec.msgpack.decode(encode_trajectory(make_trajectory()))
    old = msgspec.msgpack.encode(full[:12])
    out = decode_trajectory(old)
    assert out.timings == {} and out.error == ""
    assert out.episode_id == "ep-1" and out.num_tokens == 307


def test_gateway_messages_round_trip_through_the_union_decoder():
    decoder = msgspec.msgpack.Decoder(GatewayMessage)
    req = GatewayRequest(7, "POST", "/v1/chat/completions", {"authorization": "Bearer k"}, b'{"a":1}')
    reply = GatewayReply(7, 200, {"content-type": "text/event-stream"}, b"data: x\n\n", more=True)
    last = GatewayReply(7, 200, {}, b"")
    for msg in (req, reply, last):
        out = decoder.decode(msgspec.msgpack.encode(msg))
        assert type(out) is type(msg) and out == msg
    match decoder.decode(msgspec.msgpack.encode(last)):
        case GatewayReply(more=False, request_id=rid):
            assert rid == 7
        case other:
            pytest.fail(f"dispatched to {other!r}")


@pytest.mark.parametrize(
    "union, messages",
    [
        (ZygoteInbound, [SpawnEpisode("e1", b'{"q": 1}', "sk-1", 30.0), Shutdown()]),
        (
            ZygoteOutbound,
            [
                ZygoteReady(123, "agents.math", ["netns", "rlimits"], ["pidns: EPERM"]),
                ZygoteReady(124, "agents.math", []),
                EpisodeOutcome("e1", "ok", reward=1.0, wall_s=2.5),
                EpisodeOutcome("e2", "ok", rewards_by_id={"c1": 0.5, "c2": 1.0}),
                EpisodeOutcome("e3", "crashed", error="Killed", exit_signal=9),
            ],
        ),
        (
            TrainerMessage,
            [
                TrainerReport(3, 4, 96, {"loss": 0.12, "reward": 0.4}),
                TrainerFailed(1, "Traceback ..."),
                TrainerDone(10, "/tmp/run/final"),
            ],
        ),
    ],
)
def test_control_messages_round_trip_through_their_union(union, messages):
    decoder = msgspec.msgpack.Decoder(union)
    for msg in messages:
        data = frame(msgspec.msgpack.encode(msg))
        (n,) = FRAME_HEADER.unpack_from(data)
        assert n == len(data) - FRAME_HEADER.size
        out = decoder.decode(data[FRAME_HEADER.size :])
        assert type(out) is type(msg) and out == msg


def test_union_decoder_rejects_a_message_from_another_socket():
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.Decoder(ZygoteInbound).decode(msgspec.msgpack.encode(TrainerDone(1, "/x")))
