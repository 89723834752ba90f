"""Turn credit on a branched episode's tree (areal/trainer/credit.py: ``fork_baselines``,
``branched_turn_advantages``): the expected gradient of a small tree computed exactly, by
enumerating every outcome of a group of two branched episodes; and the tree's fork rows as the
Trajectory record carries them to the trainer (``row_forks``, schema 4) and ``compute_advantages``
reads them."""

from __future__ import annotations

import itertools
import math
import os

import msgspec
import numpy as np
import pytest
import torch
from old_schemas import TrajectoryV3

from areal.protocol import TokenRow, Trajectory, decode_trajectory, encode_trajectory
from areal.ring.buffer import NATIVE, RingReader, RingWriter, ring_name, unlink_ring
from areal.trainer.credit import branched_turn_advantages, fork_baselines, tree_depths, tree_returns, turn_baselines
from areal.trainer.step import compute_advantages

# One prompt, two episodes in its group. Each episode: call 1 picks a (prefix, the fork row),
# then branches into N = 2 at call 2, each branch picking b; the branch's reward is R[a][b].
# pi1(a=1) = sigmoid(t1); pi2(b=1 | a) = sigmoid(t2 + 0.5 a).
R = [[0.0, 1.0], [0.3, 0.6]]
T1, T2 = 0.4, -0.3
PARENTS = [-1, 0, 0]
FORKS = [0]


def _sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _p1(a: int) -> float:
    return _sig(T1) if a else 1 - _sig(T1)


def _p2(b: int, a: int) -> float:
    s = _sig(T2 + 0.5 * a)
    return s if b else 1 - s


def _grad_log(a: int, b1: int, b2: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """d log pi / d(t1, t2) of each row's action: the prefix's a, each branch's b."""
    g_a = np.array([a - _sig(T1), 0.0])
    return g_a, np.array([0.0, b1 - _sig(T2 + 0.5 * a)]), np.array([0.0, b2 - _sig(T2 + 0.5 * a)])


def _exact_gradient() -> np.ndarray:
    """dJ/d(t1, t2) of J = E_a E_b R[a][b], the expected reward of one branch."""
    d1 = _sig(T1) * (1 - _sig(T1))
    g1 = d1 * (sum(_p2(b, 1) * R[1][b] for b in (0, 1)) - sum(_p2(b, 0) * R[0][b] for b in (0, 1)))
    g2 = 0.0
    for a in (0, 1):
        s = _sig(T2 + 0.5 * a)
        g2 += _p1(a) * s * (1 - s) * (R[a][1] - R[a][0])
    return np.array([g1, g2])


def _expected_estimate(baselines) -> np.ndarray:
    """E[sum over the group's rows of (G - b) * grad log pi], enumerated exactly."""
    total = np.zeros(2)
    outcomes = list(itertools.product((0, 1), repeat=3))  # (a, b1, b2) of one episode
    for first, second in itertools.product(outcomes, repeat=2):
        prob = 1.0
        returns = []
        for a, b1, b2 in (first, second):
            prob *= _p1(a) * _p2(b1, a) * _p2(b2, a)
            returns.append(tree_returns(np.array([0.0, R[a][b1], R[a][b2]]), PARENTS, 1.0))
        base = baselines(returns)
        for (a, b1, b2), g, b in zip((first, second), returns, base):
            for k, grad in enumerate(_grad_log(a, b1, b2)):
                total += prob * (g[k] - b[k]) * grad
    return total


def _ours(returns: list[np.ndarray]) -> list[np.ndarray]:
    depths = [tree_depths(PARENTS)] * len(returns)
    base = turn_baselines(returns, depths, ["g"] * len(returns))
    return [np.where(np.isnan(s := fork_baselines(g, PARENTS, FORKS)), b, s) for g, b in zip(returns, base)]


def test_the_sibling_baseline_keeps_the_expected_gradient_exact():
    # Two episodes, each: its prefix row once (credited with the mean of its branches), two branch rows.
    exact = _exact_gradient()
    expected = _expected_estimate(_ours)
    assert expected[0] == pytest.approx(2 * exact[0], rel=1e-12, abs=1e-15)  # 2 prefix rows in the group
    assert expected[1] == pytest.approx(4 * exact[1], rel=1e-12, abs=1e-15)  # 4 branch rows
    assert exact[0] != 0 and exact[1] != 0


def test_a_baseline_that_counts_the_row_itself_is_biased():
    """The same tree with each branch row's baseline the mean of all branches, its own included."""

    def pooled(returns: list[np.ndarray]) -> list[np.ndarray]:
        ours = _ours(returns)
        return [np.array([b[0], (g[1] + g[2]) / 2, (g[1] + g[2]) / 2]) for g, b in zip(returns, ours)]

    assert _expected_estimate(pooled)[1] != pytest.approx(4 * _exact_gradient()[1], rel=1e-6)


def test_rows_compare_with_their_siblings_at_their_depth():
    # fork row 0; branch A: rows 1 -> 3; branch B: rows 2 -> 4 -> 5; branch C: row 6
    parents = [-1, 0, 0, 1, 2, 4, 0]
    returns = np.array([9.0, 1.0, 3.0, 5.0, 7.0, 11.0, 2.0])
    base = fork_baselines(returns, parents, [0])
    assert math.isnan(base[0])  # the prefix: the group's baseline
    assert base[1] == pytest.approx((3.0 + 2.0) / 2)  # the other branches' rows at depth 1
    assert base[3] == pytest.approx(7.0)  # depth 2: only branch B reached it
    assert base[5] == pytest.approx((1.0 + 2.0) / 2)  # depth 3: nobody else did; the others' first rows
    assert base[6] == pytest.approx((1.0 + 3.0) / 2)


def test_an_unbranched_episode_gets_turn_advantages_unchanged():
    from areal.trainer.credit import turn_advantages

    returns = [np.array([1.0, 0.5]), np.array([0.0, 0.2]), np.array([0.3])]
    depths = [[0, 1], [0, 1], [0]]
    groups = ["g", "g", "g"]
    plain = turn_advantages(returns, depths, groups)
    branched = branched_turn_advantages(returns, depths, [[-1, 0], [-1, 0], [-1]], [[], [], []], groups)
    for x, y in zip(plain, branched):
        assert x.tolist() == y.tolist()


# ---- the record: row_forks reach the trainer ----


def _tree(eid: str, rewards: list[float], parents: list[int], forks: list[int] | None, reward: float) -> Trajectory:
    rows = [
        TokenRow(np.array([1, 2, 3], np.int32), np.array([0, 1, 1], np.uint8), np.zeros(3, np.float32), np.zeros(3, np.int32), r)
        for r in rewards
    ]
    return Trajectory.from_rows(
        episode_id=eid, group_id="g", group_size=2, reward=reward, status="ok", rows=rows, row_parents=parents, row_forks=forks
    )


def test_compute_advantages_gives_a_branched_record_its_sibling_baselines():
    a = _tree("a", [0.0, 1.0, 0.0], PARENTS, FORKS, 0.5)  # prefix, then two branches with their rewards on their leaves
    b = _tree("b", [0.0, 1.0, 1.0], PARENTS, FORKS, 1.0)
    returns = [tree_returns(t.array("row_rewards").astype(np.float64), PARENTS, 0.9) for t in (a, b)]
    expected = branched_turn_advantages(returns, [tree_depths(PARENTS)] * 2, [PARENTS] * 2, [FORKS] * 2, ["g", "g"])
    got = compute_advantages([a, b], 0.9, 1e-6, "turn")
    for x, y in zip(got, expected):
        assert torch.equal(x, y)
    assert got[0][1] > 0 > got[0][2]  # the rewarded branch up, its unrewarded sibling down
    assert got[1][1] == got[1][2] == 0  # siblings that earned the same: no signal
    # Every row equal to the episode's reward is still read as the tree (the leaves carry the rewards).
    c = _tree("c", [1.0, 1.0], [-1, -1], [-1], 1.0)  # branched at its first call: the branches are roots
    d = _tree("d", [0.0, 1.0], [-1, -1], [-1], 0.5)
    adv = compute_advantages([c, d], 1.0, 1e-6, "turn")
    assert adv[1][0] < 0 < adv[1][1] and adv[0].tolist() == [0.0, 0.0]
    # Under episode credit, every row gets its episode's reward (the mean of its branches').
    assert compute_advantages([a, b], 0.9, 1e-6, "episode")[0].tolist() == pytest.approx([-1.0] * 3, abs=1e-3)


def test_row_forks_round_trip_and_a_schema_3_record_decodes_unbranched():
    new = _tree("a", [0.0, 1.0, 0.0], PARENTS, FORKS, 0.5)
    out = decode_trajectory(encode_trajectory(new))
    assert out.schema_version == 4 and out.array("row_forks").tolist() == FORKS and out == new
    fields = {f: getattr(new, f) for f in TrajectoryV3.__struct_fields__}
    old = decode_trajectory(msgspec.msgpack.encode(TrajectoryV3(**{**fields, "schema_version": 3})))
    assert old.schema_version == 3 and len(old.row_forks) == 0
    assert old.array("row_parents").tolist() == PARENTS
    unbranched = msgspec.structs.replace(new, row_forks=memoryview(b""))
    for x, y in zip(compute_advantages([old], 0.9, 1e-6), compute_advantages([unbranched], 0.9, 1e-6)):
        assert torch.equal(x, y)
    back = msgspec.msgpack.decode(encode_trajectory(new), type=TrajectoryV3)  # a schema-3 reader reads a schema-4 record
    assert (back.episode_id, bytes(back.row_parents)) == ("a", bytes(new.row_parents))
    with pytest.raises(ValueError, match="row_forks must name rows"):
        _tree("x", [0.0, 1.0], [-1, 0], [2], 1.0)
    with pytest.raises(ValueError, match="row_forks must name rows"):
        _tree("x", [0.0, 1.0], None, [0], 1.0)


@pytest.mark.parametrize("native", [False, True] if NATIVE is not None else [False])
def test_a_branched_record_crosses_the_ring(native):
    traj = _tree("a", [0.0, 1.0, 0.0], PARENTS, FORKS, 0.5)
    name = ring_name(f"forks{os.getpid()}{int(native)}", 0)
    try:
        with RingWriter(name, 1 << 16, native=native) as writer, RingReader(name, timeout_s=5) as reader:
            writer.put_trajectory(traj)
            got = reader.get()
            assert got == encode_trajectory(traj)
            assert decode_trajectory(got).array("row_forks").tolist() == FORKS
    finally:
        unlink_ring(name)
