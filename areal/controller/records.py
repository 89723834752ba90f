"""What one run writes into its directory, and the trackers beside it: the controller's records.

    controller ─► RunRecords ─► episodes.jsonl          one line per started episode (reason first)
                             ├► calls.jsonl              each episode's conversation tree, token by token (the viewer's)
                             ├► vocab.json               every token id's text, so the run dir decodes on its own
                             ├► trajectories.bin         every published Trajectory (save_trajectories)
                             ├► trackers (areal/controller/trackers.py): metrics.jsonl, evals.jsonl, console, W&B, TensorBoard
                             ├► untrained_episodes.json  accepted episodes no step trained (the run ended first)
                             │  (eval_episodes.jsonl, the agent's evaluation episodes: areal/controller/agent_eval.py)
                             └► summary.json, reward_curve.png   at the end

Invariants: every line is strict JSON (``areal/jsonl.py``); a failure's reason is kept whole up
to ``REASON_CHARS``, its head first; episodes.jsonl is flushed at every step, so a killed run
keeps every episode the trainer reported on; the trackers' episode tables are decoded only for
the episodes they sample.

calls.jsonl (read by ``areal/view``, its lines written by its ``call_tree_line``): one line per episode with recorded calls, each call its id,
parent, the prompt tokens it adds to its parent's prompt + output (a child's prompt extends them,
``areal/gateway/tree.py``), its sampled ids, logprobs (4 decimals) and versions, its own reward and
the reward its row is trained with. Bounded: ``view_record_mb`` in all, spread evenly over the
run's steps (by step k, at most k/steps of it is used), so early and late steps both keep
episodes; an episode over the allowance gets ``"calls_recorded": false`` in episodes.jsonl.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from areal.controller.evaluation import paired_test, reward_trend
from areal.controller.plots import plot_reward_curve
from areal.controller.trackers import Trackers
from areal.jsonl import json_line
from areal.protocol import EpisodeOutcome
from areal.view.data import call_tree_line, vocabulary

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


def row_rewards(outcome: EpisodeOutcome, calls: Sequence[Any]) -> dict[str, tuple[float | None, float]]:
    """Each call's own reward and the reward its row is trained with (as ``trajectory_from_episode``
    gives it). Own: its entry in run()'s {completion_id: reward}, else the reward set through the
    gateway, else None; None for every call when run() returned one float, which every row is
    trained with. Trained, otherwise: the own reward, or 0."""
    if outcome.reward is not None:
        return {c.id: (None, outcome.reward) for c in calls}
    own = {c.id: outcome.rewards_by_id.get(c.id, c.reward) for c in calls}
    return {i: (r, r if r is not None else 0.0) for i, r in own.items()}


class RunRecords:
    """The run directory's files and the trackers, opened at the run's start. ``tracker``: the run's
    trackers (metrics.jsonl with logger=[jsonl], the console, W&B, TensorBoard: one object,
    areal/controller/trackers.py), closed with the records. ``save_trajectories``,
    ``view_record_mb``: the run's settings of those names; ``steps``: trainer.steps, over which
    calls.jsonl's budget is spread."""

    def __init__(
        self, run_dir: Path, tracker: Trackers, *, save_trajectories: bool, view_record_mb: int, steps: int, title: str = ""
    ) -> None:
        self.run_dir = run_dir
        self.title = title  # the reward plot's
        self.episode_log = open(run_dir / "episodes.jsonl", "a")
        self.tracker = tracker
        self.step_metrics: list[dict[str, Any]] = []
        self.periodic_evals: list[dict[str, Any]] = []  # evaluations during training (the plot's points)
        self.saved = open(run_dir / "trajectories.bin", "ab") if save_trajectories else None
        self.call_log = open(run_dir / "calls.jsonl", "a") if view_record_mb > 0 else None
        self.call_budget = (view_record_mb << 20, max(1, steps))  # bytes in all, steps
        self.call_bytes = 0

    def vocabulary(self, tokenizer: Any) -> None:
        """``vocab.json``: the text of every token id, so the viewer decodes without the model."""
        if self.call_log is not None:
            (self.run_dir / "vocab.json").write_text(json.dumps(vocabulary(tokenizer)))

    def episode(
        self,
        record: dict[str, Any],
        table_row: Callable[[], dict[str, Any]],
        calls: Sequence[Any] = (),
        rewards: dict[str, tuple[float | None, float]] | None = None,
    ) -> None:
        """One started episode's line; ``table_row`` is called only if the trackers sample it.
        ``calls`` (its gateway interactions, in order) go to calls.jsonl within the budget, with
        ``rewards``: each call's own reward and its row's (``row_rewards``)."""
        if self.call_log is not None and calls:
            line = call_tree_line(record["episode_id"], calls, rewards or {})
            total, steps = self.call_budget
            allowed = total * min(steps, len(self.step_metrics) + 1) // steps
            record["calls_recorded"] = self.call_bytes + len(line) <= allowed
            if record["calls_recorded"]:
                self.call_log.write(line)
                self.call_bytes += len(line)
        self.episode_log.write(json_line(record))
        self.tracker.offer_episode(table_row)

    @property
    def saves_trajectories(self) -> bool:
        return self.saved is not None

    def trajectories(self, frames: bytes) -> None:
        """A published group's records, framed (``frame(encode_trajectory(t))`` each, joined), into
        trajectories.bin (``save_trajectories=true``; else nothing)."""
        if self.saved is not None:
            self.saved.write(frames)

    def step(self, row: dict[str, Any]) -> None:
        """One optimizer step's metrics; the episodes logged so far reach the disk with it."""
        self.step_metrics.append(row)
        self.tracker.log_step(row)
        self.episode_log.flush()
        if self.call_log is not None:
            self.call_log.flush()

    def continued(self, step: int) -> None:
        """A killed run resumed at ``step`` (areal/controller/recovery.py cut its files back): the steps and
        evaluations it logged before stay in the summary and the plot, and the calls it recorded
        count against the viewer's budget."""
        rows = [json.loads(line) for line in _lines(self.run_dir / "metrics.jsonl")]
        self.step_metrics = [r for r in rows if isinstance(r.get("step"), int) and r["step"] <= step]
        # Steps the trainer checkpointed but the killed controller never heard of: logged now,
        # from the trainer's own lines (the controller's episode counts of them are lost).
        logged = {r["step"] for r in self.step_metrics}
        for row in (json.loads(line) for line in _lines(self.run_dir / "trainer_metrics.jsonl")):
            if isinstance(row.get("step"), int) and row["step"] <= step and row["step"] not in logged:
                self.step({**row, "restored_from": "trainer_metrics.jsonl", "time": time.time()})
        self.step_metrics.sort(key=lambda r: r["step"])
        evals = [json.loads(line) for line in _lines(self.run_dir / "evals.jsonl")]
        self.periodic_evals = [{k: v for k, v in e.items() if k != "name"} for e in evals if e.get("name") == "periodic"]
        with contextlib.suppress(OSError):
            self.call_bytes = (self.run_dir / "calls.jsonl").stat().st_size

    def saved_eval_before(self) -> dict[str, Any] | None:
        """The score of the initial weights the run's first start saved (None: not scored yet)."""
        with contextlib.suppress(OSError, json.JSONDecodeError):
            return json.loads((self.run_dir / "eval_before.json").read_text())
        return None

    def evaluation(self, name: str, result: dict[str, Any], step: int) -> None:
        self.tracker.log_eval(name, result, step)
        if name == "before":  # whole (per-problem scores too): a resumed run's paired test needs it
            tmp = self.run_dir / "eval_before.json.tmp"
            tmp.write_text(json.dumps(result))
            tmp.replace(self.run_dir / "eval_before.json")
        if name == "periodic":
            self.periodic_evals.append({"step": step, **result})

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

    def summary(
        self, final_model: str, eval_before: dict | None, eval_after: dict | None, wall_s: float, best: dict | None = None
    ) -> dict[str, Any]:
        """``summary.json`` and ``reward_curve.png``: held-out accuracy before and after (paired
        test; of the run's agent, with its tool use, when ``eval_mode`` is agent), the trend of the batch reward over the steps, and ``best``: the best evaluated step
        (``best/best.json``, data.eval_every)."""
        summary = {
            "run_dir": str(self.run_dir),
            "steps": len(self.step_metrics),
            "final_model": final_model,
            "eval_before": eval_before,
            "eval_after": eval_after,
            "reward_trend": reward_trend([m["reward_mean"] for m in self.step_metrics]),
            "wall_s": round(wall_s, 2),
        }
        if eval_before or eval_after:  # single_turn: one reply, no tools; agent: the run's agent, with its tool use
            summary["eval_mode"] = (eval_after or eval_before).get("mode", "single_turn")
        if eval_before and eval_after:
            summary["eval_test"] = paired_test(eval_before["per_problem_sampled"], eval_after["per_problem_sampled"])
        if best is not None:
            summary["best"] = best
        plot_reward_curve(self.step_metrics, self.run_dir / "reward_curve.png", eval_before, eval_after, self.periodic_evals, self.title)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def close(self, finished: bool) -> None:
        self.episode_log.close()
        if self.call_log is not None:
            self.call_log.close()
        if self.saved is not None:
            self.saved.close()
        self.tracker.close(finished)


def _lines(path: Path) -> list[str]:
    """The non-empty lines of a jsonl file that parse (none if it is missing)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            if isinstance(json.loads(line), dict):
                out.append(line)
    return out
