"""Credit across turns: the return of every row (LLM call) of an episode, and its advantage.

An episode is a conversation tree: one row per call, each row's parent the call whose prompt +
sampled tokens its prompt extends (``Trajectory.row_parents``, recorded by the gateway).

    root (depth 0) ─┬─ retry (depth 1) ── retry (depth 2)     G = r + gamma * mean(G of children)
                    └─ branch (depth 1)                        depth = calls above it on its path

``trainer.credit`` picks one estimator for the run (``compute_advantages`` in step.py):

- ``episode``: every row's return is the episode's reward (the sum of its calls' rewards when
  they carry their own), normalised per group as in GRPO (``loss.episode_advantages``). Unbiased,
  but every call of an episode gets the same credit: a wrong first answer that a retry fixed is
  pushed up as much as a right first answer.
- ``turn`` (``turn_advantages``): each row's return is its own reward plus the discounted return
  of what followed it on its own path in the tree (``tree_returns``; branches never interleave:
  a row with several children takes the mean of their returns, as ``gateway.tree`` discounts).
  Its baseline is the leave-one-out mean return, at the same depth, of the other episodes of the
  group that reached that depth (where none did: the other episodes' mean return at depth 0).
  ``turn_discount`` sets how much a call is credited with what later calls earn: at 1, a wrong
  answer that a retry fixed still returns 1 (the retry's reward), as much as a right answer.

Why this baseline (the bias discussed in verl#7244). A policy-gradient baseline keeps the
estimate unbiased only if it does not depend on the action it is subtracted from, and in an
agent the policy's actions include stopping: answering now instead of calling a tool, giving up
instead of retrying. The estimators that come first to mind let the baseline of a row depend on
where the row's own episode stopped:

- pooling an episode's rows into its group's mean (what this trainer did before ``credit``):
  the episode's own rows enter the mean, and how many there are and what they return is decided
  by whether it stopped; a first turn is also compared with the group's later turns, whose
  returns are shorter sums, so a group in which every episode took the same path still pushes
  its first turns up and its last turns down;
- normalising per-call rewards per turn index and summing the normalised values over the rest
  of the episode (MT-GRPO style): the sum subtracts one baseline term per turn the episode went
  on to take, so the baseline grows with the episode's own length. Its expectation is a hidden
  bonus or penalty equal to the group's mean intermediate reward on every "take another turn".

Both reward or punish continuing for reasons that have nothing to do with the return; with
intermediate rewards (a well-formed tool call scores 0.5) the pooled estimator can push the
policy to keep calling tools even when stopping earns more (tests/unit/trainer/test_credit.py computes the
exact expected gradient of such a case: the old estimator's has the wrong sign). Here a row's
baseline is computed from the *other* episodes only, which are sampled independently of it, so
``E[grad log pi(a) * b] = 0`` for any of its actions, stopping included: the estimate is
unbiased (before the division by the group's scale, which is shared by the whole group as in
GRPO). Same-depth returns are the natural comparison (a retry is measured against other
retries, not against first answers); episodes that stopped before that depth are left out of
it rather than counted as 0, since "how good is a call at depth d" is asked of calls that exist.

Normalisation: the centred returns of a group are divided by their root mean square over the
group's rows, each episode weighing 1 whatever its number of rows. With one row per episode the
leave-one-out centring is ``n / (n - 1) (G - mean)`` and its RMS ``n / (n - 1) std``, so
``turn`` is then GRPO's ``(G - mean) / std`` (up to where eps is added; tested): single-turn
runs do not change. A row whose return equals every return its baseline averages (a group that
took one path), and a group of one, get advantage 0 exactly.

Branch points (``branched_turn_advantages``; docs/branching.md). An episode branched at a call
(sandbox/branch.py) is one tree: its shared prefix rows once, and under the fork row (the last
prefix call) one subtree per branch. ``tree_returns`` already credits the prefix with the mean
of the branches' returns. A row under a fork takes its baseline from its *sibling* subtrees
(``fork_baselines``): the leave-one-out mean, over the other branches, of their mean return at
its depth (where no other branch reached it, the other branches' first rows). Siblings start
from one state and are sampled independently of each other, so this baseline does not depend
on the row's own actions and the estimate stays unbiased, while it compares like with like.
Rows above the fork keep the group's baseline. Only forks named by the caller count: a row
with several children because the agent rewrote its history is not a branch point (its
children are not independent samples). tests/unit/trainer/test_credit.py computes the exact
expected gradient of a small tree.

Not covered: a learned critic (value per state rather than per depth); per-token rewards.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def chain_parents(rows: int) -> list[int]:
    """The parents of ``rows`` calls made one after the other: row k extends row k - 1.

    What a record without ``row_parents`` (schema < 3) is read as, its rows in call order."""
    return list(range(-1, rows - 1))


def tree_depths(parents: list[int]) -> list[int]:
    """Depth of every row: 0 for a root, else its parent's depth + 1 (parents precede children)."""
    depths: list[int] = []
    for k, p in enumerate(parents):
        if not -1 <= p < k:
            raise ValueError(f"row {k}: parent {p} must be -1 or an earlier row")
        depths.append(0 if p < 0 else depths[p] + 1)
    return depths


def tree_returns(rewards: np.ndarray, parents: list[int], gamma: float) -> np.ndarray:
    """``G_k = r_k + gamma * mean(G_c for c in children(k))`` (``r_k`` alone at a leaf).

    rewards: (K,) one reward per row, in call order; parents: K parent rows (-1 for a root).
    Returns (K,) float64. A chain gives the discounted return-to-go; branches never mix: a row's
    return holds only the rewards below it in the tree.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"turn_discount must be in [0, 1], got {gamma}")
    if len(parents) != rewards.shape[0]:
        raise ValueError(f"{rewards.shape[0]} rewards but {len(parents)} parents")
    tree_depths(parents)  # validates: every parent precedes its child
    out = rewards.astype(np.float64).copy()
    child_sum = np.zeros_like(out)
    child_n = np.zeros(len(parents), dtype=np.int64)
    for k in range(len(parents) - 1, -1, -1):  # children come after their parent: seen first
        if child_n[k]:
            out[k] += gamma * child_sum[k] / child_n[k]
        p = parents[k]
        if p >= 0:
            child_sum[p] += out[k]
            child_n[p] += 1
    return out


def _mean(values: list[float]) -> float:
    # Equal values average to themselves exactly (a float mean of 0.1, 0.1, 0.1 need not be
    # 0.1), so a row equal to all it is compared with gets exactly 0, not round-off / eps.
    return values[0] if min(values) == max(values) else math.fsum(values) / len(values)


def turn_baselines(returns: list[np.ndarray], depths: list[list[int]], group_ids: list[str]) -> list[np.ndarray]:
    """The baseline of every row: the mean, over the *other* episodes of its group that have rows
    at its depth, of their mean return at that depth; where no other episode reached the depth,
    the others' mean return at depth 0. NaN in a group of one. (K_i,) float64 per episode.
    """
    if not len(returns) == len(depths) == len(group_ids):
        raise ValueError(f"{len(returns)} episodes, {len(depths)} depth lists, {len(group_ids)} group ids")
    # Mean return of each episode at each depth it reached (branches at one depth averaged).
    at_depth: list[dict[int, float]] = []
    for g, d in zip(returns, depths):
        if g.shape[0] != len(d) or not len(d):
            raise ValueError("every episode needs one depth per row, and at least one row")
        sums: dict[int, list[float]] = {}
        for value, depth in zip(g.tolist(), d):
            sums.setdefault(depth, []).append(value)
        at_depth.append({depth: _mean(v) for depth, v in sums.items()})
    members: dict[str, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    out = []
    for i, (gid, d) in enumerate(zip(group_ids, depths)):
        others = [j for j in members[gid] if j != i]
        base = np.full(len(d), np.nan)
        for k, depth in enumerate(d):
            vals = [at_depth[j][depth] for j in others if depth in at_depth[j]] or [at_depth[j][0] for j in others]
            if vals:
                base[k] = _mean(vals)
        out.append(base)
    return out


def turn_advantages(returns: list[np.ndarray], depths: list[list[int]], group_ids: list[str], eps: float = 1e-6) -> list[torch.Tensor]:
    """Per-row advantages ``(G - b) / (rms_group + eps)`` with ``b`` from ``turn_baselines``.

    returns: one (K_i,) array of row returns per episode; depths: its rows' tree depths;
    group_ids: one group per episode. ``rms_group`` is the root mean square of the group's
    centred returns, each episode weighing 1 (its rows 1 / K_i each). A row whose return equals
    every value its baseline averages, and every row of a group of one, gets exactly 0 (no
    signal, no noise: round-off divided by eps would be noise). Returns float32 tensors
    (float64 math: a float32 square overflows from returns of about 1.8e19 on).
    """
    return _normalised(returns, turn_baselines(returns, depths, group_ids), group_ids, eps)


def fork_baselines(returns: np.ndarray, parents: list[int], forks: list[int]) -> np.ndarray:
    """Each row's baseline from its sibling subtrees under the nearest fork above it (a row of
    ``forks``, whose children are branches of one branch point); NaN for rows under no fork.

    returns: (K,) one episode's row returns; parents: its K parent rows. (K,) float64.
    """
    depths = tree_depths(parents)
    fork_set = set(forks)
    branch = [-1] * len(parents)  # the child of the nearest fork whose subtree holds the row
    for k, p in enumerate(parents):
        branch[k] = k if p in fork_set else (branch[p] if p >= 0 else -1)
    by_branch: dict[int, dict[int, list[float]]] = {}
    for k, b in enumerate(branch):
        if b >= 0:
            by_branch.setdefault(b, {}).setdefault(depths[k], []).append(float(returns[k]))
    out = np.full(len(parents), np.nan)
    for k, b in enumerate(branch):
        if b < 0:
            continue
        siblings = [c for c in by_branch if c != b and parents[c] == parents[b]]
        vals = [_mean(by_branch[c][depths[k]]) for c in siblings if depths[k] in by_branch[c]]
        vals = vals or [_mean(by_branch[c][depths[c]]) for c in siblings]
        if vals:
            out[k] = _mean(vals)
    return out


def branched_turn_advantages(
    returns: list[np.ndarray],
    depths: list[list[int]],
    parents: list[list[int]],
    forks: list[list[int]],
    group_ids: list[str],
    eps: float = 1e-6,
) -> list[torch.Tensor]:
    """``turn_advantages`` where the rows under a branch point take their baseline from their
    siblings (``fork_baselines``); ``forks``: each episode's fork rows ([] for one not branched)."""
    base = turn_baselines(returns, depths, group_ids)
    for i, (g, p, f) in enumerate(zip(returns, parents, forks)):
        if f:
            sib = fork_baselines(g, p, f)
            base[i] = np.where(np.isnan(sib), base[i], sib)
    return _normalised(returns, base, group_ids, eps)


def _normalised(returns: list[np.ndarray], base: list[np.ndarray], group_ids: list[str], eps: float) -> list[torch.Tensor]:
    """``(G - b) / (rms_group + eps)`` as ``turn_advantages`` says."""
    centred = []
    for g, b in zip(returns, base):
        centred.append(np.where(np.isnan(b), 0.0, g - np.nan_to_num(b)))
    sq: dict[str, list[float]] = {}
    for c, gid in zip(centred, group_ids):
        sq.setdefault(gid, []).append(float(np.mean(c * c)))
    rms = {gid: math.sqrt(math.fsum(v) / len(v)) for gid, v in sq.items()}
    return [torch.from_numpy(c / (rms[gid] + eps) if rms[gid] > 0 else c).to(torch.float32) for c, gid in zip(centred, group_ids)]
