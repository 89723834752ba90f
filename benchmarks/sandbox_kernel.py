"""Kernel CPU per sandboxed episode, split by isolation layer, same run.

An episode's kernel work is spread over processes that are not its own (the zygote's fork and
reaping, kernel threads tearing a network namespace down), so it is measured machine-wide: the
system CPU time of /proc/stat over a batch of episodes, divided by the episodes. The agent does
one chat completion through a real Gateway (ZeroMQ) to an instant engine, as in
benchmarks/sandbox.py. Each layer's share is the full sandbox's figure minus the figure with
that layer skipped (``sandbox.skip_layers``), measured in the same run, the variants interleaved
over rounds and each figure the median of its rounds. Baselines: the full
sandbox, and the same episodes inline (no sandbox). Run on quiet cores: other work's kernel time
counts too (the report records the load average).

    python -m benchmarks.run [--quick] sandbox_kernel
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from typing import Any

from benchmarks.sandbox import AGENT, _InstantWorld, bench_agent

LAYERS = ("netns", "mountns", "readonly_root", "pidns", "cgroup", "seccomp")


def _cpu_ticks() -> tuple[int, int]:
    """Machine-wide (user + nice, system + irq + softirq) clock ticks so far."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:8]]
    return fields[0] + fields[1], fields[2] + fields[5] + fields[6]


async def _batch(run_one: Any, n: int, concurrency: int) -> tuple[float, float, float]:
    """(wall s, user CPU s, system CPU s) of ``n`` episodes, ``concurrency`` at a time."""
    hz = os.sysconf("SC_CLK_TCK")
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await run_one(i)

    u0, s0 = _cpu_ticks()
    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.monotonic() - t0
    u1, s1 = _cpu_ticks()
    return wall, (u1 - u0) / hz, (s1 - s0) / hz


async def _sandboxed(world: _InstantWorld, tmp: str, skip: list[str], n: int) -> tuple[float, float, float]:
    from sandbox.isolation import SandboxConfig
    from sandbox.zygote import Zygote

    zygote = await Zygote.start(AGENT, world.addr, SandboxConfig(deadline_s=120, skip_layers=skip),
                                os.path.join(tmp, "log-" + ("-".join(skip) or "all")))
    try:
        async def run_one(i: int) -> None:
            key = world.gateway.open_session(f"k{i}")
            try:
                out = await zygote.run_episode(f"k{i}-{'-'.join(skip)}", {"chat": True}, key)
                assert out.status == "ok", out.error
            finally:
                world.gateway.close_session(key)

        await _batch(run_one, 8, 4)  # warm: the first slots, caches
        return await _batch(run_one, n, 4)
    finally:
        await zygote.close()


async def _inline(world: _InstantWorld, n: int) -> tuple[float, float, float]:
    import httpx

    from areal.gateway import serve_http

    runner, url = await serve_http(world.gateway)
    try:
        async with httpx.AsyncClient() as http:
            async def run_one(i: int) -> None:
                key = world.gateway.open_session(f"i{i}")
                try:
                    await bench_agent({"chat": True}, base_url=f"{url}/v1", api_key=key, http_client=http)
                finally:
                    world.gateway.close_session(key)

            await _batch(run_one, 8, 4)
            return await _batch(run_one, n, 4)
    finally:
        await runner.cleanup()


async def _measure(quick: bool) -> dict[str, tuple[float, float, float]]:
    """Per variant, the median over rounds of (wall, user, system) seconds per episode. The
    variants are interleaved round by round, so that drift on the machine (caches, other work)
    falls on all of them alike."""
    rounds, n = (3, 32) if quick else (5, 64)
    samples: dict[str, list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-kernel-") as tmp:
        world = _InstantWorld()
        await world.start(tmp)
        try:
            for _ in range(rounds):
                samples.setdefault("inline", []).append(await _inline(world, n))
                samples.setdefault("all", []).append(await _sandboxed(world, tmp, [], n))
                for layer in LAYERS:
                    skip = [layer, "readonly_root"] if layer == "mountns" else [layer]  # readonly_root needs mountns
                    samples.setdefault(layer, []).append(await _sandboxed(world, tmp, skip, n))
        finally:
            await world.stop()
    return {k: tuple(statistics.median(x[i] / n for x in v) for i in range(3)) for k, v in samples.items()}


def main(quick: bool) -> list[dict]:
    per = asyncio.run(_measure(quick))
    ms = 1000.0
    all_wall, all_user, all_sys = per["all"]
    rows = [
        {"benchmark": "sandbox_kernel", "metric": "kernel CPU per sandboxed episode, all layers", "value": all_sys * ms,
         "unit": "ms", "baseline": "inline episode (no sandbox)", "baseline_value": per["inline"][2] * ms},
        {"benchmark": "sandbox_kernel", "metric": "user CPU per sandboxed episode, all layers", "value": all_user * ms,
         "unit": "ms", "baseline": "inline episode (no sandbox)", "baseline_value": per["inline"][1] * ms},
        {"benchmark": "sandbox_kernel", "metric": "episodes/s sandboxed (4 at a time), all layers", "value": 1 / all_wall,
         "unit": "ep/s", "baseline": "inline episodes/s (4 at a time)", "baseline_value": 1 / per["inline"][0]},
    ]
    for layer in LAYERS:
        label = "mountns + readonly_root" if layer == "mountns" else layer
        rows.append({"benchmark": "sandbox_kernel", "metric": f"kernel CPU per episode attributable to {label}",
                     "value": (all_sys - per[layer][2]) * ms, "unit": "ms",
                     "baseline": "all layers", "baseline_value": all_sys * ms})
    return rows


if __name__ == "__main__":
    import json
    import sys

    for row in main("--quick" in sys.argv):
        print(json.dumps(row))
