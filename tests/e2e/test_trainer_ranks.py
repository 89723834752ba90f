"""Two trainer ranks launched by torchrun, each reading its own real ring, end with the same
weights as one rank trained on all the groups, step for step: DDP over gloo (weights replicated)
and FSDP2 over gloo (weights sharded per decoder layer, gathered to rank 0 to publish and to
checkpoint, and resumed from that checkpoint). The one-rank reference run is shared."""

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from trainer_harness import (
    RANK_JOB,
    UPDATE_ATOL,
    Rings,
    Trainers,
    make_group,
    make_model,
    params,
    run_ranks,
    run_trainer,
    torchrun,
    trainer_job,
)

from areal.protocol import TrainerDone, TrainerReport


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
    with Rings("ranks-single") as ring:
        ring.put(0, *groups)
        rc, msgs = run_trainer(trainer_job(model_dir, ring.names[0], tmp / "run", **RANK_JOB), tmp, threads=1)
    assert rc == 0, msgs[-1:]
    reports = [m for m in msgs if isinstance(m, TrainerReport)]
    assert [r.consumed for r in reports] == [4, 8]
    return Reference(model_dir, {n: p.detach().clone() for n, p in model.named_parameters()}, groups, tmp / "run", reports)


def two_rings(ref: Reference) -> Rings:
    """Rings r0 and r1 holding the reference's groups split over two ranks (group i to rank i % 2)."""
    rings = Rings("ranks", 2)
    for i, g in enumerate(ref.groups):
        rings.put(i % 2, g)
    return rings


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
    with two_rings(reference) as rings:
        two = trainer_job(reference.model_dir, rings.names[0], tmp_path / "two", ring_names=rings.names, **RANK_JOB)
        msgs2 = run_ranks(2, two, tmp_path)
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
def test_a_rank_waiting_longer_than_the_collective_timeout_for_its_peers_records_still_trains(reference, tmp_path):
    """Rank 1's records come long after rank 0 took its own (the controller evaluating, one
    group's episodes running long): rank 0 waits for them at the ranks' gate, which lasts while
    its ring's writer runs, not inside a collective bounded by trainer.collective_timeout_s. Before,
    rank 0 waited in the step's first all-reduce and failed once that timeout expired."""
    timeout_s = 5.0
    with Rings("late", 2) as rings, Trainers(tmp_path) as trainers:
        job = trainer_job(
            reference.model_dir,
            rings.names[0],
            tmp_path / "late",
            ring_names=rings.names,
            checkpoint_every=0,  # records committed as read: the ring shows what rank 0 took
            collective_timeout_s=timeout_s,
            **RANK_JOB,
        )
        rings.put(0, reference.groups[0])  # rank 0's records of step 1; none for rank 1 yet
        proc = trainers.start(job, cmd=torchrun(2), threads=1)
        deadline = time.monotonic() + 240
        while rings.writers[0].free_bytes() < rings.writers[0].capacity:  # until rank 0 has read them all
            assert proc.poll() is None and time.monotonic() < deadline, "rank 0 never took its records"
            time.sleep(0.05)
        time.sleep(3 * timeout_s)  # rank 0 holds its batch and waits for rank 1's past the collective timeout
        assert proc.poll() is None, "the trainer gave up while rank 1's records were still to come"
        rings.put(1, reference.groups[1], reference.groups[3])
        rings.put(0, reference.groups[2])
        rc, msgs = trainers.collect(proc)
    assert rc == 0 and isinstance(msgs[-1], TrainerDone), msgs[-1:]
    assert_reports_match(reference, [m for m in msgs if isinstance(m, TrainerReport)], ("tokens", "trajectories", "loss"))


@pytest.mark.e2e
def test_two_fsdp2_gloo_ranks_match_one_rank_and_resume_from_a_sharded_checkpoint(reference, tmp_path):
    """FSDP2: after every step the weights rank 0 gathers and publishes equal the unsharded rank's.
    The sharded run stops after step 1 with a checkpoint (model and AdamW state gathered to full
    tensors) and a second launch resumes from it: step 2 then matches as well, which it could not
    if the optimizer moments were lost or given to the wrong shards."""
    with two_rings(reference) as rings:
        base = {**RANK_JOB, "steps": 1, "ring_names": rings.names, "checkpoint_every": 1, "parallel": "fsdp2"}
        first = trainer_job(reference.model_dir, rings.names[0], tmp_path / "fsdp", **base)
        msgs_a = run_ranks(2, first, tmp_path)
        assert (tmp_path / "fsdp" / "checkpoints" / "step-00000001" / "state" / ".metadata").exists()  # torch.distributed.checkpoint
        msgs_b = run_ranks(2, dataclasses.replace(first, trainer=dataclasses.replace(first.trainer, steps=2, resume=True)), tmp_path)
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
    rings = two_rings(reference) if ranks == 2 else Rings("ranks-gpu")
    if ranks == 1:
        rings.put(0, *reference.groups)
    with rings:
        cfg = trainer_job(reference.model_dir, rings.names[0], tmp_path / "gpu", ring_names=rings.names, parallel="fsdp2", **RANK_JOB)
        msgs = run_ranks(ranks, cfg, tmp_path)
    assert isinstance(msgs[-1], TrainerDone)
    want = params(reference.run_dir / "final")
    for name, p in params(tmp_path / "gpu" / "final").items():
        torch.testing.assert_close(p, want[name], atol=1e-4, rtol=1e-3, msg=name)
