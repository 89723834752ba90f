"""Checkpoint and resume: a real trainer subprocess reading a real shared-memory ring is SIGKILLed
at a random step and restarted with --resume; every trajectory is trained exactly once and the
final weights equal those of an uninterrupted run on the same records."""

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq
from test_trainer import TEMPERATURE, make_group, make_model
from trainer_jobs import make_job
from transformers import AutoModelForCausalLM

from areal.protocol import encode_trajectory
from areal.ring.buffer import RingWriter, unlink_ring
from areal.trainer.checkpoint import DataPosition, latest_checkpoint
from areal.trainer.config import TrainerJob

ROOT = Path(__file__).resolve().parents[1]
STEPS = 6


def feed(name: str, trajs: list) -> RingWriter:
    writer = RingWriter(name, capacity_bytes=1 << 20)
    for t in trajs:
        writer.put(encode_trajectory(t))
    return writer


def start(config: TrainerJob, tmp_path: Path, *extra: str) -> subprocess.Popen:
    path = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}.json"
    path.write_text(config.to_json())
    return subprocess.Popen([sys.executable, "-m", "areal.trainer", "--config", str(path), *extra], cwd=ROOT, start_new_session=True)


def trained(run_dir: Path) -> list[dict]:
    path = run_dir / "trained_episodes-r0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.e2e
def test_sigkill_at_a_random_step_then_resume_trains_every_trajectory_once(tmp_path):
    model_dir = tmp_path / "model"
    model = make_model(model_dir, with_tokenizer=False)
    rng = np.random.default_rng(7)
    groups = [make_group(model, f"g{i}", rng, size=2) for i in range(STEPS)]
    # Interleave pairs of groups so that checkpoints hold records of incomplete groups.
    order = [t for a, b in zip(groups[::2], groups[1::2]) for t in (a[0], b[0], a[1], b[1])]
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    names = [f"test-ckpt-{os.getpid()}-{uuid.uuid4().hex[:6]}-{k}" for k in ("a", "b")]
    writers = [feed(n, order) for n in names]
    procs = []
    try:
        base = dict(
            model_path=str(model_dir),
            engine_urls=[],
            report_addr=f"tcp://127.0.0.1:{port}",
            steps=STEPS,
            groups_per_step=1,
            lr=1e-3,
            temperature=TEMPERATURE,
            record_timeout_s=30,
            checkpoint_every=1,
        )
        straight = make_job(ring_name=names[0], run_dir=str(tmp_path / "straight"), **base)
        killed = make_job(ring_name=names[1], run_dir=str(tmp_path / "killed"), **base)
        procs.append(start(killed, tmp_path))
        kill_after = random.Random().randint(1, STEPS - 2)  # trained steps seen before the kill
        deadline = time.monotonic() + 120
        while len(trained(Path(killed.run_dir))) < kill_after:
            assert procs[0].poll() is None and time.monotonic() < deadline, "trainer died or stalled before the kill"
            time.sleep(0.01)
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait()
        ckpt = latest_checkpoint(Path(killed.run_dir) / "checkpoints")  # None if killed before the first
        assert ckpt is None or int(ckpt.name.split("-")[1]) in (kill_after - 1, kill_after, kill_after + 1)
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

    log = trained(Path(killed.run_dir))
    assert [line["step"] for line in log] == list(range(1, STEPS + 1)), log
    episodes = [e for line in log for e in line["episodes"]]
    assert sorted(episodes) == sorted(t.episode_id for t in order)  # none twice, none skipped
    assert log == trained(Path(straight.run_dir))  # same steps on the same episodes
    a = AutoModelForCausalLM.from_pretrained(Path(killed.run_dir) / "final", dtype=torch.float32)
    b = dict(AutoModelForCausalLM.from_pretrained(Path(straight.run_dir) / "final", dtype=torch.float32).named_parameters())
    for name, p in a.named_parameters():
        torch.testing.assert_close(p, b[name], atol=1e-6, rtol=1e-5, msg=f"{name} (killed after {kill_after} steps)")
    metrics = [json.loads(line)["step"] for line in (Path(killed.run_dir) / "trainer_metrics.jsonl").read_text().splitlines()]
    assert metrics == list(range(1, STEPS + 1))


def test_checkpoint_holds_pending_records_in_arrival_order(tmp_path):
    from areal.trainer.step import GroupCollector

    model = make_model(tmp_path / "m", with_tokenizer=False)
    rng = np.random.default_rng(8)
    a, b, c = (make_group(model, g, rng, size=2) for g in "abc")

    class ListReader:  # the reader's duck type: get() and last_seq
        def __init__(self, bufs: list[bytes]) -> None:
            self.bufs, self.last_seq = bufs, None

        def get(self, timeout_s: float) -> bytes | None:
            self.last_seq = 0 if self.last_seq is None else self.last_seq + 1
            return self.bufs[self.last_seq] if self.last_seq < len(self.bufs) else None

    stream = [encode_trajectory(t) for t in (a[0], b[0], c[0], b[1], c[1], a[1])]
    first = GroupCollector(ListReader(stream), 1.0)
    assert [t.episode_id for t in first.next_batch(1)] == ["b-0", "b-1"]
    position = first.position()
    assert position.consumed == 4 and position.last_seq == 3 and len(position.held) == 2  # a-0, c-0
    resumed = GroupCollector(ListReader(stream), 1.0)  # the ring re-delivers from the start
    resumed.restore(DataPosition(consumed=position.consumed, last_seq=position.last_seq, held=position.held))
    # Records up to seq 3 are skipped (not held twice); c-1 completes c before a-1 completes a.
    assert [t.episode_id for t in resumed.next_batch(1)] == ["c-0", "c-1"]
    assert [t.episode_id for t in resumed.next_batch(1)] == ["a-0", "a-1"]
    assert resumed.consumed == 6
