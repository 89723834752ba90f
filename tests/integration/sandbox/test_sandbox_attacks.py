"""Escape attempts against the sandbox, one per test, each run beside a well-behaved episode.

The world is real: a real ``areal.gateway.Gateway`` served over ZeroMQ (ipc://) and HTTP
(loopback TCP), the embedded model's real tokenizer, and a zygote running
tests/support/sandbox_agents.py:AttackAgent. Only the engine is a stand-in (an aiohttp server speaking
SGLang's ``/generate`` on loopback that always samples "42"), because the attacks need an
engine that answers at once, not a good one.

Every test asserts three things: the attack failed with a reason (or was neutralised), the
concurrent well-behaved episode got its answer through the gateway, and nothing of the attack
is left running (no child of the zygote, no episode cgroup, no marker process).
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory
from typing import Any

import pytest
from instant_engine import start_instant_engine
from paths import ROOT
from transformers import AutoTokenizer
from zygote_harness import busy_children, idle_slots, processes_with_arg, run, zygote_env

from areal.embedded import ensure_embedded_model
from areal.engine.client import EngineClient
from areal.gateway import Gateway, serve_http, serve_zmq
from areal.protocol import EpisodeOutcome
from sandbox.isolation import CGROUP_CONTROLLERS, CGROUP_ROOT, SandboxConfig
from sandbox.zygote_client import Zygote

ANSWER = "42"
SECRET = "attack-secret-" + uuid.uuid4().hex
LIMITS = dict(
    deadline_s=30.0, memory_limit_bytes=256 << 20, max_pids=64, tmp_size_bytes=16 << 20, file_size_bytes=4 << 20, shm_size_bytes=1 << 20
)
REPO = str(ROOT)
TAG = uuid.uuid4().hex[:12]


class HostSecrets:
    """Files a real user's machine holds that no episode may read, made for real on this host:
    a root-owned 0600 file outside /tmp, one in root's home, one in another user's home, and
    the trainer's checkpoint in this run's directory (inside the project, which is exposed, and
    masked by sandbox.hide as the controller masks its run directory). Plus a file named by
    sandbox.expose, which episodes must be able to read."""

    def __init__(self) -> None:
        self.var_dir = f"/var/lib/areal-attack-{TAG}"
        self.home = f"/home/areal-attack-{TAG}"
        self.run_dir = os.path.join(REPO, "runs", f"areal-attack-{TAG}")
        self.exposed_dir = f"/var/lib/areal-expose-{TAG}"
        self.files = {
            "root_0600": os.path.join(self.var_dir, "credentials"),
            "root_home": f"/root/.areal-attack-{TAG}",
            "user_home": os.path.join(self.home, ".netrc"),
            "checkpoint": os.path.join(self.run_dir, "checkpoints", "step-2", "model.safetensors"),
        }
        self.exposed = os.path.join(self.exposed_dir, "tool-data.txt")
        for path in [*self.files.values(), self.exposed]:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write("secret" if path != self.exposed else "tool data")
        for path in self.files.values():
            os.chmod(path, 0o600)
        os.chown(self.home, 65534, 65534)  # another user's home
        os.chown(self.files["user_home"], 65534, 65534)

    def remove(self) -> None:
        for d in (self.var_dir, self.home, self.run_dir, self.exposed_dir):
            shutil.rmtree(d, ignore_errors=True)
        os.unlink(self.files["root_home"])


class World:
    """Gateway + stand-in engine + zygote, all driven from one background event loop."""

    def __init__(self, tmp: str) -> None:
        self.secrets = HostSecrets()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.tok = AutoTokenizer.from_pretrained(ensure_embedded_model())
        self.generate_calls = 0
        self.gateway_addr = f"ipc://{tmp}/gateway.sock"
        run(self.loop, self._start(tmp))

    async def _start(self, tmp: str) -> None:
        def count() -> None:
            self.generate_calls += 1

        self.engine_runner = await start_instant_engine(self.tok, ANSWER, on_call=count)
        self.engine_port = self.engine_runner.addresses[0][1]
        self.gateway = Gateway(EngineClient(f"http://127.0.0.1:{self.engine_port}"), self.tok)
        ready = asyncio.Event()
        self.zmq_task = asyncio.ensure_future(serve_zmq(self.gateway, self.gateway_addr, ready))
        await ready.wait()
        self.http_runner, http_url = await serve_http(self.gateway)
        self.http_port = int(http_url.rsplit(":", 1)[1])
        with zygote_env(SECRET_TOKEN=SECRET):
            config = SandboxConfig(**LIMITS, expose=[self.secrets.exposed_dir], hide=[self.secrets.run_dir])
            self.zygote = await Zygote.start("sandbox_agents:AttackAgent", self.gateway_addr, config, os.path.join(tmp, "log"))

    async def _stop(self) -> None:
        await self.zygote.close()
        self.zmq_task.cancel()
        await self.http_runner.cleanup()
        await self.engine_runner.cleanup()
        await self.gateway.engine.close()

    def stop(self) -> None:
        run(self.loop, self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.secrets.remove()

    async def episode(self, data: dict, deadline_s: float | None = None, key: str | None = None) -> EpisodeOutcome:
        eid = f"{data['case']}-{uuid.uuid4().hex[:8]}"
        own = key is None
        key = key or self.gateway.open_session(eid)
        try:
            return await self.zygote.run_episode(eid, data, key, deadline_s)
        finally:
            if own:
                self.gateway.close_session(key)

    def attack(self, data: dict, deadline_s: float | None = None) -> EpisodeOutcome:
        """Run the attack and a well-behaved episode at once; check the control and the cleanup."""

        async def both() -> tuple[EpisodeOutcome, EpisodeOutcome]:
            return await asyncio.gather(self.episode(data, deadline_s), self.episode({"case": "well_behaved", "expect": ANSWER}))

        out, good = run(self.loop, both())
        assert (good.status, good.reward) == ("ok", 1.0), good.error
        assert self.zygote.alive and os.path.exists(f"/proc/{self.zygote.ready.pid}")
        assert self.leftovers() == ([], [])
        return out

    def leftovers(self) -> tuple[list[int], list[str]]:
        """Children of the zygote and episode cgroups of this zygote that still exist, other than
        its idle warm slots (exactly ``warm_slots`` of them, each in its own cgroups)."""
        zpid, idle = self.zygote.ready.pid, idle_slots(self.zygote)
        cgroups = []
        for c in CGROUP_CONTROLLERS:
            parent = os.path.join(CGROUP_ROOT, c, "areal")
            if os.path.isdir(parent):
                cgroups += [os.path.join(parent, d) for d in os.listdir(parent) if d.startswith(f"{zpid}-") and d not in idle]
        return busy_children(self.zygote), cgroups


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(str(tmp_path_factory.mktemp("attack")))
    yield w
    w.stop()


def _marker() -> str:
    return f"{7000 + uuid.uuid4().int % 999}.{uuid.uuid4().int % 10**6}"


def test_all_layers_are_on(world):
    assert {"netns", "pidns", "mountns", "readonly_root", "cgroup", "seccomp", "caps"} <= set(world.zygote.ready.isolation)


def test_connect_to_gateway_and_engine_loopback_ports(world):
    calls = world.generate_calls
    out = world.attack({"case": "connect_ports", "ports": [world.http_port, world.engine_port]})
    assert out.status == "error" and "every attempt was blocked" in out.error
    assert f"127.0.0.1:{world.engine_port}: ConnectionRefusedError" in out.error
    assert world.generate_calls == calls + 1  # only the well-behaved episode reached the engine


def test_connect_to_an_outside_address(world):
    out = world.attack({"case": "connect_outside"})
    assert out.status == "error" and "every attempt was blocked" in out.error
    assert f"192.0.2.1:80: OSError errno={errno.ENETUNREACH}" in out.error
    assert "dns example.com: gaierror" in out.error


def test_fork_bomb_stops_at_the_pids_limit(world):
    out = world.attack({"case": "fork_bomb"})
    assert out.status == "error" and "BlockingIOError" in out.error and "Resource temporarily unavailable" in out.error


def test_memory_bomb_is_oom(world):
    out = world.attack({"case": "allocate", "mib": 1024})
    assert out.status == "oom" and out.exit_signal == signal.SIGKILL and "memory limit" in out.error


def test_cpu_spin_past_the_deadline_is_killed(world):
    out = world.attack({"case": "spin"}, deadline_s=2.0)
    assert out.status == "timeout" and "deadline of 2.0s" in out.error


def test_fill_the_disk_hits_the_private_tmpfs_limit(world):
    out = world.attack({"case": "fill_disk"})
    assert out.status == "error" and "No space left on device" in out.error


def test_write_outside_the_temp_dir(world):
    outside = tempfile.mkdtemp(prefix="areal-attack-", dir="/var/tmp")  # writable on the host
    target = os.path.join(outside, "escaped.txt")
    repo_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"escaped-{uuid.uuid4().hex}.txt")
    try:
        out = world.attack({"case": "write_outside", "paths": [target, repo_file, "/etc/areal-escaped"]})
        assert not os.path.exists(target) and not os.path.exists(repo_file)
        assert not os.path.exists("/etc/areal-escaped") and not os.path.exists("/sys/fs/cgroup/pids/areal/escape")
    finally:
        os.rmdir(outside)
    assert out.status == "error" and "every attempt was blocked" in out.error
    # 3 paths, the cgroup dir, /proc/sys: each refused as read-only, or absent from the minimal root
    assert out.error.count("Read-only file system") + out.error.count("No such file or directory") == 5, out.error


def test_read_files_the_run_does_not_expose(world):
    """Root's 0600 file outside /tmp, /etc/shadow, root's home, another user's home, this run's
    checkpoint: all absent from the episode's root (the agent is uid 0 without capabilities, so
    a visible root-owned file would be readable). /root and /home show nothing of their own."""
    secrets = world.secrets
    paths = [*secrets.files.values(), "/etc/shadow", "/etc/gshadow", "/etc/ssh/ssh_host_ed25519_key"]
    for path in paths[:-1]:
        assert os.path.exists(path), path  # the host really holds them
    out = world.attack(
        {"case": "read_files", "paths": paths, "dirs": ["/root", "/home"], "allowed_entries": [".pyenv", ".cache"]}
    )  # the interpreter, the models (as on this host)
    assert out.status == "error" and "every attempt was blocked" in out.error, out.error
    assert out.error.count("FileNotFoundError") == len(paths) + 2, out.error


def test_a_path_named_in_sandbox_expose_is_readable(world):
    out = run(world.loop, world.episode({"case": "read_exposed", "path": world.secrets.exposed, "expect": "tool data"}))
    assert (out.status, out.reward) == ("ok", 1.0), out.error


def test_read_another_process_environ(world):
    assert os.environ.get("SECRET_TOKEN") is None  # the secret lives in the zygote's environment
    out = world.attack({"case": "read_environ", "secret": SECRET, "pids": [world.zygote.ready.pid, os.getpid()]})
    assert out.status == "error" and "every attempt was blocked" in out.error
    assert out.error.count("FileNotFoundError") == 2


def test_signal_the_zygote_or_the_gateway(world):
    pids = [world.zygote.ready.pid, os.getpid()]  # this process runs the gateway
    out = world.attack({"case": "signal_parent", "pids": pids})
    assert out.status == "error" and out.error.count("ProcessLookupError") == 4


def test_open_the_trainers_shared_memory(world):
    name = f"areal-ring-attack-{uuid.uuid4().hex[:8]}"
    shm = shared_memory.SharedMemory(name, create=True, size=4096)
    try:
        shm.buf[:6] = b"secret"
        out = world.attack({"case": "open_shm", "name": name})
    finally:
        shm.close()
        shm.unlink()
    assert out.status == "error" and out.error.count("FileNotFoundError") == 2


def test_ptrace_a_sibling(world):
    marker = _marker()

    async def go() -> tuple[EpisodeOutcome, EpisodeOutcome]:
        sibling = asyncio.ensure_future(world.episode({"case": "sleep_marker", "marker": marker}))
        for _ in range(300):
            if processes_with_arg(marker):
                break
            await asyncio.sleep(0.02)
        [pid] = processes_with_arg(marker)  # the sibling's host pid
        out = await world.episode({"case": "ptrace", "pid": pid})
        os.kill(pid, signal.SIGTERM)  # let the sibling finish now
        return out, await sibling

    out, sibling = run(world.loop, go())
    assert out.status == "error" and "every attempt was blocked" in out.error
    assert "see other episode: FileNotFoundError" in out.error  # the PID namespace hides it
    assert out.error.count("PermissionError errno=1") == 4  # seccomp: ptrace x3, process_vm_readv
    assert (sibling.status, sibling.reward) == ("ok", 1.0), sibling.error
    assert world.leftovers() == ([], [])


def test_daemonised_grandchild_is_not_left_behind(world):
    marker = _marker()
    out = world.attack({"case": "daemonize", "marker": marker})
    assert (out.status, out.reward) == ("ok", 1.0), out.error  # it really started
    assert processes_with_arg(marker) == []


def test_forge_another_sessions_key(world):
    """Forgers spawned before and after a victim guess keys, and search their own memory (a fork
    of the zygote, which read every key) for the victim's."""

    async def go() -> tuple[list[EpisodeOutcome], EpisodeOutcome, list[Any], Any]:
        keys = [world.gateway.open_session(name) for name in ("forger-1", "victim", "forger-2")]
        data = {"case": "forge_key", "other_episode": "victim", "prefix": "sk-areal-"}
        try:
            outs = await asyncio.gather(
                world.episode(data, key=keys[0]),
                world.episode({"case": "well_behaved", "expect": ANSWER}, key=keys[1]),
                world.episode(data, key=keys[2]),
            )
        finally:
            sessions = [world.gateway.close_session(k) for k in keys]
        return [outs[0], outs[2]], outs[1], [sessions[0], sessions[2]], sessions[1]

    forgers, good, forger_sessions, victim = run(world.loop, go())
    for out in forgers:
        assert out.status == "ok", out.error
        assert out.rewards_by_id == {"forged_accepted": 0.0, "own_ok": 1.0, "other_keys_in_memory": 0.0}
    assert (good.status, good.reward) == ("ok", 1.0)
    assert len(victim.interactions) == 1 and [len(s.interactions) for s in forger_sessions] == [1, 1]
    assert world.leftovers() == ([], [])


def test_flood_stdout_and_stderr(world):
    out = world.attack({"case": "flood"})
    assert out.status == "error" and "File too large" in out.error  # the reason, first and whole
    log_path = out.log_tail.split("--- ", 1)[1].split(" ---", 1)[0]
    assert os.path.getsize(log_path) <= LIMITS["file_size_bytes"]
    assert len(out.error) < 16 << 10 and len(out.log_tail) < 16 << 10  # a tail, apart, not the flood
