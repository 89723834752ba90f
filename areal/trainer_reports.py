"""The trainer's messages as the controller reads them, and the metrics row each step's report makes.

    trainer rank 0 ── TrainerReport after each step, TrainerDone after the last ──┐
    any trainer rank ── TrainerFailed before it exits on an error ─────────────────┴─► PULL ─► trainer_messages
    the trainer process exits before TrainerDone ─► TrainerExited (its exit code, where it ran, its log's tail)

    TrainerReport + the episodes logged since the previous one ─► step_row ─► metrics.jsonl and the trackers

One typed decoder (``TrainerMessage``, areal/protocol.py) reads the socket. It is polled every half
second from the trainer's start, so a trainer that dies without a word is noticed whatever the
controller is doing (the evaluation before training, the rollouts). What each message does to
the run (the policy version, checkpoints, periodic evaluation, the run's failure) is the
controller's to decide (``Controller._listen``); this module only reads and words.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import zmq.asyncio

from areal import workflow_stats
from areal.failures import CLASSES as FAILURE_CLASSES
from areal.process import log_tail
from areal.protocol import EpisodeOutcome, TrainerDone, TrainerMessage, TrainerReport


@dataclasses.dataclass(frozen=True)
class TrainerExited:
    """The trainer process exited before it sent ``TrainerDone``; ``reason`` says how, for the run's failure."""

    reason: str


async def trainer_messages(
    pull: zmq.asyncio.Socket, proc: subprocess.Popen, run_dir: Path
) -> AsyncIterator[TrainerMessage | TrainerExited]:
    """What the trainer sends on ``pull``, in order; then ``TrainerExited``, last, if its process
    exits before ``TrainerDone``. After ``TrainerDone`` it waits on until cancelled."""
    decoder = msgspec.msgpack.Decoder(TrainerMessage)
    done = False
    while True:
        if await pull.poll(500) == 0:
            if proc.poll() is not None and not done:
                where = getattr(proc, "error", "")  # a RemoteTrainer (cluster.kind=ray) names the node, and its log
                log = run_dir / getattr(proc, "log_name", "trainer.log")
                yield TrainerExited(
                    f"trainer process exited with code {proc.returncode} without finishing{'; ' + where if where else ''}; "
                    f"log tail ({log.name}):\n{log_tail(log) or '(empty log)'}"
                )
                return
            continue
        message = decoder.decode(await pull.recv())
        done = done or isinstance(message, TrainerDone)
        yield message


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
