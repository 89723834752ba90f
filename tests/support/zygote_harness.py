"""Driving a real sandbox zygote from a test: its start environment (this folder importable, for
``sandbox_agents``), coroutines run on a loop in another thread (``loop_thread``, ``run``), rows run
as sandboxed episodes over a gateway thread (``sandboxed_episodes``), and its processes read off
/proc (children, warm slots, the episodes still running)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any

from paths import support_env

from sandbox.isolation import SandboxConfig
from sandbox.zygote_client import Zygote


def run(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


@contextlib.contextmanager
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own (``run`` hands it coroutines), stopped at exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()


def sandboxed_episodes(
    gw: Any, spec: str, rows: list[dict], kwargs: dict | None = None, config: SandboxConfig | None = None, deadline_s: float = 120.0
) -> list[tuple]:
    """Each row as one sandboxed episode of agent ``spec`` (built with ``kwargs``) on a zygote of
    ``config`` (one warm slot by default), one session each on the gateway thread ``gw``
    (``gateway_harness.GatewayThread``), one after another: [(outcome, its session's interactions)]."""
    log_dir = tempfile.mkdtemp(prefix="episodes-")

    async def go() -> list[tuple]:
        with zygote_env():
            zygote = await Zygote.start(spec, gw.zmq, config or SandboxConfig(warm_slots=1), log_dir, agent_kwargs=kwargs)
        try:
            out = []
            for row in rows:
                episode = f"ep-{uuid.uuid4().hex[:8]}"
                key = gw.gateway.open_session(episode)
                out.append((await zygote.run_episode(episode, row, key, deadline_s), key))
            return out
        finally:
            await zygote.close()

    try:
        return [(outcome, gw.interactions(key)) for outcome, key in gw.run(go(), timeout=600)]
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


@contextlib.contextmanager
def zygote_env(**extra: str) -> Iterator[None]:
    """Environment for a zygote start: this folder importable (its agents: ``sandbox_agents``), and ``extra``."""
    saved = dict(os.environ)
    os.environ.update(support_env(**extra))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def processes_with_arg(arg: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:  # exited while we looked
            continue
        if arg.encode() in argv:
            found.append(int(pid))
    return found


def children_of(ppid: int) -> list[int]:
    kids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == ppid:
            kids.append(int(pid))
    return kids


def idle_slots(zygote: Zygote) -> set[str]:
    """Names ("<zygote pid>-<seq>") of the zygote's warm slots that no spawn was handed to: only
    those keep their log under the slot's bare name (a handover renames it after the episode)."""
    zpid = zygote.ready.pid
    return {f[:-4] for f in os.listdir(zygote.log_dir) if re.fullmatch(rf"{zpid}-\d+\.log", f)}


def cgroup_name(pid: int) -> str:
    """Last component of the process's memory cgroup path ("" when it has none)."""
    for line in open(f"/proc/{pid}/cgroup").read().splitlines():
        if line.split(":")[1] == "memory":
            return line.rsplit("/", 1)[1]
    return ""


def busy_children(zygote: Zygote) -> list[int]:
    """Children of the zygote other than idle warm slots: a finished episode leaves none. The
    zygote refills its warm slots as it hands them out, so exactly ``warm_slots`` are idle."""
    idle = idle_slots(zygote)
    assert len(idle) == zygote.config.warm_slots, idle
    return [pid for pid in children_of(zygote.ready.pid) if cgroup_name(pid) not in idle]
