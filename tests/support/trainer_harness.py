"""The trainer's world in the tests: a tiny Qwen2 model, groups of trajectories whose reward
favours one token, rings holding them, and the trainer as a real subprocess (one rank, or a
torchrun of several) reporting over a real ZeroMQ PULL socket.

    model = make_model(tmp_path / "model", with_tokenizer=False)
    groups = [make_group(model, f"g{i}", rng) for i in range(4)]
    with Rings("ckpt", 1) as rings, Trainers(tmp_path) as trainers:
        rings.put(0, *groups)
        rc, msgs = trainers.run(make_job(ring_name=rings.names[0], report_addr=trainers.report_addr, ...))
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
import zmq
from paths import ROOT
from tiny_models import tiny_qwen2
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2ForCausalLM

from areal.protocol import TokenRow, TrainerMessage, Trajectory, encode_trajectory
from areal.ring.buffer import RingWriter, unlink_ring
from areal.trainer.config import TrainerConfig, TrainerJob

VOCAB = 300
REWARDED = 7  # the token the reward favours
TEMPERATURE = 0.8
TRAINER = [sys.executable, "-m", "areal.trainer"]

# The jobs of the rank tests (tests/e2e/test_trainer_ranks.py, LoRA's in tests/unit/trainer/test_lora.py),
# on top of trainer_job's: rank 1 gets the longer rows of one group, so unequal micro-batch counts
# must still sync.
RANK_JOB = dict(steps=2, groups_per_step=2, record_timeout_s=60, micro_batch_tokens=16, loss="ppo", behav_weight_cap=5.0)

# Weights after 2 AdamW steps of lr 1e-3 (updates ~1e-3 per element). Summing the gradient over
# ranks in another order changes it in the last float bits, and where an element's gradient is
# near zero Adam's m/sqrt(v) turns that into a visible difference (seen: 1.4e-6 on 1 of 8,192
# elements). 1e-5 is 1 % of one update: a rank that skipped or double-counted data is far off.
UPDATE_ATOL = 1e-5


_JOB_FIELDS = {f.name for f in dataclasses.fields(TrainerJob)} - {"trainer"}


def make_job(**fields: Any) -> TrainerJob:
    """A TrainerJob from one flat set of keywords (wiring and trainer fields mixed)."""
    job = {k: v for k, v in fields.items() if k in _JOB_FIELDS}
    return TrainerJob(**job, trainer=TrainerConfig(**{k: v for k, v in fields.items() if k not in _JOB_FIELDS}))


def trainer_job(model_dir: Path, ring_name: str, run_dir: Path, **fields: Any) -> TrainerJob:
    """``make_job`` with what the tests' trainers share unless ``fields`` say otherwise: no engine,
    2 steps of one group, lr 1e-3 at TEMPERATURE, records within 30 s (``report_addr`` a
    placeholder: ``Trainers.start`` sets its own)."""
    base = dict(engine_urls=[], report_addr="tcp://127.0.0.1:1", steps=2, groups_per_step=1, lr=1e-3, temperature=TEMPERATURE)
    return make_job(model_path=str(model_dir), ring_name=ring_name, run_dir=str(run_dir), **{**base, "record_timeout_s": 30, **fields})


def make_model(path: Path, with_tokenizer: bool) -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 of VOCAB tokens (seeded: the same weights every time), saved at ``path``."""
    model = tiny_qwen2(vocab_size=VOCAB)
    model.save_pretrained(path)
    if with_tokenizer:
        from tokenizers import Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1").save_pretrained(path)
    return model


@torch.no_grad()
def behaviour_logprobs(model: torch.nn.Module, ids: list[int], temperature: float = TEMPERATURE) -> np.ndarray:
    """Per-token logprob of ids[t] given ids[:t] at ``temperature``, one row at a time (no
    packing); 0 at t = 0."""
    x = torch.tensor([ids])
    logp = torch.log_softmax(model(x).logits[0].float() / temperature, dim=-1)  # (T, V)
    out = np.zeros(len(ids), np.float32)
    out[1:] = logp[:-1].gather(-1, x[0, 1:, None]).squeeze(-1).numpy()
    return out


def make_traj(model, group: str, idx: int, size: int, prompt: list[int], completions: list[list[int]], version: int = 0) -> Trajectory:
    rows = []
    for comp in completions:
        ids = prompt + comp
        mask = np.array([0] * len(prompt) + [1] * len(comp), np.uint8)
        lp = behaviour_logprobs(model, ids) * mask
        ver = np.where(mask == 1, version, -1).astype(np.int32)
        rows.append(TokenRow(np.array(ids, np.int32), mask, lp, ver, 0.0))
    sampled = [t for c in completions for t in c]
    reward = sum(t == REWARDED for t in sampled) / len(sampled)
    return Trajectory.from_rows(episode_id=f"{group}-{idx}", group_id=group, group_size=size, reward=reward, status="ok", rows=rows)


def make_group(model, group: str, rng: np.random.Generator, size: int = 4) -> list[Trajectory]:
    """Half the samples say the rewarded token, half say other tokens; one episode has two rows."""
    prompt = rng.integers(10, VOCAB, size=int(rng.integers(3, 7))).tolist()
    trajs = []
    for i in range(size):
        good = i % 2 == 0
        comp = [REWARDED] * 3 + rng.integers(10, VOCAB, size=1).tolist() if good else rng.integers(10, VOCAB, size=4).tolist()
        comps = [comp, comp[:2]] if i == 1 else [comp]
        trajs.append(make_traj(model, group, i, size, prompt, comps))
    return trajs


def params(path: Path) -> dict[str, torch.Tensor]:
    """The parameters of the HF model saved at ``path``, by name."""
    return dict(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).named_parameters())


def assert_same_weights(a: Path, b: Path, atol: float = 1e-6, rtol: float = 1e-5, why: str = "") -> None:
    want = params(b)
    for name, p in params(a).items():
        torch.testing.assert_close(p, want[name], atol=atol, rtol=rtol, msg=f"{name} {why}".strip())


class Rings:
    """``count`` shared-memory rings named after ``tag`` (``names``), each with its writer; closed
    and unlinked on exit."""

    def __init__(self, tag: str, count: int = 1, capacity_bytes: int = 1 << 20) -> None:
        base = f"test-{tag}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.names = [f"{base}-{k}" for k in range(count)]
        self.writers = [RingWriter(n, capacity_bytes=capacity_bytes) for n in self.names]

    def put(self, ring: int, *groups: list[Trajectory]) -> None:
        for group in groups:
            for traj in group:
                self.writers[ring].put(encode_trajectory(traj))

    def close(self) -> None:
        for writer, name in zip(self.writers, self.names):
            writer.close()
            unlink_ring(name)

    def __enter__(self) -> Rings:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def torchrun(nproc: int) -> list[str]:
    """The argv of ``nproc`` trainer ranks under torchrun on this machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rdzv = ["--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    return [sys.executable, "-m", "torch.distributed.run", *rdzv, "-m", "areal.trainer"]


class Trainers:
    """Trainer subprocesses reporting to one PULL socket (``report_addr``); each is started in a
    session of its own, and every one still running on exit is SIGKILLed with its children."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self.report_addr = f"tcp://127.0.0.1:{self._pull.bind_to_random_port('tcp://127.0.0.1')}"

    def start(self, config: TrainerJob, *extra: str, cmd: list[str] = TRAINER, threads: int | None = None) -> subprocess.Popen:
        """``threads``: OMP_NUM_THREADS of each process (ranks sharing the cores: 1)."""
        config.report_addr = self.report_addr
        path = self.tmp_path / f"cfg-{uuid.uuid4().hex[:6]}.json"
        path.write_text(config.to_json())
        env = None if threads is None else {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.procs.append(subprocess.Popen([*cmd, "--config", str(path), *extra], cwd=ROOT, start_new_session=True, env=env))
        return self.procs[-1]

    def run(self, config: TrainerJob, cmd: list[str] = TRAINER, timeout_s: float = 240, threads: int | None = None) -> tuple[int, list]:
        """Start one trainer (or torchrun of ranks) and collect its messages until it exits: (rc, msgs)."""
        return self.collect(self.start(config, cmd=cmd, threads=threads), timeout_s)

    def collect(self, proc: subprocess.Popen, timeout_s: float = 240) -> tuple[int, list]:
        """The messages of ``proc`` (started here) until it exits: (rc, msgs)."""
        decoder = msgspec.msgpack.Decoder(TrainerMessage)
        msgs = []
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            assert time.monotonic() < deadline, f"the trainer still runs after {timeout_s}s; got {msgs}"
            if self._pull.poll(100):
                msgs.append(decoder.decode(self._pull.recv()))
        while self._pull.poll(100):  # what it sent just before it exited
            msgs.append(decoder.decode(self._pull.recv()))
        return proc.returncode, msgs

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        for proc in self.procs:
            self.kill(proc)
        self._pull.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> Trainers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_trainer(
    config: TrainerJob, tmp_path: Path, cmd: list[str] = TRAINER, timeout_s: float = 240, threads: int | None = None
) -> tuple[int, list]:
    """One trainer run to its end: (returncode, the messages it reported)."""
    with Trainers(tmp_path) as trainers:
        return trainers.run(config, cmd, timeout_s, threads)


def run_ranks(nproc: int, config: TrainerJob, tmp_path: Path) -> list:
    """``nproc`` trainer ranks under torchrun, one thread each, to a clean end: their messages."""
    rc, msgs = run_trainer(config, tmp_path, cmd=torchrun(nproc), threads=1)
    assert rc == 0, msgs[-1:]
    return msgs
