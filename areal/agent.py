"""Loading user agents and turning what ``run()`` returned into an ``EpisodeOutcome``.

Used by both rollout modes: the sandbox zygote (``subproc``) and the controller's own event loop
(``inline``), so an agent behaves the same in either.

An agent spec is ``TARGET:ATTR``. TARGET is a dotted module (``my_pkg.agents``) or a Python file
path (``agents/openai_math.py``). File paths exist because the OpenAI Agents SDK owns the
top-level package name ``agents``: our example folder of that name is therefore not importable as
a package, and is loaded by path under a private module name instead. ATTR names a class
(instantiated with no arguments), an object with an async ``run`` method, or an async function.

``exec:PATH`` names a program instead (any language, e.g. agents/shell_agent.sh): the row as
JSON on stdin, ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` (and the Anthropic pair, in the sandbox)
in its environment, its result as the last line of stdout.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Awaitable, Callable

from areal.protocol import EpisodeOutcome

AgentRun = Callable[..., Awaitable[Any]]
EXEC_PREFIX = "exec:"
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def load_agent(spec: str) -> AgentRun:
    """Resolve an agent spec to its async ``run(data, **extra_kwargs)`` callable."""
    if spec.startswith(EXEC_PREFIX):
        return executable_agent(spec[len(EXEC_PREFIX):])
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"agent spec must be TARGET:ATTR (a module or .py file, then a name), got {spec!r}")
    module = _load_module(target)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"agent spec {spec!r}: {target} has no attribute {attr!r}") from None
    if inspect.isclass(obj):
        obj = obj()
    return agent_run(obj, f"agent spec {spec!r}")


def agent_run(obj: Any, what: str = "agent") -> AgentRun:
    """The async ``run`` of an agent object (or the async function itself), called with only the
    keyword arguments it declares.

    The guides write ``async def run(self, data)`` as often as ``run(self, data, **extra_kwargs)``;
    the runners always offer ``base_url``/``api_key``/``http_client``, so an agent that does not
    name them (it reads ``OPENAI_BASE_URL`` instead) must not get a ``TypeError`` for them.
    """
    run = getattr(obj, "run", obj)
    if not inspect.iscoroutinefunction(run):
        raise ValueError(f"{what} must be an async function or an object with `async def run(data, **extra_kwargs)`")
    params = list(inspect.signature(run).parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return run
    accepted = {p.name for p in params[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

    async def filtered(data: dict, **extra_kwargs: Any) -> Any:
        return await run(data, **{k: v for k, v in extra_kwargs.items() if k in accepted})

    return filtered


def _resolve(target: str) -> Path:
    path = Path(target).resolve()
    if not path.is_file() and not Path(target).is_absolute():
        path = (PROJECT_ROOT / target).resolve()  # the bundled examples, from any working dir
    if not path.is_file():
        raise ValueError(f"agent file {target!r} does not exist (looked in {Path.cwd()} and {PROJECT_ROOT})")
    return path


def executable_agent(target: str) -> AgentRun:
    """An agent that is a program: each episode runs it with the dataset row as JSON on stdin;
    the last non-empty line of its stdout is the result (a JSON number or object). Its stderr is
    passed through (the episode log in the sandbox). A non-zero exit raises, naming the code."""
    path = _resolve(target)
    if not os.access(path, os.X_OK):
        raise ValueError(f"agent spec {EXEC_PREFIX}{target}: {path} is not executable")

    async def run(data: dict, *, base_url: str | None = None, api_key: str | None = None, **_: Any) -> Any:
        env = dict(os.environ)
        if base_url and api_key and "OPENAI_BASE_URL" not in env:  # inline mode: no relay, no variables
            env.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key)
        proc = await asyncio.create_subprocess_exec(str(path), stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, env=env)
        try:
            out, _ = await proc.communicate(json.dumps(data).encode())
        finally:  # cancelled (deadline, inline timeout): do not leave the program behind
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"{path.name} exited with code {proc.returncode}")
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        if not lines:
            raise RuntimeError(f"{path.name} printed no result on stdout")
        return json.loads(lines[-1])

    return run


def _load_module(target: str) -> Any:
    if target.endswith(".py") or "/" in target:
        path = _resolve(target)
        name = f"areal_user_agent_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
        return module
    return importlib.import_module(target)


def outcome_from_result(episode_id: str, result: Any, wall_s: float = 0.0) -> EpisodeOutcome:
    """Map ``run()``'s return value: a number is the episode reward, a dict maps completion ids
    to rewards. Anything else is an error outcome naming the type (the episode is not trained on)."""
    if isinstance(result, bool) or result is None:
        return EpisodeOutcome(episode_id, "error", error=f"run() returned {result!r}; expected a float or a {{completion_id: reward}} dict", wall_s=wall_s)
    if isinstance(result, (int, float)):
        if not math.isfinite(result):
            return EpisodeOutcome(episode_id, "error", error=f"run() returned a non-finite reward {result!r}", wall_s=wall_s)
        return EpisodeOutcome(episode_id, "ok", reward=float(result), wall_s=wall_s)
    if isinstance(result, dict):
        bad = [k for k, v in result.items() if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float))]
        if bad:
            return EpisodeOutcome(episode_id, "error", error=f"run() returned a dict with non str->number entries: {bad[:3]!r}", wall_s=wall_s)
        return EpisodeOutcome(episode_id, "ok", rewards_by_id={k: float(v) for k, v in result.items()}, wall_s=wall_s)
    return EpisodeOutcome(episode_id, "error", error=f"run() returned {type(result).__name__}; expected a float or a dict", wall_s=wall_s)


def outcome_from_exception(episode_id: str, exc: BaseException, wall_s: float) -> EpisodeOutcome:
    text = "".join(traceback.format_exception(exc))
    return EpisodeOutcome(episode_id, "error", error=text[-8000:], wall_s=wall_s)
