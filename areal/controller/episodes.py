"""The run's agent episodes, one at a time: run in a gateway session, a crash judged, the outcome settled.

    Controller._run_group (training) ──┐                 ┌─ the controller's gateway: open ─► runner.run_episode ─► close
                                       ├─► Episodes.run ─┤    (branched by replay: its other branches' episodes, _replay_branches)
    AgentEvaluation (data.eval_mode) ──┘                 └─ the runner's own (its workers' gateways): runner.run_session
          │ crashed?
          ├─► Episodes.lost: the infrastructure's crash (the episode, or its group, runs again with new ids),
          │     not the agent's ─► Episodes.recover: a dead sandbox zygote restarted
          ▼
    Episodes.settle: the reward function (the agent gave no reward), the rewards checked against the
        episode's own completions and rollout.reward_range, the failure class (areal/agent/failures.py)
    Episodes.settle_episode (training): an episode branched at a model call (rollout.branch) settled
        branch by branch, as one tree (areal/controller/branches.py: settle_tree)

Both of the controller's episode paths go through this one object: a training group's episodes
(logged, counted and trained by the controller) and the held-out evaluation's
(``data.eval_mode=agent``, areal/controller/agent_eval.py: settled the same way, never trained or logged
with them). What kind of runner the run has is said once, where the controller starts it
(``Controller._start_runner``), by the arguments it builds this with; neither path asks:

- ``run_session``: the runner records each episode's session on gateways of its own and
  returns it with the outcome (``RayRunner.run_session`` with ``cluster.gateway=worker``,
  areal/cluster/ray_rollout.py). Without it the controller's gateway opens the session and
  closes it when the episode ends, however it ends (the sandbox zygote, inline agents, Ray
  workers over the controller's gateway).
- ``zygote``: the run's sandbox zygote. A crash is lost to the infrastructure when the zygote
  died under it: dead now, or restarted meanwhile (by another group, or the evaluation). The
  first path to notice restarts it, once, up to ``rollout.max_zygote_restarts`` times in the run;
  past that the run stops (``fail``) naming the last crash.
- ``lost``: a runner that names the crashes it lost itself (``RayRunner.lost``: a worker or its
  zygote died under the episode). It drops a lost worker on its own, so nothing is restarted here.

A runner with neither (inline agents) loses no episode to the infrastructure: its crashes are the
agent's. ``episode_record`` is a training episode's line in episodes.jsonl, ``workflow_call_record``
an ``arun_episode`` call's.

What is not covered: a crash a runner cannot attribute (it stays the agent's failure);
RolloutWorkflow objects, which have no runner (the controller calls them with its engine client).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from areal.agent.failures import POLICY, REWARD_HACK, classify_outcome, trained
from areal.agent.groups import WorkflowCall
from areal.agent.spec import EpisodeRunner, check_episode_rewards
from areal.config import RolloutConfig
from areal.controller.agent_eval import EvalEpisode
from areal.controller.branches import close_branches, settle_tree, tree_of
from areal.controller.records import reason
from areal.gateway import Gateway, Session
from areal.gateway.branching import branch_keys, never_branch, replay_divergence, replay_point, split_replayed
from areal.gateway.tree import Interaction
from areal.protocol import EpisodeOutcome
from sandbox.zygote_client import Zygote


class Episodes:
    """The run's runner and gateway as its episode paths use them; built by ``Controller._start_runner``.
    ``rollout``: the run's rollout settings (deadline_s, reward_range, policy_failure_reward,
    failure_classes, max_zygote_restarts); ``reward_fn``: the run's reward function (``reward``, named by
    ``reward_name``), or None. ``write`` prints a console line; ``fail`` stops the run with a
    reason (the first one stands)."""

    def __init__(
        self,
        runner: EpisodeRunner,
        gateway: Gateway,
        rollout: RolloutConfig,
        reward_fn: Callable[..., float] | None,
        reward_name: str,
        tokenizer: Any,
        write: Callable[[str], None],
        fail: Callable[[str], None],
        *,
        run_session: Callable[[str, dict, float, float | None], Awaitable[tuple[EpisodeOutcome, Session]]] | None = None,
        zygote: Zygote | None = None,
        lost: Callable[[EpisodeOutcome], bool] | None = None,
    ) -> None:
        self.runner, self.gateway, self.rollout = runner, gateway, rollout
        self.reward_fn, self.reward_name, self.tokenizer, self.write, self.fail = reward_fn, reward_name, tokenizer, write, fail
        self.run_session, self.zygote, self.worker_lost = run_session, zygote, lost
        self.restarts = 0
        self.generation = 0  # bumped by every zygote restart: what ``lost`` compares an attempt's mark with
        self.restart_lock = asyncio.Lock()

    async def close(self) -> None:
        await self.runner.close()

    # ---- one episode in its session -------------------------------------------------------

    async def run(
        self,
        episode_id: str,
        problem: dict,
        temperature: float | None = None,
        cancelled: Callable[[Session], None] | None = None,
        branching: bool = True,
    ) -> tuple[EpisodeOutcome, Session]:
        """``problem`` run as episode ``episode_id`` in a session sampled at ``temperature`` (None:
        the agent's own); its outcome (not yet settled) and the session, closed (its branch
        sessions, if it branched, are closed by ``settle_episode``). An error propagates with the
        session and its branch sessions closed; cancelled (the run is stopping), ``cancelled``
        first gets what the session recorded (an empty one for the runner's own session).
        ``branching``: False keeps the episode from branching at a model call (rollout.branch)."""
        deadline = self.rollout.deadline_s
        if self.run_session is not None:
            try:
                return await self.run_session(episode_id, problem, deadline, temperature)
            except asyncio.CancelledError:
                if cancelled is not None:
                    cancelled(Session(key="", episode_id=episode_id))
                raise
        key = self.gateway.open_session(episode_id, temperature)
        if not branching:
            never_branch(self.gateway.sessions[key], "a held-out evaluation episode is never branched")
        try:
            outcome = await self.runner.run_episode(episode_id, problem, key, deadline)
            trunk = self.gateway.sessions.get(key) or self.gateway.expired.get(key)
            point = replay_point(trunk) if trunk is not None else None
            if point is not None and not point.split:  # its other branches not run yet
                outcome = await self._replay_branches(episode_id, problem, outcome, trunk, deadline)
        except asyncio.CancelledError:
            session = self.gateway.close_session(key)
            close_branches(self.gateway, session)
            if cancelled is not None:
                cancelled(session)
            raise
        except BaseException:
            close_branches(self.gateway, self.gateway.close_session(key))
            raise
        return outcome, self.gateway.close_session(key)

    async def _replay_branches(
        self, episode_id: str, problem: dict, trunk: EpisodeOutcome, session: Session, deadline: float
    ) -> EpisodeOutcome:
        """An episode branched by replay (rollout.branch.replay; areal/gateway/branching.py): it ran
        on as branch 0; each other branch now runs as an episode of the same row in the session
        the gateway opened for it, its calls before the branch point answered from the trunk's,
        all at once. Their outcomes as the sandbox gives a forked episode's (``branches``); a branch
        that did not repeat the trunk's calls is crashed, its divergence named (never trained)."""
        keys, point = branch_keys(session), replay_point(session)
        assert point is not None
        split_replayed(self.gateway, session)
        runs = [self.runner.run_episode(f"{episode_id}/b{i}", problem, key, deadline) for i, key in enumerate(keys, 1)]
        got = await asyncio.gather(*runs, return_exceptions=True)
        branches = [msgspec.structs.replace(trunk, episode_id=f"{episode_id}/b0")]
        for i, (key, outcome) in enumerate(zip(keys, got), 1):
            if isinstance(outcome, BaseException):
                if isinstance(outcome, asyncio.CancelledError):
                    raise outcome
                outcome = EpisodeOutcome(f"{episode_id}/b{i}", "crashed", error=f"the replaying branch's runner failed: {outcome!r}")
            held = self.gateway.sessions.get(key) or self.gateway.expired.get(key)
            why = replay_divergence(held) if held is not None else ""
            if why:
                outcome = msgspec.structs.replace(
                    outcome, status="crashed", error=f"branch replay diverged: {why}", reward=None, rewards_by_id={}
                )
            branches.append(outcome)
        wall = trunk.wall_s + max((b.wall_s for b in branches[1:]), default=0.0)
        return EpisodeOutcome(
            episode_id,
            "ok",
            wall_s=wall,
            branches=branches,
            branch_point=f"call {point.call} of {episode_id}, by replay ({point.replayed})",
        )

    async def evaluate(self, episode_id: str, problem: dict, temperature: float | None) -> EvalEpisode:
        """One held-out episode of the run's agent (areal/controller/agent_eval.py), sampled at ``temperature``
        (None: the agent's own), run and settled as a training episode is but never trained or
        logged with them; run again when it was lost to the infrastructure, as a group is."""
        for attempt in range(self.rollout.max_zygote_restarts + 1):
            mark = self.generation
            attempt_id = episode_id if attempt == 0 else f"{episode_id}-retry{attempt}"
            outcome, session = await self.run(attempt_id, problem, temperature, branching=False)
            if not self.lost([outcome], mark) or not await self.recover(outcome.error):
                break
        return EvalEpisode(await self.settle(outcome, session, problem), list(session.interactions.values()))

    # ---- crashes lost to the infrastructure -----------------------------------------------

    def lost(self, outcomes: list[EpisodeOutcome], mark: int) -> bool:
        """Whether the crashes among ``outcomes`` (one attempt's, begun when ``generation`` was
        ``mark``) were the infrastructure's, so that the attempt runs again once ``recover`` says
        the runner is whole."""
        if not any(o.status == "crashed" for o in outcomes):
            return False
        if self.zygote is not None:  # it died under them: dead now, or restarted meanwhile
            return not self.zygote.alive or self.generation != mark
        return self.worker_lost is not None and any(self.worker_lost(o) for o in outcomes)

    async def recover(self, reason: str) -> bool:
        """Make the runner whole after a lost attempt: a dead zygote restarted (once, whichever
        path notices first). False, with the run stopped, when ``rollout.max_zygote_restarts``
        restarts are spent. A runner that names its own losses dropped what it lost already."""
        if self.zygote is None:
            return True
        async with self.restart_lock:
            if self.zygote.alive:  # another group restarted it already
                return True
            limit = self.rollout.max_zygote_restarts
            if self.restarts >= limit:
                self.fail(
                    f"the sandbox zygote died {self.restarts + 1} times (rollout.max_zygote_restarts={limit}); last: {reason[-2000:]}"
                )
                return False
            self.restarts += 1
            self.write(f"[sandbox] the zygote died; restarting it ({self.restarts}/{limit}): {reason.splitlines()[0][:300]}")
            await self.zygote.restart()
            self.generation += 1
            return True

    # ---- the outcome settled --------------------------------------------------------------

    async def settle(self, outcome: EpisodeOutcome, session: Session, problem: dict) -> EpisodeOutcome:
        """An episode's outcome scored, checked and classified (a training or an evaluation episode)."""
        if outcome.status == "ok" and outcome.reward is None and not outcome.rewards_by_id:
            if self.reward_fn is not None:
                outcome = await self.score(outcome, session, problem)
            elif all(i.reward is None for i in session.interactions.values()):
                outcome = msgspec.structs.replace(
                    outcome,
                    status="error",
                    error=(
                        "run() returned None and gave no reward through the gateway (set_reward), and the run has no "
                        "reward function (reward=MODULE:ATTR): nothing to train on"
                    ),
                )
        # Whoever produced the outcome (a sandboxed agent's is the agent's word), its rewards are
        # checked against this episode's own completions and the configured range here, once.
        outcome = check_episode_rewards(outcome, {i: x.reward for i, x in session.interactions.items()}, self.rollout.reward_range)
        r = self.rollout
        outcome = classify_outcome(outcome, bool(session.interactions), r.failure_classes, r.reward_hack_tripwires)
        if outcome.failure_class == POLICY:  # trained on (when it has completions) with the configured reward
            outcome = msgspec.structs.replace(outcome, reward=r.policy_failure_reward, rewards_by_id={})
        elif outcome.failure_class == REWARD_HACK and r.reward_hack == "penalty":  # trained on, penalised
            outcome = msgspec.structs.replace(outcome, reward=r.reward_hack_penalty, rewards_by_id={})
        return outcome

    async def settle_episode(self, outcome: EpisodeOutcome, session: Session, problem: dict) -> tuple[EpisodeOutcome, Session]:
        """A training episode settled, and the session it is logged and trained by: its own, or,
        branched at a model call, the tree of its branches, each settled (``branches.settle_tree``)."""
        hack = self.rollout.reward_hack
        return await settle_tree(self.gateway, outcome, session, lambda o, s: self.settle(o, s, problem), lambda o: trained(o, hack))

    async def score(self, outcome: EpisodeOutcome, session: Session, row: dict) -> EpisodeOutcome:
        """The configured reward function's score of the episode's last reply (the agent returned
        none), AReaL's way: ``fn(prompt, completions, prompt_ids, completion_ids, **row)``. A
        function that raises, or returns no number, makes it the episode's error, naming it."""
        last = next(reversed(session.interactions.values()), None)
        if last is None:
            return outcome
        decode = self.tokenizer.decode
        args = (decode(last.prompt_ids), decode(last.output_ids, skip_special_tokens=True), last.prompt_ids, last.output_ids)
        extra = {k: v for k, v in row.items() if k not in ("prompt", "completions", "prompt_ids", "completion_ids")}
        try:
            value = await asyncio.to_thread(self.reward_fn, *args, **extra)
            reward = float(value)
        except Exception as e:  # the user's function failed on this episode: the episode's error, not the run's
            return msgspec.structs.replace(outcome, status="error", error=f"reward function {self.reward_name} failed: {e!r}")
        return msgspec.structs.replace(outcome, reward=reward)


DATA_RECORD_BYTES = 64 << 10  # of an episode's dataset row as JSON in episodes.jsonl; a larger one is not recorded


def data_field(row: dict | None) -> dict[str, Any]:
    """An episode's dataset row for its line in episodes.jsonl (what ``python -m areal.replay`` poses
    again): ``{"data": row}``; ``{"data_recorded": False}`` when its JSON is over DATA_RECORD_BYTES
    or JSON cannot hold it; nothing when the caller has no row."""
    if row is None:
        return {}
    try:
        size = len(json.dumps(row))
    except (TypeError, ValueError):  # a value JSON cannot hold (bytes, an object): the row is not recorded, the run goes on
        return {"data_recorded": False}
    return {"data": row} if size <= DATA_RECORD_BYTES else {"data_recorded": False}


def episode_record(outcome: EpisodeOutcome, session: Session, group_id: str, problem: dict | None = None) -> dict[str, Any]:
    """A training episode's line in episodes.jsonl: how it ended, what its session recorded, and
    its dataset row ``problem`` (``data_field``)."""
    inters = list(session.interactions.values())
    return {
        "episode_id": outcome.episode_id,
        "group_id": group_id,
        "status": outcome.status,
        "failure_class": outcome.failure_class,
        "failure_cause": outcome.failure_cause,
        "reward": outcome.reward if outcome.reward is not None else sum(outcome.rewards_by_id.values()),
        "versions": sorted({i.version for i in inters}),
        "interactions": len(inters),
        "output_tokens": sum(len(i.output_ids) for i in inters),
        "wall_s": round(outcome.wall_s, 4),
        "exit_signal": outcome.exit_signal,
        "error": reason(outcome.error),
        "log_tail": outcome.log_tail,
        "drift": session.drift,
        "tool_calls": sum(i.tool_calls for i in inters),  # well-formed calls the agent received
        "malformed_tool_calls": sum(i.malformed_tool_calls for i in inters),  # call markup the gateway could not parse
        # an episode with a world (sandbox/world.py): the grader's checks and verdict, the sandbox's tripwires
        **({"checks": outcome.checks, "grader": outcome.grader, "tripwires": outcome.tripwires} if outcome.grader else {}),
        # rollout.branch: why its branch point was not taken (it ran on, and is trained, unbranched)
        **({"branch_refused": outcome.branch_refused} if outcome.branch_refused else {}),
        **data_field(problem),
    }


def episode_lines(
    outcome: EpisodeOutcome, session: Session, group_id: str, problem: dict | None = None
) -> list[tuple[dict[str, Any], EpisodeOutcome, list[Interaction]]]:
    """A settled training episode's lines in episodes.jsonl, each with the outcome and the calls it
    describes: its one line, or, branched at a model call (``branches.tree_of``), one line per
    branch, its ``BranchTag`` fields added (and ``branches_cut``: why later branches did not run)."""
    tree = tree_of(session)
    if tree is None:
        return [(episode_record(outcome, session, group_id, problem), outcome, list(session.interactions.values()))]
    lines = []
    for b in tree.branches:
        record = {**episode_record(b.outcome, b.session, group_id, problem), **b.tag.record()}
        if tree.cut:
            record["branches_cut"] = tree.cut
        lines.append((record, b.outcome, list(b.session.interactions.values())))
    return lines


def episode_calls(session: Session) -> tuple[int, int, int]:
    """(LLM calls, well-formed tool calls, malformed tool calls) of a settled training episode,
    each call once (a branched episode's shared prefix once: ``Tree.calls``)."""
    tree = tree_of(session)
    if tree is not None:
        return tree.calls()
    inters = session.interactions.values()
    return len(inters), sum(i.tool_calls for i in inters), sum(i.malformed_tool_calls for i in inters)


def workflow_call_record(call: WorkflowCall, outcome: EpisodeOutcome, group_id: str) -> dict[str, Any]:
    """An ``arun_episode`` call's line in episodes.jsonl (``outcome``: its outcome, classified): how
    it ended and the rows it exported (areal/agent/groups.py), as ``episode_record`` for an episode."""
    rows = call.rows
    return {
        "episode_id": call.outcome.episode_id,
        "group_id": group_id,
        "status": call.outcome.status,
        "failure_class": outcome.failure_class,
        "failure_cause": outcome.failure_cause,
        "reward": sum(r.reward for r in rows.values()) / max(1, len(rows)),
        "versions": sorted({v for r in rows.values() for v in r.versions if v >= 0}),
        "interactions": len(rows),
        "output_tokens": sum(sum(r.loss_mask) for r in rows.values()),
        "wall_s": round(call.outcome.wall_s, 4),
        "exit_signal": 0,
        "error": reason(call.outcome.error),
        "log_tail": call.outcome.log_tail,
    }
