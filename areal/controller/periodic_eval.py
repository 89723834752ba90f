"""Evaluation during training, and the best checkpoint kept by a named metric.

    TrainerReport(step s)  s % data.eval_every == 0, s < trainer.steps
        │ at once, on the controller's loop: hard-link weights/v{s} ─► .best-stage-v{s}
        │   (the trainer prunes v{s} once v{s + trainer.keep_versions} is published)
        ▼ a task beside the rollout loop (one at a time; episodes keep running meanwhile)
    the evaluation (data.eval_mode: evaluate() on the engine, or the run's agent through its runner,
    areal/controller/agent_eval.py), the engine serving v{s} since the report
        ─► records.evaluation("periodic", {version: s, served_version_min/max, sampled_acc, ...}, step=s)
           (evals.jsonl, the console, W&B, TensorBoard: areal/controller/records.py)
        ─► better than best/best.json by data.eval_best_metric (data.eval_best_mode)?
             yes: best.json into the stage; best/ ─rename─► .best-old; stage ─rename─► best/
             no:  the stage is removed
    after training: the "after" evaluation (the last step, the controller's) is a candidate the
    same way, its weights from weights/v{N} (or final/, when no weights dir was written)

Invariants: ``best/`` is a complete HF model directory with ``best.json`` (metric, mode, value,
step, version), or, when the best step's weights could not be kept, ``best.json`` alone saying
why; it is never a mix of two steps. Candidates are the trained versions (step >= 1): the
initial weights are the user's own. A tie keeps the earlier step. A run killed between the two
renames leaves ``.best-old``, which the next start puts back.

What is covered: the version that was scored (``version``) against the versions whose weights
actually generated the evaluation's tokens (``served_versions``): the trainer keeps training
while the evaluation runs, so a later version can serve its last requests; the row says so
rather than hiding it. An evaluation still running when the next is due makes the next one
skipped, with a line (run later, it would score a newer version under an older step).
What is not covered: trainer.weight_sync=collective writes no weights/v{s}, so only the final
step's weights (final/) can be kept; a version pruned before it could be staged (only when the
controller's loop stalls for trainer.keep_versions whole steps) is named in best.json instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from areal.controller.records import RunRecords

Evaluate = Callable[[], Awaitable[dict[str, Any]]]


def check_eval_rows(every: int, eval_rows: int) -> None:
    """``data.eval_every`` (``every``) needs held-out rows to score; ``eval_rows`` is how many the run has."""
    if every and not eval_rows:
        raise ValueError(
            f"data.eval_every={every} evaluates during training, but the run has no held-out rows: "
            "set data.eval_size > 0 (the embedded task), or data.eval / eval_dataset= with your data"
        )


class PeriodicEval:
    """The controller's evaluation during training; inert when ``every`` (data.eval_every) is 0 or
    there is nothing to ``evaluate``. ``steps``: the run's last step (trainer.steps), which the
    controller's "after" evaluation covers; "best" is by ``metric`` (data.eval_best_metric) and
    ``mode`` (data.eval_best_mode)."""

    def __init__(
        self,
        run_dir: Path,
        records: RunRecords,
        evaluate: Evaluate | None,
        log: Callable[[str], None],
        *,
        every: int,
        steps: int,
        metric: str,
        mode: str,
    ) -> None:
        self.every = every if evaluate is not None else 0
        self.last_step = steps  # the controller's "after" evaluation covers it
        self.metric, self.mode = metric, mode
        self.run_dir, self.records, self.evaluate, self.log = run_dir, records, evaluate, log
        self.best_dir = run_dir / "best"
        self.task: asyncio.Task | None = None
        self.best: dict[str, Any] | None = None
        if self.every:
            self.best = self._recover()

    # ---- the controller's hooks -----------------------------------------------------------

    def on_report(self, step: int, version: int) -> None:
        """After the TrainerReport of ``step``: start its evaluation when one is due."""
        if not self.every or step % self.every or step >= self.last_step:
            return
        if self.task is not None and not self.task.done():
            self.log(f"[eval] step {step} skipped: the evaluation of an earlier step is still running (data.eval_every={self.every})")
            return
        if self.task is not None and not self.task.cancelled() and self.task.exception() is not None:
            return  # an evaluation failed: drain() raises its error when the training ends
        stage, missing = self._stage(self.run_dir / "weights" / f"v{version}", version)  # before the trainer can prune it
        self.task = asyncio.create_task(self._periodic(step, version, stage, missing))
        self.task.add_done_callback(self._failed)

    async def drain(self) -> None:
        """Wait for the evaluation in flight; a failed evaluation's error is the run's."""
        if self.task is not None:
            await self.task

    def _failed(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:  # retrieved here, raised again by drain()
            self.log(f"[eval] the evaluation during training failed, no more will run: {task.exception()!r}")

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def after(self, result: dict[str, Any] | None, version: int, final_dir: str) -> dict[str, Any] | None:
        """The controller's "after" evaluation (``version``: the last one) as the last candidate;
        returns the best (``best.json``'s content), or None when nothing was evaluated."""
        if not self.every or result is None:
            return self.best
        source = self.run_dir / "weights" / f"v{version}"
        stage, missing = self._stage(source if source.is_dir() else Path(final_dir), version)
        self._consider(result, version, version, stage, missing)
        self._remove_stages()
        return self.best

    # ---- inside ---------------------------------------------------------------------------

    async def _periodic(self, step: int, version: int, stage: Path | None, missing: str) -> None:
        try:
            result = await self.evaluate()
            served = result.get("served_versions") or [version]
            # the trackers take numbers: the versions that served, as their range
            row = {"version": version, "served_version_min": served[0], "served_version_max": served[-1], **result}
            self.records.evaluation("periodic", row, step)
            self._consider(result, step, version, stage, missing)
            note = "" if served == [version] else f" (served by versions {served}: the trainer moved on meanwhile)"
            best = self.best or {}
            self.log(
                f"[eval] step {step} (v{version}): sampled_acc {result['sampled_acc']:.4g}, greedy_acc {result['greedy_acc']:.4g}"
                f"{note}; best {self.metric} {best.get('value', float('nan')):.4g} at step {best.get('step')}"
            )
        finally:
            if stage is not None and stage.exists():
                shutil.rmtree(stage, ignore_errors=True)

    def _better(self, value: float) -> bool:
        if self.best is None:
            return True
        return value > self.best["value"] if self.mode == "max" else value < self.best["value"]

    def _consider(self, result: dict[str, Any], step: int, version: int, stage: Path | None, missing: str) -> None:
        value = float(result[self.metric])
        if not self._better(value):
            return
        best = {
            "metric": self.metric,
            "mode": self.mode,
            "value": value,
            "step": step,
            "version": version,
            "served_versions": result.get("served_versions", []),
            "n": result.get("n"),
            "model": stage is not None,
        }
        if stage is None:
            best["why_no_model"] = missing
            self.log(f"[eval] step {step} is the best so far, but its weights cannot be kept: {missing}")
            stage = self.run_dir / f".best-stage-v{version}"
            stage.mkdir()
        (stage / "best.json").write_text(json.dumps(best, indent=1))
        old = self.run_dir / ".best-old"
        if old.exists():
            shutil.rmtree(old)
        if self.best_dir.exists():
            os.rename(self.best_dir, old)
        os.rename(stage, self.best_dir)
        shutil.rmtree(old, ignore_errors=True)
        self.best = best

    def _stage(self, source: Path, version: int) -> tuple[Path | None, str]:
        """Hard links to ``source``'s files (a copy across filesystems) in ``.best-stage-v{version}``:
        the trainer's pruning then removes names, not the data. ``(None, why)`` when ``source`` is
        not (or no longer) a complete model directory."""
        stage = self.run_dir / f".best-stage-v{version}"
        if stage.exists():
            shutil.rmtree(stage)
        if not source.is_dir():
            return None, _absent(source)
        try:
            shutil.copytree(source, stage, copy_function=_link_or_copy)
        except (FileNotFoundError, shutil.Error):  # pruned while it was being linked
            shutil.rmtree(stage, ignore_errors=True)
            return None, f"{source} was pruned while it was being kept (trainer.keep_versions)"
        if not _complete_model_dir(stage):
            shutil.rmtree(stage)
            return None, f"{source} is not a complete HF model directory (pruned while it was being kept?)"
        return stage, ""

    def _recover(self) -> dict[str, Any] | None:
        """Put back a ``best/`` a killed swap left as ``.best-old``, drop stale stages, and read
        the best so far (a resumed run keeps competing with it when the metric is the same)."""
        old = self.run_dir / ".best-old"
        if old.exists() and not self.best_dir.exists():
            os.rename(old, self.best_dir)
        self._remove_stages()
        with contextlib.suppress(FileNotFoundError):
            best = json.loads((self.best_dir / "best.json").read_text())
            if (best.get("metric"), best.get("mode")) == (self.metric, self.mode):
                return best
        return None

    def _remove_stages(self) -> None:
        for path in [*self.run_dir.glob(".best-stage-v*"), self.run_dir / ".best-old"]:
            shutil.rmtree(path, ignore_errors=True)


def _absent(source: Path) -> str:
    if source.parent.name == "weights":
        return (
            f"{source} does not exist (pruned by trainer.keep_versions, or trainer.weight_sync=collective, "
            "which writes no weights directories)"
        )
    return f"{source} does not exist"


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(src, dst)


def _complete_model_dir(path: Path) -> bool:
    """config.json and every weight file an index names (or a single weights file)."""
    if not (path / "config.json").is_file():
        return False
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return all((path / shard).is_file() for shard in set(json.loads(index.read_text())["weight_map"].values()))
    return any((path / name).is_file() for name in ("model.safetensors", "pytorch_model.bin"))
