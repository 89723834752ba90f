"""The grader: a task's checks run on an episode's final workspace, in a fresh sandboxed process.

    zygote, once every process of the episode is gone ──fork──► grader process: the episode's
      layers (own cgroup, network, IPC, PID and mount namespaces, rlimits, the minimal root; no
      gateway socket: no way out at all) with sandbox/world.py's grader view
        1. ``scan``: the agent's raw layer (/.task/upper): what it wrote, deleted or replaced
           ─► tripwires protected_write, runner_replaced (one per path, cache directories ignored)
        2. ``restore``: those protected paths and runner hooks, in /workspace, back to the base's
           version (or removed where the base has none): the agent's edits are discarded
        3. capabilities dropped, seccomp filter loaded (as in an agent)
        4. ``run_checks``: ``python -I -B check_runner.py`` (pytest over
           /checks and the task's own tests, cwd /workspace), which reports each event on a pipe:
           collected, each test's result, interrupted, finished
        5. one ``Grade`` frame ──result pipe──► zygote (world.apply_grade: the episode's outcome)

The checks' process runs the workspace's code, and nothing of it can reach the verdict by the
ordinary ways: ``-I`` (no PYTHONPATH, no user site, no current directory on sys.path, so no
sitecustomize.py or *.pth of the workspace), the workspace appended to sys.path after pytest was
imported (it shadows no module of the standard library or of pytest), no plugin autoloading
(PYTEST_DISABLE_PLUGIN_AUTOLOAD), a pytest.ini of the grader's own (``-c``), no bytecode from the
workspace (its __pycache__ directories removed first, ``drop_bytecode``; ``-B``: none written),
and conftest.py files only where the base has them (restored).

What is not covered: code under test runs in the checks' process, so code written to forge that
process's report (patching pytest, writing to the report pipe) can; what stops it is only that
nothing of the grader is in the agent's view but this module's source. A check that does not
finish within the task's ``timeout_s`` fails (``timeout``; no tripwire: slow code is not a hack).
"""

from __future__ import annotations

import dataclasses
import filecmp
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import msgspec

from areal.protocol import Grade, frame
from sandbox import isolation, keys
from sandbox.isolation import EpisodeResources, SandboxConfig
from sandbox.rootfs import WORKSPACE, RootPlan, _inside
from sandbox.world import CHECKS, TASK_BASE, TASK_UPPER, Task, WorldResources, grader_view

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_runner.py")
# Files through which a workspace could take over the test run (pytest's hooks and config, the
# interpreter's start-up hooks): written anywhere in the workspace, they are discarded.
RUNNER_NAMES = frozenset({"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "sitecustomize.py", "usercustomize.py"})
RUNNER_SUFFIXES = (".pth",)
CACHE_NAMES = frozenset({"__pycache__", ".pytest_cache"})  # written by running the tests: not edits
REPORT_LIMIT = 16 << 20  # bytes of report read at most (the checks' process runs the workspace's code)
TRIPWIRE_LIMIT = 32  # tripwires kept per kind
SCRATCH = "/tmp/.grader"
SETUP_S = 30.0  # a grader's deadline: its task's timeout_s and this (its start, the scan and the restore)
RESULT_BYTES = 64 << 10


# ---- the zygote's side ----------------------------------------------------------------------


@dataclasses.dataclass
class GraderProcess:
    """The zygote's handle of one grader process, from its fork to its Grade (sandbox/zygote.py)."""

    pid: int
    episode: Any  # the zygote's slot of the episode it grades, reported once this is done
    result_fd: int  # read end: one Grade frame
    res: EpisodeResources
    log_path: str
    deadline: float
    spawn_fd: int = -1  # none: the zygote's selector reads its result as a slot's
    layer_fd: int = -1  # none: no branch channel (a slot's, sandbox/zygote.py)
    branch: int = -1  # which branch of a branch point it grades (the layer that branch left); -1: the episode's
    result: keys.ControlBuffer = dataclasses.field(default_factory=lambda: keys.ControlBuffer(RESULT_BYTES))
    status: int | None = None  # its wait status, once reaped
    timed_out: bool = False
    reaped_at: float = 0.0


def start(
    episode: Any,
    found: WorldResources,
    plan: RootPlan,
    name: str,
    config: SandboxConfig,
    layers: list[str],
    log_dir: str,
    forget: Callable[[int, tuple[int, ...]], None],
) -> GraderProcess:
    """Fork the grader of ``found`` (the world of the zygote's slot ``episode``), in cgroups named
    ``name``, its root ``plan`` with the grader's view; ``forget``: the zygote's scrub of a forked
    child (stdio on a log, other episodes' keys and descriptors gone)."""
    res = isolation.prepare(config, layers, name)
    log_path = os.path.join(log_dir, f"{name}.log")
    logfd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    result_r, result_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid_init = isolation.forks_pid_namespace_init(layers)
    pid = isolation.fork_pid_namespace_init() if pid_init else os.fork()
    if pid == 0:
        os.close(result_r)
        verdict = Grade("error", detail="the grader did not start")
        try:
            forget(logfd, (0, 1, 2, result_w))
            isolation.enter(config, layers, res, "", plan, grader_view(found))
            if pid_init:
                isolation.mount_proc(readonly=True)
            elif "pidns" in layers:
                isolation.fork_into_pid_namespace(True, readonly_proc=True)
            verdict = grade(found.task, lambda: isolation.finish_agent_setup(layers))
        except BaseException:  # process boundary: the grader's own failure is its verdict
            verdict = Grade("error", detail=traceback.format_exc()[-4000:])
        payload = memoryview(frame(msgspec.msgpack.encode(verdict)))
        while payload:
            payload = payload[os.write(result_w, payload) :]
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.close(logfd)
    os.close(result_w)
    os.set_blocking(result_r, False)
    return GraderProcess(pid, episode, result_r, res, log_path, time.monotonic() + found.task.timeout_s + SETUP_S)


def verdict(g: GraderProcess) -> Grade:
    """The Grade a reaped grader sent (its log removed), or the zygote's when it sent none."""
    frames = g.result.frames()
    if g.timed_out:
        found = Grade("error", detail=f"the grader passed its deadline and was killed; see {g.log_path}")
    elif not frames:
        found = Grade("error", detail=f"the grader exited (status {g.status}) without a verdict; see {g.log_path}")
    else:  # from the zygote's own fork, which never held a session key
        found = msgspec.msgpack.Decoder(Grade).decode(frames[0])
        if found.verdict == "complete":
            os.unlink(g.log_path)
    g.result.wipe()
    return found


# ---- the grader process's side --------------------------------------------------------------


def grade(task: Task, drop_privileges: Callable[[], None]) -> Grade:
    """In the grader process, in its root: scan, restore, drop privileges, run the checks."""
    changes = [(rel, how) for rel, how in scan(TASK_UPPER) if how == "deleted" or not as_base(rel)]
    tripwires, paths = changes_to_discard(task, changes)
    for rel in paths:
        restore(rel)
    drop_bytecode(WORKSPACE)
    drop_privileges()
    return run_checks(task, tripwires)


def scan(upper: str) -> list[tuple[str, str]]:
    """What an overlay's upper layer says the agent did: (path, how) with how "written" (a file,
    link or other node it created or changed), "deleted" (a whiteout: the base's entry removed)
    or "replaced" (an opaque directory: the base's directory removed and made anew). Directories
    it only passed through (copied up to hold a change) are not changes; cache directories are
    skipped. Symbolic links are never followed."""
    out: list[tuple[str, str]] = []
    todo = [""]
    while todo:
        rel = todo.pop()
        with os.scandir(os.path.join(upper, rel)) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                path = os.path.join(rel, e.name)
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    if e.name in CACHE_NAMES:
                        continue
                    if _opaque(e.path):
                        out.append((path, "replaced"))
                    todo.append(path)
                elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    out.append((path, "deleted"))
                else:
                    out.append((path, "written"))
    return out


def as_base(rel: str) -> bool:
    """Whether /workspace's ``rel`` holds what the base's does (kinds, modes, bytes, link targets,
    a directory's entries but caches): a change undone is none, as a branch point leaves one when
    it restores the workspace of the call for the next branch (sandbox/branch.py)."""
    return _same(os.path.join(WORKSPACE, rel), os.path.join(TASK_BASE, rel))


def _same(a: str, b: str) -> bool:
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except FileNotFoundError:
        return False
    if sa.st_mode != sb.st_mode:  # the kind and the mode
        return False
    if stat.S_ISLNK(sa.st_mode):
        return os.readlink(a) == os.readlink(b)
    if stat.S_ISREG(sa.st_mode):
        return sa.st_size == sb.st_size and filecmp.cmp(a, b, shallow=False)
    if stat.S_ISDIR(sa.st_mode):
        names = set(os.listdir(a)) - CACHE_NAMES
        return names == set(os.listdir(b)) - CACHE_NAMES and all(_same(os.path.join(a, n), os.path.join(b, n)) for n in names)
    return False


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:  # no such attribute
        return False


def changes_to_discard(task: Task, changes: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(tripwires, paths to restore) for ``changes`` (``scan``'s): a change at or under a protected
    path, or above one (a directory holding it deleted or replaced), restores that protected path;
    a runner hook (RUNNER_NAMES, RUNNER_SUFFIXES) written or deleted anywhere is restored too."""
    tripwires: dict[str, list[str]] = {"protected_write": [], "runner_replaced": []}
    restore: set[str] = set()
    for rel, how in changes:
        name = os.path.basename(rel)
        if name in RUNNER_NAMES or name.endswith(RUNNER_SUFFIXES):
            tripwires["runner_replaced"].append(f"runner_replaced: {rel!r} {how}")
            restore.add(rel)
        hit = [p for p in task.protected if _inside(rel, p) or _inside(p, rel)]
        if hit:
            tripwires["protected_write"].append(f"protected_write: {rel!r} {how}")
            restore.update(hit)
    # Outermost first, each once: restoring a directory restores what is under it.
    kept: list[str] = []
    for rel in sorted(restore, key=lambda p: (p.count("/"), p)):
        if not any(_inside(rel, k) for k in kept):
            kept.append(rel)
    return [t for lines in tripwires.values() for t in lines[:TRIPWIRE_LIMIT]], kept


def restore(rel: str) -> None:
    """``rel`` in /workspace made the base's again: every directory on its way a real directory,
    whatever is there removed, the base's copy put back (nothing, if the base has none)."""
    parts = rel.split("/")
    here = WORKSPACE
    for part in parts[:-1]:
        here = os.path.join(here, part)
        if not (os.path.isdir(here) and not os.path.islink(here)):
            _remove(here)
            os.mkdir(here, 0o755)
    target = os.path.join(WORKSPACE, rel)
    _remove(target)
    source = os.path.join(TASK_BASE, rel)
    if os.path.isdir(source) and not os.path.islink(source):
        shutil.copytree(source, target, symlinks=True)
    elif os.path.lexists(source):
        shutil.copy2(source, target, follow_symlinks=False)


def drop_bytecode(top: str) -> None:
    """Every __pycache__ directory under ``top`` removed (in the grader's own layer): a .pyc the
    agent planted there, dated and sized as a source it knows (a restored test's, a conftest.py),
    would be run instead of that source, by Python or by pytest's assertion rewriter."""
    for d, dirs, _ in os.walk(top):
        for name in [n for n in dirs if n == "__pycache__"]:
            _remove(os.path.join(d, name))
            dirs.remove(name)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def run_checks(task: Task, tripwires: list[str]) -> Grade:
    """The checks' process (module docstring), its report read until it ends or ``task.timeout_s``
    passes; the Grade from what it reported."""
    os.makedirs(SCRATCH, exist_ok=True)
    ini = os.path.join(SCRATCH, "pytest.ini")
    with open(ini, "w") as f:
        f.write("[pytest]\n")
    paths = [CHECKS, *(os.path.join(WORKSPACE, t) for t in task.tests)]
    args = ["-q", "-p", "no:cacheprovider", "-c", ini, "--rootdir=/", "--continue-on-collection-errors", *paths]
    pythonpath = [os.path.normpath(os.path.join(WORKSPACE, p)) for p in task.pythonpath]
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "HOME", "TMPDIR")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    r, w = os.pipe()
    cmd = [sys.executable, "-I", "-B", RUNNER, str(w), *pythonpath, "--", *args]
    proc = subprocess.Popen(cmd, pass_fds=(w,), cwd=WORKSPACE, env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    os.close(w)
    report, timed_out = _read_report(r, time.monotonic() + task.timeout_s)
    os.close(r)
    if timed_out:
        os.killpg(proc.pid, signal.SIGKILL)
    code = proc.wait()
    events = _events(report)
    checks = check_results(task, [e for e in events if e.get("event") == "report"])
    interrupted = next((e for e in events if e.get("event") == "interrupted"), None)
    finished = any(e.get("event") == "finished" for e in events)
    if timed_out:
        return Grade("timeout", checks, tripwires, f"the checks ran past the task's timeout_s={task.timeout_s:g}")
    if interrupted is not None:
        why = f"the checks' run was interrupted by {str(interrupted.get('by', '?'))[:200]}"
        return Grade("no verdict", checks, [*tripwires, f"grader_exit_early: {why}"], why)
    if not finished:
        why = f"the checks' process exited ({_exit_text(code)}) before its report ended"
        return Grade("no verdict", checks, [*tripwires, f"grader_no_verdict: {why}"], why)
    return Grade("complete", checks, tripwires)


def _read_report(fd: int, deadline: float) -> tuple[bytes, bool]:
    """What the checks' process wrote to ``fd`` until it closed it; (bytes, timed out)."""
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b"".join(chunks), True
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), False
        if size < REPORT_LIMIT:
            chunks.append(chunk)
            size += len(chunk)


def _events(report: bytes) -> list[dict]:
    out = []
    for line in report.splitlines():
        try:
            event = json.loads(line)
        except ValueError:  # written by the code under test, or cut at the limit
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def check_results(task: Task, reports: list[dict]) -> dict[str, float]:
    """1.0 for each of ``task.checks`` that passed (every test pytest ran under its name, each
    parametrization, passed its call, and none failed its set-up or teardown), else 0.0."""
    phases: dict[str, dict[str, str]] = {}
    for r in reports:
        nodeid = str(r.get("nodeid", "")).removeprefix("workspace/")
        phases.setdefault(nodeid, {})[str(r.get("when"))] = str(r.get("outcome"))
    out = {}
    for name in task.checks:
        runs = [p for nodeid, p in phases.items() if nodeid == name or nodeid.startswith(name + "[")]
        ok = bool(runs) and all(p.get("call") == "passed" and "failed" not in (p.get("setup"), p.get("teardown")) for p in runs)
        out[name] = 1.0 if ok else 0.0
    return out


def _exit_text(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
