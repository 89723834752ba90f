"""Kernel CPU per sandboxed episode, where it goes (per isolation layer, fork and pages), same run.

Counted per process tree, so that other work on the machine does not count: a sandboxed batch
costs the system CPU time of the zygote and of every process it reaped (``/proc/<zygote>/stat``:
stime + cstime; the episode processes, their setups, the reporters) plus this process's (the
gateway and the stand-in engine); an inline batch costs this process's alone (the same gateway,
the same agent code in one event loop). Minor page faults (copy-on-write and first touches) are
counted the same way. Kernel threads finishing a network namespace's teardown belong to neither
tree: the machine-wide system time (``/proc/stat``) is reported beside, as a check, and it counts
whatever else runs. The agent makes one chat completion through a real Gateway (ZeroMQ) to an
instant engine, as in benchmarks/sandbox.py.

Variants, interleaved round by round (drift on the machine falls on all alike), each figure the
median of its rounds: inline; the full sandbox; the full sandbox with ``huge_pages=False`` (the
zygote's heap in 4 KiB pages); and the full sandbox less one layer (``skip_layers``), whose
difference to the full one is that layer's share; and the full sandbox whose agent makes no call
(``no_call``): the episode's life cycle alone (fork, layers, exit), and by difference what its one
chat call costs inside a fresh process against the same call inline.

Where the CPU goes (``perf record -g`` of 400 such episodes after warm-up, 2026-11-25, 2 vCPUs
under other load; ~32 ms of CPU per episode in all): 75 % in the episode processes, of which
page faults are 31 points (copy-on-write of the zygote's pages: CPython 3.11 writes the
reference count of every object it touches, code objects, functions and constants of the SDKs
included, so a fresh fork copies each 4 KiB page it runs through, ~3,700 per episode) and
syscalls (the exit's teardown among them) 12; 12 % in the zygote's ``fork`` (``copy_page_range``:
the page tables of its ~110 MiB of anonymous memory, ~45 MiB of it in huge pages); 6 % in the
zygote's loop and the cgroup directories; 6 % in the gateway. Timed inside an episode (thread
CPU of its main thread): isolation set-up ~4.5 ms, then ``run_agent`` ~12 ms, of which the event
loop's creation 1.8, the gateway connection 1.7 and the agent's call 7.1 (1,100 faults; the same
call inline costs ~2 ms). These are properties of one process per episode forked from a Python
zygote, not of one layer: the layers together cost a few ms, within the noise of this machine.
The relay's HTTP server is therefore set up only when an agent connects to it (sandbox/relay.py):
agents that use the handed ``http_client`` never pay it (~2 ms of CPU per episode).

Quick mode: one round of 8 episodes per variant (full: five rounds of 64).

    python -m benchmarks.run [--quick] sandbox_kernel
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass, fields
from typing import Any

from benchmarks.report import figure
from benchmarks.sandbox import AGENT, _InstantWorld, bench_agent

LAYERS = ("netns", "mountns", "readonly_root", "pidns", "cgroup", "seccomp")
_HZ = os.sysconf("SC_CLK_TCK")


@dataclass
class Cost:
    """One batch, per episode: seconds of wall and CPU, page faults."""

    wall: float = 0.0
    sys: float = 0.0  # system CPU of the processes taking part (see module docstring)
    user: float = 0.0
    minflt: float = 0.0
    machine_sys: float = 0.0  # system CPU of the whole machine (/proc/stat)


def _machine_sys() -> float:
    fields_ = [int(x) for x in open("/proc/stat").readline().split()[1:8]]
    return (fields_[2] + fields_[5] + fields_[6]) / _HZ  # system + irq + softirq


def _usage(zygote_pid: int | None) -> Cost:
    """Counters so far: this process, plus the zygote and its reaped children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    cost = Cost(time.monotonic(), me.ru_stime, me.ru_utime, me.ru_minflt, _machine_sys())
    if zygote_pid is not None:
        stat = open(f"/proc/{zygote_pid}/stat").read().rsplit(")", 1)[1].split()
        minflt, cminflt, utime, stime, cutime, cstime = (int(stat[i]) for i in (7, 8, 11, 12, 13, 14))
        cost.sys += (stime + cstime) / _HZ
        cost.user += (utime + cutime) / _HZ
        cost.minflt += minflt + cminflt
    return cost


async def _batch(run_one: Any, n: int, concurrency: int, zygote_pid: int | None) -> Cost:
    """Per-episode cost of ``n`` episodes, ``concurrency`` at a time."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await run_one(i)

    before = _usage(zygote_pid)
    await asyncio.gather(*(one(i) for i in range(n)))
    await asyncio.sleep(0.2)  # the last episodes reaped and reported: their CPU is in cstime
    after = _usage(zygote_pid)
    cost = Cost(**{f.name: (getattr(after, f.name) - getattr(before, f.name)) / n for f in fields(Cost)})
    cost.wall -= 0.2 / n
    return cost


def _zygote_memory(pid: int) -> dict[str, int]:
    """Resident memory, page tables and huge pages of the zygote, in KiB."""
    out = {}
    for path, keys in ((f"/proc/{pid}/status", ("VmRSS", "VmPTE")), (f"/proc/{pid}/smaps_rollup", ("AnonHugePages",))):
        for line in open(path):
            key, _, value = line.partition(":")
            if key in keys:
                out[key] = int(value.split()[0])
    return out


async def _sandboxed(
    world: _InstantWorld,
    tmp: str,
    variant: str,
    skip: list[str],
    huge_pages: bool,
    n: int,
    memory: dict[str, dict[str, int]],
    call: bool = True,
) -> Cost:
    from sandbox.isolation import SandboxConfig
    from sandbox.zygote_client import Zygote

    config = SandboxConfig(deadline_s=120, skip_layers=skip, huge_pages=huge_pages)
    zygote = await Zygote.start(AGENT, world.addr, config, os.path.join(tmp, f"log-{variant}"))
    try:

        async def run_one(i: int) -> None:
            key = world.gateway.open_session(f"k{i}")
            try:
                out = await zygote.run_episode(f"k{i}-{variant}", {"chat": call}, key)
                assert out.status == "ok", out.error
            finally:
                world.gateway.close_session(key)

        pid = zygote.ready.pid
        await _batch(run_one, 8, 4, pid)  # warm: the first slots, caches
        cost = await _batch(run_one, n, 4, pid)
        memory[variant] = _zygote_memory(pid)  # in the steady state: after n episodes
        return cost
    finally:
        await zygote.close()


async def _inline(world: _InstantWorld, n: int) -> Cost:
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

            await _batch(run_one, 8, 4, None)
            return await _batch(run_one, n, 4, None)
    finally:
        await runner.cleanup()


def _variants() -> dict[str, tuple[list[str], bool]]:
    """name: (skip_layers, huge_pages)."""
    out = {"all": ([], True), "4k_pages": ([], False)}
    for layer in LAYERS:
        out[layer] = ([layer, "readonly_root"] if layer == "mountns" else [layer], True)  # readonly_root needs mountns
    return out


async def _measure(quick: bool) -> tuple[dict[str, Cost], dict[str, dict[str, int]]]:
    rounds, n = (1, 8) if quick else (5, 64)  # quick: a smoke of every variant, not a measurement
    samples: dict[str, list[Cost]] = {}
    memory: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-kernel-") as tmp:
        world = _InstantWorld()
        await world.start(tmp)
        try:
            for _ in range(rounds):
                samples.setdefault("inline", []).append(await _inline(world, n))
                for name, (skip, huge) in _variants().items():
                    samples.setdefault(name, []).append(await _sandboxed(world, tmp, name, skip, huge, n, memory))
                # the episode's life cycle alone: every layer, an agent that makes no call
                samples.setdefault("no_call", []).append(await _sandboxed(world, tmp, "no_call", [], True, n, memory, call=False))
        finally:
            await world.stop()
    median = {k: Cost(**{f.name: statistics.median(getattr(c, f.name) for c in v) for f in fields(Cost)}) for k, v in samples.items()}
    return median, memory


def main(quick: bool) -> list[dict]:
    per, memory = asyncio.run(_measure(quick))
    ms = 1000.0
    full, inline, small, bare = per["all"], per["inline"], per["4k_pages"], per["no_call"]

    row = functools.partial(figure, "sandbox_kernel")

    rows = [
        row(
            "kernel CPU per sandboxed episode, all layers (zygote tree + gateway)",
            full.sys * ms,
            "ms",
            "inline episode (no sandbox)",
            inline.sys * ms,
        ),
        row(
            "kernel CPU per sandboxed episode, all layers, machine-wide",
            full.machine_sys * ms,
            "ms",
            "inline episode, machine-wide",
            inline.machine_sys * ms,
        ),
        row("kernel CPU per sandboxed episode, huge-page heap", full.sys * ms, "ms", "4 KiB-page heap (huge_pages=False)", small.sys * ms),
        row("minor page faults per sandboxed episode, all layers", full.minflt, "faults", "inline episode", inline.minflt),
        row("minor page faults per sandboxed episode, huge-page heap", full.minflt, "faults", "4 KiB-page heap", small.minflt),
        row("user CPU per sandboxed episode, all layers", full.user * ms, "ms", "inline episode", inline.user * ms),
        row(
            "CPU (user + kernel) per sandboxed episode, all layers",
            (full.user + full.sys) * ms,
            "ms",
            "inline episode",
            (inline.user + inline.sys) * ms,
        ),
        row(
            "CPU per sandboxed episode whose agent makes no call (fork, layers, exit)",
            (bare.user + bare.sys) * ms,
            "ms",
            "the same with its one chat call",
            (full.user + full.sys) * ms,
        ),
        row(
            "CPU of the one chat call, in a sandboxed episode",
            (full.user + full.sys - bare.user - bare.sys) * ms,
            "ms",
            "the same call inline",
            (inline.user + inline.sys) * ms,
        ),
        row("minor page faults per sandboxed episode whose agent makes no call", bare.minflt, "faults", "with its one call", full.minflt),
        row("episodes/s sandboxed (4 at a time), all layers", 1 / full.wall, "ep/s", "inline episodes/s (4 at a time)", 1 / inline.wall),
        row(
            "zygote page tables (VmPTE) after the batch, huge-page heap",
            memory["all"]["VmPTE"],
            "KiB",
            "4 KiB-page heap",
            memory["4k_pages"]["VmPTE"],
        ),
        row(
            "zygote heap in huge pages after the batch",
            memory["all"].get("AnonHugePages", 0) / 1024,
            "MiB",
            "zygote resident memory (VmRSS)",
            memory["all"]["VmRSS"] / 1024,
        ),
    ]
    for layer in LAYERS:
        label = "mountns + readonly_root" if layer == "mountns" else layer
        rows.append(
            row(f"kernel CPU per episode attributable to {label}", (full.sys - per[layer].sys) * ms, "ms", "all layers", full.sys * ms)
        )
    return rows


if __name__ == "__main__":
    import json
    import sys

    for r in main("--quick" in sys.argv):
        print(json.dumps(r))
