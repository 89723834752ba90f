"""Groups from ``RolloutWorkflow.arun_episode`` calls, with AReaL's semantics for both styles,
and the warning when a step's groups cannot train anything.

    first group:  call 1 ─► its rows traced to the ArealOpenAI clients that recorded them
                   (a call that fails shows nothing: the next call decides, one at a time)
                   ├─ ≥ 2 clients: the call sampled a whole group itself (AReaL before group_size:
                   │               n clients per arun_episode)           ─► one call per group
                   └─ 1 client, or rows of no known client: one trajectory per call (AReaL now,
                                   which calls it gconfig.n_samples times) ─► n_samples calls per group
    later groups: the decided number of calls, concurrently

Every exported row is one sample of its group (AReaL normalises rows, not calls), so a group's
size is the number of rows all its calls returned. A call that fails (raises, times out, returns
nothing, lies about rewards) is logged and its rows are not used; the group is the others' rows.

``AdvantageWatch`` sees each group as it is published. A group of one sample, or whose samples
all have the same rewards, yields advantage 0 for all of them; a step made only of such groups
trains nothing, and the run says so loudly (a group of one sample is a configuration problem:
the first one is reported at once, naming ``gconfig.n_samples``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from areal.agent import context as workflow_context
from areal.agent.spec import check_episode_rewards, outcome_from_exception
from areal.gateway.tree import InteractionWithTokenLogpReward
from areal.protocol import EpisodeOutcome, Trajectory


@dataclasses.dataclass
class WorkflowCall:
    """One ``arun_episode`` call: its outcome, its rows (empty unless ok), the clients behind them."""

    outcome: EpisodeOutcome
    rows: dict[str, InteractionWithTokenLogpReward]
    clients: int  # distinct ArealOpenAI clients that recorded the rows; 0 when none is known


def count_clients(rows: dict[str, InteractionWithTokenLogpReward], sessions: Sequence[Any]) -> int:
    """How many of ``sessions`` recorded at least one of ``rows`` (by interaction id)."""
    ids = {row.interaction.id for row in rows.values()}
    return sum(1 for s in sessions if ids & s.interactions.keys())


async def call_workflow(
    workflow: Any,
    engine: Any,
    data: dict,
    episode_id: str,
    deadline_s: float,
    reward_range: Sequence[float],
    task_id: int,
    gateway: Any | None = None,
    door: tuple[Any, str] | None = None,
) -> WorkflowCall:
    """One call under its deadline, in a workflow context that collects its clients (and hands
    them ``gateway``, the run's GatewayConfig, and ``door``, its Gateway and HTTP door's URL)."""
    t0 = time.monotonic()
    rows: dict[str, InteractionWithTokenLogpReward] | None = None
    with workflow_context.calling(is_eval=False, task_id=task_id, gateway=gateway, door=door) as sessions:
        try:
            rows = await asyncio.wait_for(workflow.arun_episode(engine, dict(data)), deadline_s)
        except TimeoutError:
            outcome = EpisodeOutcome(
                episode_id, "timeout", error=f"arun_episode exceeded its deadline of {deadline_s} s", wall_s=time.monotonic() - t0
            )
        except Exception as e:  # the workflow's own failure: this call fails, the run goes on
            outcome = outcome_from_exception(episode_id, e, time.monotonic() - t0)
        else:
            if rows is not None and not isinstance(rows, dict):  # a programming error, not a bad episode: stop the run
                raise TypeError(f"arun_episode must return dict[str, InteractionWithTokenLogpReward] or None, got {type(rows).__name__}")
            ok = bool(rows)
            outcome = EpisodeOutcome(
                episode_id, "ok" if ok else "error", error="" if ok else f"arun_episode returned {rows!r}", wall_s=time.monotonic() - t0
            )
    if rows:  # the workflow's rewards get the same check as an agent's
        outcome = check_episode_rewards(outcome, {i: r.reward for i, r in rows.items()}, reward_range)
    rows = rows if outcome.status == "ok" and rows else {}
    return WorkflowCall(outcome, rows, count_clients(rows, sessions))


class WorkflowGrouping:
    """How many ``arun_episode`` calls make one group, decided by the first successful call."""

    def __init__(self, workflow: Any, n_samples: int, deadline_s: float, reward_range: Sequence[float]) -> None:
        self.workflow, self.n_samples = workflow, n_samples
        self.deadline_s, self.reward_range = deadline_s, reward_range
        self.calls_per_group: int | None = 1 if n_samples == 1 else None
        self.gateway_config: Any | None = None  # the run's GatewayConfig, once its gateway is built
        self.door: tuple[Any, str] | None = None  # the run's Gateway and its HTTP door's URL, once served
        self._task_ids = iter(range(1 << 62))

    async def run_group(self, engine: Any, data: dict, group_id: str) -> list[WorkflowCall]:
        """The calls of one group (each with its outcome); the group's rows are the ok calls' rows."""

        def call(i: int) -> Any:
            return call_workflow(
                self.workflow,
                engine,
                data,
                f"{group_id}-w{i}",
                self.deadline_s,
                self.reward_range,
                next(self._task_ids),
                self.gateway_config,
                self.door,
            )

        if self.calls_per_group is not None:
            return list(await asyncio.gather(*(call(i) for i in range(self.calls_per_group))))
        # Undecided: calls one at a time until one succeeds and shows the style (a failed call, e.g.
        # an agent that stumbled on the model's output, shows nothing); then the group's other calls
        calls: list[WorkflowCall] = []
        while len(calls) < self.n_samples:
            calls.append(await call(len(calls)))
            if calls[-1].clients >= 2:  # the workflow sampled the group itself
                self.calls_per_group = 1
                return calls
            if calls[-1].outcome.status == "ok":
                self.calls_per_group = self.n_samples
                break
        return [*calls, *await asyncio.gather(*(call(i) for i in range(len(calls), self.n_samples)))]


class AdvantageWatch:
    """Warns when a step's groups cannot produce a non-zero advantage (see the module docstring)."""

    def __init__(self, groups_per_step: int, n_samples: int, write: Callable[[str], None]) -> None:
        self.groups_per_step, self.n_samples, self.write = groups_per_step, n_samples, write
        self.step_groups: list[tuple[str, int, bool]] = []  # (group id, samples, has signal)
        self.steps = 0
        self.singleton_reported = False
        self.dead_steps = 0

    def add(self, group_id: str, trajectories: Sequence[Trajectory]) -> None:
        """One published group (its trajectories in order)."""
        keys = {(t.reward, t.array("row_lens").shape[0], tuple(t.array("row_rewards").tolist())) for t in trajectories}
        signal = len(trajectories) >= 2 and len(keys) >= 2
        if len(trajectories) < 2 and not self.singleton_reported:
            self.singleton_reported = True
            self.write(
                f"WARNING [grouping] group {group_id} has {len(trajectories)} sample: its advantage is 0 and it trains nothing. "
                f"A group is every sample of one prompt (gconfig.n_samples={self.n_samples}); a RolloutWorkflow that "
                "returns one trajectory per arun_episode is called n_samples times per prompt, so set n_samples >= 2"
            )
        self.step_groups.append((group_id, len(trajectories), signal))
        if len(self.step_groups) < self.groups_per_step:
            return
        self.steps += 1
        if not any(s for _, _, s in self.step_groups):
            self.dead_steps += 1
            sizes = sorted({n for _, n, _ in self.step_groups})
            self.write(
                f"WARNING [grouping] step {self.steps}: none of its {len(self.step_groups)} groups can produce a non-zero "
                f"advantage (samples per group: {sizes}; each group has one sample or equal rewards): this step trains nothing"
            )
        self.step_groups = []
