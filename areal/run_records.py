"""What one run writes into its directory, and the trackers beside it: the controller's records.

    controller ─► RunRecords ─► episodes.jsonl          one line per started episode (reason first)
                             ├► trajectories.bin         every published Trajectory (save_trajectories)
                             ├► trackers (areal/trackers.py): metrics.jsonl, evals.jsonl, console, W&B, TensorBoard
                             ├► untrained_episodes.json  accepted episodes no step trained (the run ended first)
                             └► summary.json, reward_curve.png   at the end

Invariants: every line is strict JSON (``areal/jsonl.py``); a failure's reason is kept whole up
to ``REASON_CHARS``, its head first; episodes.jsonl is flushed at every step, so a killed run
keeps every episode the trainer reported on; the trackers' episode tables are decoded only for
the episodes they sample.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from areal.config import TrainConfig, to_dict
from areal.evaluation import paired_test, reward_trend
from areal.jsonl import json_line
from areal.plots import plot_reward_curve
from areal.protocol import Trajectory, encode_trajectory, frame
from areal.trackers import open_trackers

REASON_CHARS = 16_000  # of a failure's reason in episodes.jsonl; its head is where the reason is


def reason(error: str) -> str:
    """A failure's reason for the record: whole up to REASON_CHARS, else its head and a count of
    what was cut (an agent's exception message may be any size)."""
    if len(error) <= REASON_CHARS:
        return error
    return f"{error[:REASON_CHARS]}... ({len(error) - REASON_CHARS} more characters)"


def episode_table_row(decode: Callable[[Sequence[int]], str], record: dict[str, Any], calls: Sequence[Any]) -> dict[str, Any]:
    """An episode's row in the trackers' tables: its first prompt and every call's reply, decoded.
    ``calls`` are the episode's interactions (``prompt_ids``, ``output_ids``), in order."""
    return {
        "episode_id": record["episode_id"],
        "status": record["status"],
        "reward": record["reward"],
        "n_calls": len(calls),
        "prompt": decode(calls[0].prompt_ids) if calls else "",
        "calls": "\n".join(f"[{i + 1}] {decode(x.output_ids)}" for i, x in enumerate(calls)),
        "error": record["error"],
    }


class RunRecords:
    """The run directory's files and the trackers, opened at the run's start."""

    def __init__(self, config: TrainConfig, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.episode_log = open(run_dir / "episodes.jsonl", "a")
        # metrics.jsonl (logger=[jsonl]), the console, W&B, TensorBoard: one object (areal/trackers.py)
        self.tracker = open_trackers(config.logger, config.tracker, run_dir, config.experiment_name, to_dict(config), config.seed)
        self.step_metrics: list[dict[str, Any]] = []
        self.saved = open(run_dir / "trajectories.bin", "ab") if config.save_trajectories else None

    def episode(self, record: dict[str, Any], table_row: Callable[[], dict[str, Any]]) -> None:
        """One started episode's line; ``table_row`` is called only if the trackers sample it."""
        self.episode_log.write(json_line(record))
        self.tracker.offer_episode(table_row)

    def trajectory(self, traj: Trajectory) -> None:
        if self.saved is not None:
            self.saved.write(frame(encode_trajectory(traj)))

    def step(self, row: dict[str, Any]) -> None:
        """One optimizer step's metrics; the episodes logged so far reach the disk with it."""
        self.step_metrics.append(row)
        self.tracker.log_step(row)
        self.episode_log.flush()

    def evaluation(self, name: str, result: dict[str, Any], step: int) -> None:
        self.tracker.log_eval(name, result, step)

    def untrained(self, published: list[str], why: str | None) -> None:
        """List the episodes that reached the ring but no optimizer step (the run ended first) in
        ``untrained_episodes.json``, so no accepted episode disappears without a word. Call once
        the trainer has stopped (its trained-episode lists are final)."""
        trained: set[str] = set()
        for path in self.run_dir.glob("trained_episodes-r*.jsonl"):
            for line in path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):  # a line cut by a killed trainer
                    trained.update(json.loads(line)["episodes"])
        untrained = [e for e in published if e not in trained]
        if untrained:
            why = why or "the run reached its last step with these still in the ring"
            (self.run_dir / "untrained_episodes.json").write_text(json.dumps({"reason": why[:4000], "episodes": untrained}, indent=1))
            tqdm.write(f"{len(untrained)} accepted episodes were not trained (listed in untrained_episodes.json)")

    def summary(self, final_model: str, eval_before: dict | None, eval_after: dict | None, wall_s: float) -> dict[str, Any]:
        """``summary.json`` and ``reward_curve.png``: held-out accuracy before and after (paired
        test) and the trend of the batch reward over the steps."""
        summary = {
            "run_dir": str(self.run_dir),
            "steps": len(self.step_metrics),
            "final_model": final_model,
            "eval_before": eval_before,
            "eval_after": eval_after,
            "reward_trend": reward_trend([m["reward_mean"] for m in self.step_metrics]),
            "wall_s": round(wall_s, 2),
        }
        if eval_before and eval_after:
            summary["eval_test"] = paired_test(eval_before["per_problem_sampled"], eval_after["per_problem_sampled"])
        plot_reward_curve(self.step_metrics, self.run_dir / "reward_curve.png", eval_before, eval_after)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def close(self, finished: bool) -> None:
        self.episode_log.close()
        if self.saved is not None:
            self.saved.close()
        self.tracker.close(finished)
