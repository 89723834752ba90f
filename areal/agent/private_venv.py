"""Agents whose own loop runs with a private venv's interpreter (``verifiers_env``, ``mini_swe``):
the controller's and the episode's half of that process boundary, the same for each.

    agent module (this project's interpreter)            the same file, run by the private venv's
    ─────────────────────────────────────────            ────────────────────────────────────────
    call / call_async(python, FILE, COMMAND, request) ──► python -P FILE --inside COMMAND
        reply_of: the last stdout line, or an error  ◄── one JSON line on stdout (its log on stderr)
        naming the interpreter and its exit code

The private side is the agent module's own file, so its top level imports only the standard
library, and it imports this module only in its controller-side functions (``-P``: the file's
folder, areal/agent/, must not shadow top-level names in the private venv). A cancelled call (an
inline episode's deadline) stops the private side with SIGTERM, then SIGKILL after
``TERM_GRACE_S``, so that it can stop processes of its own first.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

TERM_GRACE_S = 5.0


def venv_dir(variable: str, name: str) -> Path:
    """Where a private venv is: ``$variable``, else ``$AREAL_CACHE/<name>`` (``~/.cache/areal/<name>``)."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    return Path(os.environ.get("AREAL_CACHE", Path.home() / ".cache" / "areal")) / name


def interpreter(venv: Path, what: str, target: str, variable: str, holding: str, error: type[Exception]) -> Path:
    """The venv's interpreter; ``error`` saying how to build it (``make target``) when absent."""
    python = venv / "bin" / "python"
    if not python.exists():
        raise error(
            f"{what} runs in its own venv and {python} does not exist: build it with `make {target}` in areal's "
            f"checkout ({variable} sets where), or point {variable} at a venv holding {holding}"
        )
    return python


def command(python: str, script: str, inside: str) -> list[str]:
    return [python, "-P", script, "--inside", inside]


def reply_of(what: str, python: str, code: int | None, out: bytes) -> dict[str, Any]:
    """The private side's one JSON line (everything else it printed went to stderr, the log)."""
    lines = out.decode(errors="replace").strip().splitlines()
    if code != 0 or not lines:
        return {"error": f"{what}: {python} exited with code {code} without a reply (its log says why)"}
    return json.loads(lines[-1])


def call(python: str, script: str, inside: str, request: bytes, what: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the private side's ``inside`` command to its end (``env`` None: this process's environment)."""
    done = subprocess.run(command(python, script, inside), input=request, stdout=subprocess.PIPE, env=env)
    return reply_of(what, python, done.returncode, done.stdout)


async def call_async(python: str, script: str, inside: str, request: bytes, what: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``call`` from an event loop; cancelled, it stops the private side (module docstring)."""
    proc = await asyncio.create_subprocess_exec(
        *command(python, script, inside), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env
    )
    try:
        out, _ = await proc.communicate(request)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), TERM_GRACE_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    return reply_of(what, python, proc.returncode, out)
