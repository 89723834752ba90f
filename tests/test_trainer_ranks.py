"""Two data-parallel trainer ranks (torchrun, DDP over gloo), each reading its own real ring, end
with the same weights as one rank trained on all the groups, step for step."""

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import msgspec
import numpy as np
import torch
import zmq
from transformers import AutoModelForCausalLM

from areal.buffer import RingWriter, unlink_ring
from areal.protocol import TrainerDone, TrainerMessage, TrainerReport, encode_trajectory
from areal.trainer import TrainerConfig
from test_trainer import TEMPERATURE, make_group, make_model

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], config: TrainerConfig, tmp_path: Path) -> list:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    config.report_addr = f"tcp://127.0.0.1:{pull.bind_to_random_port('tcp://127.0.0.1')}"
    path = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}.json"
    path.write_text(config.to_json())
    proc = subprocess.Popen(cmd + ["--config", str(path)], cwd=ROOT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    decoder = msgspec.msgpack.Decoder(TrainerMessage)
    msgs = []
    try:
        assert proc.wait(timeout=240) == 0
        while pull.poll(100):
            msgs.append(decoder.decode(pull.recv()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        pull.close(linger=0)
        ctx.term()
    return msgs


def test_two_gloo_ranks_match_one_rank(tmp_path):
    model_dir = tmp_path / "model"
    model = make_model(model_dir, with_tokenizer=False)
    rng = np.random.default_rng(11)
    groups = [make_group(model, f"g{i}", rng, size=2) for i in range(4)]  # 2 steps x 2 groups
    tag = f"test-ranks-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    single, r0, r1 = f"{tag}-single", f"{tag}-r0", f"{tag}-r1"
    writers = [RingWriter(n, capacity_bytes=1 << 20) for n in (single, r0, r1)]
    try:
        for i, g in enumerate(groups):
            for t in g:
                writers[0].put(encode_trajectory(t))
                writers[1 + i % 2].put(encode_trajectory(t))  # the step's groups split over the ranks
        # Rank 1 gets the longer rows of one group: unequal micro-batch counts must still sync.
        base = dict(model_path=str(model_dir), engine_urls=[], report_addr="tcp://127.0.0.1:1", steps=2,
                    groups_per_step=2, lr=1e-3, temperature=TEMPERATURE, record_timeout_s=60, micro_batch_tokens=16,
                    loss="ppo", behav_weight_cap=5.0)
        one = TrainerConfig(ring_name=single, run_dir=str(tmp_path / "one"), **base)
        two = TrainerConfig(ring_name=r0, ring_names=[r0, r1], run_dir=str(tmp_path / "two"), **base)
        msgs1 = run([sys.executable, "-m", "areal.trainer"], one, tmp_path)
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                    "127.0.0.1", "--master-port", str(free_port()), "-m", "areal.trainer"]
        msgs2 = run(torchrun, two, tmp_path)
    finally:
        for w, n in zip(writers, (single, r0, r1)):
            w.close()
            unlink_ring(n)

    reports1 = [m for m in msgs1 if isinstance(m, TrainerReport)]
    reports2 = [m for m in msgs2 if isinstance(m, TrainerReport)]
    assert [r.step for r in reports2] == [1, 2] and isinstance(msgs2[-1], TrainerDone)  # rank 0 alone reports
    assert [r.consumed for r in reports2] == [r.consumed for r in reports1] == [4, 8]
    for a, b in zip(reports1, reports2):
        for key in ("tokens", "trajectories", "reward_mean", "loss", "grad_norm", "logprob_max_diff_stale"
                    if "logprob_max_diff_stale" in a.metrics else "logprob_max_diff"):
            assert abs(a.metrics[key] - b.metrics[key]) <= 1e-5 * max(1.0, abs(a.metrics[key])), (key, a.metrics, b.metrics)
    one_final = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "final", dtype=torch.float32).named_parameters())
    two_final = AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "final", dtype=torch.float32)
    changed = 0
    for name, p in two_final.named_parameters():
        torch.testing.assert_close(p, one_final[name], atol=1e-6, rtol=1e-5, msg=name)
        changed += not torch.equal(p, dict(model.named_parameters())[name])
    assert changed == len(one_final)
    logs = [json.loads(x) for r in (0, 1) for x in (tmp_path / "two" / f"trained_episodes-r{r}.jsonl").read_text().splitlines()]
    assert sorted(e for line in logs for e in line["episodes"]) == sorted(t.episode_id for g in groups for t in g)
