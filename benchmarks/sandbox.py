"""Sandbox costs: spawn-to-running, memory per sandbox, and 256 concurrent episodes, same run.

Figures (each next to a baseline measured here, now):
- spawn-to-running p50/p99: from ``Zygote.run_episode`` being called to the first line of the
  agent's ``run()``, one episode at a time, with the default warm slots (a set-up episode
  process takes the spawn from a pipe). Baselines: the same with ``warm_slots=0`` (fork, then
  every isolation layer and the relay, on the spawn's path), alternated episode by episode;
  a cold ``python -c "import openai"`` subprocess (what a fresh process per episode would pay
  before any agent code), and a warm ``ProcessPoolExecutor`` running
  ``asyncio.run(agent.run(data))`` (AReaL's subprocess mode: no isolation, no deadline).
- memory per sandbox: cgroup ``memory.usage_in_bytes`` and PSS of an idle episode while 16
  run at once; baseline: the RSS of a cold process that only imports openai.
- 256 concurrent sandboxed episodes, each making one chat completion through a real Gateway
  (ZeroMQ front door) to an instant engine (an aiohttp SGLang ``/generate`` stand-in):
  episodes/s; baseline: the same 256 episodes run inline in one event loop (no sandbox), each
  on its own gateway connection, as each sandboxed one is.

    python -m benchmarks.run [--quick] sandbox
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.report import figure

AGENT = "benchmarks/sandbox.py:bench_agent"
NO_CALL_KEY = "k" * 32  # the session key of episodes that never call the gateway (the zygote wants >= 16 characters)


async def bench_agent(data: dict, **kw: Any) -> float:
    """Reports when it started (wall clock: shared by every PID namespace)."""
    started = time.time()
    if data.get("chat"):
        import openai

        client = openai.AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw["http_client"])
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "6*7?"}])
        assert reply.choices[0].message.content
    if data.get("hold_s"):
        await asyncio.sleep(data["hold_s"])
    return started


def _pool_task(data: dict) -> float:
    return asyncio.run(bench_agent(data))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


_row = functools.partial(figure, "sandbox")


def _cold_import_ms(n: int) -> tuple[list[float], int]:
    times, rss = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", "import openai, resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"],
            check=True,
            capture_output=True,
            text=True,
        )
        times.append((time.perf_counter() - t0) * 1e3)
        rss = int(out.stdout)  # KiB
    return times, rss << 10


def _pool_ms(n: int) -> list[float]:
    times = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
        pool.submit(_pool_task, {}).result()  # warm: the worker exists and has imported everything
        for _ in range(n):
            t0 = time.time()
            started = pool.submit(_pool_task, {}).result()
            times.append((started - t0) * 1e3)
    return times


class _InstantWorld:
    """Gateway over ZeroMQ + a stand-in engine that answers /generate at once."""

    async def start(self, tmp: str) -> None:
        from instant_engine import start_instant_engine
        from transformers import AutoTokenizer

        from areal.embedded import ensure_embedded_model
        from areal.engine.client import EngineClient
        from areal.gateway import Gateway, serve_zmq

        tok = AutoTokenizer.from_pretrained(ensure_embedded_model())
        self.runner = await start_instant_engine(tok, "42")
        self.engine_url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.gateway = Gateway(EngineClient(self.engine_url), tok)
        self.addr = f"ipc://{tmp}/gateway.sock"
        ready = asyncio.Event()
        self.serving = asyncio.ensure_future(serve_zmq(self.gateway, self.addr, ready))
        await ready.wait()

    async def stop(self) -> None:
        self.serving.cancel()
        await self.gateway.engine.close()
        await self.runner.cleanup()


def _memory_of_running(zygote_pid: int, log_dir: str) -> tuple[list[int], list[int]]:
    """cgroup usage of each running episode of this zygote, and PSS of each of its processes.
    Idle warm slots (their log still has the bare slot name) are left out."""
    running = [
        d
        for d in glob.glob(f"/sys/fs/cgroup/memory/areal/{zygote_pid}-*")
        if not os.path.exists(os.path.join(log_dir, os.path.basename(d) + ".log"))
    ]
    usage = [int(open(os.path.join(d, "memory.usage_in_bytes")).read()) for d in running]
    pss = []
    for d in running:
        for pid in open(os.path.join(d, "cgroup.procs")).read().split():
            for line in open(f"/proc/{pid}/smaps_rollup"):
                if line.startswith("Pss:"):
                    pss.append(int(line.split()[1]) << 10)
    return usage, pss


async def _sandboxed(quick: bool, tmp: str) -> dict[str, Any]:
    from areal.agent.spec import load_agent
    from sandbox import SandboxConfig, Zygote

    world = _InstantWorld()
    await world.start(tmp)
    zygote = await Zygote.start(AGENT, world.addr, SandboxConfig(deadline_s=120), os.path.join(tmp, "log"))
    cold = await Zygote.start(AGENT, world.addr, SandboxConfig(deadline_s=120, warm_slots=0), os.path.join(tmp, "log0"))
    out: dict[str, Any] = {"layers": zygote.ready.isolation}
    try:
        # Alternate a warm-slot spawn and a cold one (fork, then every layer, as before warm
        # slots), so that both see the same load on a shared machine.
        spawn: dict[str, list[float]] = {"warm": [], "cold": []}
        for i in range(30 if quick else 200):
            for kind, z in (("warm", zygote), ("cold", cold)):
                t0 = time.time()
                o = await z.run_episode(f"{kind}{i}", {}, NO_CALL_KEY)
                assert o.status == "ok", o.error
                spawn[kind].append((o.reward - t0) * 1e3)
        out["spawn_ms"] = spawn["warm"][3:]  # the first few fault in the zygote's pages
        out["cold_spawn_ms"] = spawn["cold"][3:]
        await cold.close()

        hold = [asyncio.ensure_future(zygote.run_episode(f"m{i}", {"hold_s": 3.0}, NO_CALL_KEY)) for i in range(16)]
        await asyncio.sleep(2.0)
        out["usage"], out["pss"] = _memory_of_running(zygote.ready.pid, zygote.log_dir)
        await asyncio.gather(*hold)

        n = 256
        keys = [world.gateway.open_session(f"c{i}") for i in range(n)]
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(zygote.run_episode(f"c{i}", {"chat": True}, keys[i]) for i in range(n)))
        out["concurrent_s"] = time.perf_counter() - t0
        out["concurrent_ok"] = sum(o.status == "ok" for o in outs)
        out["concurrent_errors"] = sorted({o.error[-300:] for o in outs if o.status != "ok"})[:3]
        assert all(len(world.gateway.close_session(k).interactions) == 1 for k, o in zip(keys, outs) if o.status == "ok")

        # Baseline: the same episodes inline, one event loop, the gateway's own transport. One
        # connection per episode, as a sandboxed episode has: the gateway charges a connection to
        # the first session that uses it, so a shared one would hold every episode to one session's limits.
        import httpx

        from sandbox.relay import ZmqTransport

        run = load_agent(AGENT)

        async def inline_episode(key: str) -> None:
            async with httpx.AsyncClient(transport=ZmqTransport(world.addr), base_url="http://gw/v1") as http:
                await run({"chat": True}, base_url="http://gw/v1", api_key=key, http_client=http)

        keys = [world.gateway.open_session(f"i{i}") for i in range(n)]
        t0 = time.perf_counter()
        await asyncio.gather(*(inline_episode(k) for k in keys))
        out["inline_s"] = time.perf_counter() - t0
    finally:
        await cold.close()
        await zygote.close()
        await world.stop()
    return out


def main(quick: bool) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="areal-bench-sandbox-") as tmp:
        sb = asyncio.run(_sandboxed(quick, tmp))
    cold, cold_rss = _cold_import_ms(3 if quick else 10)
    pool = _pool_ms(30 if quick else 200)
    p50, p99 = _percentile(sb["spawn_ms"], 0.5), _percentile(sb["spawn_ms"], 0.99)
    rows = [
        _row("spawn_to_running_p50", p50, "ms", "cold python -c 'import openai'", statistics.median(cold)),
        _row("spawn_to_running_p99", p99, "ms", "cold python -c 'import openai'", max(cold)),
        _row("spawn_to_running_p50_vs_pool", p50, "ms", "ProcessPoolExecutor p50 (no isolation)", _percentile(pool, 0.5)),
        _row(
            "spawn_to_running_p50_vs_cold_fork", p50, "ms", "warm_slots=0: fork, then isolate, p50", _percentile(sb["cold_spawn_ms"], 0.5)
        ),
        _row(
            "spawn_to_running_p99_vs_cold_fork", p99, "ms", "warm_slots=0: fork, then isolate, p99", _percentile(sb["cold_spawn_ms"], 0.99)
        ),
        _row("memory_per_sandbox_cgroup", statistics.mean(sb["usage"]) / 2**20, "MiB", "cold import-openai RSS", cold_rss / 2**20),
        _row("pss_per_sandbox_process", statistics.mean(sb["pss"]) / 2**20, "MiB", "cold import-openai RSS", cold_rss / 2**20),
        _row(
            "concurrent_256_episodes_per_s",
            sb["concurrent_ok"] / sb["concurrent_s"],
            "ep/s",
            "same 256 inline (no sandbox)",
            256 / sb["inline_s"],
        ),
        _row("concurrent_256_ok", sb["concurrent_ok"], "episodes", "submitted", 256),
    ]
    print(
        f"[sandbox] layers={sb['layers']} spawn p50={p50:.1f} ms p99={p99:.1f} ms; "
        f"{len(sb['usage'])} cgroups, {len(sb['pss'])} processes measured; errors: {sb['concurrent_errors']}"
    )
    return rows


if __name__ == "__main__":
    import json

    print(json.dumps(main("--quick" in sys.argv), indent=1))
