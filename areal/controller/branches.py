"""A branched episode's branches as the controller's episodes: one (outcome, session) per branch,
tagged with its branch point, so siblings can be grouped (docs/branching.md).

    Episodes.run ─► (trunk outcome, trunk session) ─► expand ─► [Branch(outcome, session, tag)]
      trunk outcome.branches[i]   (sandbox/branch.py, checked by the zygote)  ┐ paired by index
      gateway.close_session(K_i)  (branch_keys of the trunk, areal/gateway)   ┘
    settle_tree: each branch settled as its own episode ─► one outcome standing for the episode
      and its tree session (tree_session of the trained branches; its Tree under TREE), which the
      run logs one line per branch and trains as one Trajectory (row_forks)

Invariants: every branch session the gateway made for the trunk is closed here, run or not (a
branch the sandbox could not run, ``branch_refused``, has no outcome and yields nothing); a
branch's outcome is its own episode: its id is ``<trunk id>/b<i>`` and its rewards go to its own
session's interactions; the prefix interactions (the trunk's calls before the branch point) are
in every branch's session, with the same ids, so a grouping can tell shared from own calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from areal.gateway import Gateway, Session
from areal.gateway.branching import branch_keys, branch_of, refusal, replay_point
from areal.protocol import EpisodeOutcome


@dataclass(frozen=True)
class BranchTag:
    """Where a branch left its trunk: the trunk's episode id, the call (1-based) it branched at,
    its index, and the ids of the prefix interactions it shares with its siblings."""

    parent: str
    call: int
    index: int
    shared: tuple[str, ...]
    entropy: float | None = None  # the branch point's sampled entropy (nats per token), when found by entropy
    replayed: str = ""  # branched by replay (rollout.branch.replay): why the episode could not fork there

    def record(self) -> dict[str, Any]:
        """Its fields in the branch's line of episodes.jsonl."""
        fields: dict[str, Any] = {
            "branch_of": self.parent,
            "branch_call": self.call,
            "branch_index": self.index,
            "shared_interactions": len(self.shared),
        }
        if self.entropy is not None:
            fields["branch_entropy"] = round(self.entropy, 4)
        if self.replayed:
            fields["branch_by_replay"] = self.replayed
        return fields


@dataclass(frozen=True)
class Branch:
    outcome: EpisodeOutcome
    session: Session
    tag: BranchTag


def expand(gateway: Gateway, outcome: EpisodeOutcome, trunk: Session) -> list[Branch]:
    """The branches of a trunk episode, in branch order ([] when it did not branch); every branch
    session of the trunk closed."""
    out = []
    keys = branch_keys(trunk)
    point = replay_point(trunk)
    shared, replayed = tuple(trunk.interactions), point.replayed if point is not None else ""
    for i, key in enumerate(keys):
        session = gateway.close_session(key)
        tag = branch_of(session)
        assert tag is not None and tag.index == i
        if i < len(outcome.branches):
            out.append(Branch(outcome.branches[i], session, BranchTag(trunk.episode_id, tag.call, i, shared, tag.entropy, replayed)))
    return out


def tree_session(branches: list[Branch]) -> tuple[Session, int]:
    """The branches of one branch point as one conversation tree: the shared prefix's
    interactions once, then each branch's own, each branch's reward on its own last call (its
    leaf; a reward a branch gave a shared call is not kept: it has no one value); and the row of
    the fork (the parent of every branch's first call; -1 when the branch point was the first
    call). What ``trajectory_from_episode`` turns into one
    record whose prefix rows are packed and trained once, and ``credit.branched_turn_advantages``
    credits (its ``forks``)."""
    shared = branches[0].tag.shared
    merged = {iid: msgspec.structs.replace(branches[0].session.interactions[iid], reward=None) for iid in shared}
    for b in branches:
        own = [msgspec.structs.replace(x) for iid, x in b.session.interactions.items() if iid not in shared]
        for x in own:
            x.reward = b.outcome.rewards_by_id.get(x.id, x.reward)
        if own and b.outcome.reward is not None:
            own[-1].reward = b.outcome.reward
        merged.update((x.id, x) for x in own)
    trunk = Session(key="", episode_id=branches[0].tag.parent, interactions=merged)
    first = next((x for iid, x in branches[0].session.interactions.items() if iid not in shared), None)
    rows = list(merged)
    fork = rows.index(first.parent_id) if first is not None and first.parent_id in merged else -1
    return trunk, fork


def why_not(outcome: EpisodeOutcome, trunk: Session) -> str:
    """Why a branch point was not taken, or its branches cut short: the gateway's reason (the call
    did not come through the handed client; the episode refused, saying why), else the sandbox's."""
    return refusal(trunk) or outcome.branch_refused


TREE = "areal.tree"  # Session.store key of a tree session: its Tree


@dataclass(frozen=True)
class Tree:
    """A branched episode as the run logs and trains it: every branch, settled as its own
    episode (``branches``, in branch order); the ids of each trained branch's own interactions
    (``own``, one tuple per branch in the tree session); the tree session's fork row (``fork``:
    -1 when the branches are roots); why later branches were not run ("" when none was cut)."""

    branches: list[Branch]
    own: list[tuple[str, ...]]
    fork: int
    cut: str = ""

    def calls(self) -> tuple[int, int, int]:
        """(LLM calls, well-formed tool calls, malformed tool calls) of the whole episode, each call
        counted once: the shared prefix's once, then every branch's own."""
        shared = self.branches[0].tag.shared
        inters = [self.branches[0].session.interactions[i] for i in shared]
        inters += [x for b in self.branches for iid, x in b.session.interactions.items() if iid not in shared]
        return len(inters), sum(x.tool_calls for x in inters), sum(x.malformed_tool_calls for x in inters)


def tree_of(session: Session) -> Tree | None:
    """The ``Tree`` of a tree session made by ``settle_tree``; None for any other session."""
    tree = session.store.get(TREE)
    return tree if isinstance(tree, Tree) else None


def own_interactions(branch: Branch) -> tuple[str, ...]:
    """The ids of the interactions a branch made itself (after its branch point), in call order."""
    return tuple(iid for iid in branch.session.interactions if iid not in branch.tag.shared)


def branch_reward(outcome: EpisodeOutcome) -> float:
    """A settled branch's reward as its line in episodes.jsonl gives it: run()'s float, else the
    sum of its {completion_id: reward}."""
    return outcome.reward if outcome.reward is not None else sum(outcome.rewards_by_id.values())


async def settle_tree(
    gateway: Gateway,
    outcome: EpisodeOutcome,
    trunk: Session,
    settle: Callable[[EpisodeOutcome, Session], Awaitable[EpisodeOutcome]],
    trained: Callable[[EpisodeOutcome], bool],
) -> tuple[EpisodeOutcome, Session]:
    """An episode's settled outcome and the session it is logged and trained by; every branch
    session of the trunk closed (``expand``).

    Not branched: ``settle``'s outcome of the trunk, its ``branch_refused`` the reason a branch
    point was refused ("" when none was reached), and the trunk. Branched: every branch settled
    on its own session; the outcome standing for the episode takes the status and failure class
    of its first branch that is ``trained`` and made calls of its own (else of its first
    branch), and the mean of those branches' rewards; the session is their ``tree_session``
    (every branch's when none is trained), with its ``Tree`` (``tree_of``)."""
    branches = expand(gateway, outcome, trunk)
    if not branches:
        return await settle(msgspec.structs.replace(outcome, branch_refused=why_not(outcome, trunk)), trunk), trunk
    settled = [Branch(await settle(b.outcome, b.session), b.session, b.tag) for b in branches]
    kept = [b for b in settled if trained(b.outcome) and own_interactions(b)]
    first = (kept or settled)[0].outcome
    rewards = [branch_reward(b.outcome) for b in kept]
    standing = msgspec.structs.replace(
        outcome,
        status=first.status,
        reward=sum(rewards) / len(rewards) if rewards else first.reward,
        rewards_by_id={},
        error=first.error,
        failure_class=first.failure_class,
        failure_cause=first.failure_cause,
        branches=[b.outcome for b in settled],
    )
    session, fork = tree_session(kept or settled)
    session.store[TREE] = Tree(settled, [own_interactions(b) for b in kept], fork, outcome.branch_refused)
    return standing, session


def close_branches(gateway: Gateway, trunk: Session) -> None:
    """Close every branch session of ``trunk`` the gateway still holds (an episode that will not
    be settled: cancelled, or failed in its runner)."""
    for key in branch_keys(trunk):
        if key in gateway.sessions or key in gateway.expired:
            gateway.close_session(key)


def branch_metrics(gateway: Gateway | None) -> dict[str, int]:
    """``branch_sessions_open`` for a step's row in metrics.jsonl when the run branches (else {}):
    the branch sessions the gateway holds, live or expired. Only the branches of episodes still
    running count; ``expand`` closes the rest, so a leak shows as a count that grows."""
    if gateway is None or gateway.branching is None or not gateway.branching.enabled:
        return {}
    held = [*gateway.sessions.values(), *gateway.expired.values()]
    return {"branch_sessions_open": sum(1 for s in held if branch_of(s) is not None)}
