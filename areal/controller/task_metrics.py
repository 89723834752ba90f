"""Per-task numbers of a run whose rows name their ``task`` (reasoning-gym mixes, or any data
with a ``task`` column): the training reward per task and step, the held-out accuracy per task.

    a trained episode (ok, or a policy failure) of a row with a task
        ─► task_score: (task, its reward) ─► the step's window ─► task_reward_means
        ─► metrics.jsonl: reward/<task> (mean over the step's episodes of that task), episodes/<task>
    an evaluation's result (per_problem_sampled / per_problem_greedy, in the held-out rows' order)
        ─► task_accuracy ─► evals.jsonl, summary.json's eval_before / eval_after:
           sampled_acc/<task>, greedy_acc/<task>, n/<task>

Invariants: a step's per-task rewards cover the same episodes as its controller-side counts
(``episodes_*``: those logged since the previous report), of which the trained ones, with the
reward they are trained with; the per-task accuracies are the evaluation's own per-problem scores,
grouped, so their weighted mean is the overall accuracy. Rows without a task add no key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from areal.agent.failures import POLICY
from areal.controller.agent_eval import episode_score
from areal.gateway.tree import Interaction
from areal.protocol import EpisodeOutcome


def row_task(row: dict[str, Any]) -> str | None:
    """The task a row belongs to (its ``task`` column, a string), or None."""
    task = row.get("task")
    return task if isinstance(task, str) and task else None


def task_score(row: dict[str, Any], outcome: EpisodeOutcome, interactions: Iterable[Interaction]) -> tuple[str, float] | None:
    """(task, reward) of a settled training episode of ``row``: None when the row has no task or
    the episode is not trained (an agent or infrastructure failure)."""
    task = row_task(row)
    if task is None or not (outcome.status == "ok" or outcome.failure_class == POLICY):
        return None
    return task, episode_score(outcome, list(interactions))


def task_reward_means(scores: Iterable[tuple[str, float]]) -> dict[str, float]:
    """``reward/<task>`` (mean) and ``episodes/<task>`` (count) over ``scores``, tasks sorted."""
    by_task: dict[str, list[float]] = {}
    for task, reward in scores:
        by_task.setdefault(task, []).append(reward)
    out: dict[str, float] = {}
    for task in sorted(by_task):
        out[f"reward/{task}"] = sum(by_task[task]) / len(by_task[task])
        out[f"episodes/{task}"] = len(by_task[task])
    return out


def task_accuracy(result: dict[str, Any], problems: list[dict[str, Any]]) -> dict[str, float]:
    """``sampled_acc/<task>``, ``greedy_acc/<task>`` and ``n/<task>`` of an evaluation ``result``
    of ``problems`` (its per-problem lists are in their order); empty when no problem has a task."""
    by_task: dict[str, list[int]] = {}
    for i, p in enumerate(problems):
        if (task := row_task(p)) is not None:
            by_task.setdefault(task, []).append(i)
    out: dict[str, float] = {}
    for task in sorted(by_task):
        idx = by_task[task]
        out[f"sampled_acc/{task}"] = sum(result["per_problem_sampled"][i] for i in idx) / len(idx)
        out[f"greedy_acc/{task}"] = sum(result["per_problem_greedy"][i] for i in idx) / len(idx)
        out[f"n/{task}"] = len(idx)
    return out


def with_task_accuracy(
    evaluate_as: Callable[[str], Awaitable[dict[str, Any]]], problems: list[dict[str, Any]], write: Callable[[str], None]
) -> Callable[[str], Awaitable[dict[str, Any]]]:
    """``evaluate_as`` (an evaluation called by name: before, periodic, after) whose result also
    holds the accuracy per task (``task_accuracy``), said on the console in one line; itself when
    no held-out problem has a task."""
    if not any(row_task(p) is not None for p in problems):
        return evaluate_as

    async def evaluate(name: str) -> dict[str, Any]:
        result = await evaluate_as(name)
        per_task = task_accuracy(result, problems)
        tasks = [k.partition("/")[2] for k in per_task if k.startswith("n/")]
        write(
            f"[eval] {name}, per task (sampled_acc, n): "
            + ", ".join(f"{t} {per_task[f'sampled_acc/{t}']:.3f} ({per_task[f'n/{t}']})" for t in tasks)
        )
        return {**result, **per_task}

    return evaluate
