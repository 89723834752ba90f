"""A whole run SIGKILLed at a random point continues when the same command runs again
(``recover.mode=auto``, areal/controller/recovery.py): every step is logged once, no trajectory is trained
twice, none is skipped, the prompts keep their order, and the engine serves the checkpoint's
weights; and a run killed with one trainer rank resumes with two (the checkpoint is in
torch.distributed.checkpoint format, the ring positions come from the journal)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import ROOT

STEPS, GROUPS, SAMPLES, EVERY = 6, 2, 2, 2


def command(*extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "areal.train",
        "experiment_name=resume-test",
        "rollout.openai.mode=inline",
        f"trainer.steps={STEPS}",
        f"rollout.groups_per_step={GROUPS}",
        f"rollout.n_samples={SAMPLES}",
        f"trainer.checkpoint_every={EVERY}",
        "trainer.lr=1e-3",  # weights that move: the engine must be given the checkpoint's, not the initial ones
        "data.eval_size=0",
        *extra,
    ]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return sum(1 for line in path.read_text().splitlines() if line.strip()) if path.is_file() else 0


def run_and_kill(cmd: list[str], cwd: Path, find_dir, kill_after: int, delay: float) -> Path:
    """Start ``cmd``, SIGKILL its whole process group ``delay`` s after step ``kill_after`` is
    logged; returns its run directory."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            run_dir = find_dir()
            if run_dir is not None and steps_logged(run_dir) >= kill_after:
                time.sleep(delay)
                break
            assert proc.poll() is None, f"the run ended before the kill: {proc.stderr.read().decode()[-3000:]}"
            time.sleep(0.05)
        else:
            raise AssertionError("the run logged no step in time")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL or run_dir is not None
    return run_dir


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def check_continued(run_dir: Path, stderr: str) -> dict:
    """What the single-host end-to-end test checks, across the kill; returns the resume record."""
    assert (run_dir / "summary.json").is_file(), stderr[-3000:]
    resumes = sorted(run_dir.glob("resume-*.json"))
    assert resumes, f"the second start did not resume: {stderr[-3000:]}"
    plan = json.loads(resumes[-1].read_text())
    step = plan["step"]

    # Every step logged once, in order, by the two starts together.
    assert [r["step"] for r in lines(run_dir / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert [r["step"] for r in lines(run_dir / "trainer_metrics.jsonl")] == list(range(1, STEPS + 1))

    # No trajectory trained twice; every step trained its groups_per_step whole groups.
    trained: list[str] = []
    per_step: dict[int, list[str]] = {}
    for path in sorted(run_dir.glob("trained_episodes-r*.jsonl")):
        for row in lines(path):
            trained += row["episodes"]
            per_step.setdefault(row["step"], []).extend(row["episodes"])
    assert len(trained) == len(set(trained)), "an episode was trained twice"
    assert sorted(per_step) == list(range(1, STEPS + 1))
    assert all(len(ids) == GROUPS * SAMPLES for ids in per_step.values()), per_step

    # None skipped: what the killed run published and no checkpoint held is replayed and trained
    # (or dropped, named, for being sampled by weights after the checkpoint).
    trained_set = set(trained)
    assert set(plan["replayed"]) <= trained_set
    assert all(why for why in plan["dropped"].values())
    assert not set(plan["dropped"]) & trained_set

    # Same data order: the trained groups are exactly the first STEPS x GROUPS prompt positions.
    positions = {int(re.match(r"g(\d+)-", e).group(1)) for e in trained}
    assert positions == set(range(STEPS * GROUPS)), sorted(positions)

    # The engine served the checkpoint's weights: the second start's episodes were sampled by
    # versions >= the checkpoint's step, and at the first step after it the trainer's logprobs of
    # the tokens sampled by that version agree with the engine's.
    episodes = lines(run_dir / "episodes.jsonl")
    resumed = [
        e for e in episodes if "-resume" in e["episode_id"] or int(re.match(r"g(\d+)-", e["episode_id"]).group(1)) >= plan["next_position"]
    ]
    if step == STEPS:  # killed after the last checkpoint: nothing was left to train
        return plan
    assert resumed or len(plan["replayed"]) == (STEPS - step) * GROUPS * SAMPLES, "the second start ran no episode"
    assert all(min(e["versions"]) >= step for e in resumed if e["versions"]), [(e["episode_id"], e["versions"]) for e in resumed]
    after = next(r for r in lines(run_dir / "trainer_metrics.jsonl") if r["step"] == step + 1)
    if "logprob_max_diff" in after:  # tokens of the version the step trains from were in its batch
        assert after["logprob_max_diff"] < 1e-3, after
    assert not (run_dir / "resume_journal.bin").exists()  # a finished run leaves nothing to resume
    return plan


@pytest.mark.e2e
def test_the_same_command_after_a_sigkill_at_a_random_point_continues_the_run(tmp_path):
    seed = int(os.environ.get("RESUME_SEED", random.randrange(1 << 30)))  # RESUME_SEED=<printed seed> replays a case
    rng = random.Random(seed)
    for attempt in range(3):  # a fast machine may finish the run before the kill lands: kill earlier, again
        kill_after, delay = rng.randint(1, max(1, STEPS - 3 - attempt)), rng.uniform(0.0, 0.3 / (1 + attempt))
        print(f"seed={seed}: SIGKILL {delay:.2f} s after step {kill_after}")
        work = tmp_path / f"attempt-{attempt}"
        work.mkdir()
        runs = work / "runs" / "resume-test"  # Hydra's default layout: runs/<experiment_name>/<time>

        def newest(runs: Path = runs) -> Path | None:
            dirs = sorted(runs.iterdir()) if runs.is_dir() else []
            return dirs[-1] if dirs else None

        killed = run_and_kill(command(), work, newest, kill_after, delay)
        if not (killed / "summary.json").exists():
            break
    else:
        pytest.fail(f"seed={seed}: the run finished before each of 3 kills")
    time.sleep(1.1)  # a new second: Hydra's time-stamped directory for the second start differs
    again = subprocess.run(command(), cwd=work, env=env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "continuing it there" in again.stderr and str(killed.name) in again.stderr, again.stderr[-3000:]
    assert sorted(p.name for p in runs.iterdir()) == [killed.name]  # the second start's new directory went
    plan = check_continued(killed, again.stderr)
    print(f"seed={seed}: resumed from step {plan['step']}, {len(plan['replayed'])} replayed, {len(plan['rerun'])} rerun")


@pytest.mark.e2e
def test_a_run_killed_with_one_trainer_rank_resumes_with_two(tmp_path):
    run_dir = tmp_path / "run"
    cmd = command(f"hydra.run.dir={run_dir}")
    run_and_kill(cmd, ROOT, lambda: run_dir, EVERY + 1, 0.0)  # after the first checkpoint (step 2)
    assert (run_dir / "checkpoints" / f"step-{EVERY:08d}").is_dir()
    again = subprocess.run([*cmd, "trainer.ranks=2"], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    plan = check_continued(run_dir, again.stderr)
    assert plan["step"] >= EVERY
    assert sorted(p.name for p in run_dir.glob("trained_episodes-r*.jsonl")) == ["trained_episodes-r0.jsonl", "trained_episodes-r1.jsonl"]


def test_recover_mode_is_checked():
    from areal.controller.recovery import RecoverConfig

    with pytest.raises(ValueError, match=r"recover.mode must be one of \('auto', 'off'\), got 'sometimes'"):
        RecoverConfig(mode="sometimes")
    from areal.config import TrainConfig
    from areal.trainer.config import TrainerConfig

    assert [RecoverConfig(mode=m).mode for m in ("disabled", "fault", "resume")] == ["off", "auto", "auto"]  # AReaL's spellings
    assert TrainConfig(trainer=TrainerConfig(resume_mode="disable")).recover.mode == "off"  # verl's key and value
    with pytest.raises(ValueError, match="trainer.resume_mode .* must be auto or disable, got 'later'"):
        TrainConfig(trainer=TrainerConfig(resume_mode="later"))


def test_a_checkpoint_refuses_a_model_of_another_shape(tmp_path):
    """A checkpoint written with LoRA adapters (other parameter names) is not loaded into a run
    without them: the error names trainer.lora instead of a key mismatch deep in the loader."""
    import torch

    from areal.trainer.checkpoint import DataPosition, load_checkpoint, save_checkpoint

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    shape = {"lora": {"rank": 4}}
    path = save_checkpoint(tmp_path, 1, 1, 0, 1, model, optimizer, DataPosition(0, -1), lambda: None, model_shape=shape)
    meta, _ = load_checkpoint(path, 0, 1, model, optimizer, positions=False, model_shape=shape)
    assert (meta["step"], meta["model_shape"]) == (1, shape)
    with pytest.raises(ValueError, match=r"holds a model trained with \{'lora': \{'rank': 4\}\}, this run's is \{\}.*trainer.lora"):
        load_checkpoint(path, 0, 1, model, optimizer, positions=False, model_shape={})


def test_a_group_admitted_before_the_last_seen_that_left_no_line_runs_again(tmp_path):
    """Groups finish out of order: at the kill, group 1 (admitted before group 3) had no episode
    ended, so nothing names it in episodes.jsonl or the journal; it is run again all the same,
    its id made from the prompt order by the rollout loop, and the prompt order goes on after 3."""
    from areal.controller.recovery import plan_resume

    rows = [
        {"episode_id": "g0-p7-e0", "group_id": "g0-p7", "status": "ok"},
        {"episode_id": "g0-p7-e1", "group_id": "g0-p7", "status": "ok"},
        {"episode_id": "g2-p5-e1", "group_id": "g2-p5", "status": "ok"},
        {"episode_id": "g3-p9-e0", "group_id": "g3-p9", "status": "ok"},
    ]
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = plan_resume(tmp_path, n_samples=2)
    assert plan.readmit == [(0, "g0-p7"), (1, ""), (2, "g2-p5"), (3, "g3-p9")]  # nothing trained, nothing published
    assert plan.next_position == 4


def test_a_trained_group_whose_lines_the_kill_cut_is_not_run_again(tmp_path):
    """episodes.jsonl may lose its last lines to the kill while the trainer's own record says
    group 1 was trained at step 1 (the checkpoint's): position 1 is neither missing nor rerun."""
    from areal.controller.recovery import plan_resume

    ckpt = tmp_path / "checkpoints" / "step-00000001"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": 1}))
    (tmp_path / "trained_episodes-r0.jsonl").write_text(json.dumps({"step": 1, "episodes": ["g1-p3-e0", "g1-p3-e1"]}) + "\n")
    rows = [{"episode_id": f"g{g}-p{g}-e{i}", "group_id": f"g{g}-p{g}", "status": "ok"} for g in (0, 2) for i in (0, 1)]
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = plan_resume(tmp_path, n_samples=2)
    assert plan.readmit == [(0, "g0-p0"), (2, "g2-p2")] and plan.next_position == 3
