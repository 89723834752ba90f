"""End to end: `python -m areal.train` through sandbox, gateway, engine, ring and trainer.

The engine logs every generation it served (prompt ids, sampled ids, logprobs, weight version);
the controller saves every trajectory it put into the ring. The test joins the two: what the
trainer received must be exactly what the engine sampled.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from run_checks import read_jsonl, run_in_repo, sampled_as_served, three_step_run
from safetensors.torch import load_file

from areal.controller.audit import audit_run
from areal.controller.trajectories import read_saved_trajectories
from areal.embedded import ensure_embedded_model


def _train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = three_step_run(run_dir, "rollout.n_samples=8", *overrides)
    return run_in_repo(cmd, timeout_s=600)


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["subproc", "inline"])
def test_train_end_to_end(tmp_path, mode):
    model_dir = ensure_embedded_model()
    run_dir = tmp_path / "run"
    proc = _train(run_dir, f"rollout.openai.mode={mode}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    # Versions advance one per step, and the engine was told each one.
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert [m["version"] for m in steps] == [1, 2, 3]
    assert all(np.isfinite(m["loss"]) for m in steps)
    # fp32 CPU: the trainer's recomputed logprobs match the engine's on fresh tokens.
    assert steps[0]["logprob_max_diff"] < 1e-3

    # Every token the trainer got is a token the engine sampled, with the engine's logprob.
    trajectories = read_saved_trajectories(run_dir / "trajectories.bin")
    assert len(trajectories) >= 3 * 2  # at least one episode per group per step
    assert all(traj.status == "ok" for traj in trajectories)
    seen_versions, _ = sampled_as_served(run_dir, trajectories)
    # Synchronous mode (bound 0): step k trains on episodes sampled by version k-1.
    assert seen_versions == {0, 1, 2}
    # The audit the GPU proof reports (areal/controller/audit.py) finds nothing, and finds a token
    # the engine never served once the engine's log is altered.
    audit = audit_run(run_dir)
    assert audit["problems"] == [] and audit["episodes"] == len(trajectories) and audit["tokens_checked"] > 0
    log = run_dir / "engine_requests.jsonl"
    served = [json.loads(line) for line in log.read_text().splitlines()]
    for r in served:
        r["output_ids"][0] = -1  # no token id: +1 could turn one episode's tokens into a sibling's (same prompt)
    log.write_text("".join(json.dumps(r) + "\n" for r in served))
    assert sum("never served" in p for p in audit_run(run_dir)["problems"]) == len(trajectories)

    # The final model is an HF model whose weights all moved (a step moves weights only if some
    # group's rewards differ; with 8 samples per group a run without any such group is ~1e-7).
    assert any(m["adv_nonzero_frac"] > 0 for m in steps)
    final = Path(steps[-1].get("model_dir", run_dir / "final"))
    assert (final / "config.json").is_file() and (final / "tokenizer_config.json").is_file()
    before, after = load_file(model_dir / "model.safetensors"), load_file(final / "model.safetensors")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before), f"unchanged: {sorted(set(before) - set(changed))}"

    # The run directory has what a user looks at.
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    assert json.loads((run_dir / "config.json").read_text())["rollout"]["openai"]["mode"] == mode
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    assert all(e["status"] == "ok" for e in episodes), [e for e in episodes if e["status"] != "ok"][:2]


@pytest.mark.e2e
def test_bad_override_is_named(tmp_path):
    proc = _train(tmp_path / "run", "trainer.stpes=3")
    assert proc.returncode != 0
    assert "trainer.stpes" in proc.stderr


@pytest.mark.e2e
def test_two_trainer_ranks_with_ppo_and_checkpoints(tmp_path):
    """The main entry launches torchrun with one ring per rank; both ranks train every step."""
    run_dir = tmp_path / "run"
    proc = _train(
        run_dir,
        "rollout.openai.mode=inline",
        "trainer.ranks=2",
        "trainer.loss=ppo",
        "trainer.behav_weight_cap=5.0",
        "trainer.checkpoint_every=1",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["version"] for m in steps] == [1, 2, 3]
    for rank in (0, 1):  # each rank trained its half of every step's groups
        trained = read_jsonl(run_dir / f"trained_episodes-r{rank}.jsonl")
        assert sorted({t["step"] for t in trained}) == [1, 2, 3], trained[:2]
    assert any((run_dir / "checkpoints").iterdir())
