"""Two trainer ranks launched by torchrun, each reading its own real ring, end with the same
weights as one rank trained on all the groups, step for step: DDP over gloo (weights replicated)
and FSDP2 over gloo (weights sharded per decoder layer, gathered to rank 0 to publish and to
checkpoint, and resumed from that checkpoint). The one-rank reference run is shared."""

import dataclasses
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
import pytest
import torch
import zmq
from test_trainer import TEMPERATURE, make_group, make_model
from trainer_jobs import make_job
from transformers import AutoModelForCausalLM

from areal.protocol import TrainerDone, TrainerMessage, TrainerReport, encode_trajectory
from areal.ring.buffer import RingWriter, unlink_ring
from areal.trainer.config import TrainerJob

ROOT = Path(__file__).resolve().parents[1]
# Rank 1 gets the longer rows of one group: unequal micro-batch counts must still sync.
BASE = dict(
    engine_urls=[],
    report_addr="tcp://127.0.0.1:1",
    steps=2,
    groups_per_step=2,
    lr=1e-3,
    temperature=TEMPERATURE,
    record_timeout_s=60,
    micro_batch_tokens=16,
    loss="ppo",
    behav_weight_cap=5.0,
)

# Weights after 2 AdamW steps of lr 1e-3 (updates ~1e-3 per element). Summing the gradient over
# ranks in another order changes it in the last float bits, and where an element's gradient is
# near zero Adam's m/sqrt(v) turns that into a visible difference (seen: 1.4e-6 on 1 of 8,192
# elements). 1e-5 is 1 % of one update: a rank that skipped or double-counted data is far off.
UPDATE_ATOL = 1e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "areal.trainer",
    ]


def run(cmd: list[str], config: TrainerJob, tmp_path: Path) -> list:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    config.report_addr = f"tcp://127.0.0.1:{pull.bind_to_random_port('tcp://127.0.0.1')}"
    path = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}.json"
    path.write_text(config.to_json())
    proc = subprocess.Popen(cmd + ["--config", str(path)], cwd=ROOT, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
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


@dataclasses.dataclass
class Reference:
    model_dir: Path
    start: dict[str, torch.Tensor]  # the initial parameters
    groups: list  # 4 groups of 2 trajectories: 2 steps x 2 groups
    run_dir: Path
    reports: list[TrainerReport]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Reference:
    """One unsharded rank trained on all four groups (2 steps), from one ring."""
    tmp = tmp_path_factory.mktemp("one")
    model_dir = tmp / "model"
    model = make_model(model_dir, with_tokenizer=False)
    rng = np.random.default_rng(11)
    groups = [make_group(model, f"g{i}", rng, size=2) for i in range(4)]
    name = f"test-ranks-{os.getpid()}-{uuid.uuid4().hex[:6]}-single"
    writer = RingWriter(name, capacity_bytes=1 << 20)
    try:
        for g in groups:
            for t in g:
                writer.put(encode_trajectory(t))
        one = make_job(model_path=str(model_dir), ring_name=name, run_dir=str(tmp / "run"), **BASE)
        msgs = run([sys.executable, "-m", "areal.trainer"], one, tmp)
    finally:
        writer.close()
        unlink_ring(name)
    reports = [m for m in msgs if isinstance(m, TrainerReport)]
    assert [r.consumed for r in reports] == [4, 8]
    return Reference(model_dir, {n: p.detach().clone() for n, p in model.named_parameters()}, groups, tmp / "run", reports)


class TwoRings:
    """Rings r0 and r1 holding the reference's groups split over two ranks (group i to rank i % 2)."""

    def __init__(self, ref: Reference) -> None:
        tag = f"test-ranks-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.names = [f"{tag}-r0", f"{tag}-r1"]
        self.writers = [RingWriter(n, capacity_bytes=1 << 20) for n in self.names]
        for i, g in enumerate(ref.groups):
            for t in g:
                self.writers[i % 2].put(encode_trajectory(t))

    def close(self) -> None:
        for w, n in zip(self.writers, self.names):
            w.close()
            unlink_ring(n)


def params(path: Path) -> dict[str, torch.Tensor]:
    return dict(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).named_parameters())


def assert_reports_match(ref: Reference, reports: list[TrainerReport], keys: tuple[str, ...]) -> None:
    assert [r.step for r in reports] == [1, 2]  # rank 0 alone reports
    assert [r.consumed for r in reports] == [r.consumed for r in ref.reports]
    for a, b in zip(ref.reports, reports):
        for key in keys:
            if key == "logprob_max_diff":  # tokens of the current version, or only older ones
                key = key if key in a.metrics else "logprob_max_diff_stale"
            assert abs(a.metrics[key] - b.metrics[key]) <= 1e-5 * max(1.0, abs(a.metrics[key])), (key, a.metrics, b.metrics)


@pytest.mark.e2e
def test_two_gloo_ranks_match_one_rank(reference, tmp_path):
    rings = TwoRings(reference)
    try:
        two = make_job(
            model_path=str(reference.model_dir), ring_name=rings.names[0], ring_names=rings.names, run_dir=str(tmp_path / "two"), **BASE
        )
        msgs2 = run(torchrun(2), two, tmp_path)
    finally:
        rings.close()
    reports2 = [m for m in msgs2 if isinstance(m, TrainerReport)]
    assert isinstance(msgs2[-1], TrainerDone)
    assert_reports_match(reference, reports2, ("tokens", "trajectories", "reward_mean", "loss", "grad_norm", "logprob_max_diff"))
    one_final = params(reference.run_dir / "final")
    changed = 0
    for name, p in params(tmp_path / "two" / "final").items():
        torch.testing.assert_close(p, one_final[name], atol=UPDATE_ATOL, rtol=1e-5, msg=name)
        changed += not torch.equal(p, reference.start[name])
    assert changed == len(one_final)
    logs = [json.loads(x) for r in (0, 1) for x in (tmp_path / "two" / f"trained_episodes-r{r}.jsonl").read_text().splitlines()]
    assert sorted(e for line in logs for e in line["episodes"]) == sorted(t.episode_id for g in reference.groups for t in g)


@pytest.mark.e2e
def test_two_fsdp2_gloo_ranks_match_one_rank_and_resume_from_a_sharded_checkpoint(reference, tmp_path):
    """FSDP2: after every step the weights rank 0 gathers and publishes equal the unsharded rank's.
    The sharded run stops after step 1 with a checkpoint (model and AdamW state gathered to full
    tensors) and a second launch resumes from it: step 2 then matches as well, which it could not
    if the optimizer moments were lost or given to the wrong shards."""
    rings = TwoRings(reference)
    try:
        first = make_job(
            model_path=str(reference.model_dir),
            ring_name=rings.names[0],
            ring_names=rings.names,
            run_dir=str(tmp_path / "fsdp"),
            checkpoint_every=1,
            parallel="fsdp2",
            **{**BASE, "steps": 1},
        )
        msgs_a = run(torchrun(2), first, tmp_path)
        assert (tmp_path / "fsdp" / "checkpoints" / "step-00000001" / "state" / ".metadata").exists()  # torch.distributed.checkpoint
        msgs_b = run(torchrun(2), dataclasses.replace(first, trainer=dataclasses.replace(first.trainer, steps=2, resume=True)), tmp_path)
    finally:
        rings.close()
    assert isinstance(msgs_b[-1], TrainerDone)
    reports = [m for m in msgs_a + msgs_b if isinstance(m, TrainerReport)]
    assert_reports_match(reference, reports, ("tokens", "trajectories", "loss", "grad_norm", "clip_frac", "logprob_max_diff"))
    for step in (1, 2):
        want = params(reference.run_dir / "weights" / f"v{step}")
        got = params(tmp_path / "fsdp" / "weights" / f"v{step}")  # gathered to rank 0 and published
        assert set(got) == set(want)
        for name, p in got.items():
            torch.testing.assert_close(p, want[name], atol=UPDATE_ATOL, rtol=1e-5, msg=f"v{step} {name}")
            assert not torch.equal(p, reference.start[name]), f"v{step} {name} did not change"
    final = params(tmp_path / "fsdp" / "final")
    for name, p in params(tmp_path / "fsdp" / "weights" / "v2").items():
        assert torch.equal(final[name], p), name
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = tmp_path / "ckpt-2.pt"  # the shards of both ranks, put together
    dcp_to_torch_save(tmp_path / "fsdp" / "checkpoints" / "step-00000002" / "state", whole)
    ckpt = torch.load(whole, weights_only=True)["model"]
    for name, p in final.items():  # full tensors under the HF names
        assert torch.equal(ckpt[name], p), name


@pytest.mark.e2e
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FSDP2 over NCCL needs CUDA GPUs (none here)")
def test_fsdp2_nccl_on_gpus_matches_one_cpu_rank(reference, tmp_path):
    """The GPU path: FSDP2 over NCCL with one rank per GPU (1 or 2), weights published from rank 0."""
    ranks = min(2, torch.cuda.device_count())
    rings = TwoRings(reference) if ranks == 2 else None
    single = f"test-ranks-{os.getpid()}-{uuid.uuid4().hex[:6]}-gpu"
    writer = None
    try:
        if rings is None:
            writer = RingWriter(single, capacity_bytes=1 << 20)
            for g in reference.groups:
                for t in g:
                    writer.put(encode_trajectory(t))
        names = rings.names if rings else [single]
        cfg = make_job(
            model_path=str(reference.model_dir),
            ring_name=names[0],
            ring_names=names,
            run_dir=str(tmp_path / "gpu"),
            parallel="fsdp2",
            **BASE,
        )
        msgs = run(torchrun(ranks), cfg, tmp_path)
    finally:
        if rings is not None:
            rings.close()
        if writer is not None:
            writer.close()
            unlink_ring(single)
    assert isinstance(msgs[-1], TrainerDone)
    want = params(reference.run_dir / "final")
    for name, p in params(tmp_path / "gpu" / "final").items():
        torch.testing.assert_close(p, want[name], atol=1e-4, rtol=1e-3, msg=name)
