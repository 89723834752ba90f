"""A branched episode's branches as the controller's episodes: one (outcome, session) per branch,
tagged with its branch point, so siblings can be grouped (docs/branching.md).

    Episodes.run ─► (trunk outcome, trunk session) ─► expand ─► [Branch(outcome, session, tag)]
      trunk outcome.branches[i]   (sandbox/branch.py, checked by the zygote)  ┐ paired by index
      gateway.close_session(K_i)  (branch_keys of the trunk, areal/gateway)   ┘

Invariants: every branch session the gateway made for the trunk is closed here, run or not (a
branch the sandbox could not run, ``branch_refused``, has no outcome and yields nothing); a
branch's outcome is its own episode: its id is ``<trunk id>/b<i>`` and its rewards go to its own
session's interactions; the prefix interactions (the trunk's calls before the branch point) are
in every branch's session, with the same ids, so a grouping can tell shared from own calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from areal.gateway import Gateway, Session
from areal.gateway.branching import branch_keys, branch_of, refusal
from areal.protocol import EpisodeOutcome


@dataclass(frozen=True)
class BranchTag:
    """Where a branch left its trunk: the trunk's episode id, the call (1-based) it branched at,
    its index, and the ids of the prefix interactions it shares with its siblings."""

    parent: str
    call: int
    index: int
    shared: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        """Its fields in the branch's line of episodes.jsonl."""
        return {"branch_of": self.parent, "branch_call": self.call, "branch_index": self.index, "shared_interactions": len(self.shared)}


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
    shared = tuple(trunk.interactions)
    for i, key in enumerate(keys):
        session = gateway.close_session(key)
        tag = branch_of(session)
        assert tag is not None and tag.index == i
        if i < len(outcome.branches):
            out.append(Branch(outcome.branches[i], session, BranchTag(trunk.episode_id, tag.call, i, shared)))
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
