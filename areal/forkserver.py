"""A fork server for a run's Python children: the embedded engine and a one-rank trainer start by
fork from a process that has already imported torch, transformers and their own modules, instead
of as new interpreters that import them again (about 3.5 s of CPU each, most of a short run's).

    controller (python -m areal.train)                  fork server (forked at start-up)
    ──────────────────────────────────                  ────────────────────────────────
    import torch, transformers  ── fork, one thread ──► imports PRELOAD (engine, trainer, model code)
    spawn(module, args, log, env, cwd) ── request ────► fork ─► child: own session, log on fd 1 and 2,
                                                                env and cwd set, runs ``python -m module``
    ForkedProcess(pid)                  ◄── {pid} ────
    poll() / wait() / returncode        ◄── {exit} ─── reaps the child (a pidfd per child)

A process that cannot fork a server safely (it runs threads: a test runner) starts one as a new
interpreter instead (``ForkServer.started``: ``python -m areal.forkserver FD MODULE...``); its
children are the same. The tests start their whole runs (``python -m areal.train``) so.

Both ends are here. A request is one JSON line over a socketpair, the log file's descriptor beside
it (SCM_RIGHTS; or two, stdout's and stderr's); the server answers the child's pid, and later, when it has reaped the child, its
return code as ``subprocess.Popen`` has it (negative: the signal). A ``ForkedProcess`` has the
surface of ``Popen`` that the project's callers use (``pid``, ``poll``, ``wait``, ``returncode``,
``send_signal``, ``terminate``, ``kill``), so ``stop_group`` and the engine and trainer
supervisors treat both alike.

Invariants:
- The server is forked from the controller's main thread while it runs no other Python thread and
  before it opens a ZeroMQ context; otherwise ``start`` declines and children start as new
  interpreters (``current()`` is None). ``AREAL_FORKSERVER=0`` declines too, and so does a machine
  with a GPU driver: there every child starts as a new interpreter, as before.
- A child is what ``python -m module args`` would be (its ``sys.path`` starts with its cwd and
  PYTHONPATH): the leader of its own session, SIGTERM when
  its parent dies (the server, which gets SIGTERM when the controller dies), stdin from /dev/null,
  stdout and stderr the log, default signal handlers, the logging configuration and exit handlers that
  a new interpreter would have (the server is forked before the run configures logging); it exits
  with ``sys.exit``'s code, 1 on an uncaught exception.
- Every child is reaped by the server, and the server by the controller (``close``), so CPU used
  by children still counts in the controller's ``RUSAGE_CHILDREN``.
- ``ps`` shows a child's own command line (``python -m areal.engine.server ...``), written over the
  controller's it inherited, cut to that one's length; its name (``comm``, what ``top`` shows) is
  the module's last parts, e.g. ``engine.server``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import io
import json
import logging
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence

from areal.process import die_with_parent, pid_alive

# What the server imports once for its children: the embedded engine's and the trainer's modules
# with the model classes they load (the embedded family and the Llama family of SmolLM2).
PRELOAD = (
    "areal.engine.batch",
    "areal.trainer.rank",
    "areal.trainer.packing",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.llama.modeling_llama",
)
# A machine with one of these has a GPU driver: its children start as new interpreters, as CUDA
# (and ROCm) is not to be used in a child forked from a process that may have initialized it.
GPU_DEVICES = ("/dev/nvidiactl", "/dev/kfd")
_PR_SET_NAME = 15
_server: ForkServer | None = None


def current() -> ForkServer | None:
    """This process's fork server, if ``start`` started one and it is still serving."""
    return _server if _server is not None and _server.alive() else None


def start(preload: Sequence[str] = PRELOAD) -> ForkServer | None:
    """Fork the server (once per process). Declines (None) where a fork is unsafe (another thread
    running, a GPU driver present) or ``AREAL_FORKSERVER=0``."""
    global _server
    if _server is not None:
        return current()
    if not wanted():
        return None
    if len(threading.enumerate()) > 1 or "zmq" in sys.modules and _zmq_has_context():
        return None
    import torch  # noqa: F401  -- shared with the server: the controller imports both anyway
    import transformers  # noqa: F401

    _server = ForkServer(preload)
    atexit.register(_server.close)
    return _server


def wanted() -> bool:
    """Whether children may start by fork on this machine: not with ``AREAL_FORKSERVER=0``, nor
    with a GPU driver (a CUDA or ROCm child must not fork from a parent that may have probed it),
    nor on a kernel without pidfds (Linux < 5.3)."""
    if os.environ.get("AREAL_FORKSERVER", "1") == "0" or not hasattr(os, "pidfd_open"):
        return False
    return not any(os.path.exists(dev) for dev in GPU_DEVICES)


def _zmq_has_context() -> bool:
    import zmq

    return zmq.Context._instance is not None


def _set_name(name: str) -> None:
    """The process's name (``comm``: what ``top`` and ``ps -o comm`` show), at most 15 bytes."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


REPORT_WAIT_S = 10.0  # how long a poll waits for the report of a child whose pid is gone


class ForkedProcess:
    """A child of the fork server, seen from the process that asked for it (``Popen``'s surface)."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        """The return code once the child has exited, as ``Popen.poll``. The server reaps the child
        before its report arrives here: a pid already gone waits for that report (moments), so a
        caller never sees None for a child that no longer exists and then signals a missing pid."""
        if self.returncode is None and not pid_alive(self.pid):
            self._exited.wait(REPORT_WAIT_S)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass  # exited; the server's report of it is on its way

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The controller's end: forks the server at construction, then asks it for children."""

    def __init__(self, preload: Sequence[str]) -> None:
        """Fork the server from this process (see ``start`` for when that is safe)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the server
            ours.close()
            code = 0
            try:
                _serve(theirs, preload)
            except BaseException:  # noqa: BLE001  -- whatever ends the server, its children go with it
                traceback.print_exc()
                code = 1
            os._exit(code)
        theirs.close()
        self._attach(ours, pid)

    @classmethod
    def started(cls, preload: Sequence[str], log_path: str, cwd: str | None = None) -> ForkServer:
        """A server that is a new interpreter (``python -m areal.forkserver``), for a process that
        cannot fork one safely (threads of its own, a test runner's state): its children are what
        they would be from a forked server. Its own output goes to ``log_path``."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "areal.forkserver", str(theirs.fileno()), *preload],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=cwd,
            )
        theirs.close()
        server = cls.__new__(cls)
        server._attach(ours, proc.pid, proc)
        return server

    def _attach(self, sock: socket.socket, pid: int, proc: subprocess.Popen | None = None) -> None:
        self.pid = pid
        self._proc = proc  # the server as a new interpreter: reaped through its Popen
        self._sock = sock
        self._lock = threading.Lock()  # one request at a time: its pid answer is the next line
        self._answers: list[dict] = []
        self._answered = threading.Condition()
        self._children: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}  # exits reported before their spawn's answer was read
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="forkserver-reader", daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        return not self._closed and self._reader.is_alive()

    def spawn(
        self,
        module: str,
        args: list[str],
        log_path: str,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stderr_path: str | None = None,
    ) -> ForkedProcess:
        """``python -m module args`` as a child of the server, stdout and stderr appended to
        ``log_path`` (stderr to ``stderr_path`` where given); ``env`` None: this process's
        environment now."""
        request = {"module": module, "args": args, "env": dict(os.environ if env is None else env), "cwd": cwd or os.getcwd()}
        paths = [log_path] if stderr_path is None else [log_path, stderr_path]
        request["fds"] = len(paths)
        with contextlib.ExitStack() as files, self._lock:
            fds = [files.enter_context(open(path, "ab")).fileno() for path in paths]
            socket.send_fds(self._sock, [json.dumps(request).encode() + b"\n"], fds)
            with self._answered:
                if not self._answered.wait_for(lambda: self._answers or not self._reader.is_alive(), timeout=30):
                    raise RuntimeError(f"the fork server did not start {module} within 30 s")
                if not self._answers:
                    raise RuntimeError(f"the fork server exited before starting {module}")
                answer = self._answers.pop(0)
        if "error" in answer:
            raise RuntimeError(f"the fork server could not start {module}: {answer['error']}")
        child = ForkedProcess(answer["pid"], [sys.executable, "-m", module, *args])
        with self._answered:
            self._children[child.pid] = child
            if child.pid in self._early:
                child._set_exit(self._early.pop(child.pid))
        return child

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                with self._answered:
                    if "exit" in msg:
                        child = self._children.pop(msg["exit"], None)
                        if child is None:
                            self._early[msg["exit"]] = msg["code"]
                        else:
                            child._set_exit(msg["code"])
                    else:
                        self._answers.append(msg)
                    self._answered.notify_all()
        with self._answered:  # the server is gone (and with it, by PDEATHSIG, its children)
            for child in self._children.values():
                child._set_exit(-signal.SIGTERM)
            self._children.clear()
            self._answered.notify_all()

    def close(self) -> None:
        """Stop the server (it SIGTERMs any child still running) and reap it."""
        if self._closed:
            return
        self._closed = True
        try:  # the server sees the end of its requests; its last reports still come back
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        try:
            if self._proc is not None:
                self._proc.wait()
            else:
                os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self._reader.join(timeout=5)
        self._sock.close()


# ---- the server's side ------------------------------------------------------------------------


def _serve(sock: socket.socket, preload: Sequence[str]) -> None:
    global _server
    _server = None  # a child never sees its controller's server as its own
    die_with_parent()
    if os.getppid() == 1:  # the controller died before the line above took effect
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C goes to the controller, which stops the run
    _set_name("areal-forksrv")
    import importlib

    for name in preload:
        importlib.import_module(name)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, None)
    children: dict[int, int] = {}  # pidfd -> pid
    buf, fds = b"", []  # requests' bytes and their logs' descriptors, as they arrive
    try:
        while True:
            for key, _ in sel.select():
                if key.data is not None:  # a child exited: reap it, report its code
                    pid = key.data
                    sel.unregister(key.fileobj)
                    os.close(key.fd)
                    children.pop(key.fd, None)
                    _, status = os.waitpid(pid, 0)
                    sock.sendall(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                    continue
                data, more_fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)
                if not data:
                    return
                buf += data
                fds += more_fds
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    request = json.loads(line)
                    mine, fds = fds[: request["fds"]], fds[request["fds"] :]  # stdout's, then stderr's
                    try:
                        pid = _fork_child(request, mine, sock)
                    except OSError as e:
                        sock.sendall(json.dumps({"error": str(e)}).encode() + b"\n")
                        continue
                    finally:
                        for fd in mine:
                            os.close(fd)
                    pidfd = os.pidfd_open(pid)
                    children[pidfd] = pid
                    sel.register(pidfd, selectors.EVENT_READ, pid)
                    sock.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    finally:
        for pid, code in _stop_all(list(children.values())).items():
            try:  # the asking side reads these until it sees this server exit
                sock.sendall(json.dumps({"exit": pid, "code": code}).encode() + b"\n")
            except OSError:
                pass


def _stop_all(pids: list[int], grace_s: float = 10.0) -> dict[int, int]:
    """SIGTERM each child's process group, SIGKILL what is left after ``grace_s``, reap them all;
    their return codes."""
    codes: dict[int, int] = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids and (sig == signal.SIGKILL or time.monotonic() < deadline):
            for pid in pids:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
            pids = [pid for pid in pids if pid not in codes]
            if pids:
                time.sleep(0.05)
    return codes


def _fork_child(request: dict, out_fds: list[int], sock: socket.socket) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        sock.close()
        code = _run_child(request, out_fds)
    except BaseException:  # noqa: BLE001  -- a child never returns into the server's loop
        traceback.print_exc()
    finally:
        os._exit(code)


def _run_child(request: dict, out_fds: list[int]) -> int:
    """Become ``python -m module args`` (stdout on ``out_fds[0]``, stderr on the last); returns
    its exit code."""
    os.setsid()
    die_with_parent()
    module: str = request["module"]
    _set_name(".".join(module.split(".")[-2:]))
    _retitle([sys.executable, "-m", module, *request["args"]])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if out_fds:
        os.dup2(out_fds[0], 1)
        os.dup2(out_fds[-1], 2)
    sys.stdin = io.TextIOWrapper(open(0, "rb", closefd=False))
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), line_buffering=True, errors="backslashreplace")
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _set_path(request["cwd"], request["env"].get("PYTHONPATH", ""))
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = [module, *request["args"]]
    code: int = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001  -- what the interpreter would print and exit 1 with
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def _set_path(cwd: str, pythonpath: str) -> None:
    """``sys.path`` starts as ``python -m`` in ``cwd`` with this ``PYTHONPATH`` would: the folder
    first, then PYTHONPATH's entries; the server's own entries follow."""
    first = [os.path.abspath(cwd), *(os.path.abspath(os.path.join(cwd, p)) for p in pythonpath.split(os.pathsep) if p)]
    sys.path[:] = [*first, *(p for p in sys.path if os.path.abspath(p or ".") not in first)]


def _retitle(argv: list[str]) -> None:
    """Show ``argv`` as this process's command line (``ps``, ``/proc/PID/cmdline``): written over
    the inherited one in place, as much as its length holds (the interpreter's name shortened to
    its file name, then the tail cut, where the whole does not fit)."""
    fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49 of proc(5)
    room = end - start - 1
    if room <= 0:
        return
    title = "\0".join(argv).encode()
    if len(title) > room:
        title = "\0".join([os.path.basename(argv[0]), *argv[1:]]).encode()
    title = title[:room]
    ctypes.memmove(start, title + b"\0" * (room + 1 - len(title)), room + 1)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":  # ForkServer.started: python -m areal.forkserver FD MODULE...
    _serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[2:])
