"""``cluster.rollout_workers``: sandboxed episodes on two Ray nodes, the trainer on a third, one real run.

Ray's own multi-node test cluster on this machine (``ray.cluster_utils.Cluster``): the head node and
a second node carry a custom resource ``rollout`` (one worker bundle each), a third carries
``trainer``. The controller (``python -m areal.train``, a Ray driver on the head node) places a
rollout worker on each ``rollout`` node (a zygote whose agents reach the controller's gateway over
TCP, areal/cluster/ray_rollout.py) and the trainer on the third. The checks are the single-host
end-to-end test's (tests/support/run_checks.py). Then a worker node is killed with episodes in flight on
it: the run finishes on the other worker, the lost episodes are in episodes.jsonl as crashed
infrastructure failures naming the worker, and their groups ran again and were trained.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from paths import ROOT

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from run_checks import check_trained_as_sampled, ray_run, ray_torn_down, read_jsonl, run_in_repo, started_in_repo  # noqa: E402

# A node that stops answering is declared dead within ~1.5 s, not Ray's default ~30 s.
FAST_HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 3}
SLOW_AGENT = """
import asyncio
from openai import AsyncOpenAI

async def run(data, **kw):
    await asyncio.sleep(1.0)  # a tool call: the kill lands with episodes in flight
    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["question"]}], max_tokens=8)
    return 1.0
"""


@contextlib.contextmanager
def _three_nodes() -> Iterator[tuple[Cluster, object, object]]:
    """(cluster, the second rollout node, the trainer node); the head is the other rollout node."""
    head = {"num_cpus": 1, "resources": {"rollout": 1}, "include_dashboard": False, "_system_config": FAST_HEALTH_CHECKS}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        rollout_node = cluster.add_node(num_cpus=1, resources={"rollout": 1})
        trainer_node = cluster.add_node(num_cpus=1, resources={"trainer": 1})
        cluster.wait_for_nodes()
        yield cluster, rollout_node, trainer_node
    finally:
        cluster.shutdown()


def _cmd(run_dir: Path, address: str, *extra: str) -> list[str]:
    return ray_run(
        run_dir,
        address,
        "subproc",
        "cluster.rollout_workers=2",
        "++cluster.worker_resources={CPU:1,rollout:1}",
        "++cluster.trainer_resources={CPU:1,trainer:1}",
        *extra,
    )


def _placed(out: str) -> dict[int, str]:
    """Worker index -> the Ray node the controller placed it on (from its log)."""
    return {int(i): node for i, node in re.findall(r"\[cluster\] rollout worker (\d+) on node (\w+) \([^)]*\)\n", out)}


@pytest.mark.e2e
@pytest.mark.parametrize("gateway", ["worker", "controller"])
def test_rollout_workers_on_two_nodes_feed_the_trainer_on_the_third(tmp_path, gateway):
    """Each worker's agents call the worker's own gateway (cluster.gateway=worker: the engines are
    called from the worker's node, the session record comes back per episode) or the controller's
    over TCP; either way every trained token is one the engine served, with its logprob and version."""
    run_dir = tmp_path / "run"
    with _three_nodes() as (cluster, rollout_node, trainer_node):
        # The run's own agent evaluation goes through the workers too (greedy: a temperature the session forces).
        evaluation = ["data.eval_mode=agent", "data.eval_size=3", "data.eval_samples=1"] if gateway == "worker" else []
        cmd = _cmd(run_dir, cluster.address, f"cluster.gateway={gateway}", *evaluation)
        proc = run_in_repo(cmd, timeout_s=170)
        head_id = cluster.head_node.node_id
        groups, free, total = ray_torn_down(cluster.address)  # torn down with the run: groups removed, resources free
    assert len(groups) == 2 and all(g["state"] == "REMOVED" for g in groups.values()), groups  # the trainer's and the workers'
    assert free == total
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert sorted(_placed(out).values()) == sorted([head_id, rollout_node.node_id])  # SPREAD: one per rollout node
    assert f"[cluster] trainer placed on Ray node {trainer_node.node_id}" in out
    own = "[cluster] each rollout worker's own gateway calls the engines at http://"
    assert (own in out, "[cluster] the gateway serves the rollout workers at tcp://" in out) == (
        gateway == "worker",
        gateway == "controller",
    )
    dispatched = re.search(r"\[cluster\] episodes per rollout worker: 0: (\d+), 1: (\d+)", out)
    assert dispatched and min(map(int, dispatched.groups())) > 0, out[-3000:]  # both workers ran episodes
    assert not (run_dir / "sandbox" / "zygote.log").exists()  # no episode on the controller's own host zygote
    assert all((run_dir / "sandbox" / f"worker-{i}" / "zygote.log").is_file() for i in (0, 1))

    check_trained_as_sampled(run_dir)
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    assert len(episodes) == 3 * 2 * 4 and all(e["status"] == "ok" for e in episodes), [e for e in episodes if e["status"] != "ok"][:2]
    if gateway == "worker":  # before and after training: 3 problems x (1 sampled + 1 greedy), each with its replies recorded
        evals = read_jsonl(run_dir / "eval_episodes.jsonl")
        assert len(evals) == 2 * 3 * 2, len(evals)
        assert all(e["status"] == "ok" and e["replies"] for e in evals), evals[:2]


@pytest.mark.e2e
def test_a_killed_worker_node_loses_only_its_inflight_episodes_and_their_groups_run_again(tmp_path):
    (tmp_path / "slow_agent.py").write_text(SLOW_AGENT)
    run_dir, log_path = tmp_path / "run", tmp_path / "controller.log"
    with _three_nodes() as (cluster, rollout_node, _):
        cmd = _cmd(run_dir, cluster.address, f"rollout.agent={tmp_path / 'slow_agent.py'}:run")
        with started_in_repo(cmd, log_path) as proc:
            # The worker on the second node (the head cannot be removed): once a step has trained and
            # that worker holds episodes (their logs are named after them until they end ok), kill the node.
            deadline, killed = time.monotonic() + 150, None
            while killed is None and proc.poll() is None and time.monotonic() < deadline:
                victim = next((i for i, n in _placed(log_path.read_text()).items() if n == rollout_node.node_id), None)
                metrics = run_dir / "metrics.jsonl"
                trained = metrics.exists() and metrics.read_text().count("\n") >= 1
                if victim is not None and trained and list((run_dir / "sandbox" / f"worker-{victim}").glob("*-g*-e*.log")):
                    cluster.remove_node(rollout_node, allow_graceful=False)
                    killed = victim
                time.sleep(0.05)
            assert killed is not None, log_path.read_text()[-3000:]
            rc = proc.wait(timeout=150)
    out = log_path.read_text()
    assert rc == 0, out[-6000:]
    worker = f"rollout worker {killed} on node {rollout_node.node_id}"
    assert out.count(f"[cluster] {worker} (") == 2, out[-3000:]  # placed, then lost (reported once)
    assert f"[cluster] {worker} ({rollout_node.node_ip_address}) was lost, 1 of 2 left" in out

    published = check_trained_as_sampled(run_dir)  # the lost episodes were never published
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    lost = [e for e in episodes if e["status"] != "ok"]
    assert lost, "the kill landed with no episode in flight"
    for e in lost:
        assert e["status"] == "crashed" and e["failure_class"] == "infrastructure", e
        assert e["error"].startswith(f"infrastructure failure, group re-admitted: {worker} "), e["error"]
    trained = {t.episode_id: t.group_id for t in published}
    for group in {e["group_id"] for e in lost}:  # each cut group ran again, and that run was trained
        assert any(g == group and "-retry" in eid for eid, g in trained.items()), (group, sorted(trained))
    assert not set(trained) & {e["episode_id"] for e in lost}


@pytest.mark.e2e
def test_a_lost_worker_is_replaced_on_a_node_that_joins_and_the_run_waits_for_it(tmp_path):
    """The run's only rollout worker's node is killed mid-run: with no worker left, the episodes wait
    for its replacement (not fail); a node with the worker resources joins, the replacement starts
    there in the lost worker's bundle, and the run finishes on it, every trained token checked."""
    (tmp_path / "slow_agent.py").write_text(SLOW_AGENT)
    run_dir, log_path = tmp_path / "run", tmp_path / "controller.log"
    head = {"num_cpus": 1, "include_dashboard": False, "_system_config": FAST_HEALTH_CHECKS}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        rollout_node = cluster.add_node(num_cpus=1, resources={"rollout": 1})
        cluster.add_node(num_cpus=1, resources={"trainer": 1})
        cluster.wait_for_nodes()
        cmd = _cmd(run_dir, cluster.address, f"rollout.agent={tmp_path / 'slow_agent.py'}:run")
        cmd[cmd.index("cluster.rollout_workers=2")] = "cluster.rollout_workers=1"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            deadline, new_node = time.monotonic() + 150, None
            while new_node is None and proc.poll() is None and time.monotonic() < deadline:
                metrics = run_dir / "metrics.jsonl"
                trained = metrics.exists() and metrics.read_text().count("\n") >= 1
                if trained and list((run_dir / "sandbox" / "worker-0").glob("*-g*-e*.log")):
                    cluster.remove_node(rollout_node, allow_graceful=False)
                    time.sleep(3)  # the episodes find no worker and wait
                    new_node = cluster.add_node(num_cpus=1, resources={"rollout": 1})
                time.sleep(0.05)
            assert new_node is not None, log_path.read_text()[-3000:]
            rc = proc.wait(timeout=150)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    finally:
        cluster.shutdown()
    out = log_path.read_text()
    assert rc == 0, out[-6000:]
    assert f"[cluster] rollout worker 0 on node {rollout_node.node_id} ({rollout_node.node_ip_address}) was lost, 0 of 1 left" in out
    assert _placed(out)[1] == new_node.node_id, out[-3000:]  # the replacement, on the node that joined
    assert "[cluster] rollout worker 1 replaces rollout worker 0, 1 of 2 live" in out
    dispatched = re.search(r"\[cluster\] episodes per rollout worker: 0: (\d+), 1: (\d+)", out)
    assert dispatched and int(dispatched.group(2)) > 0, out[-3000:]
    published = check_trained_as_sampled(run_dir)
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    lost = [e for e in episodes if e["status"] != "ok"]
    assert lost and all(e["failure_class"] == "infrastructure" for e in lost), lost
    trained = {t.episode_id for t in published}
    assert any("-retry" in eid for eid in trained) and not trained & {e["episode_id"] for e in lost}


def _zygote_of(log_dir: Path) -> int | None:
    """The pid of the zygote logging to ``log_dir`` (found in /proc by its command line; killed by pid)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"sandbox.zygote" in args and str(log_dir.resolve()).encode() in args:
            return int(cmdline.parent.name)
    return None


@pytest.mark.e2e
def test_a_worker_restarts_its_dead_zygote_and_the_cut_groups_run_again(tmp_path):
    (tmp_path / "slow_agent.py").write_text(SLOW_AGENT)
    run_dir = tmp_path / "run"
    with _three_nodes() as (cluster, _, _):
        cmd = _cmd(run_dir, cluster.address, f"rollout.agent={tmp_path / 'slow_agent.py'}:run")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            deadline, killed = time.monotonic() + 150, None
            log_dir = run_dir / "sandbox" / "worker-0"
            while killed is None and proc.poll() is None and time.monotonic() < deadline:
                metrics = run_dir / "metrics.jsonl"
                if metrics.exists() and metrics.read_text().count("\n") >= 1 and list(log_dir.glob("*-g*-e*.log")):
                    killed = _zygote_of(log_dir)
                    if killed is not None:
                        os.kill(killed, signal.SIGKILL)
                time.sleep(0.05)
            assert killed is not None
            out, _ = proc.communicate(timeout=150)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-6000:]
    assert "was lost" not in out  # the worker lives on with a new zygote
    check_trained_as_sampled(run_dir)
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    cut = [e for e in episodes if e["status"] != "ok"]
    assert cut and all(e["status"] == "crashed" and e["failure_class"] == "infrastructure" for e in cut), cut
    assert all(
        re.match(r"infrastructure failure, group re-admitted: rollout worker 0 on node \w+ \([^)]*\): its zygote died", e["error"])
        for e in cut
    )
    retried = {e["group_id"] for e in episodes if "-retry" in e["episode_id"] and e["status"] == "ok"}
    assert {e["group_id"] for e in cut} <= retried


def test_cluster_config_checks_the_rollout_worker_keys(monkeypatch):
    from areal.cluster.config import ClusterConfig
    from areal.cluster.ray_rollout import node_agent_spec
    from areal.config import RolloutConfig, TrainConfig

    with pytest.raises(ValueError, match="needs cluster.kind=ray"):
        ClusterConfig(rollout_workers=2)
    with pytest.raises(ValueError, match="cluster.rollout_workers must be >= 0"):
        ClusterConfig(kind="ray", rollout_workers=-1)
    with pytest.raises(ValueError, match="cluster.worker_resources"):
        ClusterConfig(kind="ray", rollout_workers=1, worker_resources={"CPU": 0})
    with pytest.raises(ValueError, match="cluster.slots_per_worker"):
        ClusterConfig(kind="ray", rollout_workers=1, slots_per_worker=0)
    with pytest.raises(ValueError, match="cluster.max_worker_replacements must be >= 0"):
        ClusterConfig(kind="ray", rollout_workers=1, max_worker_replacements=-1)
    with pytest.raises(ValueError, match="cluster.gateway must be one of"):
        ClusterConfig(kind="ray", rollout_workers=1, gateway="node")
    rollout = RolloutConfig()
    rollout.openai.mode = "inline"
    with pytest.raises(ValueError, match="needs rollout.openai.mode=subproc"):
        TrainConfig(rollout=rollout, cluster=ClusterConfig(kind="ray", rollout_workers=1))
    # A relative agent file is made absolute for the workers; module specs are left alone.
    monkeypatch.chdir(ROOT)
    assert node_agent_spec("agents/openai_math.py:MathAgent") == f"{ROOT}/agents/openai_math.py:MathAgent"
    assert node_agent_spec("areal.agent.spec:nothing") == "areal.agent.spec:nothing"


def test_a_worker_gateway_refuses_engines_on_the_controller_hosts_loopback(tmp_path):
    """A worker on another host than the controller cannot reach 127.0.0.1 there: it says so, and what to set."""
    from areal.cluster.ray_rollout import WorkerGatewaySpec, _own_gateway

    spec = WorkerGatewaySpec(str(tmp_path), "embedded", ["http://127.0.0.1:30000"], {}, controller_ip="203.0.113.9")
    with pytest.raises(RuntimeError, match=r"loopback, which this node .* cannot reach: .*cluster.engine_resources"):
        asyncio.run(_own_gateway(spec, f"ipc://{tmp_path}/gateway.sock"))
