"""Checks every task of this library (docs/swe-tasks.md: the format): each is a real bug-fix task.

    python tasks/swe/check_tasks.py [TASK_ID ...]

A task's directory is its whole source: ``repo/`` (the package with its bug, its README and its
visible tests), ``checks/`` (the grader's hidden tests), ``reference/solution/`` (the fixed files,
laid over ``repo/``) and ``task.json``. For each task, pytest runs on this host (not sandboxed: the
tasks are the library's own) over the checks and the visible tests: on the buggy repository at
least one must fail, with the reference solution every one must pass.

This file lives inside the library on purpose: the library is masked in its tasks' episodes
(sandbox/world.py), so nothing here is in an agent's view.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def failing(task_dir: str, solved: bool) -> int:
    """How many tests fail on the task's repository (with its reference solution when ``solved``),
    checks and visible tests together; pytest in a scratch copy on this host."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(task_dir, "repo"), os.path.join(tmp, "workspace"))
        shutil.copytree(os.path.join(task_dir, "checks"), os.path.join(tmp, "checks"))
        if solved:
            shutil.copytree(os.path.join(task_dir, "reference", "solution"), os.path.join(tmp, "workspace"), dirs_exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.path.join(tmp, "workspace"), "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", tmp, "checks", "workspace/tests"]
        p = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        if p.returncode not in (0, 1):
            raise RuntimeError(f"{task_dir}: pytest exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        return 0 if p.returncode == 0 else int(p.stdout.strip().splitlines()[-1].split(" failed")[0].split()[-1])


def main(ids: list[str]) -> None:
    tasks = ids or sorted(d for d in os.listdir(HERE) if os.path.isfile(os.path.join(HERE, d, "task.json")))
    for task in tasks:
        d = os.path.join(HERE, task)
        if json.load(open(os.path.join(d, "task.json")))["id"] != task:
            raise SystemExit(f"{task}: task.json names another id")
        broken, fixed = failing(d, solved=False), failing(d, solved=True)
        if broken == 0 or fixed != 0:
            raise SystemExit(f"{task}: {broken} tests fail on the bug (want > 0), {fixed} with the solution (want 0)")
        print(f"{task}: {broken} failing with the bug, 0 with the reference solution")


if __name__ == "__main__":
    main(sys.argv[1:])
