"""The controller's handle of one zygote process (sandbox/zygote.py): starts it, sends it
SpawnEpisode frames, reads its EpisodeOutcome frames, and turns its death into a "crashed"
outcome for every pending episode.

    controller (Zygote, asyncio or uvloop) ──stdin: SpawnEpisode | Shutdown──► zygote process
                                           ◄─stdout: ZygoteReady, EpisodeOutcome per spawn─┘

Only the zygote writes its stdout (every episode closes its copy before user code, see
sandbox/isolation.py's close_all_fds_but), so a frame that does not decode means a broken
zygote: it is killed, and the reason names the frame.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import msgspec

from areal.process import die_with_parent, log_tail
from areal.protocol import FRAME_HEADER, EpisodeOutcome, Shutdown, SpawnEpisode, ZygoteOutbound, ZygoteReady, frame
from sandbox import isolation, keys
from sandbox.isolation import SandboxConfig

log = logging.getLogger("sandbox.zygote")
WORLD_KEY = "world"  # a row's task directory (sandbox/world.py)
_encoder = msgspec.msgpack.Encoder()


class ZygoteDied(RuntimeError):
    """The zygote process exited before it was ready."""


class Zygote:
    """Controller-side handle of one zygote process (asyncio; one event loop)."""

    def __init__(
        self,
        agent: str,
        gateway_addr: str,
        config: SandboxConfig,
        log_dir: str,
        ready_timeout_s: float = 120.0,
        agent_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not gateway_addr.startswith("ipc:///"):
            # The abstract namespace (ipc://@name) and TCP are per network namespace: unreachable.
            raise ValueError(f"gateway_addr must be ipc:///absolute/path, got {gateway_addr!r}")
        self.agent, self.gateway_addr, self.config, self.log_dir = agent, gateway_addr, config, log_dir
        self.agent_kwargs = dict(agent_kwargs or {})  # the agent class's constructor arguments (JSON values)
        self.ready_timeout_s = ready_timeout_s
        self.ready: ZygoteReady | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[str, asyncio.Future[EpisodeOutcome]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._dead: str = "not started"
        self._bad_frame = ""  # why the control channel was given up, when a frame did not decode
        self._decoder = msgspec.msgpack.Decoder(ZygoteOutbound)
        # Run-time imports of the episodes (EpisodeOutcome.imported), each named once through
        # ``on_warning`` (the controller's console; default: this module's log).
        self.on_warning: Callable[[str], None] = log.warning
        self.run_time_imports: set[str] = set()

    @classmethod
    async def start(
        cls, agent: str, gateway_addr: str, config: SandboxConfig, log_dir: str, agent_kwargs: dict[str, Any] | None = None
    ) -> Zygote:
        """Spawn the zygote (own process group) and wait for ZygoteReady."""
        zygote = cls(agent, gateway_addr, config, log_dir, agent_kwargs=agent_kwargs)
        await zygote._spawn()
        return zygote

    @property
    def alive(self) -> bool:
        return not self._dead

    @property
    def stderr_path(self) -> str:
        return os.path.join(self.log_dir, "zygote.log")

    async def _spawn(self) -> None:
        os.makedirs(self.log_dir, exist_ok=True)
        # The zygote gets the agents' allow-listed environment already (ENV_ALLOW and sandbox.env):
        # an episode inherits the zygote's memory, including the environment block it was exec'd with.
        allowed = {*isolation.ENV_ALLOW, *self.config.env}
        env = dict(os.environ) if "env" in self.config.skip_layers else {k: v for k, v in os.environ.items() if k in allowed}
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # so `sandbox` imports
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        with open(self.stderr_path, "ab") as stderr:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "sandbox.zygote",
                "--agent",
                self.agent,
                "--gateway",
                self.gateway_addr,
                "--config",
                json.dumps(dataclasses.asdict(self.config)),
                "--log-dir",
                self.log_dir,
                "--agent-kwargs",
                json.dumps(self.agent_kwargs),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
                env=env,
                preexec_fn=die_with_parent,
            )
        try:
            first = await asyncio.wait_for(self._read_message(), self.ready_timeout_s)
        except TimeoutError:
            self._kill_group()
            await self._proc.wait()
            raise ZygoteDied(f"zygote not ready after {self.ready_timeout_s}s; stderr tail:\n{self._stderr_tail()}") from None
        if not isinstance(first, ZygoteReady):
            self._kill_group()
            rc = await self._proc.wait()
            raise ZygoteDied(f"zygote for {self.agent} exited (rc={rc}) before it was ready; stderr tail:\n{self._stderr_tail()}")
        self.ready = first
        self._dead = ""
        self._reader = asyncio.create_task(self._read_outcomes())

    def _stderr_tail(self) -> str:
        return log_tail(self.stderr_path, 4096)

    def _kill_group(self) -> None:
        assert self._proc is not None
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    async def _read_message(self) -> ZygoteOutbound | None:
        assert self._proc is not None and self._proc.stdout is not None
        try:
            (n,) = FRAME_HEADER.unpack(await self._proc.stdout.readexactly(4))
            return self._decoder.decode(await self._proc.stdout.readexactly(n))
        except asyncio.IncompleteReadError:
            return None

    async def _read_bad_or_message(self) -> ZygoteOutbound | None:
        """The next message; None at EOF or at a frame that does not decode, which is named in
        the zygote's death (only the zygote writes this channel: a bad frame means it is broken)."""
        try:
            return await self._read_message()
        except msgspec.DecodeError as e:
            self._bad_frame = f"an undecodable frame on the zygote's control channel ({e}); "
            return None

    async def _read_outcomes(self) -> None:
        assert self._proc is not None
        try:
            while (msg := await self._read_bad_or_message()) is not None:
                match msg:
                    case EpisodeOutcome():
                        if msg.imported:
                            self._note_imports(msg.imported)
                        future = self._pending.pop(msg.episode_id, None)
                        if future is not None and not future.done():
                            future.set_result(msg)
                    case ZygoteReady():
                        log.warning("unexpected second ZygoteReady from pid %d", msg.pid)
        finally:  # EOF, or a frame we cannot decode: either way this zygote is finished
            if self._proc.returncode is None:
                self._kill_group()
            rc = await self._proc.wait()
            self._dead = f"{self._bad_frame}the zygote (pid {self._proc.pid}) exited with rc={rc}; stderr tail:\n{self._stderr_tail()}"
            self._fail_pending()

    def _note_imports(self, imported: list[str]) -> None:
        new = [m for m in imported if m not in self.run_time_imports]
        if new:
            self.run_time_imports.update(new)
            listed = ",".join([*self.config.preload, *sorted(self.run_time_imports - set(self.config.preload))])
            self.on_warning(
                f"episodes of {self.agent} import {', '.join(new)} at run time, which the zygote did not preload: every "
                f"episode imports it again (CPU and memory per episode); preload it with sandbox.preload=[{listed}], "
                "or import it at the top of the agent's module"
            )

    def _fail_pending(self) -> None:
        for episode_id, future in self._pending.items():
            if not future.done():  # cancelled by the caller, or already resolved
                future.set_result(EpisodeOutcome(episode_id, "crashed", error=self._dead))
        self._pending.clear()

    async def run_episode(self, episode_id: str, data: dict, api_key: str, deadline_s: float | None = None) -> EpisodeOutcome:
        """Run one sandboxed episode; many may run concurrently. Never raises for agent failures:
        they come back as the outcome's status. If the zygote dies, the outcome is "crashed".
        A row naming a task directory in ``data["world"]`` (sandbox/world.py) runs in its world, and
        is graded: the agent gets the row without that key (the host's path is none of its business)
        and works in /workspace."""
        if self._dead:
            return EpisodeOutcome(episode_id, "crashed", error=f"zygote not running: {self._dead}")
        if episode_id in self._pending:
            raise ValueError(f"episode {episode_id!r} is already running")
        if not api_key.isascii():  # HTTP headers are ASCII; the zygote wipes keys as ASCII bytes
            raise ValueError("api_key must be ASCII")
        if len(api_key) < keys.MIN_SECRET_BYTES:  # the slot masks it, verbatim, in what it sends back
            raise ValueError(f"api_key must be at least {keys.MIN_SECRET_BYTES} characters, got {len(api_key)}")
        assert self._proc is not None and self._proc.stdin is not None
        task_dir = data.get(WORLD_KEY, "")
        if not isinstance(task_dir, str) or (task_dir and not os.path.isabs(task_dir)):
            raise ValueError(f"data[{WORLD_KEY!r}] must be a task directory's absolute path, got {task_dir!r}")
        row = {k: v for k, v in data.items() if k != WORLD_KEY} if task_dir else data
        spawn = SpawnEpisode(
            episode_id,
            json.dumps(row).encode(),
            api_key,
            deadline_s if deadline_s is not None else self.config.deadline_s,
            world=task_dir,
        )
        future: asyncio.Future[EpisodeOutcome] = asyncio.get_running_loop().create_future()
        self._pending[episode_id] = future
        await self._send(spawn)  # if the zygote is dying, _read_outcomes resolves the future as "crashed"
        try:
            return await future
        finally:  # a cancelled caller frees the id; the zygote still ends the episode by its deadline
            if self._pending.get(episode_id) is future:
                del self._pending[episode_id]

    async def _send(self, msg: SpawnEpisode | Shutdown) -> bool:
        """Write one frame to the zygote; False where its pipe is gone (it died, and the death may
        not be reaped yet: a closed transport raises RuntimeError under uvloop, a broken pipe under
        asyncio's own loop)."""
        assert self._proc is not None and self._proc.stdin is not None
        if self._proc.stdin.is_closing():
            return False
        try:
            self._proc.stdin.write(frame(_encoder.encode(msg)))
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            return False
        return True

    async def restart(self) -> None:
        """Replace a dead (or live) zygote with a fresh one; same agent, gateway and config."""
        await self.close()
        await self._spawn()

    async def close(self) -> None:
        """Ask the zygote to shut down (it kills its episodes); SIGKILL its group after 10 s."""
        if self._proc is None:
            return
        if self._proc.returncode is None and self._proc.stdin is not None:
            try:
                if await self._send(Shutdown()):
                    self._proc.stdin.close()
                    await asyncio.wait_for(self._proc.wait(), 10.0)
                else:
                    self._kill_group()
            except TimeoutError:
                self._kill_group()
        await self._proc.wait()
        if self._reader is not None:
            await self._reader  # resolves whatever is still pending
        self._dead = self._dead or "closed"
