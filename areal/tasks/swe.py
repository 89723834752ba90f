"""Repository bug-fix tasks with a world as dataset rows: ``data.train=swe:DIR``.

    data.train=swe:tasks/swe       DIR: a task library, relative to the working directory or else
        │                          to the project (the library shipped: tasks/swe, 24 tasks)
        │ task_rows: one row per task directory under DIR (a task.json in it: sandbox/world.py's
        │ format, read and checked by ``sandbox.world.load_task``), in the order of their ids
        ▼
    rows {question, messages: [user], answer: "", task: "swe", task_id, world: <task directory>}
        │ areal/dataset.py: load_rows, get_custom_dataset
        ▼
    sandboxed episodes (rollout.openai.mode=subproc): the agent gets the row without ``world`` and
    works in /workspace, a private copy-on-write view of the task's repo/; the grader's verdict
    on the final workspace is the reward (sandbox/grader.py); no reward function is needed.

A task library is data, not code: it must not sit inside a Python package of the project (every
package directory is readable to episodes); sandbox/world.py masks a task's library in its own
episodes anyway. Both splits hold every task (a library has no held-out side of its own: name
another library in data.eval for one). docs/swe-tasks.md says how to write a task.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PREFIX = "swe:"
TASK_FILE = "task.json"
PREAMBLE = (
    "You are working in a Python repository, checked out in /workspace (your current directory). "
    "You can run shell commands there; there is no network. The tests in tests/ show how the code "
    "is used (python -m pytest -q tests). Fix the problem below by editing the source code; do not "
    "edit the tests: hidden checks decide whether the problem is fixed.\n\n"
)


def is_swe_spec(path: str) -> bool:
    """Whether a data path (data.train, data.eval) names a task library."""
    return path.startswith(PREFIX)


def library_dir(spec: str) -> Path:
    """The directory ``spec`` names: as given when absolute or found from the working directory,
    else from the project's root; a ``ValueError`` naming both places when neither holds it."""
    name = spec[len(PREFIX) :]
    if not name:
        raise ValueError(f"{spec!r} names no directory: write {PREFIX}DIR (e.g. {PREFIX}tasks/swe)")
    project = Path(__file__).resolve().parents[2]
    for base in (Path.cwd(), project):
        path = (base / name).resolve()
        if path.is_dir():
            return path
    raise ValueError(f"{spec!r}: no directory {name} in {Path.cwd()} or {project}")


def task_rows(spec: str) -> list[dict[str, Any]]:
    """One row per task of the library ``spec`` names (module docstring)."""
    from sandbox.world import load_task  # the one reader of the format

    root = library_dir(spec)
    tasks = [load_task(str(d)) for d in sorted(root.iterdir()) if (d / TASK_FILE).is_file()]
    if not tasks:
        raise ValueError(f"{spec!r}: no task directory (one holding a {TASK_FILE}) in {root}")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{spec!r}: task ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    return [_row(t.id, t.prompt, t.dir) for t in sorted(tasks, key=lambda t: t.id)]


def _row(task_id: str, prompt: str, task_dir: str) -> dict[str, Any]:
    question = PREAMBLE + prompt
    return {
        "question": question,
        "messages": [{"role": "user", "content": question}],
        "answer": "",
        "task": "swe",
        "task_id": task_id,
        "world": os.path.realpath(task_dir),
    }


def has_worlds(rows: list[dict[str, Any]] | None) -> bool:
    """Whether any of ``rows`` names a world (a task directory under ``world``)."""
    return bool(rows) and any(r.get("world") for r in rows)
