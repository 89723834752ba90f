"""Starting inference servers as subprocesses, and waiting until they serve.

    spawn(argv, log) ─► a subprocess in its own session (process group), output to its log,
                        killed with its parent (``die_with_parent``)
    launch_embedded_engine ─► spawn ``python -m areal.engine.server`` (on CPU, by the run's fork
                              server when there is one: areal/forkserver.py) ─► poll its ready file (URL)
    launch_command         ─► spawn a command template (``engine.launch.command``: SGLang, vLLM)
                              ─► wait_healthy: poll ``GET /health`` until 200
    embedded_launcher / command_launcher ─► a fleet's ``Launcher``: (index, port, log) -> server

Every server started here is an ``EngineProcess``: its URL, its log, ``alive()``, ``stop()`` (the
process group only, never anything found by name) and ``exit_status()``. ``free_port`` is the one
"a port nothing listens on now" of the project (servers, rendezvous stores, launchers).

Invariants:
- A launch that fails (the process exits, or the deadline passes before it serves) stops the
  process group and raises with the tail of its log: nothing it started is left running.
- ``launch_embedded_engine`` gives the child this very package on ``PYTHONPATH``, installed or not.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from areal import forkserver
from areal.process import die_with_parent, log_tail, owned_temp_dir, stop_group


def exit_status(returncode: int) -> str:
    """``exit status N``, or ``signal NAME`` for a negative return code."""
    return f"signal {signal.Signals(-returncode).name}" if returncode < 0 else f"exit status {returncode}"


class EngineProcess:
    """A running server subprocess, leader of its own process group."""

    def __init__(self, popen: subprocess.Popen | forkserver.ForkedProcess, url: str, log_path: str, scratch_dir: str | None = None) -> None:
        self.popen = popen
        self.url = url
        self.log_path = log_path
        self.scratch_dir = scratch_dir  # ready file (and the log, unless one was named); removed by stop()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def exit_status(self) -> str:
        """How the exited server ended, for ``death_of``."""
        return exit_status(self.popen.returncode)

    def stop(self, timeout_s: float = 10) -> None:
        """SIGTERM the process group, then SIGKILL it if it has not exited in ``timeout_s``."""
        stop_group(self.popen, timeout_s)
        if self.scratch_dir is not None:
            shutil.rmtree(self.scratch_dir, ignore_errors=True)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` now (bind(0)); whoever uses it binds it itself a moment later."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def spawn(cmd: list[str], log_path: str, *, env: dict[str, str] | None = None, cwd: str | None = None) -> subprocess.Popen:
    """Start ``cmd`` in its own session (process group), stdout and stderr appended to ``log_path``,
    no stdin, killed with this process; ``env`` None inherits this process's environment."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )


def wait_healthy(proc: EngineProcess, name: str, timeout_s: float) -> EngineProcess:
    """Poll ``GET /health`` of a just-started server until it answers 200; stop it and raise,
    with its log tail, if it exits or the deadline passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not proc.alive():
            raise RuntimeError(f"{name} exited with {proc.popen.returncode}; log tail:\n{log_tail(proc.log_path)}")
        try:
            with urllib.request.urlopen(proc.url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            pass  # not listening yet: poll again until the deadline
        if time.monotonic() > deadline:
            proc.stop()
            raise TimeoutError(f"{name} not healthy after {timeout_s}s; log tail:\n{log_tail(proc.log_path)}")
        time.sleep(0.25)


def launch_command(
    template: str,
    model_path: str,
    port: int,
    log_path: str,
    *,
    host: str = "127.0.0.1",
    timeout_s: float = 900,
    fields: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    scratch_env: str | None = None,
) -> EngineProcess:
    """Start an inference server from a command template (``{python}``, ``{model}``, ``{host}``,
    ``{port}`` and the extra ``fields`` filled in; e.g. ``python -m sglang.launch_server
    --model-path {model} --port {port}``) in its own process group, with ``env`` added to this
    process's environment, logging to ``log_path``, and wait until ``/health`` answers 200.
    ``scratch_env``: a variable naming where the server keeps its own temp files (vLLM's
    ``VLLM_RPC_BASE_PATH``, its ZeroMQ sockets), set to a folder removed when it stops."""
    fields = {"python": sys.executable, "model": model_path, "host": host, "port": port, **(fields or {})}
    try:
        cmd = shlex.split(template.format(**fields))
    except (KeyError, IndexError, ValueError) as e:
        names = ", ".join(f"{{{k}}}" for k in fields)
        raise ValueError(f"engine.launch.command {template!r}: only {names} can be filled in ({e!r})") from None
    scratch = owned_temp_dir("engine") if scratch_env else None
    env = {**(env or {}), scratch_env: scratch} if scratch_env and scratch else env
    popen = spawn(cmd, log_path, env={**os.environ, **env} if env else None)
    return wait_healthy(EngineProcess(popen, f"http://{host}:{port}", log_path, scratch_dir=scratch), cmd[0], timeout_s)


def launch_embedded_engine(
    model_path: str,
    *,
    threads: int = 1,
    log_path: str | None = None,
    timeout_s: float = 120,
    max_batch: int = 32,
    weight_version: str = "default",
    api_key: str | None = None,
    request_log: str | None = None,
    port: int = 0,
    host: str = "127.0.0.1",
    device: str = "cpu",
    dtype: str = "float32",
    busy_log: str | None = None,
) -> EngineProcess:
    """Start the embedded engine and wait until it has written its URL to the ready file.
    ``port`` 0 takes a free one; a restarted engine is given its predecessor's. ``host``: the
    address it listens on (a node's own address when other nodes call it); ``device`` and
    ``dtype``: where and in what it serves the model (engine.device, engine.dtype); ``busy_log``:
    the file its compute spans go to (engine.busy_log)."""
    run_dir = owned_temp_dir("engine")
    ready = os.path.join(run_dir, "ready")
    log_path = log_path or os.path.join(run_dir, "engine.log")
    flags = {
        "--model-path": model_path,
        "--ready-file": ready,
        "--threads": str(threads),
        "--max-batch": str(max_batch),
        "--weight-version": weight_version,
        "--port": str(port),
        "--host": host,
        "--api-key": api_key or None,
        "--request-log": request_log or None,
        "--device": device,
        "--dtype": dtype,
        "--busy-log": busy_log,
    }
    cmd = [sys.executable, "-m", "areal.engine.server", *(x for flag, value in flags.items() if value is not None for x in (flag, value))]
    env = dict(os.environ)
    # The child must import this very package even when it is not installed.
    repo_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH")) if p)
    server = forkserver.current() if device == "cpu" else None  # a CUDA engine starts as a new interpreter
    popen = server.spawn("areal.engine.server", cmd[3:], log_path, env=env) if server else spawn(cmd, log_path, env=env)
    proc = EngineProcess(popen, "", log_path, scratch_dir=run_dir)
    proc.url = _wait_ready(proc, ready, timeout_s)
    return proc


def _wait_ready(proc: EngineProcess, ready: str, timeout_s: float) -> str:
    """The URL the embedded engine wrote to its ready file; stops it and raises, with its log
    tail, if it exits or the deadline passes first (the tail is in the error, so its scratch dir goes)."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(ready):
        failure = None
        if not proc.alive():
            failure = RuntimeError(f"embedded engine exited with {proc.popen.returncode}; log tail:\n{log_tail(proc.log_path)}")
        elif time.monotonic() > deadline:
            failure = TimeoutError(f"embedded engine not ready after {timeout_s}s; log tail:\n{log_tail(proc.log_path)}")
        if failure is not None:
            proc.stop()
            raise failure
        time.sleep(0.05)
    with open(ready) as f:
        return f.read().strip()


# ------------------------------------------------------------------------------------------
# A fleet's launchers (areal/engine/fleet.py): how server ``index`` of a run is started.
# ------------------------------------------------------------------------------------------

# (index, port or 0, log path) -> a healthy server: an EngineProcess here, or a RemoteEngine on a
# Ray node (areal/cluster/ray_engines.py), which has the surface the fleet uses
Launcher = Callable[[int, int, Path], EngineProcess]


def embedded_launcher(
    model_dir: Path,
    *,
    threads: int,
    max_batch: int,
    request_log: Path | None,
    host: str = "127.0.0.1",
    device: str = "cpu",
    dtype: str = "float32",
    busy_log_dir: Path | None = None,
) -> Launcher:
    """Our engine (``areal.engine.server``), from the initial weights, listening on ``host``,
    serving on ``device`` in ``dtype``; server ``index`` writes its compute spans to
    ``busy_log_dir/engine_busy-<index>.jsonl`` when a directory is given."""

    def launch(index: int, port: int, log_path: Path) -> EngineProcess:
        return launch_embedded_engine(
            str(model_dir),
            threads=threads,
            max_batch=max_batch,
            log_path=str(log_path),
            request_log=str(request_log) if request_log else None,
            port=port,
            host=host,
            weight_version="0",
            device=device,
            dtype=dtype,
            busy_log=str(busy_log_dir / f"engine_busy-{index}.jsonl") if busy_log_dir else None,
        )

    return launch


def command_launcher(
    template: str,
    model_dir: Path,
    health_timeout_s: float,
    *,
    fields: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    gpus_of: Callable[[int], list[int]] = lambda index: [],
    host: str = "127.0.0.1",
    scratch_env: str | None = None,
) -> Launcher:
    """Any server started by a command template (``engine.launch``): SGLang's, or vLLM's
    (``areal.engine.fleet.server_launcher`` adds its fields and environment), its ``{host}`` filled
    in with ``host``. ``gpus_of(index)`` is server ``index``'s CUDA_VISIBLE_DEVICES (a restarted
    server gets its predecessor's GPUs); ``scratch_env`` as in ``launch_command``."""

    def launch(index: int, port: int, log_path: Path) -> EngineProcess:
        gpus = gpus_of(index)
        env_i = {**(env or {}), "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))} if gpus else env
        return launch_command(
            template,
            str(model_dir),
            port or free_port(host),
            str(log_path),
            host=host,
            timeout_s=health_timeout_s,
            fields=fields,
            env=env_i,
            scratch_env=scratch_env,
        )

    return launch
