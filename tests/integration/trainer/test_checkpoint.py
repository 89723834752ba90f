"""Checkpoint and resume: a real trainer subprocess reading a real shared-memory ring is SIGKILLed
at a random step and restarted with --resume; every trajectory is trained exactly once and the
final weights equal those of an uninterrupted run on the same records."""

import json
import random
import time
from pathlib import Path

import numpy as np
import pytest
from trainer_harness import Rings, Trainers, assert_same_weights, make_group, make_model, trainer_job

from areal.protocol import encode_trajectory
from areal.trainer.checkpoint import DataPosition, latest_checkpoint

STEPS = 6


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
    with Rings("ckpt", 2) as rings, Trainers(tmp_path) as trainers:
        rings.put(0, order)
        rings.put(1, order)
        base = dict(steps=STEPS, checkpoint_every=1)
        straight = trainer_job(model_dir, rings.names[0], tmp_path / "straight", **base)
        killed = trainer_job(model_dir, rings.names[1], tmp_path / "killed", **base)
        first = trainers.start(killed)
        kill_after = random.Random().randint(1, STEPS - 2)  # trained steps seen before the kill
        deadline = time.monotonic() + 120
        while len(trained(Path(killed.run_dir))) < kill_after:
            assert first.poll() is None and time.monotonic() < deadline, "trainer died or stalled before the kill"
            time.sleep(0.01)
        trainers.kill(first)
        ckpt = latest_checkpoint(Path(killed.run_dir) / "checkpoints")  # None if killed before the first
        assert ckpt is None or int(ckpt.name.split("-")[1]) in (kill_after - 1, kill_after, kill_after + 1)
        resumed, other = trainers.start(killed, "--resume"), trainers.start(straight)
        assert resumed.wait(timeout=180) == 0 and other.wait(timeout=180) == 0

    log = trained(Path(killed.run_dir))
    assert [line["step"] for line in log] == list(range(1, STEPS + 1)), log
    episodes = [e for line in log for e in line["episodes"]]
    assert sorted(episodes) == sorted(t.episode_id for t in order)  # none twice, none skipped
    assert log == trained(Path(straight.run_dir))  # same steps on the same episodes
    assert_same_weights(Path(killed.run_dir) / "final", Path(straight.run_dir) / "final", why=f"(killed after {kill_after} steps)")
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
