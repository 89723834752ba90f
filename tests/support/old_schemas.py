"""Frozen copies of the Trajectory layouts records were written in before the current one
(areal/protocol.py), for the tests that decode old records and read new ones with an old reader.
Never edit them: each is what a record of that schema holds on disk and on the wire."""

from __future__ import annotations

import msgspec


class TrajectoryV1(msgspec.Struct, array_like=True, gc=False):
    """Schema 1 (as shipped before schema 2)."""

    schema_version: int
    episode_id: str
    group_id: str
    group_size: int
    reward: float
    status: str
    input_ids: memoryview
    loss_mask: memoryview
    logprobs: memoryview
    versions: memoryview
    row_lens: memoryview
    row_rewards: memoryview
    timings: dict[str, float] = {}
    error: str = ""


class TrajectoryV2(TrajectoryV1, array_like=True, gc=False):
    """Schema 2 (before row_parents): schema 1's fields, then these."""

    drift: int = 0
    failure_kind: str = ""
    policy_version_start: int = -1
    policy_version_end: int = -1
    created: float = 0.0
    interaction_ids: list[str] = []
    row_turns: memoryview = memoryview(b"")


class TrajectoryV3(TrajectoryV2, array_like=True, gc=False):
    """Schema 3 (before row_forks): schema 2's fields, then this."""

    row_parents: memoryview = memoryview(b"")
