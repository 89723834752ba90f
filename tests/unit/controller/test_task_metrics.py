"""The controller's side of rows with a task (reasoning-gym mixes): which reward scores them, how a
step's groups mix the tasks, the reward per task in a step's row and the held-out accuracy per task
in an evaluation's result."""

from __future__ import annotations

import asyncio
import collections

import pytest

from areal.config import DataConfig, RolloutConfig
from areal.controller.metrics import step_row
from areal.controller.problems import REASONING_GYM_AGENT, REASONING_GYM_REWARD, run_reward, train_problems, user_rows
from areal.controller.task_metrics import task_accuracy, task_score, with_task_accuracy
from areal.dataset import stratified_order
from areal.protocol import EpisodeOutcome, TrainerReport

MIX = "reasoning-gym:chain_sum@2+leg_counting+fraction_simplification"


def test_reasoning_gym_rows_are_scored_by_the_tasks_scorer_unless_reward_is_set():
    d = DataConfig(train=MIX, train_size=12, eval_size=4)
    rows, held_out = user_rows(d, None, None, seed=3)
    assert len(rows) == 12 and len(held_out) == 4
    assert user_rows(DataConfig(train=MIX, train_size=12, eval_size=0), None, None, seed=3)[1] is None
    assert run_reward("", rows, REASONING_GYM_AGENT) == REASONING_GYM_REWARD
    assert run_reward("", rows, "") == REASONING_GYM_REWARD  # an agent object: its own run()
    assert run_reward("my.mod:fn", rows, REASONING_GYM_AGENT) == "my.mod:fn"
    assert run_reward("", [{"question": "q", "answer": "1", "task": "x"}], REASONING_GYM_AGENT) == ""  # not reasoning-gym's
    assert run_reward("", None, RolloutConfig.agent) == ""  # the embedded task
    with pytest.raises(ValueError, match=r"built-in agent .* \\boxed\{\} check.* set rollout.agent=agents/reasoning_gym_agent.py"):
        run_reward("", rows, RolloutConfig.agent)


def test_a_steps_groups_mix_the_tasks_in_the_datas_proportions():
    rows, _ = user_rows(DataConfig(train=MIX, train_size=40, eval_size=0), None, None, seed=1)
    problems, levels = train_problems(rows, 40, seed=1)
    order = stratified_order(levels, 4, seed=1)
    shares = collections.Counter(rows[i]["task"] for i in range(40))
    for block in range(0, 40, 4):
        step = collections.Counter(problems[i]["task"] for i in order[block : block + 4])
        assert set(step) == set(shares)  # every step samples every task
    assert train_problems([{"question": "q", "answer": "a"}] * 3, 3, 1)[1] == [0, 0, 0]  # no task: one level


def test_a_steps_row_has_the_reward_of_each_task_over_its_trained_episodes():
    rows = {"a": {"task": "chain_sum"}, "b": {"task": "leg_counting"}, "none": {"question": "q"}}
    settled = [
        (rows["a"], EpisodeOutcome("e1", "ok", reward=1.0)),
        (rows["a"], EpisodeOutcome("e2", "ok", reward=0.0)),
        (rows["a"], EpisodeOutcome("e3", "error", failure_class="agent")),  # not trained: left out
        (rows["b"], EpisodeOutcome("e4", "ok", rewards_by_id={"c1": 0.25, "c2": 0.25})),
        (rows["b"], EpisodeOutcome("e5", "error", reward=-1.0, failure_class="policy")),  # trained with its reward
        (rows["none"], EpisodeOutcome("e6", "ok", reward=1.0)),  # no task: no key
    ]
    scored = [s for row, o in settled if (s := task_score(row, o, [])) is not None]
    assert scored == [("chain_sum", 1.0), ("chain_sum", 0.0), ("leg_counting", 0.5), ("leg_counting", -1.0)]
    row = step_row(TrainerReport(1, 1, 6, {"reward_mean": 0.3}), [o for _, o in settled], [], scored)
    assert row["reward/chain_sum"] == 0.5 and row["episodes/chain_sum"] == 2
    assert row["reward/leg_counting"] == -0.25 and row["episodes/leg_counting"] == 2
    assert not any(k.startswith("reward/") for k in step_row(TrainerReport(1, 1, 6, {}), [], []))


def test_an_evaluation_has_its_accuracy_per_task():
    problems = [{"task": "a"}, {"task": "b"}, {"task": "a"}, {"question": "no task"}]
    result = {"sampled_acc": 0.375, "per_problem_sampled": [1.0, 0.5, 0.0, 0.0], "per_problem_greedy": [1.0, 1.0, 1.0, 0.0]}
    assert task_accuracy(result, problems) == {
        "sampled_acc/a": 0.5,
        "greedy_acc/a": 1.0,
        "n/a": 2,
        "sampled_acc/b": 0.5,
        "greedy_acc/b": 1.0,
        "n/b": 1,
    }
    lines: list[str] = []

    async def evaluate_as(name: str) -> dict:
        return dict(result, name=name)

    out = asyncio.run(with_task_accuracy(evaluate_as, problems, lines.append)("after"))
    assert out["name"] == "after" and out["sampled_acc"] == 0.375 and out["n/a"] == 2
    assert lines == ["[eval] after, per task (sampled_acc, n): a 0.500 (2), b 0.500 (1)"]
    assert with_task_accuracy(evaluate_as, [{"question": "q"}], lines.append) is evaluate_as  # no tasks: unchanged
