"""``cluster.kind=ray``: a real run whose trainer is placed on the third node of a 3-node Ray cluster.

Ray's own multi-node test cluster (``ray.cluster_utils.Cluster``: a GCS and one raylet per node, on
this machine) with a custom resource ``trainer`` on the third node only. The controller (a separate
``python -m areal.train`` process, a Ray driver on the head node) places the trainer there by a
placement group; trajectories reach the trainer's ring over the ZeroMQ TCP hop
(``areal/ring/remote.py``) and its reports come back over tcp://. The checks are the single-host
end-to-end test's: the tokens the engine sampled are the tokens trained, versions advance 1..3, and
every published episode is trained exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from areal.trajectories import read_saved_trajectories  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def three_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, resources={"rollout": 1})
        trainer_node = cluster.add_node(num_cpus=1, resources={"trainer": 1})
        cluster.wait_for_nodes()
        yield cluster, trainer_node.node_id
    finally:
        cluster.shutdown()


def test_trainer_on_the_third_node_trains_every_published_episode_once(tmp_path, three_nodes):
    cluster, trainer_node_id = three_nodes
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "areal.train",
        f"hydra.run.dir={run_dir}",
        "model.path=scripted",
        "rollout.openai.mode=inline",
        "trainer.steps=3",
        "rollout.groups_per_step=2",
        "rollout.n_samples=4",
        "rollout.max_head_offpolicyness=0",
        "data.eval_size=0",
        "save_trajectories=true",
        "engine.request_log=true",
        "cluster.kind=ray",
        f"cluster.address={cluster.address}",
        "++cluster.trainer_resources={CPU:1,trainer:1}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert f"[cluster] trainer placed on Ray node {trainer_node_id}" in proc.stdout + proc.stderr

    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert [m["version"] for m in steps] == [1, 2, 3]
    assert all(np.isfinite(m["loss"]) for m in steps)

    # Every token trained is a token the engine sampled, with its logprob and weight version.
    served: dict[tuple, list[dict]] = {}
    for line in (run_dir / "engine_requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        served.setdefault(tuple(r["input_ids"]), []).append(r)
    published = read_saved_trajectories(run_dir / "trajectories.bin")
    seen_versions, recorded_tokens = set(), 0
    for traj in published:
        for row in traj.rows():
            mask = row.loss_mask.astype(bool)
            n_prompt = int((~mask).sum())
            prompt, sampled = row.input_ids[:n_prompt].tolist(), row.input_ids[mask].tolist()
            matches = [r for r in served[tuple(prompt)] if r["output_ids"] == sampled]
            assert matches, "trajectory tokens that the engine never generated"
            rec = min(matches, key=lambda r: np.abs(np.array(r["output_logprobs"]) - row.logprobs[mask]).max())
            assert row.logprobs[mask].tolist() == pytest.approx(rec["output_logprobs"], abs=1e-6)
            version = int(rec["weight_version"]) if rec["weight_version"].isdigit() else 0
            assert set(row.versions[mask].tolist()) == {version}
            seen_versions.add(version)
            recorded_tokens += int(mask.sum())  # sampled tokens: what the trainer's loss counts
    assert seen_versions == {0, 1, 2}  # bound 0: step k trains on episodes of version k-1

    # Exactly once across the hop: each published episode trained once, nothing trained twice or
    # unpublished, and the trainer's loss covered every sampled token the controller published.
    trained = [json.loads(line) for line in (run_dir / "trained_episodes-r0.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trained] == [1, 2, 3]
    counts = Counter(e for t in trained for e in t["episodes"])
    assert max(counts.values()) == 1
    assert set(counts) == {t.episode_id for t in published}
    trainer_steps = [json.loads(line) for line in (run_dir / "trainer_metrics.jsonl").read_text().splitlines()]
    assert sum(m["tokens"] for m in trainer_steps) == recorded_tokens
    assert (run_dir / "final" / "config.json").is_file()


def test_a_trainer_no_node_can_hold_fails_the_run_naming_the_resources(tmp_path, three_nodes):
    cluster, _ = three_nodes
    cmd = [
        sys.executable,
        "-m",
        "areal.train",
        f"hydra.run.dir={tmp_path / 'run'}",
        "model.path=scripted",
        "rollout.openai.mode=inline",
        "trainer.steps=1",
        "data.eval_size=0",
        "cluster.kind=ray",
        f"cluster.address={cluster.address}",
        "++cluster.trainer_resources={CPU:1,gpu_node:1}",
        "cluster.placement_timeout_s=3",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "cluster.trainer_resources={'CPU': 1.0, 'gpu_node': 1.0}: no node of the Ray cluster had them free" in proc.stderr


def test_cluster_config_refuses_ray_client_and_unknown_kinds():
    from areal.cluster.config import ClusterConfig

    with pytest.raises(ValueError, match="cluster.kind"):
        ClusterConfig(kind="slurm")
    with pytest.raises(ValueError, match="Ray Client"):
        ClusterConfig(kind="ray", address="ray://head:10001")
    with pytest.raises(ValueError, match="trainer_resources"):
        ClusterConfig(kind="ray", trainer_resources={"GPU": 0})
