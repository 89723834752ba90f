"""A small task with a world, written where a test wants it (sandbox/world.py's format), and what a
zygote leaves behind of its worlds (mounts, directories, grader cgroups), read off /proc and the host.

The task: ``calc.add`` subtracts. ``repo/tests/test_calc.py::test_add`` (visible, protected) and
``checks/test_hidden.py::test_add_negative`` (the grader's) fail with the bug;
``test_commutes_on_equal`` passes either way. The base has an empty conftest.py of its own.
"""

from __future__ import annotations

import json
import os

from areal.tasks.root import from_host
from sandbox.world import worlds_dir

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
HIDDEN_MARK = "def test_add_negative"  # text only the hidden checks hold
CHECKS = (
    "checks/test_hidden.py::test_add_negative",
    "checks/test_hidden.py::test_commutes_on_equal",
    "tests/test_calc.py::test_add",
)


ROOT_RELEASE = "areal-test-root 1\n"  # /etc/os-release of make_root's file system
ROOT_PROGRAMS = ("sh", "cat", "ls", "touch", "mkdir", "rm", "head", "env", "id")


def make_root(dest: str) -> str:
    """A small root file system at ``dest`` (made anew) of the host's ``ROOT_PROGRAMS``, as a
    task's "root" names one (``areal.tasks.root.from_host``); a debootstrap tree is the same kind
    of directory, larger."""
    return from_host(dest, list(ROOT_PROGRAMS), ROOT_RELEASE)


def make_task(library: str, name: str = "calc-add", reward: str = "all", root: str = "") -> str:
    """The task directory ``library/name`` (made anew); ``root``: its task.json's "root"."""
    d = os.path.join(library, name)
    files = {
        "repo/calc/__init__.py": BUGGY,
        "repo/tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
        "repo/conftest.py": "",  # the base's own (empty) conftest: an agent's edit to it is a runner hook
        "checks/test_hidden.py": (
            f"from calc import add\n\n\n{HIDDEN_MARK}():\n    assert add(-2, -3) == -5\n\n\n"
            "def test_commutes_on_equal():\n    assert add(4, 4) == add(4, 4)\n"
        ),
        "reference/expected.txt": "5\n",
    }
    for rel, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
        with open(os.path.join(d, rel), "w") as f:
            f.write(text)
    spec = {
        "prompt": "add() subtracts; fix calc/__init__.py.",
        "protected": ["tests"],
        "tests": ["tests"],
        "timeout_s": 30,
        "reward": reward,
        **({"root": root} if root else {}),
    }
    with open(os.path.join(d, "task.json"), "w") as f:
        json.dump(spec, f)
    return d


def tree_digest(path: str) -> dict[str, bytes]:
    """Every file under ``path`` with its bytes, a link with its target (the base, to show it unchanged)."""
    out = {}
    for d, dirs, names in os.walk(path):
        for n in [*names, *(x for x in dirs if os.path.islink(os.path.join(d, x)))]:
            full = os.path.join(d, n)
            if os.path.islink(full):
                out[os.path.relpath(full, path)] = b"-> " + os.readlink(full).encode()
                continue
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


def world_leftovers(zygote_pid: int, temp_root: str) -> list[str]:
    """What remains of finished worlds: tmpfs or overlay mounts in the zygote's mount namespace,
    directories under its worlds directory (and the directory itself once the zygote is gone),
    grader cgroups, any world mount on the host."""
    parent = worlds_dir(temp_root, zygote_pid)
    found = []
    if os.path.exists(f"/proc/{zygote_pid}"):  # else its mount namespace is gone with it
        found += [
            f"zygote mount: {line.strip()}" for line in open(f"/proc/{zygote_pid}/mountinfo") if parent in line or " overlay " in line
        ]
    found += [f"host mount: {line.strip()}" for line in open("/proc/self/mountinfo") if "areal-worlds" in line]
    found += [f"directory: {parent}/{n}" for n in (os.listdir(parent) if os.path.isdir(parent) else [])]
    if os.path.isdir(parent) and not os.path.exists(f"/proc/{zygote_pid}"):
        found.append(f"directory: {parent}")
    for c in ("memory", "pids"):
        top = f"/sys/fs/cgroup/{c}/areal"
        found += [
            f"cgroup: {top}/{n}"
            for n in (os.listdir(top) if os.path.isdir(top) else [])
            if n.startswith(f"{zygote_pid}-") and "grader" in n
        ]
    return found
