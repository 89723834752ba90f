"""Turn credit on a branched episode's tree (areal/trainer/credit.py: ``fork_baselines``,
``branched_turn_advantages``): the expected gradient of a small tree computed exactly, by
enumerating every outcome of a group of two branched episodes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from areal.trainer.credit import branched_turn_advantages, fork_baselines, tree_depths, tree_returns, turn_baselines

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
