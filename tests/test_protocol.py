"""Wire types: Trajectory codec (zero-copy, little-endian, schema evolution) and control unions."""

import msgspec
import numpy as np
import pytest

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
    frame,
)

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


def test_trajectory_buffers_are_little_endian_zero_copy_views():
    buf = encode_trajectory(make_trajectory())
    out = decode_trajectory(buf)
    frame_bytes = np.frombuffer(buf, dtype=np.uint8)
    expected = {"input_ids": "<i4", "loss_mask": "u1", "logprobs": "<f4", "versions": "<i4",
                "row_lens": "<i4", "row_rewards": "<f4"}
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
