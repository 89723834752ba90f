"""The whole map across nodes in one run: engine, rollout workers and trainer ranks each on Ray nodes.

Ray's own multi-node test cluster on this machine, four nodes: the head runs only the controller
(``python -m areal.train``, a Ray driver); node A carries ``engine`` and ``trainer``, node B
``rollout`` and ``trainer``, node C ``rollout``. The run places its embedded engine on A
(``cluster.engine_resources``), a rollout worker with its own gateway on each of B and C
(``cluster.rollout_workers``, ``cluster.gateway=worker``: their agents' calls go from B and C to
the engine on A) and its two trainer ranks one on A, one on B (``cluster.trainer_nodes=2``,
torchrun meeting across them). The checks are the single-host end-to-end test's
(tests/run_checks.py): every trained token is one the engine sampled, with its logprob and
version; versions advance; every published episode trained once by one of the ranks; and each
process ran where it was placed.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from run_checks import check_trained_as_sampled, three_step_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_engine_rollout_workers_and_trainer_ranks_on_their_own_nodes(tmp_path):
    run_dir = tmp_path / "run"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        a = cluster.add_node(num_cpus=2, resources={"engine": 1, "trainer": 1})
        b = cluster.add_node(num_cpus=2, resources={"rollout": 1, "trainer": 1})
        c = cluster.add_node(num_cpus=1, resources={"rollout": 1})
        cluster.wait_for_nodes()
        cmd = three_step_run(
            run_dir,
            "model.path=scripted",
            "rollout.openai.mode=subproc",
            "rollout.n_samples=4",
            "trainer.ranks=2",
            "cluster.kind=ray",
            f"cluster.address={cluster.address}",
            "++cluster.engine_resources={CPU:1,engine:1}",
            "cluster.rollout_workers=2",
            "++cluster.worker_resources={CPU:1,rollout:1}",
            "cluster.trainer_nodes=2",
            "++cluster.trainer_resources={CPU:1,trainer:1}",
        )
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    finally:
        cluster.shutdown()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    engine = re.search(r"\[cluster\] engine 0 on Ray node (\w+) \([^)]*\) at (\S+)", out)
    assert engine and engine.group(1) == a.node_id, out[-3000:]
    url = engine.group(2)
    workers = dict(re.findall(r"\[cluster\] rollout worker (\d+) on node (\w+) \([^)]*\)\n", out))
    assert sorted(workers.values()) == sorted([b.node_id, c.node_id]), out[-3000:]
    assert f"[cluster] each rollout worker's own gateway calls the engines at {url}" in out
    trainer_nodes = re.findall(r"\[cluster\] trainer placed on Ray node (\w+) \([^)]*\)", out)
    assert sorted(trainer_nodes) == sorted([a.node_id, b.node_id]), out[-3000:]
    dispatched = re.search(r"\[cluster\] episodes per rollout worker: 0: (\d+), 1: (\d+)", out)
    assert dispatched and min(map(int, dispatched.groups())) > 0, out[-3000:]

    check_trained_as_sampled(run_dir, ranks=2)  # the engine's own log against what both ranks trained
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 3 * 2 * 4 and all(e["status"] == "ok" for e in episodes), [e for e in episodes if e["status"] != "ok"][:2]
