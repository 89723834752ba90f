"""Credit across turns (areal/trainer/credit.py): returns over the conversation tree, a baseline
that does not depend on where an episode stopped, group normalisation, old records."""

from __future__ import annotations

import itertools

import msgspec
import numpy as np
import pytest
import torch
from old_schemas import TrajectoryV2

from areal.controller.trajectories import trajectory_from_episode
from areal.gateway import Interaction, Session
from areal.protocol import EpisodeOutcome, TokenRow, Trajectory, decode_trajectory, encode_trajectory
from areal.trainer.config import TrainerConfig
from areal.trainer.credit import chain_parents, tree_depths, tree_returns, turn_advantages, turn_baselines
from areal.trainer.loss import episode_advantages, group_advantages, turn_returns
from areal.trainer.step import compute_advantages


def _row(reward: float) -> TokenRow:
    return TokenRow(
        input_ids=np.array([1, 2, 3], np.int32),
        loss_mask=np.array([0, 1, 1], np.uint8),
        logprobs=np.array([0.0, -0.5, -0.5], np.float32),
        versions=np.array([-1, 0, 0], np.int32),
        reward=reward,
    )


def _traj(
    eid: str, rewards: list[float], parents: list[int] | None = None, group: str = "g", size: int = 2, reward: float | None = None
) -> Trajectory:
    return Trajectory.from_rows(
        episode_id=eid,
        group_id=group,
        group_size=size,
        reward=sum(rewards) if reward is None else reward,
        status="ok",
        rows=[_row(r) for r in rewards],
        row_parents=parents,
    )


# ---- returns over the tree ----


def test_two_branches_get_returns_of_their_own_path_only():
    """Calls of two sub-agents interleave in call order; each row's return sums its own branch."""
    #   0 ─┬─ 1 ── 3 (reward 1: branch A solved it)
    #      └─ 2 ── 4 (reward 0)           call order 0, 1, 2, 3, 4: the branches interleave
    rewards, parents, gamma = np.array([0.0, 0.0, 0.0, 1.0, 0.0]), [-1, 0, 0, 1, 2], 0.5
    got = tree_returns(rewards, parents, gamma)
    assert got.tolist() == [0.125, 0.5, 0.0, 1.0, 0.0]  # root: gamma * mean(0.5, 0.0)
    assert tree_depths(parents) == [0, 1, 1, 2, 2]
    # Row order would have credited branch B's row 2 with branch A's reward (0.5 instead of 0).
    assert turn_returns(torch.from_numpy(rewards), gamma)[2].item() == 0.5
    # Through the trainer: branch A's calls are pushed up against the same depth of episode b
    # (same tree, nothing solved); branch B's calls are not, since they earned what b's did.
    a, b = compute_advantages([_traj("a", rewards.tolist(), parents), _traj("b", [0.0] * 5, parents)], 0.5, 1e-6, "turn")
    assert a[1] > 0 and a[3] > 0 and a[2] == 0 and a[4] < a[3]


def test_a_chain_is_the_discounted_return_to_go():
    rewards = np.array([1.0, 0.0, 2.0, -1.0])
    np.testing.assert_allclose(tree_returns(rewards, chain_parents(4), 0.9), turn_returns(torch.from_numpy(rewards), 0.9).double())
    assert chain_parents(3) == [-1, 0, 1] and chain_parents(1) == [-1]


def test_bad_trees_and_discounts_are_refused():
    with pytest.raises(ValueError, match="earlier row"):
        tree_returns(np.zeros(2), [-1, 1], 1.0)  # a row cannot be its own parent
    with pytest.raises(ValueError, match="turn_discount"):
        tree_returns(np.zeros(1), [-1], 1.5)
    with pytest.raises(ValueError, match="row_parents must name an earlier row"):
        _traj("x", [0.0, 0.0], [1, -1])
    with pytest.raises(ValueError, match="row_parents has 1 entries for 2 rows"):
        _traj("x", [0.0, 0.0], [-1])
    with pytest.raises(ValueError, match="trainer.credit must be one of"):
        TrainerConfig(credit="step")
    with pytest.raises(ValueError, match="trainer.credit must be one of"):
        compute_advantages([_traj("x", [1.0])], 1.0, 1e-6, "trajectory")


# ---- the baseline does not depend on where an episode stopped ----


def test_an_episode_stopping_early_leaves_every_first_call_baseline_unchanged():
    """Episode z earns 1 either in one call, or in two calls of 0.5 (it chose to go on). Nothing
    about the first calls changed, so their baselines must not change either: not the others'
    (x, y), and not z's own (a baseline that moves with the episode's own choice to continue is
    the action-dependent baseline of verl#7244)."""
    x, y = np.array([0.0, 1.0]), np.array([0.5])
    depth = {1: [0], 2: [0, 1]}
    stop, go_on = np.array([1.0]), tree_returns(np.array([0.5, 0.5]), [-1, 0], 1.0)  # returns [1.0] / [1.0, 0.5]
    base = {}
    for name, z in (("stop", stop), ("go_on", go_on)):
        returns = [tree_returns(x, [-1, 0], 1.0), y, z]
        base[name] = turn_baselines(returns, [depth[len(r)] for r in returns], ["g"] * 3)
    for i in range(3):
        assert base["stop"][i][0] == base["go_on"][i][0], i

    # The estimator this trainer used before: the group mean pools every row of every episode,
    # so z's choice to go on moves the baseline of x's and y's first calls.
    def pooled_mean(z: np.ndarray) -> float:
        returns = [torch.tensor([1.0, 1.0]), torch.tensor([0.5]), torch.from_numpy(z)]
        adv = episode_advantages(returns, ["g"] * 3, eps=0.0)
        std = (returns[1][0] - returns[0][0]).item() / (adv[1][0] - adv[0][0]).item()  # A = (G - m) / std
        return returns[1][0].item() - adv[1][0].item() * std

    assert pooled_mean(stop) == pytest.approx(5 / 6) and pooled_mean(go_on) == pytest.approx(0.75)


# Stop or go on: the first call answers now (path ``stop``) or makes a tool call and goes on
# (path ``go_on``), each call rewarded on its own. The policy goes on with probability P; the
# true gradient of J = P * sum(go_on) + (1 - P) * sum(stop) in the logit of going on is
# P (1 - P) (sum(go_on) - sum(stop)). Rewards are exact in float32, as they travel.
P = 0.5


def _expected_gradient(advantages, n: int, stop: list[float], go_on: list[float]) -> float:
    """Exact E[(1/n) sum_i A_i,first * d log pi(first action_i) / d logit] over every group of n
    episodes, by enumeration: the expectation of the policy-gradient estimate."""
    total = 0.0
    for paths in itertools.product((stop, go_on), repeat=n):
        prob = np.prod([P if p is go_on else 1 - P for p in paths])
        scores = [1 - P if p is go_on else -P for p in paths]  # d log pi / d logit, Bernoulli(P)
        adv = advantages([_traj(f"e{i}", list(p), chain_parents(len(p)), size=n) for i, p in enumerate(paths)])
        total += prob * sum(float(a[0]) * s for a, s in zip(adv, scores)) / n
    return total


def _old(trajs: list[Trajectory]) -> list[torch.Tensor]:
    """The estimator before ``trainer.credit``: return-to-go in row order, pooled group statistics."""
    rets = [turn_returns(torch.from_numpy(t.array("row_rewards").astype(np.float64)), 1.0, dtype=torch.float64) for t in trajs]
    return episode_advantages(rets, [t.group_id for t in trajs])


def _turn(trajs: list[Trajectory]) -> list[torch.Tensor]:
    return compute_advantages(trajs, 1.0, 1e-6, "turn")


def _centred(trajs: list[Trajectory]) -> list[np.ndarray]:
    """Turn credit before the division by the group's scale: ``G - b``."""
    rets = [tree_returns(t.array("row_rewards"), chain_parents(len(t.array("row_lens"))), 1.0) for t in trajs]
    deps = [tree_depths(chain_parents(len(r))) for r in rets]
    return [g - np.nan_to_num(b) for g, b in zip(rets, turn_baselines(rets, deps, [t.group_id for t in trajs]))]


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_going_on_for_the_same_total_is_not_rewarded(n):
    """Answering now earns 0.5; going on earns 0.25 + 0.25 + 0 over three calls: the choice is
    worth nothing either way. The pooled estimator still pushes towards going on (its group mean
    averages the shorter returns of later calls, so a long episode's first call looks good);
    turn credit's expected push is 0."""
    stop, go_on = [0.5], [0.25, 0.25, 0.0]
    assert _expected_gradient(_centred, n, stop, go_on) == 0.0
    assert _expected_gradient(_turn, n, stop, go_on) == pytest.approx(0.0, abs=1e-9)
    assert _expected_gradient(_old, n, stop, go_on) > 0.01


@pytest.mark.parametrize("n", [2, 3, 4])
def test_turn_credit_is_unbiased_when_stopping_earns_more(n):
    """Answering now earns 0.625; a tool call earns 0.5, then a wrong answer 0: stop."""
    stop, go_on = [0.625], [0.5, 0.0]
    true = P * (1 - P) * (sum(go_on) - sum(stop))
    assert true < 0
    # Before the division by the group's scale, exactly unbiased: the baseline comes from the
    # other episodes only (and, leave-one-out, without GRPO's (n - 1) / n shrinkage).
    assert _expected_gradient(_centred, n, stop, go_on) == pytest.approx(true, abs=1e-12)
    assert _expected_gradient(_turn, n, stop, go_on) < 0  # normalised as trained: towards stopping
    if n == 2:  # pairs: the pooled estimator gets even the sign wrong
        assert _expected_gradient(_old, n, stop, go_on) > 0


def test_a_group_that_took_one_path_gets_no_signal():
    same = [_traj(f"e{i}", [0.5, 0.0], size=3) for i in range(3)]
    assert all(a.tolist() == [0.0, 0.0] for a in compute_advantages(same, 1.0, 1e-6, "turn"))
    assert all(a[0] > 0 > a[1] for a in _old(same))  # the pooled estimator's position bias


def test_turn_credit_separates_a_fixed_wrong_answer_from_a_right_one():
    """The retry agent: a wrong first answer that the retry fixed is not a right first answer."""
    trajs = [_traj("right", [1.0], size=3), _traj("fixed", [0.0, 1.0], size=3), _traj("never", [0.0, 0.0], size=3)]
    right, fixed, never = compute_advantages(trajs, 0.5, 1e-6, "turn")
    assert right[0] > fixed[0] > never[0]
    assert fixed[1] > 0 > never[1]  # retries compared with retries
    e_right, e_fixed, _ = compute_advantages(trajs, 0.5, 1e-6, "episode")
    assert e_right[0] == e_fixed[0] == e_fixed[1] > 0  # episode credit: the same for every call


# ---- group normalisation ----


def test_one_call_per_episode_is_grpo_under_both_credits():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.25, 3.0, -1.0]
    groups = ["g"] * 5 + ["h"] * 3
    trajs = [_traj(f"e{i}", [r], group=g, size=5 if g == "g" else 3) for i, (r, g) in enumerate(zip(rewards, groups))]
    want = group_advantages(torch.tensor(rewards), groups)
    for credit in ("turn", "episode"):
        got = torch.cat(compute_advantages(trajs, 0.9, 1e-6, credit))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_constant_groups_and_groups_of_one_are_exactly_zero():
    same = [_traj(f"e{i}", [0.1, 0.1, 0.1], size=3) for i in range(3)]
    alone = [_traj("solo", [1.0, 0.0], group="h", size=1)]
    for a in compute_advantages(same + alone, 0.9, 1e-6, "turn"):
        assert a.tolist() == [0.0] * len(a)


def test_groups_are_normalised_apart_and_each_episode_weighs_once():
    g = [_traj("a", [0.0, 1.0], size=2), _traj("b", [0.0, 0.0], size=2)]
    h = [_traj(f"h{i}", [float(i)] * (i + 1), group="h", size=3, reward=float(i)) for i in range(3)]
    adv = compute_advantages(g + h, 1.0, 1e-6, "turn")
    alone = compute_advantages(g, 1.0, 1e-6, "turn")
    for x, y in zip(adv[:2], alone):
        assert torch.equal(x, y)
    # The group's centred returns have unit root mean square, each episode weighing 1.
    for part in (adv[:2], adv[2:]):
        ms = [float((a.double() ** 2).mean()) for a in part]
        assert sum(ms) / len(ms) == pytest.approx(1.0, abs=1e-5)


def test_large_rewards_do_not_overflow():
    big = 3e38
    adv = compute_advantages([_traj("a", [big, 0.0], reward=big), _traj("b", [0.0, 0.0], reward=0.0)], 1.0, 1e-6, "turn")
    assert all(a.dtype == torch.float32 and bool(a.isfinite().all()) for a in adv)
    # Centred [big, 0] and [-big, 0]; each episode's mean square is big^2 / 2, so the scale is big / sqrt(2).
    assert adv[0].tolist() == pytest.approx([2**0.5, 0.0]) and adv[1].tolist() == pytest.approx([-(2**0.5), 0.0])


def test_turn_advantages_checks_its_inputs():
    with pytest.raises(ValueError, match="one depth per row"):
        turn_advantages([np.zeros(2)], [[0]], ["g"])


# ---- the record: the tree is recorded, old records still decode ----


def test_trajectory_from_episode_records_the_conversation_tree():
    s = Session(key="k", episode_id="e")
    s.interactions["a"] = Interaction("a", [1, 2], [3], [-0.5], 0, "stop", 0.0)
    s.interactions["b"] = Interaction("b", [1, 2, 3, 4], [5], [-0.5], 0, "stop", 0.0, parent_id="a")
    s.interactions["c"] = Interaction("c", [1, 2, 3, 6], [7], [-0.5], 0, "stop", 0.0, parent_id="a")  # a branch
    s.interactions["d"] = Interaction("d", [9], [8], [-0.5], 0, "stop", 0.0, parent_id="gone")  # parent not in the tree
    t = decode_trajectory(encode_trajectory(trajectory_from_episode(EpisodeOutcome("e", "ok", rewards_by_id={"b": 1.0}), s, "g", 1)))
    assert t.array("row_parents").tolist() == [-1, 0, 0, -1]
    assert t.schema_version == 4


def test_a_schema_2_record_decodes_and_is_credited_as_a_chain():
    new = [_traj("a", [0.0, 1.0, 0.0], [-1, 0, 1]), _traj("b", [1.0], [-1])]
    old = []
    for t in new:
        fields = {f: getattr(t, f) for f in TrajectoryV2.__struct_fields__}
        old.append(decode_trajectory(msgspec.msgpack.encode(TrajectoryV2(**{**fields, "schema_version": 2}))))
    assert [o.schema_version for o in old] == [2, 2] and all(len(o.row_parents) == 0 for o in old)
    for x, y in zip(compute_advantages(old, 0.9, 1e-6, "turn"), compute_advantages(new, 0.9, 1e-6, "turn")):
        assert torch.equal(x, y)
    # And a schema-2 reader still reads the leading fields of a schema-3 record.
    back = msgspec.msgpack.decode(encode_trajectory(new[0]), type=TrajectoryV2)
    assert (back.episode_id, bytes(back.row_rewards)) == ("a", bytes(new[0].row_rewards))
