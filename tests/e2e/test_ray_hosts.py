"""The whole map across three "hosts": Ray nodes in separate network namespaces joined by a bridge.

Closer to real hosts than Ray's own test cluster (whose nodes all share this machine's address):
each host is a network namespace with its own address (10.23x.y.1-3/24), its own ports and its
own loopback, joined to the others through veth pairs on a bridge, and runs its own ``ray start``
(token authentication on, as Ray 2.60 sets up a cluster by default). Every hop of the map
crosses the bridge: the controller runs on host 1 next to the embedded engine (placed there by
``cluster.engine_resources``), a rollout worker with its own gateway on each of hosts 2 and 3
calls that engine at host 1's address, the two trainer ranks meet across hosts 1 and 2 (torchrun's
rendezvous and gloo over the veth), and the controller sends each rank's trajectories over the
hop to the rank's host. The checks are the single-host end-to-end test's (tests/support/run_checks.py).
Then the one thing a shared address hides: an engine left on the controller's loopback cannot be
reached from the workers' hosts, and the run says so and what to set.

What is shared, as on a cluster with a shared filesystem: the files (the run directory, the
model), and /dev/shm (each host's rings have their own names).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from paths import ROOT

ray = pytest.importorskip("ray")
from run_checks import check_trained_as_sampled, read_jsonl, three_step_run  # noqa: E402

RAY = str(Path(sys.executable).with_name("ray"))
# host -> (logical CPUs, custom resources): the engine and a trainer rank on host 1 (the
# controller's), a rollout worker and the other rank on host 2, a rollout worker on host 3
HOSTS = {1: (2, {"engine": 1, "trainer": 1}), 2: (2, {"rollout": 1, "trainer": 1}), 3: (1, {"rollout": 1})}


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=20)


def _kill_namespace(ns: str) -> None:
    """Every process left in network namespace ``ns`` (Ray's daemons and workers), by pid."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in map(int, pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _hosts(tmp_path: Path) -> Iterator[tuple[dict[int, str], dict[int, str], dict[str, str]]]:
    """Three namespaces on a bridge, each running a Ray node; (namespace, address) per host and
    the environment every Ray process of this cluster (and the controller) runs with."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make network namespaces")
    tag = secrets.token_hex(2)
    net = f"10.{230 + int(tag[0], 16) % 10}.{int(tag[1:], 16) % 250}"
    bridge, names = f"arlbr{tag}", {h: f"arl-h{h}-{tag}" for h in HOSTS}
    addrs = {h: f"{net}.{h}" for h in HOSTS}
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",  # every node and driver of this cluster, with the same token
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    procs: list[subprocess.Popen] = []
    try:
        try:
            _sh("ip", "link", "add", bridge, "type", "bridge")
            _sh("ip", "addr", "add", f"{net}.254/24", "dev", bridge)
            _sh("ip", "link", "set", bridge, "up")
            for h, ns in names.items():
                outside, inside = f"arl{h}o{tag}", f"arl{h}i{tag}"
                _sh("ip", "netns", "add", ns)
                _sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
                _sh("ip", "link", "set", outside, "master", bridge, "up")
                _sh("ip", "link", "set", inside, "netns", ns)
                _sh("ip", "-n", ns, "addr", "add", f"{addrs[h]}/24", "dev", inside)
                _sh("ip", "-n", ns, "link", "set", inside, "up")
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                # a default route: Ray finds a node's address by the route out (nothing is sent)
                _sh("ip", "-n", ns, "route", "add", "default", "via", f"{net}.254")
        except subprocess.CalledProcessError as e:
            pytest.skip(f"cannot make network namespaces and a bridge here: {e.stderr.decode().strip()}")
        for h, ns in names.items():
            cpus, resources = HOSTS[h]
            where = ["--head", "--port", "6379", "--include-dashboard", "false"] if h == 1 else ["--address", f"{addrs[1]}:6379"]
            cmd = [RAY, "start", *where, "--node-ip-address", addrs[h], "--num-cpus", str(cpus), "--resources", json.dumps(resources)]
            # a temp dir per host, as on separate machines (nodes sharing one pick their socket names racily)
            cmd += ["--temp-dir", f"/tmp/arl-ray-{tag}-h{h}", "--disable-usage-stats", "--block"]
            log = open(tmp_path / f"ray-h{h}.log", "w")
            procs.append(
                subprocess.Popen(["ip", "netns", "exec", ns, *cmd], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            )
            if h == 1:
                time.sleep(3)  # the head's GCS first
        _wait_for_nodes(names[1], f"{addrs[1]}:6379", len(HOSTS), env, tmp_path)
        yield names, addrs, env
    finally:
        for proc in procs:  # `ray start --block` stops its daemons on SIGTERM (draining up to 30 s);
            with contextlib.suppress(ProcessLookupError):  # then whatever is left goes, by pid
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for ns in names.values():
            _kill_namespace(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=20)
        for h in HOSTS:
            shutil.rmtree(f"/tmp/arl-ray-{tag}-h{h}", ignore_errors=True)


def _wait_for_nodes(ns: str, address: str, count: int, env: dict[str, str], tmp_path: Path) -> None:
    script = (
        "import ray, sys, time\n"
        f"ray.init(address={address!r}, log_to_driver=False)\n"
        "deadline = time.monotonic() + 90\n"
        f"while len([n for n in ray.nodes() if n['Alive']]) < {count} and time.monotonic() < deadline:\n"
        "    time.sleep(0.5)\n"
        "print(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))\n"
    )
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=150)
    alive = re.findall(r"'([\d.]+)'", out.stdout)
    logs = "".join((tmp_path / f"ray-h{h}.log").read_text()[-1500:] for h in HOSTS)
    assert len(alive) == count, f"{out.stdout[-500:]}{out.stderr[-2000:]}\nnode logs:\n{logs}"


def _run(names: dict[int, str], addrs: dict[int, str], env: dict[str, str], run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """The controller on host 1, joining the cluster at host 1's address."""
    cmd = three_step_run(
        run_dir,
        "model.path=scripted",
        "rollout.openai.mode=subproc",
        "rollout.n_samples=4",
        "cluster.kind=ray",
        f"cluster.address={addrs[1]}:6379",
        "cluster.rollout_workers=2",
        "++cluster.worker_resources={CPU:1,rollout:1}",
        *extra,
    )
    return subprocess.run(["ip", "netns", "exec", names[1], *cmd], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.e2e
def test_the_map_across_three_hosts_in_network_namespaces(tmp_path):
    with _hosts(tmp_path) as (names, addrs, env):
        run_dir = tmp_path / "run"
        proc = _run(
            names,
            addrs,
            env,
            run_dir,
            "++cluster.engine_resources={CPU:1,engine:1}",
            "trainer.ranks=2",
            "cluster.trainer_nodes=2",
            "++cluster.trainer_resources={CPU:1,trainer:1}",
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        # Where each part ran: the engine at host 1's own address, a worker on each of hosts 2
        # and 3 calling it there, the trainer's ranks on hosts 1 and 2.
        engine = re.search(r"\[cluster\] engine 0 on Ray node \w+ \(([\d.]+)\) at (\S+)", out)
        assert engine and engine.group(1) == addrs[1] and engine.group(2).startswith(f"http://{addrs[1]}:"), out[-3000:]
        workers = re.findall(r"\[cluster\] rollout worker \d+ on node \w+ \(([\d.]+)\)\n", out)
        assert sorted(workers) == [addrs[2], addrs[3]], out[-3000:]
        assert f"[cluster] each rollout worker's own gateway calls the engines at {engine.group(2)}" in out
        trainer = re.findall(r"\[cluster\] trainer placed on Ray node \w+ \(([\d.]+)\): ranks (\d+)-(\d+)", out)
        assert sorted(ip for ip, _, _ in trainer) == [addrs[1], addrs[2]], out[-3000:]  # a rank on each
        assert sorted((first, last) for _, first, last in trainer) == [("0", "0"), ("1", "1")]
        dispatched = re.search(r"\[cluster\] episodes per rollout worker: 0: (\d+), 1: (\d+)", out)
        assert dispatched and min(map(int, dispatched.groups())) > 0, out[-3000:]
        check_trained_as_sampled(run_dir, ranks=2)  # the engine's own log against what both ranks trained
        episodes = read_jsonl(run_dir / "episodes.jsonl")
        assert len(episodes) == 3 * 2 * 4 and all(e["status"] == "ok" for e in episodes), [e for e in episodes if e["status"] != "ok"][:2]

        # The engine left on the controller's host: it listens on host 1's loopback, which the
        # workers' hosts cannot reach; the run stops at the start and names what to set.
        proc = _run(names, addrs, env, tmp_path / "loopback", "++cluster.trainer_resources={CPU:1,trainer:1}")
        assert proc.returncode != 0
        assert re.search(r"engine URLs \['http://127\.0\.0\.1:\d+'\] are the controller host's loopback, which this node", proc.stderr), (
            proc.stderr[-4000:]
        )
        assert "cluster.engine_resources" in proc.stderr and "cluster.gateway=controller" in proc.stderr
