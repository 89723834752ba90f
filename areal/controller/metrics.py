"""Each step's row in metrics.jsonl: the trainer's report and the episodes logged since the last one.

    TrainerReport (areal/trainer/reports.py) + the episodes logged since the previous one
        ─► step_row ─► metrics.jsonl and the trackers

One row per report, written by the controller's records (areal/controller/records.py).
"""

from __future__ import annotations

import time
from typing import Any

from areal.agent import stats as workflow_stats
from areal.agent.failures import CLASSES as FAILURE_CLASSES
from areal.protocol import EpisodeOutcome, TrainerReport


def step_row(r: TrainerReport, outcomes: list[EpisodeOutcome], calls: list[tuple[int, int, int]]) -> dict[str, Any]:
    """Step ``r``'s row in metrics.jsonl: the trainer's metrics; the statuses and failure classes
    of ``outcomes`` and the mean LLM, well-formed and malformed tool calls of ``calls`` (one
    triple per episode), both the episodes logged since the previous report; what in-process
    workflows recorded (stats_tracker); the time."""
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
        **workflow_stats.DEFAULT.export(),  # what in-process workflows recorded (stats_tracker)
        "time": time.time(),
    }
