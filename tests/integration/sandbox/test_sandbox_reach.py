"""What an episode can reach, against the allow-list of sandbox/isolation.py, and the attacks that
reached further at 250e73b: the zygote's control channel (through descriptors uvloop leaks), the
host's SysV IPC, locks on host files, other runs' outputs, and an outcome frame of its own.

The world is real: ``areal.gateway.Gateway`` over ZeroMQ (ipc://), the embedded model's
tokenizer, a zygote running tests/support/sandbox_agents.py:ReachAgent, driven from an event loop of
either kind the controller may run (asyncio, uvloop). Only the engine is a stand-in (SGLang's
``/generate`` on loopback, always "42"), so that a test can act while an episode waits on it.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgspec
import pytest
import uvloop
from instant_engine import start_instant_engine
from paths import ROOT
from transformers import AutoTokenizer
from zygote_harness import run, zygote_env

from areal.embedded import ensure_embedded_model
from areal.engine.client import EngineClient
from areal.gateway import Gateway, serve_zmq
from areal.protocol import EpisodeOutcome
from sandbox import reach
from sandbox.isolation import SandboxConfig
from sandbox.outcome import ERROR_LIMIT, MODULE_NAME
from sandbox.zygote_client import Zygote

REPO = str(ROOT)
TAG = uuid.uuid4().hex[:10]
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
_libc = ctypes.CDLL(None, use_errno=True)


class Host:
    """Gateway, stand-in engine and zygote on one event loop of ``loop_kind`` in a thread.
    ``on_call`` runs in that loop while the engine holds a model call's reply."""

    def __init__(
        self, tmp: str, loop_kind: str, config: SandboxConfig, on_call: Callable[[], Awaitable[None] | None] | None = None
    ) -> None:
        self.loop = LOOPS[loop_kind]()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.tmp, self.on_call, self.config = tmp, on_call, config
        self.addr = f"ipc://{tmp}/gateway.sock"
        run(self.loop, self._start())

    async def _start(self) -> None:
        self.tok = AutoTokenizer.from_pretrained(ensure_embedded_model())
        self.engine = await start_instant_engine(self.tok, "42", on_call=self.on_call)
        self.gateway = Gateway(EngineClient(f"http://127.0.0.1:{self.engine.addresses[0][1]}"), self.tok)
        ready = asyncio.Event()
        self.door = asyncio.ensure_future(serve_zmq(self.gateway, self.addr, ready))
        await ready.wait()
        with zygote_env():
            self.zygote = await Zygote.start("sandbox_agents:ReachAgent", self.addr, self.config, os.path.join(self.tmp, "log"))

    async def episode(self, data: dict) -> EpisodeOutcome:
        eid = f"{data['case']}-{uuid.uuid4().hex[:8]}"
        key = self.gateway.open_session(eid)
        try:
            return await self.zygote.run_episode(eid, data, key)
        finally:
            self.gateway.close_session(key)

    def run(self, data: dict) -> EpisodeOutcome:
        return run(self.loop, self.episode(data), timeout=120)

    def close(self) -> None:
        async def stop() -> None:
            await self.zygote.close()
            self.door.cancel()
            await self.engine.cleanup()
            await self.gateway.engine.close()

        run(self.loop, stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def _report(out: EpisodeOutcome, name: str) -> Any:
    found = re.findall(rf"{name}=(.*?)=end", out.error, re.S)  # the last: the message, not the traceback's source line
    assert out.status == "error" and found, f"{out.status}: {out.error[-3000:]}"
    return json.loads(found[-1])


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    h = Host(str(tmp_path_factory.mktemp("reach")), "asyncio", SandboxConfig(deadline_s=60.0))
    yield h
    h.close()


@pytest.mark.parametrize("loop_kind", sorted(LOOPS))
def test_an_episode_reaches_only_what_isolation_allows(tmp_path, loop_kind):
    """The survey of an episode, compared with isolation.REACH_*: nothing unlisted, whatever the
    controller's event loop and whatever its launcher leaked (here an inheritable pipe at fd 251,
    as a shell leaves one)."""
    leak_r, leak_w = os.pipe()
    os.dup2(leak_r, 251, inheritable=True)
    try:
        h = Host(str(tmp_path), loop_kind, SandboxConfig(deadline_s=60.0))
    finally:
        for fd in (251, leak_r, leak_w):
            os.close(fd)
    try:
        out = h.run({"case": "survey"})
        zpid, layers, root = h.zygote.ready.pid, h.zygote.ready.isolation, h.zygote.ready.root
        host_ns = {n: os.readlink(f"/proc/{zpid}/ns/{n}") for n in os.listdir(f"/proc/{zpid}/ns")}
    finally:
        h.close()
    found = msgspec.json.decode(json.dumps(_report(out, "reach")), type=reach.Reach)
    unlisted = reach.unlisted(found, host_ns, layers, root, h.addr.removeprefix("ipc://"))
    assert unlisted == [], "\n".join(unlisted)
    # Not vacuous: the survey saw what every episode holds, and every layer it checks was on.
    assert {"netns", "ipcns", "pidns", "mountns", "readonly_root"} <= set(layers)
    kinds = {(d.fd, d.kind) for d in found.descriptors}
    assert {(0, "file"), (1, "file"), (2, "file")} <= kinds and any(d.kind == "pipe" for d in found.descriptors)
    assert any(d.kind == "socket" and d.own_netns for d in found.descriptors)
    assert any(m.fstype == "overlay" for m in found.mounts) and found.namespaces["ipc"] != host_ns["ipc"]


def test_the_survey_names_what_the_allow_list_does_not():
    """``unlisted`` is not vacuous: a descriptor of the host, a shared mapping, a host namespace,
    an IPC object, a bind of the host's disk and a foreign process each give a line."""
    found = reach.Reach(
        descriptors=[
            reach.Descriptor(0, "/dev/null", "r", "file", True, False),
            reach.Descriptor(7, "socket:[1]", "rw", "socket", False, False),
            reach.Descriptor(8, "pipe:[2]", "r", "pipe", False, False),
        ],
        shared_mappings=["rw-s /dev/shm/ring"],
        namespaces={"ipc": "ipc:[1]", "net": "net:[2]", "pid": "pid:[3]", "mnt": "mnt:[4]"},
        ipc_objects=["shm key=1 id=0"],
        mounts=[reach.Mount("/work/runs", "ext4", True, False), reach.Mount("/usr", "overlay", True, False)],
        foreign_processes=[1234],
    )
    host_ns = {"ipc": "ipc:[1]", "net": "net:[9]", "pid": "pid:[8]", "mnt": "mnt:[7]"}
    lines = reach.unlisted(found, host_ns, ["ipcns", "netns", "pidns", "mountns", "readonly_root"], ["/usr"], "/s")
    assert len(lines) == 7, lines
    for needle in ("descriptor 7", "descriptor 8", "rw-s /dev/shm/ring", "namespace ipc", "shm key=1", "/work/runs", "process 1234"):
        assert any(needle in line for line in lines), (needle, lines)


def test_sysv_ipc_objects_are_the_episodes_own(host):
    """A segment and a queue an episode leaves behind die with it; the host's cannot be attached."""
    host_key, episode_key = 0x5EC0000 + os.getpid() % 0xFFFF, 0x5EC1000 + os.getpid() % 0xFFFF
    host_shm = _libc.shmget(host_key, 4096, 0o1000 | 0o600)
    assert host_shm >= 0, os.strerror(ctypes.get_errno())
    try:
        made = host.run({"case": "sysv_make", "key": episode_key})
        assert (made.status, made.reward) == ("ok", 1.0), made.error
        found = _report(host.run({"case": "sysv_find", "keys": [episode_key, host_key]}), "found")
        on_host = open("/proc/sysvipc/shm").read() + open("/proc/sysvipc/msg").read()
    finally:
        _libc.shmctl(host_shm, 0, None)  # IPC_RMID
    assert found == {str(episode_key): 0.0, str(host_key): 0.0}
    assert f" {episode_key} " not in on_host  # the kernel's tables print keys in decimal


def test_a_lock_an_episode_holds_on_an_exposed_file_does_not_hold_the_host(tmp_path_factory):
    """An episode locks exposed files (a file of sandbox.expose, one of the project's packages,
    one of site-packages) and waits on a model call; meanwhile the host takes the same locks."""
    exposed_dir = str(tmp_path_factory.mktemp("exposed"))
    paths = [os.path.join(exposed_dir, "build.lock"), os.path.join(REPO, "tests", "support", "sandbox_agents.py"), msgspec.__file__]
    open(paths[0], "w").close()
    host_got: list[str] = []

    def try_locks() -> None:
        for path in paths:
            with open(path, "r+b") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    host_got.append(path)
                except BlockingIOError:
                    pass

    h = Host(str(tmp_path_factory.mktemp("locks")), "asyncio", SandboxConfig(deadline_s=60.0, expose=[exposed_dir]), on_call=try_locks)
    try:
        out = h.run({"case": "hold_locks", "paths": paths})
    finally:
        h.close()
    assert (out.status, out.reward) == ("ok", 3.0), out.error  # the episode held every lock while the host tried
    assert host_got == paths


def test_other_runs_and_what_is_not_code_in_the_project_are_invisible(tmp_path):
    """Runs under the project (``runs/``, ``multirun/``, one started after the zygote) and a
    ``.env`` beside the code are absent from an episode's root; the project's packages are there."""
    made = [os.path.join(REPO, "runs", f"reach-{TAG}"), os.path.join(REPO, "multirun", f"reach-{TAG}", "0")]
    for d in made:
        os.makedirs(d)
        with open(os.path.join(d, "episodes.jsonl"), "w") as f:
            f.write('{"completion": "secret"}\n')
    dotenv = os.path.join(REPO, f".env-reach-{TAG}")
    with open(dotenv, "w") as f:
        f.write("TOKEN=secret\n")
    h = Host(str(tmp_path), "asyncio", SandboxConfig(deadline_s=60.0))
    late = os.path.join(REPO, "runs", f"reach-late-{TAG}")
    try:
        os.makedirs(late)  # a run started while the zygote serves
        control = os.path.join(REPO, "areal", "__init__.py")
        paths = [os.path.join(d, "episodes.jsonl") for d in made] + [late, dotenv, control]
        seen = _report(h.run({"case": "look", "paths": paths}), "seen")
    finally:
        h.close()
        for d in [*made, late]:
            shutil.rmtree(d, ignore_errors=True)
        os.unlink(dotenv)
        for d in (os.path.join(REPO, "multirun", f"reach-{TAG}"), os.path.join(REPO, "runs"), os.path.join(REPO, "multirun")):
            if os.path.isdir(d) and not os.listdir(d):
                os.rmdir(d)
    assert seen == [control]


@pytest.mark.parametrize("status", ["ok", "timeout"])
def test_an_episode_cannot_say_what_only_the_sandbox_says(host, status):
    """An outcome frame the episode wrote itself: another episode's id, a status only the sandbox
    decides, a signal, a 12 MiB log tail, terminal escapes, a long import list. What only the
    zygote knows is the zygote's; what the episode may say is bounded and printable."""
    out = host.run({"case": "forge_outcome", "status": status})
    assert out.episode_id.startswith("forge_outcome-")
    assert out.exit_signal is None and out.exit_code == 0 and out.wall_s > 0.001
    assert out.status == ("ok" if status == "ok" else "error")
    assert len(out.log_tail) < 8192 and "L" * 100 not in out.log_tail
    assert len(out.error) <= ERROR_LIMIT + 200 and "\x1b" not in out.error and "\x07" not in out.error
    assert len(out.failure_cause) <= 200
    assert out.imported and len(out.imported) <= 20 and all(MODULE_NAME.fullmatch(m) for m in out.imported)
    assert out.imported[:2] == ["json", "ok_module"]
