"""DAPO's rollout-side pieces (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning
System at Scale"): dynamic sampling's group filter, overlong filtering and the soft overlong
punishment. Clip-higher and the token-mean loss are the trainer's (docs/algorithms.md).

    finished group ─► trajectories (overlong: truncated calls' tokens masked, rewards penalised)
                         │
                         ▼ DynamicSampling.keep (rollout.dynamic_sampling)
             rewards differ ──► published to the rings (trained)
             all equal      ──► dropped: logged in episodes.jsonl ("dropped": "dynamic_sampling"),
                                never published; the admission loop starts another prompt in its place
             all equal, the step's drops at rollout.dynamic_sampling_max_groups ──► published anyway

Invariants. A dropped group is never published, so the controller's count of published groups
(what admission and the staleness bound read) and the trainer's groups per step are unchanged: a
drop frees its admission slot as a failed group does. Drops are charged to the step being filled
when the group finishes (``published // groups_per_step``); once that step has
``dynamic_sampling_max_groups`` of them, every group is published until the step is full, so a
task the model always solves (or always fails) trains on what it gets instead of looping.

The length of a call and its limit, for a multi-turn agent: each LLM call is one training row
(``trajectory_from_episode``); |y| is the tokens that call sampled and L_max the ``max_tokens``
the gateway granted it (``Interaction.max_tokens``: the request's, or less where
``gateway.fit_max_tokens`` cut it to the context). A call is truncated when its
``finish_reason`` is "length". A call of unknown limit (``max_tokens`` 0) is penalised only when
truncated, as at its limit (-factor).

What is covered: episodes of agents and RolloutWorkflow rows (a row's last call: a ``concat``
row's earlier calls are not looked at). What is not: a limit the agent enforces itself (a
truncation that is not the engine's ``length`` finish).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from areal.gateway.tree import Interaction
from areal.protocol import Trajectory

DROPPED = "dynamic_sampling"  # episodes.jsonl's "dropped" of the episodes of a dropped group
TRUNCATED = "length"  # the finish_reason of a generation that hit its max_tokens


def reward_key(t: Trajectory) -> tuple[float, ...]:
    """What a trajectory's advantage is computed from (areal/trainer/step.py compute_advantages):
    the episode reward when every row carries it (or none carries any), else the rows' own too."""
    rows = t.array("row_rewards")  # (K,) float32
    if rows.size == 0 or bool((rows == np.float32(t.reward)).all()) or not bool(rows.any()):
        return (float(t.reward),)
    return (float(t.reward), *rows.tolist())


def has_signal(trajectories: Sequence[Trajectory]) -> bool:
    """Whether a group can train anything: at least two samples whose rewards differ, or a
    branched sample whose branches do (``branches_differ``). Otherwise a group of one, or of
    equal rewards, gets advantage 0 on every token (GRPO normalises per group)."""
    return len({reward_key(t) for t in trajectories}) >= 2 or any(branches_differ(t) for t in trajectories)


def branches_differ(t: Trajectory) -> bool:
    """Whether sibling branches of a branched episode (``row_forks``, docs/branching.md) earned
    different rewards (the sum of each branch's rows'): its rows under the fork then get nonzero
    advantages from their siblings' baseline, whatever the group's other samples earned."""
    forks = set(t.array("row_forks").tolist())
    if not forks:
        return False
    parents, rewards = t.array("row_parents").tolist(), t.array("row_rewards").tolist()
    branch: list[int] = []  # the fork's child whose subtree holds each row, -1 above the forks
    sums: dict[int, dict[int, float]] = {}  # fork row -> {branch: its rows' reward sum}
    for k, p in enumerate(parents):
        branch.append(k if p in forks else (branch[p] if p >= 0 else -1))
        if branch[k] >= 0:
            by_branch = sums.setdefault(parents[branch[k]], {})
            by_branch[branch[k]] = by_branch.get(branch[k], 0.0) + rewards[k]
    return any(len(set(s.values())) >= 2 for s in sums.values())


class DynamicSampling:
    """The drop decision of each finished group, and the counts logged per step (see the module
    docstring). ``max_dropped``: groups dropped per step at most; ``write`` prints a console line."""

    def __init__(self, groups_per_step: int, max_dropped: int, write: Callable[[str], None]) -> None:
        self.groups_per_step, self.max_dropped, self.write = groups_per_step, max_dropped, write
        self.dropped: dict[int, int] = {}  # step (1-based) -> groups dropped while it was being filled
        self.window = dict.fromkeys(("groups_sampled", "groups_dropped", "dynamic_sampling_exhausted"), 0)

    def keep(self, trajectories: Sequence[Trajectory], published: int) -> bool:
        """Whether a finished group with something to train on is published; ``published``:
        groups published so far (the step it would fill)."""
        self.window["groups_sampled"] += 1
        if has_signal(trajectories):
            return True
        step = published // self.groups_per_step + 1
        dropped = self.dropped.get(step, 0)
        if dropped < self.max_dropped:
            self.dropped[step] = dropped + 1
            self.window["groups_dropped"] += 1
            return False
        if self.window["dynamic_sampling_exhausted"] == 0:  # said once per report
            self.write(
                f"[dynamic sampling] step {step}: {dropped} groups of equal rewards dropped "
                f"(rollout.dynamic_sampling_max_groups={self.max_dropped}): its remaining groups are trained as they come, "
                "equal rewards included (advantage 0)"
            )
        self.window["dynamic_sampling_exhausted"] += 1
        return True

    def take_window(self) -> dict[str, int]:
        """The counts since the last call, for the step's row in metrics.jsonl: ``groups_sampled``
        (groups that finished with something to train on), ``groups_dropped``, and
        ``dynamic_sampling_exhausted`` (groups of equal rewards published because of the bound)."""
        window, self.window = self.window, dict.fromkeys(self.window, 0)
        return window


def overlong_penalty(length: int, limit: int, cache: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment of one response of ``length`` sampled tokens under the
    limit ``limit`` (L_max) with an interval of ``cache`` tokens (L_cache): 0 up to
    L_max - L_cache, then ((L_max - L_cache) - length) / L_cache, down to -1 at L_max and beyond;
    scaled by ``factor`` (AReaL's overlong_penalty_factor). An interval longer than the limit (a
    call that asked for fewer tokens) is cut to it: the penalty then ramps from 0 tokens."""
    if cache <= 0 or limit <= 0:
        raise ValueError(f"overlong_penalty needs a positive limit and interval, got limit={limit}, cache={cache}")
    cache = min(cache, limit)
    return factor * min(0.0, max(-1.0, ((limit - cache) - length) / cache))


@dataclass(frozen=True)
class Overlong:
    """The run's overlong settings: ``filter`` (rollout.overlong_filter); ``cache`` (L_cache,
    rollout.overlong_penalty_tokens; 0: no penalty) and ``factor`` (rollout.overlong_penalty_factor)."""

    filter: bool = False
    cache: int = 0
    factor: float = 1.0

    def penalty(self, call: Interaction) -> float:
        """The reward added for ``call``'s length (0 without a penalty)."""
        if self.cache == 0:
            return 0.0
        if call.max_tokens > 0:
            return overlong_penalty(len(call.output_ids), call.max_tokens, self.cache, self.factor)
        return -self.factor if call.finish_reason == TRUNCATED else 0.0  # limit unknown: a truncated call is at it

    def filtered(self, call: Interaction) -> bool:
        """Whether ``call``'s sampled tokens leave the loss (it hit its max_tokens)."""
        return self.filter and call.finish_reason == TRUNCATED

    def mask(self, loss_mask: list[int], call: Interaction) -> list[int]:
        """``loss_mask`` of a row ending with ``call``'s sampled tokens, those zeroed when filtered."""
        if not self.filtered(call) or not call.output_ids:
            return loss_mask
        return loss_mask[: -len(call.output_ids)] + [0] * len(call.output_ids)

    def counts(self, calls: Sequence[Interaction]) -> tuple[int, int]:
        """(rows filtered, rows penalised) among ``calls``."""
        return sum(self.filtered(c) for c in calls), sum(self.penalty(c) < 0 for c in calls)


NO_OVERLONG = Overlong()  # neither filter nor penalty: the default


class Dapo:
    """What the controller asks of DAPO for each finished group: whether it is dropped (None
    ``sampling``: dynamic sampling off), the published calls counted, and the counts logged per
    step in metrics.jsonl (none when every setting is off)."""

    def __init__(self, sampling: DynamicSampling | None, overlong: Overlong) -> None:
        self.sampling, self.overlong = sampling, overlong
        self.rows = [0, 0]  # published rows filtered, penalised, since the last step's metrics

    def drop(self, trajectories: Sequence[Trajectory], published: int) -> bool:
        """Whether a finished group is dropped (``DynamicSampling.keep``); never published then."""
        return self.sampling is not None and not self.sampling.keep(trajectories, published)

    def published(self, calls: Sequence[Interaction]) -> None:
        """Count the calls of a published group whose rows were filtered or penalised."""
        filtered, penalised = self.overlong.counts(calls)
        self.rows = [self.rows[0] + filtered, self.rows[1] + penalised]

    def take_metrics(self) -> dict[str, int]:
        """The counts since the last call: dynamic sampling's (``DynamicSampling.take_window``),
        ``overlong_filtered_rows`` and ``overlong_penalised_rows``, of the settings that are on."""
        out = self.sampling.take_window() if self.sampling is not None else {}
        if self.overlong.filter or self.overlong.cache:
            out["overlong_filtered_rows"], out["overlong_penalised_rows"] = self.rows
        self.rows = [0, 0]
        return out
