"""Learning-rate schedules (trainer.lr_scheduler, trainer.warmup_steps): the rate of every
optimizer update against the closed forms of transformers' schedules, and a trainer SIGKILLed
after a checkpoint that resumes the schedule where it stood (a real trainer subprocess on a real
ring, as in test_checkpoint.py)."""

import json
import math
import os
import signal
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq
from test_checkpoint import start
from test_trainer import TEMPERATURE, make_group, make_model
from trainer_jobs import make_job
from transformers import AutoModelForCausalLM

from areal.protocol import encode_trajectory
from areal.ring.buffer import RingWriter, unlink_ring
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


def test_a_resumed_trainer_continues_the_schedule_from_its_checkpoint(tmp_path):
    """The killed trainer has only KILL_AT steps' records: it checkpoints step KILL_AT and waits
    for data; it is SIGKILLed there, the rest arrives, and it resumes with --resume. Its rates and
    final weights equal those of a trainer that ran straight through."""
    model_dir = tmp_path / "model"
    model = make_model(model_dir, with_tokenizer=False)
    rng = np.random.default_rng(11)
    groups = [make_group(model, f"g{i}", rng, size=2) for i in range(STEPS)]
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    names = [f"test-lrs-{os.getpid()}-{uuid.uuid4().hex[:6]}-{k}" for k in ("a", "b")]
    writers = [RingWriter(n, capacity_bytes=1 << 20) for n in names]
    procs = []
    try:
        for t in (t for g in groups for t in g):
            writers[0].put(encode_trajectory(t))
        for t in (t for g in groups[:KILL_AT] for t in g):
            writers[1].put(encode_trajectory(t))
        base = dict(
            model_path=str(model_dir),
            engine_urls=[],
            report_addr=f"tcp://127.0.0.1:{port}",
            steps=STEPS,
            groups_per_step=1,
            lr=LR,
            lr_scheduler="cosine",
            warmup_steps=WARMUP,
            temperature=TEMPERATURE,
            record_timeout_s=60,
            checkpoint_every=1,
        )
        straight = make_job(ring_name=names[0], run_dir=str(tmp_path / "straight"), **base)
        killed = make_job(ring_name=names[1], run_dir=str(tmp_path / "killed"), **base)
        procs.append(start(killed, tmp_path))
        deadline = time.monotonic() + 120
        ckpt_root = Path(killed.run_dir) / "checkpoints"
        while (ckpt := latest_checkpoint(ckpt_root)) is None or ckpt.name != f"step-{KILL_AT:08d}":
            assert procs[0].poll() is None and time.monotonic() < deadline, "trainer died or stalled before its checkpoint"
            time.sleep(0.05)
        time.sleep(0.5)  # past the checkpoint, into the wait for records of step KILL_AT + 1
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait()
        assert [s for s, _ in _lrs(Path(killed.run_dir))] == list(range(1, KILL_AT + 1))
        for t in (t for g in groups[KILL_AT:] for t in g):
            writers[1].put(encode_trajectory(t))
        procs.append(start(killed, tmp_path, "--resume"))
        procs.append(start(straight, tmp_path))
        assert procs[1].wait(timeout=180) == 0 and procs[2].wait(timeout=180) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for w in writers:
            w.close()
        for n in names:
            unlink_ring(n)
        pull.close(linger=0)
        ctx.term()

    want = [(s, expected_lr("cosine", s - 1, WARMUP, STEPS)) for s in range(1, STEPS + 1)]
    for run in (straight, killed):
        got = _lrs(Path(run.run_dir))
        assert [s for s, _ in got] == [s for s, _ in want]
        assert [lr for _, lr in got] == pytest.approx([lr for _, lr in want], rel=1e-9, abs=1e-15), (run.run_dir, got)
    a = AutoModelForCausalLM.from_pretrained(Path(killed.run_dir) / "final", dtype=torch.float32)
    b = dict(AutoModelForCausalLM.from_pretrained(Path(straight.run_dir) / "final", dtype=torch.float32).named_parameters())
    for name, p in a.named_parameters():
        torch.testing.assert_close(p, b[name], atol=1e-6, rtol=1e-5, msg=name)
