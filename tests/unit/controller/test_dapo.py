"""DAPO's rollout-side pieces (areal/controller/dapo.py): the soft overlong penalty against values
computed by hand, the group filter, dynamic sampling's per-step bound, and overlong filtering and
penalties as the trajectories the trainer receives carry them."""

from __future__ import annotations

import pytest

from areal.config import RolloutConfig
from areal.controller.dapo import DynamicSampling, Overlong, has_signal, overlong_penalty
from areal.controller.trajectories import trajectory_from_episode, trajectory_from_row
from areal.gateway import Interaction, Session
from areal.gateway.tree import InteractionWithTokenLogpReward
from areal.protocol import EpisodeOutcome, TokenRow, Trajectory


@pytest.mark.parametrize(
    "length, limit, cache, factor, penalty",
    [
        (10, 64, 16, 1.0, 0.0),  # well inside the limit
        (48, 64, 16, 1.0, 0.0),  # L_max - L_cache: the interval starts after it
        (56, 64, 16, 1.0, -0.5),  # halfway through the interval
        (64, 64, 16, 1.0, -1.0),  # at the limit
        (80, 64, 16, 1.0, -1.0),  # beyond it
        (56, 64, 16, 0.5, -0.25),  # AReaL's overlong_penalty_factor scales it
        (2, 4, 16, 1.0, -0.5),  # an interval longer than the limit is cut to it
    ],
)
def test_overlong_penalty_by_hand(length: int, limit: int, cache: int, factor: float, penalty: float) -> None:
    assert overlong_penalty(length, limit, cache, factor) == pytest.approx(penalty)


def _trajectory(episode_reward: float, row_rewards: list[float]) -> Trajectory:
    rows = [TokenRow(input_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -1.0], versions=[-1, 0], reward=r) for r in row_rewards]
    return Trajectory.from_rows(episode_id="e", group_id="g", group_size=2, reward=episode_reward, status="ok", rows=rows)


def test_group_filter_keeps_only_groups_whose_rewards_differ() -> None:
    assert not has_signal([_trajectory(1.0, [1.0]), _trajectory(1.0, [1.0, 1.0])])  # one float reward each: advantage 0
    assert not has_signal([_trajectory(0.0, [0.0])] * 4)
    assert not has_signal([_trajectory(1.0, [1.0])])  # a group of one
    assert has_signal([_trajectory(1.0, [1.0]), _trajectory(0.0, [0.0])])
    assert has_signal([_trajectory(1.0, [1.0, 0.0]), _trajectory(1.0, [0.0, 1.0])])  # same sums, rows of their own


def test_dynamic_sampling_drops_up_to_its_bound_per_step() -> None:
    said: list[str] = []
    ds = DynamicSampling(groups_per_step=2, max_dropped=2, write=said.append)
    flat, mixed = [_trajectory(1.0, [1.0])] * 2, [_trajectory(1.0, [1.0]), _trajectory(0.0, [0.0])]
    assert ds.keep(mixed, published=0)
    assert not ds.keep(flat, published=0) and not ds.keep(flat, published=1)
    assert ds.keep(flat, published=1) and ds.keep(flat, published=1)  # the bound: step 1 takes what comes
    assert len(said) == 1 and "step 1" in said[0] and "dynamic_sampling_max_groups=2" in said[0]
    assert ds.take_window() == {"groups_sampled": 5, "groups_dropped": 2, "dynamic_sampling_exhausted": 2}
    assert not ds.keep(flat, published=2)  # step 2 has a bound of its own
    assert ds.take_window() == {"groups_sampled": 1, "groups_dropped": 1, "dynamic_sampling_exhausted": 0}


def _session() -> Session:
    """Two calls: the first cut by its max_tokens of 4, the second done after 3 of its 64."""
    s = Session(key="k", episode_id="e")
    s.interactions["a"] = Interaction("a", [1, 2], [7, 8, 9, 10], [-0.5] * 4, 0, "length", 0.0, max_tokens=4)
    s.interactions["b"] = Interaction("b", [1, 2, 7, 8, 9, 10, 3], [5, 6, 11], [-1.0] * 3, 0, "stop", 0.0, max_tokens=64)
    return s


def test_overlong_filter_masks_the_truncated_call_only() -> None:
    t = trajectory_from_episode(EpisodeOutcome("e", "ok", reward=1.0), _session(), "g", 1, Overlong(filter=True))
    a, b = t.rows()
    assert a.loss_mask.tolist() == [0, 0, 0, 0, 0, 0]  # its 4 sampled tokens leave the loss
    assert b.loss_mask.tolist() == [0] * 7 + [1, 1, 1]
    assert [a.reward, b.reward, t.reward] == [1.0, 1.0, 1.0]  # filtering leaves the rewards
    unfiltered = trajectory_from_episode(EpisodeOutcome("e", "ok", reward=1.0), _session(), "g", 1)
    assert unfiltered.rows()[0].loss_mask.tolist() == [0, 0, 1, 1, 1, 1]


def test_overlong_penalty_of_a_float_reward_goes_to_the_episode() -> None:
    # call a: 4 of 4 tokens, the interval (8) cut to 4: -1; call b: 3 of 64, before 64 - 8: 0
    t = trajectory_from_episode(EpisodeOutcome("e", "ok", reward=1.0), _session(), "g", 1, Overlong(cache=8))
    assert t.reward == 0.0 and t.array("row_rewards").tolist() == [0.0, 0.0]
    assert t.array("loss_mask").sum() == 7  # no filter: every sampled token trained


def test_overlong_penalty_of_own_rewards_goes_to_its_row() -> None:
    o = EpisodeOutcome("e", "ok", rewards_by_id={"a": 1.0, "b": 2.0})
    t = trajectory_from_episode(o, _session(), "g", 1, Overlong(cache=8, factor=0.5))
    assert t.array("row_rewards").tolist() == [0.5, 2.0] and t.reward == 2.5


def test_overlong_on_a_workflow_row_and_a_call_of_unknown_limit() -> None:
    cut = Interaction("a", [1, 2], [7, 8], [-0.5] * 2, 0, "length", 0.0)  # max_tokens unknown (0)
    row = InteractionWithTokenLogpReward(cut, [1, 2, 7, 8], [0, 0, 1, 1], [0.0, 0.0, -0.5, -0.5], [-1, -1, 0, 0], 1.0)
    t = trajectory_from_row(row, "e-r0", "g", 2, Overlong(filter=True, cache=16))
    assert t.reward == 0.0 and t.array("loss_mask").tolist() == [0, 0, 0, 0]  # at its limit: -1, masked
    assert Overlong(filter=True, cache=16).counts([cut, _session().interactions["b"]]) == (1, 1)


@pytest.mark.parametrize(
    "key, value",
    [("dynamic_sampling_max_groups", -1), ("overlong_penalty_tokens", -4), ("overlong_penalty_factor", -1.0)],
)
def test_rollout_config_refuses_negative_dapo_settings(key: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"rollout.{key}"):
        RolloutConfig(**{key: value})
