"""Finished episodes as ``Trajectory`` records, the unit the rings carry to the trainer, and the
run's saved copy of them read back.

    EpisodeOutcome + the gateway's Session ─► trajectory_from_episode ─► Trajectory (one row per call)
      (a branched episode's tree session ─► one Trajectory, the shared prefix once, row_forks)
    RolloutWorkflow export row              ─► trajectory_from_row     ─► Trajectory (one row)
    run_dir/trajectories.bin (save_trajectories=true) ─► read_saved_trajectories ─► [Trajectory]

Every token id, loss-mask bit, logprob and policy version comes from what the gateway recorded
from the engine; nothing is re-tokenized here.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import msgspec

from areal.controller.branches import tree_of
from areal.controller.dapo import NO_OVERLONG, Overlong
from areal.gateway import Session
from areal.gateway.tree import InteractionWithTokenLogpReward
from areal.protocol import FRAME_HEADER, EpisodeOutcome, TokenRow, Trajectory, decode_trajectory


def trajectory_from_episode(
    outcome: EpisodeOutcome, session: Session, group_id: str, group_size: int, overlong: Overlong = NO_OVERLONG
) -> Trajectory:
    """One row per interaction (prompt + sampled tokens), built from the gateway's recorded ids,
    in call order, with each row's parent row (``row_parents``: the conversation tree).

    Rewards: a float returned by run() applies to every row; a {completion_id: reward} dict
    rewards the named rows; rows it does not name keep a reward set through the gateway
    (``set_reward``), else 0. A policy failure carries ``rollout.policy_failure_reward`` as its
    float (the controller set it), and its ``failure_kind`` is "policy". ``outcome`` has passed
    ``check_episode_rewards`` against ``session``: every id it names is one of the session's
    (else ``KeyError``).

    ``overlong`` (areal/controller/dapo.py): a call cut by its max_tokens has its sampled tokens
    masked out (``overlong.filter``); each call's length penalty is added to the reward its row
    is trained with: to the episode's float (every row's) when run() returned one, else to the
    call's own row. Either way the episode reward grows by the sum of its calls' penalties.

    A branched episode's tree session (``branches.tree_of``: its branches' rewards already on their
    own rows) becomes one record whose shared prefix rows appear once: its ``row_forks`` the fork
    row, its reward the mean over its trained branches of the rewards their own rows are trained
    with (``outcome``'s rewards are not applied).
    """
    tree = tree_of(session)
    if tree is not None:
        outcome = msgspec.structs.replace(outcome, reward=None, rewards_by_id={})
    for inter_id, r in outcome.rewards_by_id.items():
        session.set_reward(inter_id, r)
    exported = session.export_interactions("individual")
    index = {inter_id: k for k, inter_id in enumerate(exported)}
    # Each row's parent row in the conversation tree (-1: a root, or a parent outside the tree).
    parents = [index.get(row.interaction.parent_id, -1) for row in exported.values()]  # type: ignore[arg-type]
    rows, versions = [], []
    shared = None if outcome.reward is None else outcome.reward + sum(overlong.penalty(r.interaction) for r in exported.values())
    for row in exported.values():
        reward = shared if shared is not None else (row.interaction.reward or 0.0) + overlong.penalty(row.interaction)
        mask = overlong.mask(row.loss_mask, row.interaction)
        rows.append(TokenRow(input_ids=row.input_ids, loss_mask=mask, logprobs=row.logprobs, versions=row.versions, reward=reward))
        versions.extend(v for v in row.versions if v >= 0)
    episode_reward = shared if shared is not None else sum(r.reward for r in rows)
    if tree is not None and tree.own:
        episode_reward = sum(sum(rows[index[i]].reward for i in own) for own in tree.own) / len(tree.own)
    return Trajectory.from_rows(
        episode_id=outcome.episode_id,
        group_id=group_id,
        group_size=group_size,
        reward=episode_reward,
        status=outcome.status,
        rows=rows,
        timings={"wall_s": outcome.wall_s},
        error=outcome.error[-2000:],
        drift=session.drift,
        failure_kind="" if outcome.status == "ok" else outcome.failure_class or outcome.status,
        policy_version_start=min(versions, default=-1),
        policy_version_end=max(versions, default=-1),
        interaction_ids=list(exported),
        row_parents=parents,
        row_forks=[tree.fork] if tree is not None and tree.own else None,
    )


def trajectory_from_row(
    row: InteractionWithTokenLogpReward, episode_id: str, group_id: str, group_size: int, overlong: Overlong = NO_OVERLONG
) -> Trajectory:
    """One row of a RolloutWorkflow's export as a one-row Trajectory (its own reward), its last
    call's overlong mask and penalty applied (``overlong``, areal/controller/dapo.py)."""
    versions = [v for v in row.versions if v >= 0]
    reward = row.reward + overlong.penalty(row.interaction)
    mask = overlong.mask(row.loss_mask, row.interaction)
    return Trajectory.from_rows(
        episode_id=episode_id,
        group_id=group_id,
        group_size=group_size,
        reward=reward,
        status="ok",
        rows=[TokenRow(input_ids=row.input_ids, loss_mask=mask, logprobs=row.logprobs, versions=row.versions, reward=reward)],
        policy_version_start=min(versions, default=-1),
        policy_version_end=max(versions, default=-1),
        interaction_ids=[row.interaction.id],
        row_parents=[-1],
    )


STALE = "stale"  # episodes.jsonl's "dropped" for a group that finished too late for the staleness bound


def too_stale(trajectories: list[Trajectory], published: int, groups_per_step: int, bound: int) -> int | None:
    """The oldest policy version among ``trajectories``' sampled tokens when it is more than
    ``bound`` versions behind the weights of the step that would train them (the group published
    after ``published`` others is trained by step ``published // groups_per_step + 1``, which starts
    from version ``published // groups_per_step``); else None. Admission alone cannot promise the
    bound: a group admitted early can finish after groups admitted one version later."""
    versions = [t.array("versions") for t in trajectories]
    sampled = [int(v[v >= 0].min()) for v in versions if (v >= 0).any()]  # -1: a prompt token
    if not sampled:
        return None
    oldest = min(sampled)
    return oldest if oldest < published // groups_per_step - bound else None


def read_saved_trajectories(path: Path) -> list[Trajectory]:
    """Read back ``trajectories.bin`` (written with ``save_trajectories=true``): every complete
    record. A file cut short (a full disk, a kill mid-write) keeps the records before the cut,
    and the cut is reported (a ``UserWarning`` naming the offset and the bytes dropped)."""
    data, out, pos = path.read_bytes(), [], 0
    while pos < len(data):
        n = FRAME_HEADER.unpack_from(data, pos)[0] if len(data) - pos >= FRAME_HEADER.size else None
        if n is None or len(data) - pos - FRAME_HEADER.size < n:
            warnings.warn(
                f"{path}: cut at byte {pos} of {len(data)} (an incomplete record); read the {len(out)} complete records before it",
                stacklevel=2,
            )
            break
        try:
            out.append(decode_trajectory(data[pos + FRAME_HEADER.size : pos + FRAME_HEADER.size + n]))
        except msgspec.DecodeError as e:
            warnings.warn(
                f"{path}: record {len(out)} at byte {pos} does not decode ({e}); read the {len(out)} complete records before it",
                stacklevel=2,
            )
            break
        pos += FRAME_HEADER.size + n
    return out
