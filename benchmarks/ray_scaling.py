"""Rollout workers on Ray nodes: episodes/s with 1, 2 and 4 workers on a tool-latency-bound agent,
against linear scaling from the 1-worker figure, same run; with each worker's own gateway
(``cluster.gateway=worker``, the default) and with the controller's (``controller``).

One Ray test cluster on this machine (``ray.cluster_utils.Cluster``: a head node and 4 nodes with
one CPU and a custom resource ``rollout`` each) and an instant engine (an aiohttp SGLang
``/generate`` stand-in that answers at once): the figure is the rollout side alone, not the model.
For each gateway mode and N = 1, 2, 4 a ``RayRunner`` (``areal/cluster/ray_rollout.py``) places N
workers (a sandbox zygote each, ``slots_per_worker`` episodes at once), then ``EPISODES_PER_SLOT``
x N x slots episodes are submitted at once and the runner's admission spreads them; episodes/s =
episodes / wall time from the first submission to the last outcome. The agent
(``slow_tool_agent``) waits ``TOOL_S`` (an emulated tool call, ``asyncio.sleep``), then makes one
chat completion through its sandbox's relay and either the worker's own gateway (which calls the
engine itself and returns the session's record with the outcome) or the worker's bridge to this
process's gateway over TCP. Baseline: N x the 1-worker figure of the same mode (linear scaling).

This drives the RayRunner directly (no trainer, no rings, no admission by staleness) to stay
bounded in time; the whole-run path is tested by tests/e2e/test_ray_rollout.py and
tests/e2e/test_ray_hosts.py. All "nodes" share this machine's cores: with 2 cores, the sandboxes' spawn
and exit cost (kernel time per episode, see the ``sandbox_kernel`` benchmark) and the gateways'
CPU cap the curve long before real nodes would. Not measured: real network latency between nodes,
many controllers.

Quick mode: 1 and 2 workers (full: 1, 2 and 4), 1 episode per slot (full: 4).

    python -m benchmarks.run [--quick] ray_scaling
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.sandbox import _InstantWorld

AGENT = "benchmarks/ray_scaling.py:slow_tool_agent"
TOOL_S = 0.5  # the emulated tool call of every episode
SLOTS = 8  # cluster.slots_per_worker
EPISODES_PER_SLOT = 4  # per measured point: N x SLOTS x this many episodes
WORKERS = (1, 2, 4)
QUICK_WORKERS = (1, 2)  # quick: a smoke of both gateway modes on a smaller cluster
GATEWAYS = ("worker", "controller")  # cluster.gateway


async def slow_tool_agent(data: dict, **kw: Any) -> float:
    """Wait on a "tool", then one chat completion through the gateway."""
    import openai

    await asyncio.sleep(data["tool_s"])
    client = openai.AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw["http_client"], max_retries=0)
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "6*7?"}], max_tokens=8)
    return float(bool(reply.choices[0].message.content))


async def _episodes_per_s(world: _InstantWorld, workers: int, per_slot: int, log_dir: str, gateway: str) -> tuple[float, int]:
    import dataclasses

    from areal.cluster.config import ClusterConfig
    from areal.cluster.ray_rollout import RayRunner, WorkerGatewaySpec
    from areal.embedded import ensure_embedded_model
    from sandbox import SandboxConfig

    config = ClusterConfig(kind="ray", rollout_workers=workers, worker_resources={"CPU": 1.0, "rollout": 1.0}, slots_per_worker=SLOTS)
    own = None
    if gateway == "worker":
        own = WorkerGatewaySpec(str(ensure_embedded_model()), "embedded", [world.engine_url], dataclasses.asdict(world.gateway.config))
    runner = await RayRunner.start(
        config, world.gateway, AGENT, SandboxConfig(deadline_s=120), Path(log_dir), {}, 0, f"bench{workers}", print, own
    )
    try:
        n = workers * SLOTS * per_slot
        ids = [f"{gateway}{workers}-e{i}" for i in range(n)]
        t0 = time.perf_counter()
        if own is not None:
            results = await asyncio.gather(*(runner.run_session(i, {"tool_s": TOOL_S}, 120.0) for i in ids))
            wall = time.perf_counter() - t0
            outs = [o for o, session in results if session.interactions]  # each with its one recorded call
        else:
            keys = [world.gateway.open_session(i) for i in ids]
            outs = await asyncio.gather(*(runner.run_episode(i, {"tool_s": TOOL_S}, k, 120.0) for i, k in zip(ids, keys)))
            wall = time.perf_counter() - t0
            outs = [o for o, k in zip(outs, keys) if world.gateway.close_session(k).interactions]
    finally:
        await runner.close()
    if len(outs) != n:
        raise RuntimeError(f"{n - len(outs)} of {n} episodes recorded no call")
    bad = [o for o in outs if o.status != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} of {n} episodes failed; e.g. {bad[0].status}: {bad[0].error[-1500:]}")
    return n / wall, n


async def _measure(quick: bool, tmp: str) -> dict[tuple[str, int], tuple[float, int]]:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    world = _InstantWorld()
    try:
        workers = QUICK_WORKERS if quick else WORKERS
        for _ in range(max(workers)):
            cluster.add_node(num_cpus=1, resources={"rollout": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        await world.start(tmp)
        per_slot = 1 if quick else EPISODES_PER_SLOT  # quick: every slot runs an episode, once
        await _episodes_per_s(world, 1, 1, f"{tmp}/warm", "controller")  # the first placement pays Ray's worker start-up
        return {(g, n): await _episodes_per_s(world, n, per_slot, f"{tmp}/{g}{n}", g) for g in GATEWAYS for n in workers}
    finally:
        await world.stop()
        ray.shutdown()
        cluster.shutdown()


def main(quick: bool) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="areal-bench-ray-") as tmp:
        rates = asyncio.run(_measure(quick, tmp))
    workers = sorted({n for _, n in rates})
    rows = []
    for gateway in GATEWAYS:
        one = rates[gateway, 1][0]
        for n in workers:
            rate, episodes = rates[gateway, n]
            rows.append(
                {
                    "benchmark": "ray_scaling",
                    "metric": f"episodes_per_s_{n}_workers_{gateway}_gateway",
                    "value": rate,
                    "unit": "ep/s",
                    "baseline": f"linear: {n} x the 1-worker figure ({gateway} gateway)",
                    "baseline_value": n * one,
                    "note": f"{episodes} episodes, {SLOTS} slots per worker, {TOOL_S}s tool wait + 1 LLM call (instant engine)",
                }
            )
        print(
            f"[ray_scaling] {gateway} gateway: "
            + ", ".join(f"{n} workers: {rates[gateway, n][0]:.1f} ep/s ({rates[gateway, n][0] / (n * one):.2f} of linear)" for n in workers)
        )
    return rows


if __name__ == "__main__":
    import sys

    main("--quick" in sys.argv)
