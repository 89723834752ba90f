"""Each step's row in metrics.jsonl: the trainer's report and the episodes logged since the last one.

    TrainerReport (areal/trainer/reports.py) + the episodes logged since the previous one
        (+ the task and reward of each trained one, for rows with a task: areal/controller/task_metrics.py)
        ─► step_row ─► metrics.jsonl and the trackers

One row per report, written by the controller's records (areal/controller/records.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from areal.agent import stats as workflow_stats
from areal.agent.failures import OUTCOME_CLASSES as FAILURE_CLASSES
from areal.controller.task_metrics import task_reward_means
from areal.protocol import EpisodeOutcome, TrainerReport


def step_row(
    r: TrainerReport, outcomes: list[EpisodeOutcome], calls: list[tuple[int, int, int]], tasks: Sequence[tuple[str, float]] = ()
) -> dict[str, Any]:
    """Step ``r``'s row in metrics.jsonl: the trainer's metrics; the statuses and failure classes
    of ``outcomes`` and the mean LLM, well-formed and malformed tool calls of ``calls`` (one
    triple per episode), both the episodes logged since the previous report; the reward per task
    of ``tasks`` (``reward/<task>``, ``episodes/<task>``: (task, reward) of each trained episode
    among them whose row has a task); the episodes with each kind of tripwire (worlds only); what
    in-process workflows recorded (stats_tracker); the time."""
    statuses: dict[str, int] = {}
    for o in outcomes:
        statuses[o.status] = statuses.get(o.status, 0) + 1
    return {
        "step": r.step,
        "version": r.version,
        "consumed": r.consumed,
        **r.metrics,
        **{f"episodes_{k}": v for k, v in statuses.items()},
        **{f"failures_{c}": sum(1 for o in outcomes if o.failure_class == c) for c in FAILURE_CLASSES},
        **tripwire_counts(outcomes),  # tripwires_<kind>: episodes whose sandbox saw one (sandbox/grader.py)
        # what the agents did: LLM calls, well-formed and malformed tool calls per episode (logged since the last step)
        **(
            {
                "calls_per_episode": sum(c for c, _, _ in calls) / len(calls),
                "tool_calls_per_episode": sum(t for _, t, _ in calls) / len(calls),
                "malformed_tool_calls_per_episode": sum(m for _, _, m in calls) / len(calls),
            }
            if calls
            else {}
        ),
        **task_reward_means(tasks),  # reward/<task>: rows with a task (reasoning-gym mixes)
        **workflow_stats.DEFAULT.export(),  # what in-process workflows recorded (stats_tracker)
        "time": time.time(),
    }


def tripwire_counts(outcomes: list[EpisodeOutcome]) -> dict[str, int]:
    """``tripwires_<kind>``: how many of ``outcomes`` had a tripwire of that kind (a world's
    episodes; sandbox/world.py's kinds), only the kinds seen."""
    counts: dict[str, int] = {}
    for o in outcomes:
        for kind in {t.partition(":")[0] for t in o.tripwires}:
            counts[f"tripwires_{kind}"] = counts.get(f"tripwires_{kind}", 0) + 1
    return counts
