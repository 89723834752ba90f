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

import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from run_checks import check_trained_as_sampled, three_step_run  # noqa: E402

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
    cmd = three_step_run(
        run_dir,
        "model.path=scripted",
        "rollout.openai.mode=inline",
        "rollout.n_samples=4",
        "cluster.kind=ray",
        f"cluster.address={cluster.address}",
        "++cluster.trainer_resources={CPU:1,trainer:1}",
    )
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert f"[cluster] trainer placed on Ray node {trainer_node_id}" in proc.stdout + proc.stderr

    check_trained_as_sampled(run_dir)


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
