"""Resuming a whole run that was killed: ``recover.mode=auto`` (the default), the same command again.

    killed run's dir ─► plan_resume ─► Resume(step S, checkpoint, weights of version S,
         │                                    trajectories to replay, prompts to run again)
         │   checkpoints/step-S          model + optimizer + schedule (torch.distributed.checkpoint)
         │   resume_journal.bin          every published trajectory no checkpoint holds yet
         │   trained_episodes-r*.jsonl   which episodes each step trained
         │   episodes.jsonl              which prompts were started (group ids g<k>-p<row>)
         ▼
    controller: engines load weights v<S>; trainer loads checkpoint S and trains S+1..; the
    replayed groups go into the new rings first; then the prompts of lost groups, then the
    prompt order goes on where it stopped.

What a resumed run keeps and redoes (the issue's contract: no trajectory trained twice or skipped):
- Steps 1..S stay trained (the checkpoint holds them); their episodes are not replayed.
- A published trajectory that step <= S did not train is replayed into the new rings, whole
  groups in publish order, if every token of it was sampled by a version <= S (weights the
  resumed run has). One sampled by a later version (published by the killed run after its last
  checkpoint) belongs to a policy that no longer exists: it is dropped, named in
  ``resume.json``, and its prompt runs again.
- Groups started but not published (in flight at the kill, or cut mid-publish) run again with
  new episode ids (``-resume<n>``); a group that ended with nothing to train (every episode
  failed) counts as done, as it did in the killed run.
- metrics.jsonl, evals.jsonl and the trainer's jsonl files are cut back to step S, so the steps
  after S are logged once, by the resumed run. episodes.jsonl keeps every line: those episodes
  happened.
- The checkpoint's model and optimizer are in ``torch.distributed.checkpoint`` format and the
  data positions come from the journal, not from the rings, so the resumed run may have another
  number of trainer ranks.

The journal stays small: at every checkpoint the controller rewrites it without the episodes the
checkpoint holds (``Journal.compact``), so it holds at most the trajectories of the steps since
the last checkpoint plus those waiting in the rings.

Finding the run: with an explicit run directory (``hydra.run.dir=...``) it is that directory.
With Hydra's default (``runs/<experiment_name>/<time>``), a new directory is made for each
command; ``find_unfinished`` then picks the newest sibling that has no ``summary.json`` and was
started with the same resolved config (``recover`` aside), and the run continues there.

Not covered: a run killed between a checkpoint's rename and its trained-episode lines (the
trainer writes those lines first, so this cannot happen with this trainer); a journal lost with
its disk (the rings are shared memory: a reboot loses them, the journal does not).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal.protocol import Trajectory, encode_trajectory, frame
from areal.trainer.layout import latest_checkpoint

MODES = ("auto", "off")
# AReaL's recover.mode and verl's trainer.resume_mode spellings
ALIASES = {"disabled": "off", "disable": "off", "fault": "auto", "resume": "auto"}
JOURNAL = "resume_journal.bin"
RECORD_FILES = ("metrics.jsonl", "trainer_metrics.jsonl")  # one line per step, cut back to the checkpoint
_GROUP = re.compile(r"^g(\d+)-p(\d+)")


@dataclass
class RecoverConfig:
    """``recover``: what a run does when its directory holds a killed run (AReaL's spelling)."""

    mode: str = "auto"  # auto: continue a killed run from its last checkpoint; off: a run dir holds one run

    def __post_init__(self) -> None:
        self.mode = ALIASES.get(self.mode, self.mode)
        if self.mode not in MODES:
            raise ValueError(f"recover.mode must be one of {MODES}, got {self.mode!r}")


# ---- the journal -----------------------------------------------------------------------------


class Journal:
    """``resume_journal.bin``: the published trajectories no checkpoint holds yet, framed like
    trajectories.bin. Appended group by group (flushed to the OS after each group: a SIGKILL loses
    nothing written); rewritten without the trained ones at each checkpoint."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / JOURNAL
        self.file = open(self.path, "ab")

    def append(self, frames: bytes) -> None:
        """A group's records, framed as trajectories.bin frames them (``frame(encode_trajectory(t))``
        each, joined): encoded once by the publisher for this file and the saved copy."""
        self.file.write(frames)
        self.file.flush()

    def compact(self, trained: set[str]) -> int:
        """Drop the records of ``trained`` episodes (a complete checkpoint holds them); returns how
        many records stay. Written to a temporary file and renamed: a kill leaves one whole journal."""
        self.file.close()
        kept = [t for t in read_journal(self.path) if t.episode_id not in trained]
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(frame(encode_trajectory(t)) for t in kept))
        os.replace(tmp, self.path)
        self.file = open(self.path, "ab")
        return len(kept)

    def close(self) -> None:
        self.file.close()


def read_journal(path: Path) -> list[Trajectory]:
    """Every complete record of the journal (a record cut by the kill is dropped, and said)."""
    from areal.controller.trajectories import read_saved_trajectories

    if not path.is_file():
        return []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_saved_trajectories(path)
    for w in caught:
        print(f"[resume] {w.message}")
    return records


def trained_episodes(run_dir: Path, through_step: int | None = None) -> set[str]:
    """Episode ids the trainer's steps (those <= ``through_step``, or all) trained on, from every
    rank's ``trained_episodes-r*.jsonl``; a line cut by a kill is skipped."""
    trained: set[str] = set()
    for path in run_dir.glob("trained_episodes-r*.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
                row = json.loads(line)
                if through_step is None or row["step"] <= through_step:
                    trained.update(row["episodes"])
    return trained


def cut_jsonl(path: Path, step: int, key: str = "step") -> int:
    """Keep the lines whose ``key`` is <= ``step`` (and lines without it); returns lines dropped.
    A last line cut by the kill is dropped too."""
    if not path.is_file():
        return 0
    keep, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if isinstance(row, dict) and isinstance(row.get(key), int) and row[key] > step:
            dropped += 1
        else:
            keep.append(line)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)
    return dropped


# ---- the plan --------------------------------------------------------------------------------


def prompt_position(group_id: str) -> int | None:
    """The prompt-order position k of a group id ``g<k>-p<row>`` (None for another shape)."""
    m = _GROUP.match(group_id)
    return int(m.group(1)) if m else None


@dataclass
class Resume:
    """What a resumed run starts from (``plan_resume``)."""

    step: int  # the checkpoint's step (0: none; the run restarts from the initial weights)
    checkpoint: Path | None
    replay: list[Trajectory]  # whole groups, in the order the killed run published them
    readmit: list[tuple[int, str]]  # (position, group id, or "" for one that left no line) of prompts to run again, in order
    next_position: int  # where the prompt order goes on
    attempt: int  # 1 for the first resume of this run dir, 2 for the second...
    dropped: dict[str, str] = field(default_factory=dict)  # journal episode id -> why it is not replayed

    def describe(self) -> str:
        groups = len({t.group_id for t in self.replay})
        return (
            f"resuming from step {self.step} ({self.checkpoint or 'no checkpoint: the initial weights'}): "
            f"{len(self.replay)} trajectories in {groups} groups replayed, {len(self.readmit)} prompts run again, "
            f"{len(self.dropped)} trajectories dropped (sampled by weights after the checkpoint; listed in resume.json)"
        )


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run's records (a killed or finished run)."""
    return any((run_dir / n).is_file() and (run_dir / n).stat().st_size for n in ("metrics.jsonl", "episodes.jsonl", JOURNAL))


def plan_resume(run_dir: Path, n_samples: int) -> Resume:
    """Read the killed run in ``run_dir`` and decide what the resumed run replays and reruns."""
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    step = json.loads((ckpt / "meta.json").read_text())["step"] if ckpt else 0
    trained = trained_episodes(run_dir, step)
    # episode ids are <group>[-retryN|-resumeN]-e<i> (agents) or <group>-r<i> (workflow rows)
    trained_groups = {g for g in (_group_of(e) for e in trained) if g}

    # Journal records the checkpoint does not hold: replay whole groups sampled by versions <= S.
    by_group: dict[str, list[Trajectory]] = {}
    for t in read_journal(run_dir / JOURNAL):
        if t.episode_id not in trained:
            by_group.setdefault(t.group_id, []).append(t)
    replay: list[Trajectory] = []
    dropped: dict[str, str] = {}
    for group_id, trajs in by_group.items():
        newest = max((int(t.array("versions").max(initial=-1)) for t in trajs), default=-1)
        if len(trajs) < trajs[0].group_size:
            why = f"its group was cut short by the kill ({len(trajs)} of {trajs[0].group_size} published)"
        elif newest > step:
            why = f"sampled by version {newest}, after the checkpoint's {step}"
        else:
            replay.extend(trajs)
            continue
        dropped.update({t.episode_id: why for t in trajs})
    replayed_groups = {t.group_id for t in replay}

    # Every group the killed run started, from episodes.jsonl (and the journal).
    started: dict[str, list[dict[str, Any]]] = {}
    path = run_dir / "episodes.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
                row = json.loads(line)
                started.setdefault(row["group_id"], []).append(row)
    for group_id in by_group:
        started.setdefault(group_id, [])
    readmit: list[tuple[int, str]] = []
    for group_id, rows in started.items():
        pos = prompt_position(group_id)
        if pos is None or group_id in trained_groups or group_id in replayed_groups:
            continue
        if len(rows) >= n_samples and not any(r["status"] == "ok" or r.get("failure_class") == "policy" for r in rows):
            continue  # it failed as a whole: the killed run moved on from it too
        if any(r.get("dropped") for r in rows):
            continue  # dropped by dynamic sampling (rollout.dynamic_sampling): the killed run moved on from it too
        readmit.append((pos, group_id))
    # Every position the killed run admitted and left a trace of: a line in episodes.jsonl (which
    # a kill may cut short of its last lines), a journal record, or a trained step.
    positions = {p for p in (prompt_position(g) for g in (*started, *trained_groups)) if p is not None}
    next_position = max(positions, default=-1) + 1
    # Admission hands out positions in order, but groups finish out of order: a group admitted
    # before the last one seen, none of whose episodes had ended at the kill, left no trace. It
    # runs again too (its id is made from the prompt order by the rollout loop: "").
    readmit += [(pos, "") for pos in range(next_position) if pos not in positions]
    readmit.sort()
    attempt = 1 + sum(1 for _ in run_dir.glob("resume-*.json"))
    return Resume(step, ckpt, replay, readmit, next_position, attempt, dropped)


def _group_of(episode_id: str) -> str | None:
    m = _GROUP.match(episode_id)
    return m.group(0) if m else None


def prepare_records(run_dir: Path, plan: Resume) -> None:
    """Cut the per-step records back to the checkpoint's step and write ``resume-<n>.json`` (what
    this resume replays, reruns and drops). Stale end-of-run files of the killed run go."""
    for name in RECORD_FILES:
        cut_jsonl(run_dir / name, plan.step)
    for path in run_dir.glob("trained_episodes-r*.jsonl"):
        cut_jsonl(path, plan.step)
    for name in ("evals.jsonl", "eval.jsonl"):  # "before" (step 0) stays: it scored the initial weights
        cut_jsonl(run_dir / name, plan.step)
    # The journal from now on: exactly what is replayed (the rest is trained or dropped).
    tmp = run_dir / (JOURNAL + ".tmp")
    tmp.write_bytes(b"".join(frame(encode_trajectory(t)) for t in plan.replay))
    os.replace(tmp, run_dir / JOURNAL)
    for name in ("untrained_episodes.json", "summary.json"):
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "final", ignore_errors=True)
    (run_dir / f"resume-{plan.attempt}.json").write_text(
        json.dumps(
            {
                "step": plan.step,
                "checkpoint": str(plan.checkpoint) if plan.checkpoint else None,
                "replayed": [t.episode_id for t in plan.replay],
                "rerun": [g or f"position {pos}" for pos, g in plan.readmit],
                "next_position": plan.next_position,
                "dropped": plan.dropped,
            },
            indent=1,
        )
    )


def find_unfinished(run_dir: Path, resolved: dict[str, Any]) -> Path | None:
    """The newest sibling of the fresh ``run_dir`` holding a killed run started with the same
    resolved config (``recover`` aside): where ``recover.mode=auto`` continues when Hydra made a
    new time-stamped directory for the same command. None when there is none."""
    want = {k: v for k, v in resolved.items() if k != "recover"}
    candidates = []
    for sib in run_dir.parent.iterdir() if run_dir.parent.is_dir() else []:
        if sib == run_dir or not sib.is_dir() or (sib / "summary.json").exists() or not holds_run(sib):
            continue
        try:
            theirs = json.loads((sib / "config.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if {k: v for k, v in theirs.items() if k != "recover"} == want:
            candidates.append(sib)
    return max(candidates, key=lambda p: p.name) if candidates else None
