"""``cluster.engine_resources``: the run's engine server placed on a Ray node by its resources.

Ray's own multi-node test cluster (``ray.cluster_utils.Cluster``) on this machine: a head node,
and a second node that alone carries the custom resource ``engine``. The controller (``python -m
areal.train``, a Ray driver on the head) places its one embedded engine there
(areal/cluster/ray_engines.py): an ``EngineHost`` actor runs the local run's launcher on that
node, and the server listens on the node's address. The run's checks are the single-host
end-to-end test's (tests/support/run_checks.py): the tokens the engine on the other node sampled are the
tokens trained, versions advance 1..3 (weights pushed to that node's URL), every published episode
trained exactly once. Then a server's death, restart and its actor's loss through the placement
itself, and the refusals.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from run_checks import check_trained_as_sampled, ray_placement_failure, ray_run, ray_torn_down, started_in_repo  # noqa: E402

from areal.cluster.config import ClusterConfig  # noqa: E402
from areal.engine.config import EngineConfig  # noqa: E402

ENGINE_RESOURCES = "++cluster.engine_resources={CPU:1,engine:1}"
PLACED = re.compile(r"\[cluster\] engine 0 on Ray node (\w+) \(([^)]*)\) at (\S+) \(pid (\d+), a child of EngineHost actor pid (\d+)\)")


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        engine_node = cluster.add_node(num_cpus=1, resources={"engine": 1})
        cluster.wait_for_nodes()
        yield cluster, engine_node
    finally:
        cluster.shutdown()


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("PPid:")))


@pytest.mark.e2e
def test_the_engine_runs_on_the_engine_node_and_serves_what_is_trained(tmp_path, two_nodes):
    cluster, engine_node = two_nodes
    run_dir, log_path = tmp_path / "run", tmp_path / "controller.log"
    cmd = ray_run(run_dir, cluster.address, "inline", ENGINE_RESOURCES)
    with started_in_repo(cmd, log_path) as proc:
        # While it runs: the server is a child of the EngineHost actor, a Ray worker process.
        deadline, placed = time.monotonic() + 120, None
        while placed is None and proc.poll() is None and time.monotonic() < deadline:
            placed = PLACED.search(log_path.read_text())
            time.sleep(0.05)
        assert placed is not None, log_path.read_text()[-4000:]
        engine_pid, actor_pid = int(placed[4]), int(placed[5])
        assert _ppid(engine_pid) == actor_pid
        with open(f"/proc/{actor_pid}/cmdline", "rb") as f:
            assert b"EngineHost" in f.read()  # Ray names an actor's process after its class
        rc = proc.wait(timeout=170)
    out = log_path.read_text()
    assert rc == 0, out[-6000:]
    node_id, ip, url = placed[1], placed[2], placed[3]
    assert node_id == engine_node.node_id != cluster.head_node.node_id
    assert ip == engine_node.node_ip_address and url.startswith(f"http://{ip}:") and "127.0.0.1" not in url

    check_trained_as_sampled(run_dir)  # the engine's request log (written on its node) ≡ what was trained
    groups, free, total = ray_torn_down(cluster.address)
    assert groups and all(g["state"] == "REMOVED" for g in groups.values()), groups
    assert free == total


@pytest.mark.e2e
def test_engine_resources_no_node_has_fail_the_run_naming_them(tmp_path, two_nodes):
    cluster, _ = two_nodes
    stderr = ray_placement_failure(tmp_path / "run", cluster.address, "++cluster.engine_resources={CPU:1,gpu_node:1}")
    assert "cluster.engine_resources={'CPU': 1.0, 'gpu_node': 1.0} for 1 engine server(s): the Ray cluster had no room" in stderr
    assert "'engine': 1.0" in stderr  # the cluster's resources, to compare
    _, free, total = ray_torn_down(cluster.address)
    assert free == total


@pytest.mark.e2e
def test_a_dead_server_restarts_on_its_node_and_a_lost_actor_is_its_death(tmp_path, two_nodes):
    from areal.cluster.ray_engines import RayEnginePlacement
    from areal.engine.fleet import EngineFleet, death_of
    from areal.utils.hf_utils import resolve_model_path

    cluster, engine_node = two_nodes
    config = ClusterConfig(kind="ray", address=cluster.address, engine_resources={"CPU": 1, "engine": 1})
    model_dir = Path(resolve_model_path("scripted"))
    placement = RayEnginePlacement.place(config, "t", EngineConfig(), model_dir, tmp_path, 1)
    try:
        fleet = EngineFleet(placement.launch, 1, tmp_path, max_restarts=1)
        fleet.start()
        first = fleet.procs[0]
        assert first.url.startswith(f"http://{engine_node.node_ip_address}:") and death_of(first) is None
        os.kill(first.pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while (death := death_of(first)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        where = f"on Ray node {engine_node.node_id} ({engine_node.node_ip_address}) with cluster.engine_resources="
        assert death is not None and f"died (signal SIGKILL, {where}" in death, death

        # What supervise does: the same index relaunched on its port, by the same actor, on the same node.
        port = int(first.url.rsplit(":", 1)[1])
        second = placement.launch(0, port, tmp_path / "engine.log")
        assert second.url == first.url and second.pid != first.pid and death_of(second) is None

        ray.kill(placement.hosts[0])  # the actor (as its node's loss would): the server dies with it
        deadline = time.monotonic() + 20
        while (death := death_of(second)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert death is not None and f"its EngineHost actor or its node was lost, {where}" in death, death
        with pytest.raises(RuntimeError, match=f"the EngineHost actor of engine 0 on Ray node {engine_node.node_id}"):
            placement.launch(0, port, tmp_path / "engine.log")
        with pytest.raises(ProcessLookupError):  # die_with_parent: no orphan left on the node
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                os.kill(second.pid, 0)
                time.sleep(0.1)
    finally:
        placement.close()
    assert not ray.is_initialized()  # the placement started Ray in this process, so it shut it down
    _, free, total = ray_torn_down(cluster.address)
    assert free == total


def test_engine_resources_config_is_validated():
    from areal.config import TrainConfig
    from areal.engine.config import EngineLaunchConfig

    with pytest.raises(ValueError, match="cluster.engine_resources=.*needs cluster.kind=ray"):
        ClusterConfig(engine_resources={"GPU": 1})
    with pytest.raises(ValueError, match="cluster.engine_resources must name resources with amounts > 0"):
        ClusterConfig(kind="ray", engine_resources={"GPU": 0})
    placed = ClusterConfig(kind="ray", engine_resources={"GPU": 1})
    with pytest.raises(ValueError, match="the servers at engine.urls are not this run's"):
        TrainConfig(engine=EngineConfig(kind="sglang", urls=["http://10.0.0.5:30000"]), cluster=placed)
    with pytest.raises(ValueError, match="leave engine.launch.gpus empty"):
        launch = EngineLaunchConfig(command="python -m sglang.launch_server --host {host} --port {port}", gpus=[0])
        TrainConfig(engine=EngineConfig(kind="sglang", launch=launch), cluster=placed)
    with pytest.raises(ValueError, match="engine.launch.command needs --host"):
        launch = EngineLaunchConfig(command="python -m sglang.launch_server --port {port}")
        TrainConfig(engine=EngineConfig(kind="sglang", launch=launch), cluster=placed)
    assert TrainConfig(cluster=placed).cluster.engine_resources == {"GPU": 1}
    assert ClusterConfig().engine_resources == {}  # the default: engines on the controller's host
