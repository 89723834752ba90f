"""Scripted agents for tasks with a world (tests/integration/sandbox/test_world*.py, tests/e2e/test_swe_run.py).

``ShellAgent`` acts as a software-engineering agent does, without a model: it writes the files of
``data["files"]`` (paths relative to its working directory, /workspace), then runs each shell
command of ``data["commands"]`` there. It returns ``data["claim"]`` (default 1.0), a reward of its
own that the sandbox must ignore for a world. With ``data["report"]`` it raises ``Observed``
carrying what each command printed: the test reads it from the outcome's error.

With ``data["survey"]`` it first lists what it reaches (sandbox/reach.py's survey, as JSON).

``ModelShellAgent`` is the same after one call to the model through the gateway (a whole run's
plumbing: every episode records a completion).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import msgspec


class Observed(Exception):
    """What the commands printed, as JSON after ``OBSERVED ``."""


def act(data: dict) -> list[dict[str, Any]]:
    for rel, text in data.get("files", {}).items():
        os.makedirs(os.path.dirname(rel) or ".", exist_ok=True)
        with open(rel, "w") as f:
            f.write(text)
    seen: list[dict[str, Any]] = [{"cwd": os.getcwd()}]
    if data.get("survey"):  # what the episode reaches (sandbox/reach.py), before it acts
        from sandbox.reach import survey

        seen.append({"survey": msgspec.json.encode(survey()).decode()})
    for cmd in data.get("commands", []):
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120)
        seen.append({"cmd": cmd, "rc": p.returncode, "out": p.stdout[-4000:], "err": p.stderr[-4000:]})
    return seen


class ShellAgent:
    async def run(self, data: dict, **kw: Any) -> float:
        seen = act(data)
        if data.get("report"):
            raise Observed("OBSERVED " + json.dumps(seen))
        return float(data.get("claim", 1.0))


class ModelShellAgent:
    async def run(self, data: dict, base_url: str, api_key: str, http_client: Any = None, **kw: Any) -> None:
        import openai

        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["question"]}], max_tokens=16)
        act(data)
        return None  # the grader's verdict is the reward
