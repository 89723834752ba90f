"""``cluster.kind=ray``: a real run whose trainer is placed on the third node of a 3-node Ray cluster.

Ray's own multi-node test cluster (``ray.cluster_utils.Cluster``: a GCS and one raylet per node, on
this machine) with a custom resource ``trainer`` on the third node only. The controller (a separate
``python -m areal.train`` process, a Ray driver on the head node) places the trainer there by a
placement group; trajectories reach the trainer's ring over the ZeroMQ TCP hop
(``areal/ring/remote.py``) and its reports come back over tcp://. The checks are the single-host
end-to-end test's: the tokens the engine sampled are the tokens trained, versions advance 1..3, and
every published episode is trained exactly once.

The trainer's ranks split over two nodes (``cluster.trainer_nodes=2``): a custom resource
``trainer_pool`` on the second and third nodes, one rank on each, joined by torchrun's
rendezvous on the first of them and gloo over TCP between the nodes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from run_checks import check_trained_as_sampled, ray_placement_failure, ray_run, read_jsonl, run_ok  # noqa: E402


@pytest.fixture(scope="module")
def three_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, resources={"rollout": 1, "trainer_pool": 1})
        trainer_node = cluster.add_node(num_cpus=1, resources={"trainer": 1, "trainer_pool": 1})
        cluster.wait_for_nodes()
        yield cluster, trainer_node.node_id
    finally:
        cluster.shutdown()


@pytest.mark.e2e
def test_trainer_on_the_third_node_trains_every_published_episode_once(tmp_path, three_nodes):
    cluster, trainer_node_id = three_nodes
    run_dir = tmp_path / "run"
    cmd = ray_run(run_dir, cluster.address, "inline", "++cluster.trainer_resources={CPU:1,trainer:1}")
    proc = run_ok(cmd, timeout_s=170)
    assert f"[cluster] trainer placed on Ray node {trainer_node_id}" in proc.stdout + proc.stderr

    check_trained_as_sampled(run_dir)


@pytest.mark.e2e
def test_a_trainer_no_node_can_hold_fails_the_run_naming_the_resources(tmp_path, three_nodes):
    cluster, _ = three_nodes
    stderr = ray_placement_failure(tmp_path / "run", cluster.address, "++cluster.trainer_resources={CPU:1,gpu_node:1}")
    assert "cluster.trainer_resources={'CPU': 1.0, 'gpu_node': 1.0}: no node of the Ray cluster had them free" in stderr


def test_cluster_config_refuses_ray_client_and_unknown_kinds():
    from areal.cluster.config import ClusterConfig

    with pytest.raises(ValueError, match="cluster.kind"):
        ClusterConfig(kind="slurm")
    with pytest.raises(ValueError, match="Ray Client"):
        ClusterConfig(kind="ray", address="ray://head:10001")
    with pytest.raises(ValueError, match="trainer_resources"):
        ClusterConfig(kind="ray", trainer_resources={"GPU": 0})


@pytest.mark.e2e
def test_two_trainer_nodes_run_one_rank_each_and_train_every_published_episode_once(tmp_path, three_nodes):
    cluster, _ = three_nodes
    run_dir = tmp_path / "run"
    cmd = ray_run(
        run_dir,
        cluster.address,
        "inline",
        "trainer.ranks=2",
        "cluster.trainer_nodes=2",
        "++cluster.trainer_resources={CPU:1,trainer_pool:1}",
    )
    proc = run_ok(cmd, timeout_s=300)

    # One host per node, each with its rank, on two distinct nodes that have the resource (not the head).
    placed = re.findall(r"\[cluster\] trainer placed on Ray node (\w+) \([^)]*\): ranks (\d+)-(\d+)", proc.stdout + proc.stderr)
    assert [(lo, hi) for _, lo, hi in placed] == [("0", "0"), ("1", "1")], placed
    nodes = {node for node, _, _ in placed}
    assert len(nodes) == 2 and cluster.head_node.node_id not in nodes
    assert (run_dir / "trainer_config-node1.json").is_file() and (run_dir / "trainer-node1.log").is_file()  # node 1's torchrun

    check_trained_as_sampled(run_dir, ranks=2)  # both ranks trained every step; every episode once
    trainer_steps = read_jsonl(run_dir / "trainer_metrics.jsonl")
    # The max over both ranks: rank 1's weights (node 1) are the engine's too, every step.
    assert all(m["logprob_max_diff"] < 1e-3 for m in trainer_steps), [m.get("logprob_max_diff") for m in trainer_steps]


@pytest.mark.e2e
def test_a_trainer_node_whose_torchrun_dies_fails_the_trainer_naming_that_node(tmp_path, three_nodes):
    """The placement of a 2-node trainer, driven directly: node 1's torchrun stopped (SIGTERM to the
    pid the placement returned; torchrun ends its ranks) while both ranks wait on their rings."""
    import os
    import signal
    import time

    import zmq

    from areal.cluster.config import ClusterConfig
    from areal.cluster.ray_trainer import RayTrainerPlacement
    from areal.trainer.config import TrainerConfig, TrainerJob
    from areal.utils.hf_utils import resolve_model_path

    cluster, _ = three_nodes
    config = ClusterConfig(kind="ray", address=cluster.address, trainer_nodes=2, trainer_resources={"CPU": 1, "trainer_pool": 1})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    pull = zmq.Context.instance().socket(zmq.PULL)
    placement = None
    try:
        placement = RayTrainerPlacement.place(config, f"t{os.getpid()}", 2, 1 << 20)
        assert len({node for node, _ in placement.nodes}) == 2
        names = [r.name for r in placement.rings]
        job = TrainerJob(
            model_path=resolve_model_path("scripted"),
            ring_name=names[0],
            ring_names=names,
            engine_urls=[],
            report_addr=placement.bind_report(pull),
            run_dir=str(tmp_path),
            groups_per_step=2,
            trainer=TrainerConfig(ranks=2, steps=1, record_timeout_s=120.0),
        )
        trainer = placement.start_trainer(job, tmp_path)
        time.sleep(3)
        assert trainer.poll() is None  # both nodes' ranks wait for trajectories
        os.kill(trainer.pids[1], signal.SIGTERM)  # node 1's torchrun (this machine in the test cluster)
        deadline = time.monotonic() + 30
        while trainer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert trainer.returncode not in (None, 0)
        node_id, ip = placement.nodes[1]
        expected = f"trainer node 1 (Ray node {node_id}, {ip}; log trainer-node1.log) exited with code {trainer.returncode}"
        assert trainer.error == expected
        assert trainer.log_name == "trainer-node1.log"  # the log the run's failure shows the tail of
    finally:
        if placement is not None:
            placement.close()  # stops node 0's trainer, still waiting for its peer
        pull.close(0)
        ray.shutdown()


@pytest.mark.e2e
def test_more_trainer_nodes_than_the_cluster_has_fails_the_run_naming_the_resources(tmp_path, three_nodes):
    cluster, _ = three_nodes
    nodes = ("trainer.ranks=3", "cluster.trainer_nodes=3", "++cluster.trainer_resources={CPU:1,trainer_pool:1}")
    stderr = ray_placement_failure(tmp_path / "run", cluster.address, *nodes)
    expected = "cluster.trainer_resources={'CPU': 1.0, 'trainer_pool': 1.0}: fewer than cluster.trainer_nodes=3 distinct nodes"
    assert expected in stderr, stderr[-3000:]


def test_trainer_ranks_must_split_evenly_over_the_trainer_nodes():
    from areal.cluster.config import ClusterConfig
    from areal.config import TrainConfig
    from areal.trainer.config import TrainerConfig

    with pytest.raises(ValueError, match=r"trainer.ranks=3 cannot be split evenly over cluster.trainer_nodes=2"):
        TrainConfig(trainer=TrainerConfig(ranks=3), cluster=ClusterConfig(kind="ray", trainer_nodes=2))
    with pytest.raises(ValueError, match="trainer.gpus"):  # GPU ids of one host cannot serve two
        TrainConfig(trainer=TrainerConfig(ranks=2, gpus=[0, 1]), cluster=ClusterConfig(kind="ray", trainer_nodes=2))
    with pytest.raises(ValueError, match="needs cluster.kind=ray"):
        ClusterConfig(trainer_nodes=2)
    with pytest.raises(ValueError, match="cluster.trainer_nodes must be an integer >= 1"):
        ClusterConfig(kind="ray", trainer_nodes=0)
    assert TrainConfig(trainer=TrainerConfig(ranks=4), cluster=ClusterConfig(kind="ray", trainer_nodes=2)).cluster.trainer_nodes == 2


@pytest.mark.e2e
def test_trainer_command_joins_node_zero_on_several_nodes_and_keeps_the_one_host_command():
    from areal.trainer.launch import Rendezvous, trainer_command

    one = trainer_command(Path("job.json"), 1)
    assert one == [sys.executable, "-m", "areal.trainer", "--config", "job.json"]
    two = trainer_command(Path("job.json"), 2)
    assert two[two.index("--master-addr") + 1] == "127.0.0.1" and "--nnodes" not in two
    node1 = trainer_command(Path("job.json"), 2, Rendezvous("10.0.0.1", 29400, nnodes=2, node_rank=1, node_addr="10.0.0.2"))
    flags = dict(zip(node1[3:13:2], node1[4:14:2]))
    assert flags == {"--nnodes": "2", "--node-rank": "1", "--nproc-per-node": "2", "--master-addr": "10.0.0.1", "--master-port": "29400"}
    assert node1[:3] == [sys.executable, "-m", "torch.distributed.run"] and node1[-4:] == ["-m", "areal.trainer", "--config", "job.json"]
