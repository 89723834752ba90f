"""Tasks with a world, measured: what a workspace and its grader cost an episode, same run.

An episode with a world (sandbox/world.py) is forked when its spawn arrives (its root holds its
workspace: a tmpfs, an overlay on the task's base, decoys), and after it a grader process runs the
task's checks (sandbox/grader.py: a scan of the agent's layer, pytest in a fresh sandbox). The agent
here does nothing, so every figure is the sandbox's own cost, on the shipped task
tasks/swe/swe-02-median (five checks).

Figures (each beside a baseline measured here, now):
- CPU per episode: user + system time of the zygote and of everything it reaped (episode
  processes, graders, reporters and their children), from /proc/<zygote>/stat, over sequential
  episodes of each arm, interleaved. World episodes against the same agent without a world, with
  the default warm slots and with ``warm_slots=0`` (forked on the spot, as a world episode is).
- CPU per episode of the same world on a root file system of its own (task.json's "root": a small
  root of host programs, each episode's and each grader's root an overlay of it), against the world
  on the host's system paths.
- the grader's unavoidable part: pytest over the task's checks and tests, run alone on this host
  (``python -I -m pytest`` on a scratch copy, no sandbox), against what the world added to an
  episode (world CPU less the on-the-spot plain episode's).
- wall time of an episode, from ``run_episode`` to its outcome (grading included), p50.
- 64 concurrent episodes, each writing 1 MiB into its working directory and holding 3 s: the wall
  time until all 64 are graded, and the memory of their cgroups (``memory.usage_in_bytes`` summed
  while they hold; a world's writable layer counts there) per episode; baseline: the same 64
  episodes without a world (both arms forked on the spot).

    python -m benchmarks.run [--quick] worlds
"""

from __future__ import annotations

import asyncio
import functools
import glob
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.report import figure

AGENT = "benchmarks/worlds.py:bench_agent"
TASK = Path(__file__).resolve().parents[1] / "tasks" / "swe" / "swe-02-median"
CONCURRENT = 64
_row = functools.partial(figure, "worlds")


async def bench_agent(data: dict, **kw: Any) -> float:
    """Writes ``write_mb`` MiB into its working directory, then holds ``hold_s`` seconds."""
    if data.get("write_mb"):
        with open("scratch.bin", "wb") as f:
            f.write(os.urandom(data["write_mb"] << 20))
    if data.get("hold_s"):
        await asyncio.sleep(data["hold_s"])
    return 0.0


def _cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid``, seconds."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _cgroup_memory(zygote_pid: int) -> int:
    """Memory of the zygote's episode cgroups now; one that its episode's end removed between the
    listing and the read counts nothing (the read fails with ENOENT, or ENODEV while the kernel
    takes the group down)."""
    total = 0
    for path in glob.glob(f"/sys/fs/cgroup/memory/areal/{zygote_pid}-*/memory.usage_in_bytes"):
        try:
            total += int(Path(path).read_text())
        except OSError:
            pass
    return total


def _bare_pytest_cpu_s(n: int) -> float:
    """CPU per run of pytest over the task's checks and tests on a scratch copy, no sandbox."""
    with tempfile.TemporaryDirectory(prefix="areal-bench-worlds-") as tmp:
        shutil.copytree(TASK / "repo", f"{tmp}/workspace")
        shutil.copytree(TASK / "checks", f"{tmp}/checks")
        cmd = [sys.executable, "-I", "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", tmp, "checks", "workspace/tests"]
        env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(n):
            subprocess.run(cmd, cwd=f"{tmp}/workspace", env=env, capture_output=True, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / n


def _rooted_task(tmp: str) -> str:
    """TASK on a root file system of its own (task.json's "root"): a small root of host programs
    (``areal.tasks.root.from_host``), so the arm needs no mirror."""
    from areal.tasks.root import from_host

    task = os.path.join(tmp, "rooted-task", TASK.name)
    shutil.copytree(TASK, task)
    spec = json.loads(open(os.path.join(task, "task.json")).read())
    spec["root"] = from_host(os.path.join(tmp, "root"), ["sh", "cat", "ls"])
    with open(os.path.join(task, "task.json"), "w") as f:
        json.dump(spec, f)
    return task


async def _measure(quick: bool, tmp: str) -> dict[str, Any]:
    import zmq

    from sandbox import SandboxConfig, Zygote

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)  # the gateway's socket file must exist; the agent never calls it
    addr = f"ipc://{tmp}/gateway.sock"
    sock.bind(addr)
    config, spot = SandboxConfig(deadline_s=300), SandboxConfig(deadline_s=300, warm_slots=0)
    arms = {
        "plain": ({}, await Zygote.start(AGENT, addr, config, f"{tmp}/plain")),
        "plain_on_the_spot": ({}, await Zygote.start(AGENT, addr, spot, f"{tmp}/spot")),
        "world": ({"world": str(TASK)}, await Zygote.start(AGENT, addr, spot, f"{tmp}/world")),
        "world_on_a_root": ({"world": _rooted_task(tmp)}, await Zygote.start(AGENT, addr, spot, f"{tmp}/rooted")),
    }
    out: dict[str, Any] = {"cpu_s": {}, "wall_ms": {k: [] for k in arms}}
    try:
        for name, (data, z) in arms.items():  # warm-up: first faults, the first world's mount namespace
            assert (await z.run_episode(f"{name}-warm", data, "k" * 32)).status == "ok"
        n = 4 if quick else 30
        start = {name: _cpu_s(z.ready.pid) for name, (_, z) in arms.items()}
        for i in range(n):
            for name, (data, z) in arms.items():
                t0 = time.perf_counter()
                o = await z.run_episode(f"{name}-{i}", data, "k" * 32)
                out["wall_ms"][name].append((time.perf_counter() - t0) * 1e3)
                assert o.status == "ok" and (not name.startswith("world") or o.grader == "complete"), (o.error, o.grader)
        await asyncio.sleep(1.0)  # the last reporters and replacement slots reaped
        out["cpu_s"] = {name: (_cpu_s(z.ready.pid) - start[name]) / n for name, (_, z) in arms.items()}

        for name in ("plain_on_the_spot", "world"):
            data, z = arms[name]
            hold = {**data, "write_mb": 1, "hold_s": 3.0}
            t0 = time.perf_counter()
            running = [asyncio.ensure_future(z.run_episode(f"{name}-c{i}", hold, "k" * 32)) for i in range(CONCURRENT)]
            peak = 0
            while not all(f.done() for f in running):
                peak = max(peak, _cgroup_memory(z.ready.pid))
                await asyncio.sleep(0.2)
            outs = [f.result() for f in running]
            out[f"{name}_concurrent_s"] = time.perf_counter() - t0
            out[f"{name}_concurrent_ok"] = sum(o.status == "ok" for o in outs)
            out[f"{name}_memory_per_episode"] = peak / CONCURRENT
    finally:
        for _, z in arms.values():
            await z.close()
        sock.close(0)
        ctx.term()
    return out


def main(quick: bool) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="areal-bench-worlds-") as tmp:
        m = asyncio.run(_measure(quick, tmp))
    bare = _bare_pytest_cpu_s(3 if quick else 10)
    cpu, wall = m["cpu_s"], m["wall_ms"]
    added = cpu["world"] - cpu["plain_on_the_spot"]
    rows = [
        _row("cpu_per_world_episode", cpu["world"] * 1e3, "ms", "the same episode without a world (warm slots)", cpu["plain"] * 1e3),
        _row(
            "cpu_per_world_episode_vs_on_the_spot",
            cpu["world"] * 1e3,
            "ms",
            "the same episode without a world, warm_slots=0",
            cpu["plain_on_the_spot"] * 1e3,
        ),
        _row(
            "cpu_world_adds_per_episode",
            added * 1e3,
            "ms",
            "pytest over the checks alone, unsandboxed",
            bare * 1e3,
            note="world CPU per episode less the plain on-the-spot episode's; the baseline is the grader's unavoidable part",
        ),
        _row(
            "cpu_per_world_episode_on_a_task_root",
            cpu["world_on_a_root"] * 1e3,
            "ms",
            "the same world on the host's system paths",
            cpu["world"] * 1e3,
            note="task.json \"root\": a root of host programs (areal.tasks.root.from_host) under each episode's and grader's own layer",
        ),
        _row(
            "wall_per_world_episode_p50",
            statistics.median(wall["world"]),
            "ms",
            "without a world (warm slots), p50",
            statistics.median(wall["plain"]),
        ),
        _row(
            f"concurrent_{CONCURRENT}_world_episodes",
            m["world_concurrent_s"],
            "s",
            f"{CONCURRENT} episodes without a world (warm_slots=0)",
            m["plain_on_the_spot_concurrent_s"],
            note="each writes 1 MiB and holds 3 s; until every one is graded",
        ),
        _row(f"concurrent_{CONCURRENT}_world_ok", m["world_concurrent_ok"], "episodes", "submitted", CONCURRENT),
        _row(
            "memory_per_world_episode",
            m["world_memory_per_episode"] / 2**20,
            "MiB",
            "without a world (warm_slots=0)",
            m["plain_on_the_spot_memory_per_episode"] / 2**20,
            note=f"peak sum of the zygote's cgroups' memory.usage_in_bytes over {CONCURRENT} holding episodes, / {CONCURRENT}",
        ),
    ]
    print(f"[worlds] cpu/episode: {', '.join(f'{k}={v * 1e3:.0f} ms' for k, v in cpu.items())}; bare pytest {bare * 1e3:.0f} ms")
    return rows


if __name__ == "__main__":
    print(json.dumps(main("--quick" in sys.argv), indent=1))
