"""Whole groups into the trainer's rings: the one producer of a run's records.

    group's trajectories ─► too_stale? ─ yes ─► not published (logged ``stale``; the loop runs the prompt again)
                                 │ no
                                 ▼
                 resume journal (append) ─► ring of rank (groups written mod ranks) ─► trajectories.bin
                                                                                  └─► accepted += 1

Groups finish concurrently on the controller's event loop; one lock serialises them, so the
staleness verdict, the journal, the ring and the count of accepted groups always agree. A record
is in a ring only after the journal holds it, so a resumed run can replay every published group
no checkpoint trained (``areal/controller/recovery.py``). A full ring is back-pressure: the put
waits as long as the trainer lives, in slices that each re-check the run's failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from areal.agent.groups import AdvantageWatch
from areal.controller.records import RunRecords
from areal.controller.recovery import Journal
from areal.controller.run_setup import RunFailed
from areal.controller.trajectories import STALE, too_stale
from areal.protocol import Trajectory, encode_trajectory, frame

PUT_SLICE_S = 1.0  # a put into a full ring re-checks the run's failure this often


class Ring(Protocol):
    """What a group is put into: a local ``RingWriter``, or a remote rank's ring (Ray)."""

    def put_trajectory(self, traj: Trajectory, timeout_s: float | None = None) -> object: ...


class GroupPublisher:
    """The rings' one writer. ``accepted`` counts the groups published (a resumed run starts it at
    the groups its checkpoint trained); ``published`` the episode ids put into the rings, in order;
    ``stale`` the groups refused since the last ``take_stale``. ``failure()`` is the run's
    failure, or None while it goes on."""

    def __init__(
        self,
        records: RunRecords,
        journal: Journal | None,
        advantage_watch: AdvantageWatch,
        groups_per_step: int,
        max_head_offpolicyness: int,
        failure: Callable[[], str | None],
    ) -> None:
        self.records, self.journal, self.advantage_watch = records, journal, advantage_watch
        self.groups_per_step, self.bound, self.failure = groups_per_step, max_head_offpolicyness, failure
        self.rings: list[Ring] = []  # set once the trainer side is up
        self.lock = asyncio.Lock()
        self.accepted = 0
        self.groups_written = 0
        self.stale = 0
        self.published: list[str] = []

    async def publish(self, trajectories: list[Trajectory], journal: bool = True, log: Callable[[str], None] | None = None) -> bool:
        """A whole group into one ring (round-robin over ranks), in order; then it counts. False,
        publishing nothing, when the step that would train it starts more than
        ``rollout.max_head_offpolicyness`` versions after its oldest token (``too_stale``; not asked
        of a resumed run's replay, ``journal=False``): the caller runs its prompt again. ``log(mark)``
        writes the group's episode lines, under the same lock as the verdict ("" or ``STALE``).
        ``put_trajectory`` frames each record straight into shared memory (no encoded copy)."""
        async with self.lock:
            oldest = too_stale(trajectories, self.accepted, self.groups_per_step, self.bound) if journal else None
            if log is not None:
                log("" if oldest is None else STALE)
            if oldest is not None:
                self.stale += 1
                return False
            # each record encoded once, for the journal and the saved copy alike (the ring's writer
            # frames it from the arrays itself)
            to_journal = journal and self.journal is not None
            frames = b"".join(frame(encode_trajectory(t)) for t in trajectories) if to_journal or self.records.saves_trajectories else b""
            if to_journal:
                self.journal.append(frames)
            ring = self.rings[self.groups_written % len(self.rings)]
            self.groups_written += 1
            for traj in trajectories:
                await self._put(ring, traj)
                self.published.append(traj.episode_id)
            self.records.trajectories(frames)
            self.accepted += 1
        self.advantage_watch.add(trajectories[0].group_id, trajectories)
        return True

    async def _put(self, ring: Ring, traj: Trajectory) -> None:
        """Put ``traj`` into ``ring``; while the ring is full (the trainer is still on earlier
        records), wait as long as the trainer runs, re-checking the run's failure every
        ``PUT_SLICE_S``: a trainer that died with the ring full stops the run, not a fixed timeout."""
        while True:
            try:
                await asyncio.to_thread(ring.put_trajectory, traj, PUT_SLICE_S)
                return
            except TimeoutError:  # RingFull, or a remote ring's HopTimeout: the record was not put
                if (why := self.failure()) is not None:
                    raise RunFailed(why) from None

    async def replay(self, replay: list[Trajectory], write: Callable[[str], None]) -> None:
        """A resumed run's first records: the killed run's published groups no checkpoint holds,
        whole and in their order (the journal holds them already)."""
        groups: dict[str, list[Trajectory]] = {}
        for t in replay:
            groups.setdefault(t.group_id, []).append(t)
        for trajectories in groups.values():
            await self.publish(trajectories, journal=False)
        if groups:
            write(f"[resume] replayed {len(replay)} trajectories in {len(groups)} groups")

    async def compact(self, trained: set[str]) -> None:
        """Drop the ``trained`` episodes (a complete checkpoint holds them) from the journal, with
        no group being appended meanwhile."""
        if self.journal is not None:
            async with self.lock:
                self.journal.compact(trained)

    def take_stale(self) -> int:
        """The groups refused as stale since the last call (a step's ``stale_groups``)."""
        stale, self.stale = self.stale, 0
        return stale
