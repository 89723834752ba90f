"""Online mode (``rollout.openai.mode=online``): the episodes are sessions of agents that run outside
the project (any process on the host: a chat app, a CLI harness, a person), started and scored over
the gateway's HTTP door; the run trains on them as on sandboxed episodes.

    external client ──POST /rl/start_session (admin key)──► OnlineSessions.start ─┐ claims the oldest
        │                                                                          │ waiting episode slot
        │  ◄── 200 (v1) / 201 (v2) {session_id, api_key} ◄── gateway.open_session(episode, key) ◄──┘ (waits for one)
        ├── /v1/chat/completions, /v1/responses, /v1/messages (Bearer api_key): recorded as any episode's
        ├── POST /rl/set_reward {reward[, interaction_id]} (Bearer api_key)
        └── POST /rl/start_session {api_key} again (a refresh), or POST /rl/end_session (Bearer api_key)
               ─► the episode ends: its session closed, handed to the run (Episodes.run ─► settle ─► trained)

    Controller._run_group ─► Episodes.run ─► OnlineSessions.run_session: a slot waits to be claimed,
                                             then until its client ends it or rollout.deadline_s passes

What an episode is here. The run admits groups as it does for sandboxed agents (the staleness bound,
``rollout.max_concurrent_episodes``); each admitted episode is a slot that the next
``/rl/start_session`` claims. A start that finds no slot waits for one up to
``rollout.online_claim_s`` (the trainer has not caught up: the staleness bound holds new episodes
back), then gets a 429. The sessions have no shared prompt, so a group is not "n samples of one
prompt": the controller makes each step's ``groups_per_step x n_samples`` sessions one group
(``online_rollout``), so the baseline of an advantage is the mean reward of the step's sessions
(AReaL's batch-level normalisation of its online configs).

How an episode ends, and its reward:
- the client refreshes (``/rl/start_session`` naming its ``api_key``: the old episode ends and a
  new one starts under the same key, as AReaL's refresh does) or calls ``/rl/end_session``: the
  episode is over; a reward set meanwhile (``/rl/set_reward``, or ``/v1/rewards``) is its reward,
  else 0 (AReaL's default for a refreshed session);
- ``rollout.deadline_s`` after it was claimed: it ends as a timeout (an agent failure, not trained)
  unless a reward was set, which then stands;
- the run stops: claimed sessions are closed (the client's next call is a 401), waiting slots go.
A session without a single model call is not trained (the run's usual rule: nothing was sampled).

What this exposes (docs/security.md): the HTTP door on ``rollout.online_host`` (loopback by default)
and ``rollout.online_port``. Starting episodes needs the admin key (``gateway.admin_key``, at least 16
characters; drawn at random and printed when unset); a session key reaches only its own session,
under the gateway's per-session budgets (calls, sampled tokens, requests in flight). External agents
are not sandboxed: they are whatever the user runs.

Not covered: sessions spread over several gateways (Ray rollout workers); an external agent's own
failures (it reports none: a session it abandons ends at the deadline).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from areal.config import TrainConfig
from areal.gateway import Gateway, Session
from areal.gateway.contract import Reply, RequestError
from areal.protocol import EpisodeOutcome

# Default reward of a session its client ended without one (AReaL's refresh default).
UNREWARDED = 0.0


def online_rollout(config: TrainConfig) -> TrainConfig:
    """``config`` with each step's sessions as one group (the module docstring: "What an episode is
    here"): ``groups_per_step`` 1 and ``n_samples`` the step's sessions. Unchanged outside online mode."""
    r = config.rollout
    if r.openai.mode != "online" or r.groups_per_step == 1:
        return config
    per_step = r.groups_per_step * r.n_samples
    tqdm.write(
        f"[online] a step's {per_step} sessions (rollout.groups_per_step={r.groups_per_step} x rollout.n_samples={r.n_samples}) "
        "form one group: external sessions share no prompt, so each advantage's baseline is the step's mean reward"
    )
    rollout = dataclasses.replace(
        r, groups_per_step=1, n_samples=per_step, max_concurrent_episodes=max(r.max_concurrent_episodes, per_step)
    )
    return dataclasses.replace(config, rollout=rollout)


@dataclasses.dataclass(eq=False)
class _Slot:
    """One admitted episode: waiting for a client, then claimed by one (``key``) until it ends."""

    episode_id: str
    temperature: float | None
    claimed: asyncio.Future = dataclasses.field(default_factory=lambda: asyncio.get_running_loop().create_future())
    ended: asyncio.Future = dataclasses.field(default_factory=lambda: asyncio.get_running_loop().create_future())
    key: str = ""
    t0: float = 0.0
    session: Session | None = None  # closed when its client ended it (its key may already serve the next one)


class OnlineSessions:
    """The run's external sessions: ``run_session`` is ``Episodes``' hook (one admitted episode, run
    by whoever claims it), so ``Episodes`` never asks it for ``run_episode`` and holds it as its
    runner only to ``close`` it; ``start`` / ``end`` serve the gateway's ``/rl/`` routes (``gateway.online``)."""

    def __init__(
        self, gateway: Gateway, claim_s: float, write: Callable[[str], None], scored: bool = False, generation: str = "v1"
    ) -> None:
        """``scored``: the run has a reward function (``reward=``), which scores a session its client
        ended without a reward; else such a session's reward is ``UNREWARDED``."""
        self.gateway, self.claim_s, self.write, self.scored = gateway, claim_s, write, scored
        # AReaL's v1 gateway answers a start 200, its v2 one 201 (rollout.openai.online_gateway): its scripts check for it
        self.started_status = 201 if generation == "v2" else 200
        self.waiting: collections.deque[_Slot] = collections.deque()  # admitted, not claimed, oldest first
        self.live: dict[str, _Slot] = {}  # claimed, by session key
        self.keys: set[str] = set()  # every key this run issued (a refresh may name only these)
        self.arrived = asyncio.Condition()
        self.started = 0
        self.closed = False
        gateway.online = self

    # ---- the run's side ---------------------------------------------------------------------

    async def run_session(
        self, episode_id: str, problem: dict, deadline_s: float, temperature: float | None
    ) -> tuple[EpisodeOutcome, Session]:
        """One admitted episode: waits for a client to claim it, then for its end (the module
        docstring); the outcome (not settled) and its closed session."""
        slot = _Slot(episode_id, temperature)
        async with self.arrived:
            self.waiting.append(slot)
            self.arrived.notify()
        try:
            await slot.claimed
            try:
                why = await asyncio.wait_for(asyncio.shield(slot.ended), deadline_s)
            except TimeoutError:
                why = "deadline"
            return self._finish(slot, why, deadline_s)
        except asyncio.CancelledError:
            if slot in self.waiting:
                self.waiting.remove(slot)
            elif self.live.get(slot.key) is slot:
                del self.live[slot.key]
                self.gateway.close_session(slot.key)
            raise

    def _finish(self, slot: _Slot, why: str, deadline_s: float) -> tuple[EpisodeOutcome, Session]:
        session = slot.session
        if session is None:  # the deadline ended it: its key serves nobody else yet
            del self.live[slot.key]
            session = self.gateway.close_session(slot.key)
        wall = time.monotonic() - slot.t0
        rewarded = any(i.reward is not None for i in session.interactions.values())
        if why == "deadline" and not rewarded:
            error = f"the external agent neither ended its session nor set a reward within rollout.deadline_s={deadline_s:g} s"
            return EpisodeOutcome(slot.episode_id, "timeout", error=error, wall_s=wall), session
        if not session.interactions:
            error = "the external agent's session made no model call: nothing to train on"
            return EpisodeOutcome(slot.episode_id, "error", error=error, wall_s=wall), session
        if not rewarded and not self.scored:
            session.set_final_reward(UNREWARDED)
        # the client's rewards stand as the episode's own (a reward function scores only an unrewarded one)
        rewards = {i: x.reward for i, x in session.interactions.items() if x.reward is not None}
        return EpisodeOutcome(slot.episode_id, "ok", rewards_by_id=rewards if rewarded else {}, wall_s=wall), session

    def announce(self, http_url: str) -> None:
        """The console lines an external agent's user needs: where to start sessions, with what."""
        root = http_url.removesuffix("/v1")
        self.write(
            f"[online] external agents start episodes at {root}/rl/start_session (POST, Authorization: Bearer "
            f"{self.gateway.admin_key}); each gets an api_key for OPENAI_BASE_URL={root}/v1 (or ANTHROPIC_BASE_URL={root}), "
            f'scores it with POST {root}/rl/set_reward {{"reward": r}} and ends it with /rl/end_session or a refresh'
        )

    async def close(self) -> None:
        """The run is over: a start waiting for an episode, and every later one, is told so."""
        async with self.arrived:
            self.closed = True
            self.arrived.notify_all()

    # ---- the clients' side (the gateway's /rl/ routes) ----------------------------------------

    async def start(self, body: dict[str, Any]) -> Reply:
        """``/rl/start_session``: a refresh ends the episode of ``api_key`` first; then the oldest
        waiting episode is claimed (waiting ``claim_s`` for one) under that key or a new one."""
        key = body.get("api_key")
        if key is not None:
            if not isinstance(key, str) or key not in self.keys:
                raise RequestError(400, "api_key must be a key this run issued (omit it to get a new one)", param="api_key")
            if key in self.live:
                self.end(key)
        try:
            async with self.arrived:
                await asyncio.wait_for(self.arrived.wait_for(lambda: bool(self.waiting) or self.closed), self.claim_s)
                if self.closed:
                    raise RequestError(503, "the run has ended (or failed): it starts no more episodes", kind="engine_unavailable")
                slot = self.waiting.popleft()
        except TimeoutError:
            raise RequestError(
                429,
                f"the run admitted no new episode within rollout.online_claim_s={self.claim_s:g} s (the trainer has not "
                "caught up with the staleness bound, or the run is ending): retry later",
                kind="rate_limit_error",
            ) from None
        slot.key = self.gateway.open_session(slot.episode_id, slot.temperature, key=key)
        slot.t0 = time.monotonic()
        self.keys.add(slot.key)
        self.live[slot.key] = slot
        self.started += 1
        slot.claimed.set_result(None)
        credentials = {"session_id": slot.episode_id, "session_api_key": slot.key}
        # the status AReaL's gateway of that generation answers: its scripts check for exactly that one
        return Reply(
            status=self.started_status,
            body={"session_id": slot.episode_id, "api_key": slot.key, "group_id": slot.episode_id, "sessions": [credentials]},
        )

    def end(self, key: str) -> Reply:
        """``/rl/end_session`` (or a refresh): the episode of ``key`` is over."""
        slot = self.live.get(key)
        if slot is None:
            raise RequestError(404, "no live online session has this key", kind="not_found_error")
        del self.live[key]
        slot.session = self.gateway.close_session(key)  # now: a refresh opens the next session under this key
        slot.ended.set_result("ended")
        return Reply(status=200, body={"session_id": slot.episode_id, "ended": True})
