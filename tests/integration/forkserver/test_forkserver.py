"""The fork server (areal/forkserver.py): a child it forks is what ``python -m module`` would be
(args, environment, working directory, its own session, default signals, the log on stdout and
stderr, stdin empty, exit codes as ``Popen`` gives them), it is stopped by ``stop_group`` like any
child, it dies with the process that asked for it, and its CPU counts in that process's
``RUSAGE_CHILDREN``; ``start`` declines where a fork is unsafe (another thread, a GPU driver) or
switched off.

Each case runs in a driver subprocess: ``start`` forks only from a process with one thread, and a
pytest worker has more. The child is tests/support/forked_child.py.

A server can also be a new interpreter (``ForkServer.started``), for a process with threads: the
tests' own whole runs start from one (tests/support/run_checks.py); its children are the same.

What is not covered here: the engine and the trainer as forked children (every whole run in
tests/e2e starts them so; ``AREAL_FORKSERVER=0`` starts them as new interpreters).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from areal import forkserver

ROOT = Path(__file__).resolve().parents[3]
SUPPORT = ROOT / "tests" / "support"
GUARD_S = 120  # a guard against a hang on a loaded machine, never a timing assertion

DRIVER = """
import json, os, resource, subprocess, sys, threading
sys.path[:0] = [{support!r}, {root!r}]
from areal import forkserver
from areal.process import stop_group
out = {{}}
case = sys.argv[1]
if case == "declines_with_a_thread":
    stop = threading.Event()
    threading.Thread(target=stop.wait).start()
if case == "declines_with_a_gpu_driver":
    forkserver.GPU_DEVICES = ({support!r},)  # a path that exists stands in for /dev/nvidiactl
server = forkserver.start(preload=())
out["started"] = server is not None
if case == "declines_with_a_thread":
    stop.set()
if server is not None:
    log = sys.argv[2]
    if case == "report":
        env = dict(os.environ, FORKED_CHILD_VALUE="from the request")
        child = server.spawn("forked_child", ["report", "x y"], log, env=env, cwd="/")
        out["code"] = child.wait(60)
    elif case == "codes":
        out["exit"] = server.spawn("forked_child", ["exit", "3"], log).wait(60)
        out["raise"] = server.spawn("forked_child", ["raise"], log).wait(60)
        out["missing"] = server.spawn("no_such_module_here", [], log).wait(60)
    elif case == "poll_when_gone":  # the server reaped it: its pid is gone before its report arrives
        child = server.spawn("forked_child", ["exit", "5"], log)
        while True:
            try:
                os.kill(child.pid, 0)
            except ProcessLookupError:
                break
        out["poll"] = child.poll()
    elif case == "stop":
        child = server.spawn("forked_child", ["sleep", sys.argv[3]], log)
        while not os.path.exists(sys.argv[3]):
            pass
        try:
            child.wait(0.2)
            out["timed_out"] = False
        except subprocess.TimeoutExpired:
            out["timed_out"] = True
        out["poll_running"] = child.poll()
        stop_group(child, 30)
        out["code"] = child.returncode
    elif case == "orphaned":
        server.spawn("forked_child", ["sleep", sys.argv[3]], log)
        while not os.path.exists(sys.argv[3]):
            pass
        print(json.dumps(out), flush=True)
        os.kill(os.getpid(), 9)
    elif case == "stubborn":
        child = server.spawn("forked_child", ["stubborn", sys.argv[3]], log)
        while not os.path.exists(sys.argv[3]):
            pass
        server.close()  # the server's end: SIGTERM, ignored, then SIGKILL
        out["code"] = child.wait(60)
    elif case == "rusage":
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["code"] = server.spawn("forked_child", ["burn", "0.5"], log).wait(60)
        server.close()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["child_cpu_s"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
print(json.dumps(out), flush=True)
"""


def _drive(case: str, *args: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER.format(support=str(SUPPORT), root=str(ROOT)), case, *args],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        env={**os.environ, **(env or {})},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(lines[-1])


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_forked_child_is_what_python_dash_m_would_be(tmp_path):
    log = tmp_path / "child.log"
    out = _drive("report", str(log))
    assert out == {"started": True, "code": 0}
    said, stderr_line = log.read_text().splitlines()
    seen = json.loads(said)
    assert seen["argv"] == ["report", "x y"] and seen["env"] == "from the request" and seen["cwd"] == "/"
    assert seen["session_leader"] and seen["sigterm_default"] and seen["sigint_raises"]
    assert seen["stdin"] == "" and seen["main"] == "__main__" and stderr_line == "to stderr"
    # what ps shows: its own command line, cut to the length of the driver's that it overwrote
    assert seen["cmdline"].split("\0")[1:4] == ["-m", "forked_child", "report"] and seen["comm"] == "forked_child"


def test_exit_codes_are_popens(tmp_path):
    log = tmp_path / "child.log"
    out = _drive("codes", str(log))
    assert (out["exit"], out["raise"], out["missing"]) == (3, 1, 1)
    text = log.read_text()
    assert "RuntimeError: raised by forked_child" in text  # the traceback an interpreter prints
    assert "No module named no_such_module_here" in text


def test_poll_gives_the_code_of_a_child_whose_pid_is_gone(tmp_path):
    """As Popen.poll does: never None for a child that no longer exists (stop_group would then
    signal a missing pid; a CI run once failed on that)."""
    assert _drive("poll_when_gone", str(tmp_path / "child.log")) == {"started": True, "poll": 5}


def test_stop_group_ends_a_forked_child_with_its_signal(tmp_path):
    out = _drive("stop", str(tmp_path / "child.log"), str(tmp_path / "pid"))
    assert out == {"started": True, "timed_out": True, "poll_running": None, "code": -signal.SIGTERM}


def test_a_child_dies_with_the_process_that_asked_for_it(tmp_path):
    pid_file = tmp_path / "pid"
    out = _drive("orphaned", str(tmp_path / "child.log"), str(pid_file))  # the driver SIGKILLs itself
    assert out == {"started": True}
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + GUARD_S
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pid), f"forked child {pid} outlived its controller"


def test_closing_the_server_ends_even_a_child_that_ignores_sigterm(tmp_path):
    pid_file = tmp_path / "pid"
    out = _drive("stubborn", str(tmp_path / "child.log"), str(pid_file))
    assert out == {"started": True, "code": -signal.SIGKILL}
    assert _gone(int(pid_file.read_text()))


def test_a_childs_cpu_counts_in_the_asking_process_rusage(tmp_path):
    out = _drive("rusage", str(tmp_path / "child.log"))
    assert out["code"] == 0 and out["child_cpu_s"] >= 0.5 * 0.9  # process_time burned, tick rounding


@pytest.mark.parametrize(
    "case, env",
    [("declines_with_a_thread", {}), ("declines_with_a_gpu_driver", {}), ("report", {"AREAL_FORKSERVER": "0"})],
    ids=["a-thread-runs", "a-gpu-driver", "switched-off"],
)
def test_start_declines_where_a_fork_is_unsafe_or_switched_off(tmp_path, case, env):
    assert _drive(case, str(tmp_path / "child.log"), env=env) == {"started": False}


def test_a_server_started_as_a_new_interpreter_forks_the_same_children(tmp_path):
    """From this test's own process, which runs threads (``start`` would decline): stdout and
    stderr apart where asked, and the request's PYTHONPATH first on ``sys.path`` after its cwd, as
    ``python -m`` would have it (forked_child is found through it alone)."""
    server = forkserver.ForkServer.started(("json",), str(tmp_path / "server.log"), cwd=str(tmp_path))
    try:
        env = {**os.environ, "PYTHONPATH": str(SUPPORT), "FORKED_CHILD_VALUE": "from the request"}
        out, err = tmp_path / "out", tmp_path / "err"
        child = server.spawn("forked_child", ["report", "x y"], str(out), env=env, cwd="/", stderr_path=str(err))
        assert child.wait(GUARD_S) == 0, (out.read_text(), err.read_text())
        seen = json.loads(out.read_text())
        assert err.read_text() == "to stderr\n"
        assert seen["path"] == ["/", str(SUPPORT)] and seen["argv"] == ["report", "x y"] and seen["cwd"] == "/"
        assert seen["env"] == "from the request" and seen["session_leader"] and seen["main"] == "__main__"
        assert server.spawn("forked_child", ["exit", "4"], str(out), env=env).wait(GUARD_S) == 4
    finally:
        server.close()
    assert not server.alive() and _gone(server.pid)
