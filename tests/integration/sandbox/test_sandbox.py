"""The sandbox, end to end: a real zygote subprocess, real forks and namespaces, real ZeroMQ.

A stand-in gateway (a real ROUTER socket on an ipc:// path, speaking the real wire format)
answers every GatewayRequest with an OpenAI chat completion whose content echoes the request's
Authorization header, streamed in several ``more=True`` chunks when the request asks for it.
One zygote (tests/support/sandbox_agents.py:ProbeAgent) serves most tests from a background event loop.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq
from paths import ROOT, SUPPORT
from run_checks import run_in_repo
from zygote_harness import busy_children, loop_thread, processes_with_arg, run, zygote_env

from areal.protocol import EpisodeOutcome, GatewayReply, GatewayRequest
from sandbox import isolation
from sandbox.isolation import ENV_ALLOW, SET_PER_EPISODE, SandboxConfig
from sandbox.zygote_client import Zygote

KEY = "sk-session-test-123"


class FakeGateway:
    """ROUTER on ipc://; records (path, headers) of every request."""

    def __init__(self, path: str) -> None:
        self.addr = f"ipc://{path}"
        self.seen: list[tuple[str, dict[str, str]]] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _serve(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.bind(self.addr)
        self._ready.set()
        decoder, encoder = msgspec.msgpack.Decoder(GatewayRequest), msgspec.msgpack.Encoder()
        while not self._stop.is_set():
            if not sock.poll(50):
                continue
            ident, payload = sock.recv_multipart()
            req = decoder.decode(payload)
            self.seen.append((req.path, req.headers))
            content = "key=" + req.headers.get("authorization", "")
            if json.loads(req.body or b"{}").get("stream"):
                for i, reply in enumerate(_stream_replies(req.request_id, content)):
                    sock.send_multipart([ident, encoder.encode(reply)])
            else:
                body = json.dumps(
                    {
                        "id": "c1",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "m",
                        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                )
                reply = GatewayReply(req.request_id, 200, {"content-type": "application/json"}, body.encode())
                sock.send_multipart([ident, encoder.encode(reply)])
        sock.close(0)
        ctx.term()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _stream_replies(request_id: int, content: str) -> list[GatewayReply]:
    def event(delta: dict) -> bytes:
        chunk = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
        return f"data: {json.dumps(chunk)}\n\n".encode()

    half = len(content) // 2
    bodies = [event({"role": "assistant", "content": content[:half]}), event({"content": content[half:]}), b"data: [DONE]\n\n"]
    headers = {"content-type": "text/event-stream"}
    return [GatewayReply(request_id, 200, headers, b, more=i < len(bodies) - 1) for i, b in enumerate(bodies)]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGateway]:
    gw = FakeGateway(str(tmp_path_factory.mktemp("gw") / "gateway.sock"))
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    with loop_thread() as loop:
        yield loop


@pytest.fixture(scope="module")
def zygote(loop, gateway, tmp_path_factory) -> Iterator[Zygote]:
    config = SandboxConfig(deadline_s=30.0, memory_limit_bytes=256 << 20)
    # SECRET_TOKEN is inherited by the zygote and must not reach the agents; a private venv's
    # location must (a verifiers or mini-swe-agent episode runs that venv's interpreter).
    with zygote_env(SECRET_TOKEN="do-not-leak", AREAL_MINI_SWE_VENV="/opt/mini-swe-venv"):
        z = run(loop, Zygote.start("sandbox_agents:ProbeAgent", gateway.addr, config, str(tmp_path_factory.mktemp("zlog"))))
    yield z
    run(loop, z.close())


def episode(loop, zygote: Zygote, data: dict, deadline_s: float | None = None) -> EpisodeOutcome:
    eid = f"{data['case']}-{uuid.uuid4().hex[:8]}"
    out = run(loop, zygote.run_episode(eid, data, KEY, deadline_s))
    assert out.episode_id == eid
    return out


def test_ready_reports_all_layers(zygote):
    assert {"netns", "pidns", "mountns", "cgroup", "rlimits", "env", "caps", "readonly_root", "seccomp"} <= set(zygote.ready.isolation)
    assert zygote.ready.warnings == []
    # As root the user namespace is not used (sandbox/isolation.py says why), and not warned about.
    assert ("userns" in zygote.ready.isolation) == (os.geteuid() != 0)


def test_returns_float(loop, zygote):
    out = episode(loop, zygote, {"case": "reward", "value": 0.75})
    assert (out.status, out.reward, out.error) == ("ok", 0.75, ""), out.error


def test_returns_dict(loop, zygote):
    out = episode(loop, zygote, {"case": "rewards"})
    assert out.status == "ok" and out.reward is None
    assert out.rewards_by_id == {"a": 1.0, "b": 0.25}


def test_raise_is_error_with_traceback(loop, zygote):
    out = episode(loop, zygote, {"case": "raises", "tag": "tag-42"})
    assert out.status == "error"
    assert "Traceback" in out.error and "ValueError: agent failed on purpose tag-42" in out.error


def test_deadline_kills_every_process_even_one_that_called_setsid(loop, zygote):
    marker = f"{9000 + int(uuid.uuid4().int % 999)}.{uuid.uuid4().int % 10**6}"
    future = asyncio.run_coroutine_threadsafe(
        zygote.run_episode("sleeper", {"case": "sleep_forever", "marker": marker}, KEY, deadline_s=4.0), loop
    )
    for _ in range(200):  # the grandchild must exist before the deadline, or the test proves nothing
        if processes_with_arg(marker):
            break
        time.sleep(0.02)
    assert processes_with_arg(marker), "the agent's grandchild never started"
    out = future.result(60)
    assert out.status == "timeout" and "deadline" in out.error
    assert processes_with_arg(marker) == []
    assert busy_children(zygote) == []


def test_deadline_ends_an_agent_that_blocks_its_event_loop(loop, zygote):
    out = episode(loop, zygote, {"case": "block_loop"}, deadline_s=1.0)
    assert out.status == "timeout"


def test_segfault_is_crashed_with_signal_and_zygote_serves_next(loop, zygote):
    out = episode(loop, zygote, {"case": "segfault"})
    assert out.status == "crashed" and out.exit_signal == signal.SIGSEGV
    assert "SIGSEGV" in out.error
    assert episode(loop, zygote, {"case": "reward", "value": 3}).reward == 3.0


def test_openai_sdk_from_environment_through_relay(loop, zygote, gateway):
    out = episode(loop, zygote, {"case": "openai_env", "expect": f"key=Bearer {KEY}"})
    assert out.status == "ok", out.error
    assert out.rewards_by_id == {"matched": 1.0}
    assert out.imported == [], out.imported  # the relay's server, set up on this first request, is preloaded
    path, headers = gateway.seen[-1]
    assert path == f"/sessions/{KEY}/v1/chat/completions" and headers["authorization"] == f"Bearer {KEY}"


def test_openai_sdk_with_handed_http_client(loop, zygote, gateway):
    before = len(gateway.seen)
    out = episode(loop, zygote, {"case": "openai_http_client", "expect": f"key=Bearer {KEY}"})
    assert out.status == "ok", out.error
    assert out.rewards_by_id == {"matched": 1.0}
    assert len(gateway.seen) == before + 1 and gateway.seen[-1][1]["authorization"] == f"Bearer {KEY}"


def test_streamed_reply_through_relay_and_zmq_transport(loop, zygote):
    out = episode(loop, zygote, {"case": "openai_stream", "expect": f"key=Bearer {KEY}"})
    assert out.status == "ok", out.error
    assert out.rewards_by_id == {"relay": 1.0, "zmq": 1.0}
    assert out.imported == [], out.imported


def test_a_sync_client_of_the_agents_own_goes_straight_to_the_gateway(loop, zygote, gateway):
    """openai.OpenAI() from the environment: its calls (plain, streamed, from another thread) reach
    the gateway over ZeroMQ (relay.SyncZmqTransport), the loopback relay never set up."""
    before = len(gateway.seen)
    out = episode(loop, zygote, {"case": "openai_sync", "expect": f"key=Bearer {KEY}"})
    assert out.status == "ok", (out.error, out.log_tail)
    assert out.rewards_by_id == {"plain": 1.0, "stream": 1.0, "thread": 1.0, "direct": 1.0}
    assert len(gateway.seen) == before + 3
    assert all(path == f"/sessions/{KEY}/v1/chat/completions" for path, _ in gateway.seen[before:])


def test_agent_cannot_reach_host_loopback(loop, zygote):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        out = episode(loop, zygote, {"case": "connect_host", "port": listener.getsockname()[1]})
        assert out.status == "ok" and out.reward == 0.0  # connect failed inside the sandbox
        with pytest.raises(BlockingIOError):
            listener.accept()  # and nothing arrived on the host side


def test_environment_is_scrubbed(loop, zygote):
    out = episode(loop, zygote, {"case": "environment"})
    names = set(out.rewards_by_id)
    assert "SECRET_TOKEN" not in names
    assert {"OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "HOME", "AREAL_MINI_SWE_VENV"} <= names
    assert names <= set(ENV_ALLOW) | set(SET_PER_EPISODE)


def test_pid_namespace_and_private_tmp(loop, zygote, tmp_path):
    host_file = tmp_path / "host-secret.txt"  # pytest's tmp_path lives under the host's /tmp
    host_file.write_text("secret")
    out = episode(loop, zygote, {"case": "identity", "host_file": str(host_file)})
    assert out.status == "ok", out.error
    r = out.rewards_by_id
    assert r["pid"] == 1.0 and r["visible_pids"] < 10  # fresh /proc: only the agent's own processes
    assert r["host_file_visible"] == 0.0 and r["tmp_writable"] == 1.0


def test_root_in_sandbox_cannot_unmount_private_tmp(loop, zygote):
    out = episode(loop, zygote, {"case": "remount"})
    assert out.status == "ok" and out.reward == 0.0


def test_memory_limit_is_oom(loop, zygote):
    out = episode(loop, zygote, {"case": "allocate", "mib": 512})
    assert out.status == "oom" and out.exit_signal == signal.SIGKILL, out.error


def test_16_concurrent_episodes_each_get_their_outcome(loop, zygote):
    async def many() -> list[EpisodeOutcome]:
        return await asyncio.gather(*(zygote.run_episode(f"c{i}", {"case": "reward", "value": i}, KEY) for i in range(16)))

    outs = run(loop, many())
    assert [(o.episode_id, o.status, o.reward) for o in outs] == [(f"c{i}", "ok", float(i)) for i in range(16)]


def test_spawn_larger_than_a_pipe_reaches_its_warm_slot(loop, zygote):
    """A SpawnEpisode frame beyond the pipe's 64 KiB is written as the slot reads it."""
    pad = "x" * (1 << 20)
    out = episode(loop, zygote, {"case": "data_size", "pad": pad})
    assert (out.status, out.error) == ("ok", ""), out.error
    assert out.reward == len(json.dumps({"case": "data_size", "pad": pad}))


@pytest.mark.parametrize(
    ("preload", "expected"),
    [(None, {"openai": 1.0, "anthropic": 1.0, "wave": 0.0}), (["openai"], {"openai": 1.0, "anthropic": 0.0, "wave": 0.0})],
    ids=["default", "openai only"],
)
def test_zygote_preloads_the_listed_modules_and_the_agents_imports_only(gateway, tmp_path, preload, expected):
    """What every episode forks: sandbox.preload (default openai, anthropic) and what the agent's
    module imports (tests/support/sandbox_agents.py imports openai), not every module installed."""
    config = SandboxConfig() if preload is None else SandboxConfig(preload=preload)

    async def go() -> dict[str, float]:
        with zygote_env():
            z = await Zygote.start("sandbox_agents:module_loaded_agent", gateway.addr, config, str(tmp_path))
        try:
            out = {m: await z.run_episode(f"m-{m}", {"module": m}, KEY) for m in expected}
        finally:
            await z.close()
        assert all(o.status == "ok" and not o.imported for o in out.values()), out
        return {m: o.reward for m, o in out.items()}

    assert asyncio.run(go()) == expected


def test_modules_episodes_import_at_run_time_are_reported_and_named_once(gateway, tmp_path):
    """An agent importing a module inside run() makes every episode import it again: the outcome
    says which (EpisodeOutcome.imported), the zygote's handle names it once, with the preload
    key that fixes it; listed in sandbox.preload, the episodes import nothing."""
    warned: list[str] = []

    async def go(config: SandboxConfig) -> list[EpisodeOutcome]:
        with zygote_env():
            z = await Zygote.start("sandbox_agents:lazy_import_agent", gateway.addr, config, str(tmp_path))
        z.on_warning = warned.append
        try:
            return [await z.run_episode(f"lazy-{i}", {"module": "wave"}, KEY) for i in range(3)]
        finally:
            await z.close()

    lazy = asyncio.run(go(SandboxConfig()))
    assert [(o.status, o.imported) for o in lazy] == [("ok", ["wave"])] * 3
    assert len(warned) == 1 and "wave" in warned[0] and "sandbox.preload=[openai,anthropic,wave]" in warned[0], warned
    preloaded = asyncio.run(go(SandboxConfig(preload=["openai", "wave"])))
    assert [(o.status, o.imported) for o in preloaded] == [("ok", [])] * 3
    assert len(warned) == 1


def test_preload_entries_must_be_module_names():
    with pytest.raises(ValueError, match="sandbox.preload"):
        SandboxConfig(preload=["anthropic", "not a module"])


def test_sandbox_env_passes_the_named_variables_and_no_other(gateway, tmp_path):
    """sandbox.env: a variable of the controller's environment the user names reaches every
    episode (the zygote is exec'd with it, the episode's scrub keeps it); the others stay out."""
    names = ["AREAL_TEST_TOOL_TOKEN", "SECRET_TOKEN"]

    async def go() -> EpisodeOutcome:
        with zygote_env(AREAL_TEST_TOOL_TOKEN="tool-token-1", SECRET_TOKEN="do-not-leak"):
            z = await Zygote.start("sandbox_agents:ProbeAgent", gateway.addr, SandboxConfig(env=names[:1]), str(tmp_path))
        try:
            return await z.run_episode("env", {"case": "environment_values", "names": names}, KEY)
        finally:
            await z.close()

    out = asyncio.run(go())
    assert out.status == "ok", out.error
    assert set(out.rewards_by_id) == {"AREAL_TEST_TOOL_TOKEN=tool-token-1", "SECRET_TOKEN=None"}


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["TOOL-TOKEN"], "sandbox.env entries must be environment variable names"),
        (["1ST"], "sandbox.env entries"),
        (["OPENAI_API_KEY"], "sandbox.env cannot pass ['OPENAI_API_KEY']"),
        (["HOME"], "the sandbox sets them"),
    ],
)
def test_sandbox_env_entries_must_be_names_the_sandbox_does_not_set(names, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SandboxConfig(env=names)


def test_warm_slots_must_not_be_negative():
    with pytest.raises(ValueError, match="warm_slots"):
        SandboxConfig(warm_slots=-1)


def test_async_function_agent_without_warm_slots(gateway, tmp_path):
    """warm_slots=0: every spawn forks a slot and hands it the spawn at once."""

    async def go() -> EpisodeOutcome:
        with zygote_env():
            z = await Zygote.start("sandbox_agents:function_agent", gateway.addr, SandboxConfig(warm_slots=0), str(tmp_path))
        try:
            return await z.run_episode("f", {}, KEY)
        finally:
            await z.close()

    out = asyncio.run(go())
    assert (out.status, out.reward) == ("ok", 2.5)


def test_zygote_death_resolves_pending_as_crashed_and_restart_works(gateway, tmp_path):
    marker = f"{8000 + int(uuid.uuid4().int % 999)}.{uuid.uuid4().int % 10**6}"

    async def go() -> tuple[EpisodeOutcome, list[int], EpisodeOutcome]:
        with zygote_env():
            z = await Zygote.start("sandbox_agents:ProbeAgent", gateway.addr, SandboxConfig(), str(tmp_path))
        pending = asyncio.create_task(z.run_episode("p", {"case": "sleep_forever", "marker": marker}, KEY))
        for _ in range(200):
            if processes_with_arg(marker):
                break
            await asyncio.sleep(0.02)
        os.kill(z.ready.pid, signal.SIGKILL)
        crashed = await pending
        for _ in range(200):  # episodes die with their zygote (parent-death signal)
            if not processes_with_arg(marker):
                break
            await asyncio.sleep(0.02)
        left = processes_with_arg(marker)
        with zygote_env():
            await z.restart()
        try:
            return crashed, left, await z.run_episode("q", {"case": "reward", "value": 1}, KEY)
        finally:
            await z.close()

    crashed, left, after = asyncio.run(go())
    assert crashed.status == "crashed" and "zygote" in crashed.error and "rc=-9" in crashed.error
    assert left == []
    assert (after.status, after.reward) == ("ok", 1.0)


def test_a_zygote_whose_pipe_closed_before_its_death_was_reaped_fails_episodes_and_closes(gateway, tmp_path):
    """Under uvloop a write to a closed pipe raises RuntimeError (not BrokenPipeError): a zygote
    killed between the pipe's close and the reaping of its exit must still give "crashed" outcomes
    and a clean close (a Ray worker stopping after its zygote was killed)."""
    import uvloop

    async def go() -> EpisodeOutcome:
        with zygote_env():
            z = await Zygote.start("sandbox_agents:ProbeAgent", gateway.addr, SandboxConfig(), str(tmp_path))
        assert z._proc is not None and z._proc.stdin is not None
        z._proc.stdin.close()  # the transport closed; the zygote has not exited yet
        await asyncio.sleep(0.01)  # uvloop finishes the close on a later turn of the loop
        try:
            return await z.run_episode("p", {"case": "reward", "value": 1}, KEY)
        finally:
            await z.close()

    out = uvloop.run(go())
    assert out.status == "crashed" and "zygote" in out.error


def test_skipped_layers_are_warned_and_episodes_fall_back(gateway, tmp_path):
    skipped = ["netns", "pidns", "mountns", "cgroup", "caps"]
    temp_root = tmp_path / "roots"
    temp_root.mkdir()
    host_file = tmp_path / "visible.txt"
    host_file.write_text("x")

    async def go() -> tuple[Zygote, EpisodeOutcome, EpisodeOutcome, EpisodeOutcome]:
        with zygote_env():
            z = await Zygote.start(
                "sandbox_agents:ProbeAgent",
                gateway.addr,
                SandboxConfig(skip_layers=skipped, temp_root=str(temp_root)),
                str(tmp_path / "log"),
            )
        try:
            chat = await z.run_episode("chat", {"case": "openai_env", "expect": f"key=Bearer {KEY}"}, KEY)
            ident = await z.run_episode("id", {"case": "identity", "host_file": str(host_file)}, KEY)
            # Positive control for test_agent_cannot_reach_host_loopback: without netns it connects.
            with socket.socket() as listener:
                listener.bind(("127.0.0.1", 0))
                listener.listen()
                port = listener.getsockname()[1]
                reach = await z.run_episode("net", {"case": "connect_host", "port": port}, KEY)
        finally:
            await z.close()
        return z, chat, ident, reach

    z, chat, ident, reach = asyncio.run(go())
    assert reach.reward == 1.0
    assert sorted(w.split(":")[0] for w in z.ready.warnings) == sorted(skipped + ["readonly_root"])
    assert not set(skipped) & set(z.ready.isolation)
    assert chat.rewards_by_id == {"matched": 1.0}  # the relay works on the host's loopback too
    assert ident.rewards_by_id["pid"] != 1.0 and ident.rewards_by_id["host_file_visible"] == 1.0
    assert ident.rewards_by_id["tmp_writable"] == 1.0
    assert list(temp_root.iterdir()) == []  # the per-episode temp dirs were removed


def test_code_under_tmp_stays_importable_in_the_private_tmp(gateway, monkeypatch):
    """A checkout or venv under /tmp (as in CI) is bound back in read-only, so lazy imports work."""
    code_dir = tempfile.mkdtemp(prefix="areal-code-", dir="/tmp")
    with open(os.path.join(code_dir, "lazy_mod_for_sandbox.py"), "w") as f:
        f.write("VALUE = 7\n")

    monkeypatch.setenv("PYTHONPATH", code_dir)  # zygote_env puts tests/support in front of it

    async def go() -> tuple[EpisodeOutcome, EpisodeOutcome]:
        with zygote_env():
            z = await Zygote.start("sandbox_agents:ProbeAgent", gateway.addr, SandboxConfig(), code_dir)
        try:
            ok = await z.run_episode("lazy", {"case": "lazy_import", "module": "lazy_mod_for_sandbox"}, KEY)
            write = await z.run_episode("ro", {"case": "write_file", "path": os.path.join(code_dir, "lazy_mod_for_sandbox.py")}, KEY)
            return ok, write
        finally:
            await z.close()

    try:
        ok, write = asyncio.run(go())
        assert open(os.path.join(code_dir, "lazy_mod_for_sandbox.py")).read() == "VALUE = 7\n"
    finally:
        shutil.rmtree(code_dir, ignore_errors=True)
    assert (ok.status, ok.reward) == ("ok", 7.0), ok.error
    assert write.status == "error" and "Read-only file system" in write.error


def test_shell_script_agent_calls_curl_through_the_relay(gateway, tmp_path):
    """A non-Python agent (exec:agents/shell_agent.sh): curl to $OPENAI_BASE_URL, reward on stdout."""

    async def go() -> tuple[EpisodeOutcome, EpisodeOutcome]:
        with zygote_env():
            z = await Zygote.start("exec:agents/shell_agent.sh", gateway.addr, SandboxConfig(), str(tmp_path))
        try:
            right = await z.run_episode("sh1", {"question": "hi", "answer": f"key=Bearer {KEY}"}, KEY)
            wrong = await z.run_episode("sh2", {"question": "hi", "answer": "something else"}, KEY)
            return right, wrong
        finally:
            await z.close()

    before = len(gateway.seen)
    right, wrong = asyncio.run(go())
    assert (right.status, right.reward) == ("ok", 1.0), right.error
    assert (wrong.status, wrong.reward) == ("ok", 0.0), wrong.error
    assert len(gateway.seen) == before + 2
    path, headers = gateway.seen[-1]
    assert path == f"/sessions/{KEY}/v1/chat/completions" and headers["authorization"] == f"Bearer {KEY}"
    assert headers["user-agent"].startswith("curl/")


NOBODY = 65534
# Run as the unprivileged user: start a real Zygote, run the given episodes, print what it saw as JSON.
_UNPRIVILEGED_CONTROLLER = """
import asyncio, json, os, sys
from sandbox.isolation import SandboxConfig
from sandbox.zygote_client import Zygote
from paths import ROOT, SUPPORT
from zygote_harness import busy_children, children_of, processes_with_arg, run, zygote_env

async def main():
    gateway, log_dir, skip, episodes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    config = SandboxConfig(deadline_s=30.0, warm_slots=1, skip_layers=skip)
    z = await Zygote.start("sandbox_agents:ProbeAgent", gateway, config, log_dir)
    try:
        zygote_uid = os.stat(f"/proc/{z.ready.pid}").st_uid
        outs = [await z.run_episode(f"e{i}", data, sys.argv[5]) for i, data in enumerate(episodes)]
    finally:
        await z.close()
    print(json.dumps({"controller_uid": os.getuid(), "zygote_uid": zygote_uid, "isolation": z.ready.isolation,
                      "warnings": z.ready.warnings, "outcomes": [
                          {"status": o.status, "error": o.error, "agent": o.rewards_by_id} for o in outs]}))

asyncio.run(main())
"""


def _as_user(uid: int) -> dict[str, Any]:
    """subprocess keyword arguments that run the child as ``uid`` (its gid too, no other groups)."""
    return {"user": uid, "group": uid, "extra_groups": []} if os.geteuid() == 0 else {}


def _runs_as(python: str, uid: int, code: str, *args: str) -> subprocess.CompletedProcess | None:
    """Run ``python -c code args...`` as ``uid`` with the project importable; None if it cannot be executed."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join([str(ROOT), str(SUPPORT)])}
    try:
        return subprocess.run([python, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120, cwd="/", **_as_user(uid))
    except PermissionError:  # the interpreter's path is not searchable by that user
        return None


def _python_for(uid: int, scratch: str) -> str:
    """An interpreter ``uid`` can run with this project's packages.

    Ours when the user can reach it. When it lives where the user cannot (here the venv links to
    /root/.pyenv, mode 0700), a venv made in ``scratch`` over the system interpreter of the same
    version, whose site-packages adds ours: the same packages and project code, all world-readable.
    """
    check = "import msgspec, zmq, httpx, openai, aiohttp, sandbox.zygote, sandbox_agents"
    done = _runs_as(sys.executable, uid, check)
    if done is not None and done.returncode == 0:
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base = shutil.which(version, path="/usr/local/bin:/usr/bin")
    if base is None:
        pytest.skip(f"uid {uid} cannot run {sys.executable} ({done.stderr[-300:] if done else 'EACCES'}) and there is no system {version}")
    venv = os.path.join(scratch, "venv")
    site_dir = os.path.join(venv, "lib", version, "site-packages")
    os.makedirs(site_dir)
    os.makedirs(os.path.join(venv, "bin"))
    os.symlink(base, os.path.join(venv, "bin", "python"))
    with open(os.path.join(venv, "pyvenv.cfg"), "w") as f:
        f.write(f"home = {os.path.dirname(base)}\ninclude-system-site-packages = false\n")
    with open(os.path.join(site_dir, "areal_venv.pth"), "w") as f:  # addsitedir: its own .pth files too
        f.write(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    python = os.path.join(venv, "bin", "python")
    done = _runs_as(python, uid, check)
    if done is None or done.returncode != 0:
        pytest.skip(
            f"uid {uid} cannot import the project with {sys.executable} nor with {base}: {done.stderr[-500:] if done else 'EACCES'}"
        )
    return python


def _userns_sysctls() -> str:
    values = []
    for path in (
        "/proc/sys/kernel/unprivileged_userns_clone",
        "/proc/sys/user/max_user_namespaces",
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
    ):
        if os.path.exists(path):
            values.append(f"{path}={open(path).read().strip()}")
    return ", ".join(values) or "none of the userns sysctls exist"


@pytest.fixture(scope="module")
def unprivileged() -> Iterator[Any]:
    """Runs a Zygote as nobody (or as this user when not root) against a gateway it can reach;
    skips, saying why, when that user cannot run the project or the kernel refuses it a user
    namespace. Yields ``run(skip_layers) -> (uid, report)``: episodes "namespaces" (with a host
    port to reach), "openai_env" (a chat through the relay) and "identity" (with a host file)."""
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    scratch = tempfile.mkdtemp(prefix="areal-userns-", dir="/tmp")  # pytest's tmp_path is root-only (0700)
    try:
        os.chmod(scratch, 0o755)
        python = _python_for(uid, scratch)
        unshare = (
            "import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
            "sys.exit(0 if libc.unshare(0x10000000) == 0 else os.strerror(ctypes.get_errno()))"
        )
        refused = _runs_as(python, uid, unshare)
        if refused is not None and refused.returncode != 0:
            pytest.skip(f"the kernel refuses unprivileged user namespaces to uid {uid} ({refused.stderr.strip()}); {_userns_sysctls()}")
        gw = FakeGateway(os.path.join(scratch, "gateway.sock"))
        os.chmod(os.path.join(scratch, "gateway.sock"), 0o666)  # connecting needs write permission

        def run(skip_layers: list[str]) -> tuple[int, dict[str, Any]]:
            work = tempfile.mkdtemp(dir=scratch)  # the user's: zygote log and episode logs
            os.chmod(work, 0o755)
            os.chown(work, uid, uid)
            host_file = os.path.join(scratch, "host-file.txt")
            open(host_file, "w").close()
            with socket.socket() as listener:
                listener.bind(("127.0.0.1", 0))
                listener.listen()
                listener.setblocking(False)
                episodes = [
                    {"case": "namespaces", "port": listener.getsockname()[1]},
                    {"case": "openai_env", "expect": f"key=Bearer {KEY}"},
                    {"case": "identity", "host_file": host_file},
                ]
                done = _runs_as(python, uid, _UNPRIVILEGED_CONTROLLER, gw.addr, work, json.dumps(skip_layers), json.dumps(episodes), KEY)
                assert done is not None and done.returncode == 0, done and (done.stdout, done.stderr)
                report = json.loads(done.stdout.splitlines()[-1])
                try:  # did the agent's connection reach the host side?
                    listener.accept()[0].close()
                    report["host_accepted"] = True
                except BlockingIOError:
                    report["host_accepted"] = False
            return uid, report

        try:
            yield run
        finally:
            gw.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_unprivileged_zygote_uses_a_user_namespace_for_the_other_namespaces(unprivileged):
    """A zygote started as nobody: each episode is uid 0 in its own user namespace (nobody
    outside), which lets it create its network, mount and PID namespaces; the root-only cgroup
    layer is warned about by name."""
    uid, report = unprivileged([])
    assert report["controller_uid"] == uid and report["zygote_uid"] == uid
    assert {"userns", "netns", "mountns", "pidns", "readonly_root", "caps", "no_new_privs"} <= set(report["isolation"])
    assert "cgroup" not in report["isolation"]
    assert [w.split(":")[0] for w in report["warnings"]] == ["cgroup"], report["warnings"]
    assert [(o["status"], o["error"]) for o in report["outcomes"]] == [("ok", "")] * 3, report["outcomes"]
    agent, chat, ident = (o["agent"] for o in report["outcomes"])
    for ns in ("user", "net", "mnt", "pid"):
        assert agent[f"ns_{ns}"] != os.stat(f"/proc/self/ns/{ns}").st_ino, ns  # not the host's namespace
    assert (agent["uid"], agent["uid_map_inside"], agent["uid_map_outside"]) == (0, 0, uid)
    assert (agent["interfaces"], agent["only_loopback"]) == (1, 1)
    assert (agent["host_port_reached"], agent["outside_reached"], report["host_accepted"]) == (0, 0, False)
    assert chat == {"matched": 1.0}  # the gateway's ipc:// socket, bound into the namespace, still works
    assert (ident["pid"], ident["host_file_visible"], ident["tmp_writable"]) == (1, 0, 1)


def test_unprivileged_zygote_without_userns_warns_for_each_namespace_and_still_runs(unprivileged):
    """Control: the same user with the userns layer skipped cannot create the namespaces; each
    missing layer is warned about by name (the probe applies no skipped layer) and the episode
    runs in the host's namespaces."""
    uid, report = unprivileged(["userns"])
    warned = [w.split(":")[0] for w in report["warnings"]]
    assert {"userns", "netns", "mountns", "pidns", "cgroup"} <= set(warned), report["warnings"]
    assert not {"userns", "netns", "mountns", "pidns"} & set(report["isolation"])
    assert [(o["status"], o["error"]) for o in report["outcomes"]] == [("ok", "")] * 3, report["outcomes"]
    agent, chat, ident = (o["agent"] for o in report["outcomes"])
    for ns in ("user", "net", "mnt", "pid"):
        assert agent[f"ns_{ns}"] == os.stat(f"/proc/self/ns/{ns}").st_ino, ns
    assert agent["uid"] == uid  # not mapped: the same user inside and outside
    assert agent["host_port_reached"] == 1 and report["host_accepted"]  # the host's network
    assert chat == {"matched": 1.0}
    assert ident["pid"] != 1 and ident["host_file_visible"] == 1 and ident["tmp_writable"] == 1


def test_anthropic_imported_after_the_bridge_install_takes_a_handed_client():
    """A zygote that does not preload anthropic installs the httpx2 bridge before anthropic
    exists in the process: an agent importing anthropic inside run() still gets a working client
    from the handed httpx one (the bridge wraps the SDK when it is imported)."""
    code = """
import sys, asyncio, httpx
from areal.agent.spec import hand_out
hand_out(httpx.AsyncClient())  # installs the bridge, as the zygote's warm-up does
assert "anthropic" not in sys.modules, "install() imported anthropic"
import anthropic

def reply(request):
    return httpx.Response(200, json={"id": "m", "type": "message", "role": "assistant", "model": "m",
        "stop_reason": "end_turn", "content": [{"type": "text", "text": "ok:" + request.url.path}],
        "usage": {"input_tokens": 1, "output_tokens": 1}})

async def main():
    handed = hand_out(httpx.AsyncClient(transport=httpx.MockTransport(reply)))
    claude = anthropic.AsyncAnthropic(base_url="http://gw", api_key="k", http_client=handed)
    out = await claude.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    print(out.content[0].text)

asyncio.run(main())
"""
    done = run_in_repo([sys.executable, "-c", code], timeout_s=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok:/v1/messages"


_V2_PROBE = r"""
import json, sys, tempfile, subprocess
from sandbox import isolation
root = tempfile.mkdtemp()
subprocess.run(["mount", "-t", "cgroup2", "none", root], check=True)
isolation.CGROUP_ROOT = root
available, warnings = isolation.probe(isolation.SandboxConfig())
print(json.dumps({"available": available, "warnings": warnings}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="mounts a cgroup2 hierarchy: needs root and unshare")
def test_a_cgroup_v2_host_skips_the_cgroup_layer_at_the_probe():
    """On a cgroup v2 hierarchy a v1 path is a nested v2 group: creating it succeeds, writing its
    v1 limit is refused (EACCES). The probe tries what each episode will do, so the layer is
    skipped with a warning once, instead of every episode failing at its preparation."""
    cmd = ["unshare", "-m", "--propagation", "private", sys.executable, "-c", _V2_PROBE]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "cgroup" not in report["available"] and "rlimits" in report["available"]
    assert any(w.startswith("cgroup: not available") and "no cgroup v1 memory hierarchy" in w for w in report["warnings"])


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/sys/fs/cgroup/memory"), reason="creates cgroup v1 groups: needs root")
def test_the_stale_cgroup_sweep_survives_a_group_removed_under_it(monkeypatch):
    """Zygotes of parallel runs sweep the same parent: a group another sweep removes between this
    sweep's listing and its read (ENOENT, or ENODEV mid-removal) is skipped, not a crash of the
    zygote at its start. Group names carry a pid above any pid_max, so their owner is gone."""
    name = f"{2**22 + 1}-{os.getpid()}-sweep"
    made = []
    for c in isolation.CGROUP_CONTROLLERS:
        d = os.path.join(isolation.CGROUP_ROOT, c, "areal", name)
        os.makedirs(d)
        made.append(d)
    real_open = open

    def removed_meanwhile(path, *a, **kw):
        if name in str(path):
            os.rmdir(os.path.dirname(path))  # the other sweep wins the race
            raise OSError(errno.ENODEV, "No such device", path)
        return real_open(path, *a, **kw)

    try:
        monkeypatch.setattr(isolation, "open", removed_meanwhile, raising=False)
        assert [d for d in isolation.sweep_stale_cgroups() if name in d] == []
        assert not any(os.path.exists(d) for d in made)
        for d in made:  # and an undisturbed sweep removes a stale group itself
            os.makedirs(d)
        monkeypatch.undo()
        assert sorted(d for d in isolation.sweep_stale_cgroups() if name in d) == sorted(made)
    finally:
        for d in made:
            if os.path.isdir(d):
                os.rmdir(d)
