"""Helpers for the child processes this project starts (engine, trainer, zygote).

Every child is started as the leader of its own process group (``start_new_session=True``), so
it and anything it forked are stopped together, by process group, never by name. Every child
also asks the kernel for SIGTERM when its parent dies (``die_with_parent``), so a controller
killed with SIGKILL leaves no engine or trainer behind.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for ``subprocess.Popen``: SIGTERM this child when the parent exits.

    The kernel tracks the parent *thread*: start children from the thread that outlives them
    (the main thread here), not from a short-lived worker thread.
    """
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def stop_group(popen: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the child's process group, then SIGKILL it if it has not exited in ``grace_s``."""
    if popen.poll() is not None:
        return
    try:
        os.killpg(popen.pid, signal.SIGTERM)
    except ProcessLookupError:  # exited meanwhile (a fork server's child is reaped by the server)
        pass
    try:
        popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        popen.wait()


def log_tail(path: str | os.PathLike, limit: int = 4000) -> str:
    """The last ``limit`` bytes of a log file, for error messages ("" if there is none)."""
    if limit <= 0 or not os.path.exists(path):
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - limit))
        return f.read().decode(errors="replace")


# Temp folders named for the process that owns them: ``areal-<kind>-<owner pid>-<random>``.
_OWNED = re.compile(r"^areal-(run|engine|sglang|vllm)-(\d+)-")


def owned_temp_dir(kind: str) -> str:
    """A new temp folder ``areal-<kind>-<this pid>-XXXX``: ``reclaim_temp_dirs`` removes it once
    this process is gone, if it was not removed (a SIGKILL skips every cleanup)."""
    return tempfile.mkdtemp(prefix=f"areal-{kind}-{os.getpid()}-")


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_partial_writes(root: Path, depth: int = 3) -> list[Path]:
    """Remove the ``.tmp-*`` files and folders under ``root`` (to ``depth`` levels): writes that
    were cut before their rename into place (checkpoints, weight versions). Call only once no
    process writes there (the run's end)."""
    removed = []
    for level in range(1, depth + 1):
        for path in sorted(root.glob("/".join(["*"] * (level - 1) + [".tmp-*"]))):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def reclaim_temp_dirs(root: str | None = None) -> list[str]:
    """Remove the ``owned_temp_dir`` folders under ``root`` (the temp dir) whose owner is dead
    (socket folders and engine scratch of killed runs); returns them. Call at start."""
    root = root or tempfile.gettempdir()
    removed = []
    for name in sorted(os.listdir(root)):
        m = _OWNED.match(name)
        if m and not pid_alive(int(m.group(2))) and os.path.isdir(os.path.join(root, name)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(os.path.join(root, name))
    return removed


def descendants(pid: int, module: bytes) -> list[int]:
    """Descendants of ``pid`` whose command line holds ``module`` (e.g. ``b"areal.engine.server"``),
    read from /proc over every thread's children (Linux lists a child under the thread that forked
    it). A run's engine and trainer are children of its fork server, so below the controller."""
    out, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
                continue
            for child in children:
                todo.append(int(child))
                try:
                    if module in Path(f"/proc/{child}/cmdline").read_bytes():
                        out.append(int(child))
                except (FileNotFoundError, ProcessLookupError):  # gone meanwhile: /proc answers ESRCH mid-exit
                    pass
    return sorted(out)
