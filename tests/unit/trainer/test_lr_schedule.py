"""Learning-rate schedules (trainer.lr_scheduler, trainer.warmup_steps): the rate of every
optimizer update against the closed forms of transformers' schedules, and a trainer SIGKILLed
after a checkpoint that resumes the schedule where it stood (a real trainer subprocess on a real
ring, as in test_checkpoint.py)."""

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from trainer_harness import Rings, Trainers, assert_same_weights, make_group, make_model, trainer_job

from areal.trainer.checkpoint import latest_checkpoint
from areal.trainer.config import TrainerConfig
from areal.trainer.rank import make_lr_scheduler

LR = 1e-3


def expected_lr(schedule: str, update: int, warmup: int, total: int) -> float:
    """The rate of 0-based update ``update``: linear warm-up from 0, then the schedule to 0 at ``total``."""
    if update < warmup:
        return LR * update / warmup
    progress = (update - warmup) / max(1, total - warmup)
    if schedule == "constant":
        return LR
    if schedule == "linear":
        return LR * (1.0 - progress)
    return LR * 0.5 * (1.0 + math.cos(math.pi * progress))


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
@pytest.mark.parametrize(("warmup", "minibatches"), [(0, 1), (3, 1), (3, 2)])
def test_each_schedule_sets_the_rate_of_every_update(schedule, warmup, minibatches):
    config = TrainerConfig(steps=5, lr=LR, lr_scheduler=schedule, warmup_steps=warmup, minibatches=minibatches)
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([param], lr=config.lr)
    scheduler = make_lr_scheduler(optimizer, config)
    total = config.steps * minibatches  # the schedule counts optimizer updates, not steps
    seen = []
    for _ in range(total):
        seen.append(optimizer.param_groups[0]["lr"])
        param.grad = torch.ones(2)
        optimizer.step()
        scheduler.step()
    want = [expected_lr(schedule, k, warmup, total) for k in range(total)]
    assert seen == pytest.approx(want, rel=1e-9, abs=1e-15), (seen, want)
    if schedule != "constant":
        assert seen[-1] < LR  # it decays after the peak
    if warmup:
        assert seen[0] == 0.0 and seen[warmup] == pytest.approx(LR)


def test_schedule_settings_are_validated_naming_the_field():
    with pytest.raises(ValueError, match="trainer.lr_scheduler"):
        TrainerConfig(lr_scheduler="exponential")
    with pytest.raises(ValueError, match=r"trainer.warmup_steps .*= 8\]"):
        TrainerConfig(steps=4, minibatches=2, warmup_steps=9)
    TrainerConfig(steps=4, minibatches=2, warmup_steps=8)  # the whole run may be warm-up


STEPS, WARMUP, KILL_AT = 6, 2, 3


def _lrs(run_dir: Path) -> list[tuple[int, float]]:
    return [(m["step"], m["lr"]) for m in map(json.loads, (run_dir / "trainer_metrics.jsonl").read_text().splitlines())]


@pytest.mark.e2e
def test_a_resumed_trainer_continues_the_schedule_from_its_checkpoint(tmp_path):
    """The killed trainer has only KILL_AT steps' records: it checkpoints step KILL_AT and waits
    for data; it is SIGKILLed there, the rest arrives, and it resumes with --resume. Its rates and
    final weights equal those of a trainer that ran straight through."""
    model_dir = tmp_path / "model"
    model = make_model(model_dir, with_tokenizer=False)
    rng = np.random.default_rng(11)
    groups = [make_group(model, f"g{i}", rng, size=2) for i in range(STEPS)]
    with Rings("lrs", 2) as rings, Trainers(tmp_path) as trainers:
        rings.put(0, *groups)
        rings.put(1, *groups[:KILL_AT])
        base = dict(steps=STEPS, lr=LR, lr_scheduler="cosine", warmup_steps=WARMUP, record_timeout_s=60, checkpoint_every=1)
        straight = trainer_job(model_dir, rings.names[0], tmp_path / "straight", **base)
        killed = trainer_job(model_dir, rings.names[1], tmp_path / "killed", **base)
        first = trainers.start(killed)
        deadline = time.monotonic() + 120
        ckpt_root = Path(killed.run_dir) / "checkpoints"
        while (ckpt := latest_checkpoint(ckpt_root)) is None or ckpt.name != f"step-{KILL_AT:08d}":
            assert first.poll() is None and time.monotonic() < deadline, "trainer died or stalled before its checkpoint"
            time.sleep(0.05)
        time.sleep(0.5)  # past the checkpoint, into the wait for records of step KILL_AT + 1
        trainers.kill(first)
        assert [s for s, _ in _lrs(Path(killed.run_dir))] == list(range(1, KILL_AT + 1))
        rings.put(1, *groups[KILL_AT:])
        resumed, other = trainers.start(killed, "--resume"), trainers.start(straight)
        assert resumed.wait(timeout=180) == 0 and other.wait(timeout=180) == 0

    want = [(s, expected_lr("cosine", s - 1, WARMUP, STEPS)) for s in range(1, STEPS + 1)]
    for run in (straight, killed):
        got = _lrs(Path(run.run_dir))
        assert [s for s, _ in got] == [s for s, _ in want]
        assert [lr for _, lr in got] == pytest.approx([lr for _, lr in want], rel=1e-9, abs=1e-15), (run.run_dir, got)
    assert_same_weights(Path(killed.run_dir) / "final", Path(straight.run_dir) / "final")
