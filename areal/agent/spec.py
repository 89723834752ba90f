"""Loading user agents and turning what ``run()`` returned into an ``EpisodeOutcome``.

Used by both rollout modes: the sandbox zygote (``subproc``) and the controller's own event loop
(``inline``), so an agent behaves the same in either.

An agent spec is ``TARGET:ATTR``. TARGET is a dotted module (``my_pkg.agents``) or a Python file
path (``agents/openai_math.py``). File paths exist because the OpenAI Agents SDK owns the
top-level package name ``agents``: our example folder of that name is therefore not importable as
a package, and is loaded by path under a private module name instead. ATTR names a class
(instantiated with no arguments), an object with an async ``run`` method, or an async function.

``exec:PATH`` names a program instead (any language, e.g. agents/shell_agent.sh): the row as
JSON on stdin, ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` and the Anthropic pair in its environment
(sandboxed or inline), its result as the last line of stdout.

Environment libraries are agents too: ``verifiers:[ENV+]TASKSET`` runs a verifiers environment in
its private venv (``areal/agent/verifiers_env.py``), ``textarena:GAME`` plays a TextArena game
(``areal/agent/textarena_env.py``), ``openenv:MODULE:CLASS`` runs an OpenEnv environment class in the
episode (``areal/agent/openenv_env.py``); ``agent_kwargs`` is their configuration. A software-engineering
agent too: ``mini-swe[:CONFIG]`` runs mini-swe-agent's own loop in its private venv (``areal/agent/mini_swe.py``).
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
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx
import msgspec

from areal.agent import environment, mini_swe, openenv_env, textarena_env, verifiers_env
from areal.agent.failures import classify_exception, raised_types
from areal.protocol import EpisodeOutcome


class EpisodeRunner(Protocol):
    """Runs one episode of the agent and says how it ended; the controller is written against
    this. Implementations: ``sandbox.zygote_client.Zygote`` (a sandboxed process per episode),
    ``InlineRunner`` below (the controller's own event loop, for trusted agents) and
    ``areal.cluster.ray_rollout.RayRunner`` (zygotes on Ray nodes).
    ``api_key`` is the episode's gateway session key; ``deadline_s`` its wall-clock limit.
    What a kind brings beyond this (sessions on gateways of its own, a zygote to restart, crashes
    it names as lost) is handed to ``areal.controller.episodes.Episodes`` where the controller starts it."""

    async def run_episode(self, episode_id: str, data: dict, api_key: str, deadline_s: float) -> EpisodeOutcome: ...

    async def close(self) -> None: ...


AgentRun = Callable[..., Awaitable[Any]]
EXEC_PREFIX = "exec:"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def load_agent(spec: str, kwargs: dict[str, Any] | None = None) -> AgentRun:
    """Resolve an agent spec to its async ``run(data, **extra_kwargs)`` callable; a class is
    built with ``kwargs`` (``rollout.agent_kwargs``, AReaL's ``workflow_kwargs``)."""
    if spec.startswith(EXEC_PREFIX):
        return executable_agent(spec[len(EXEC_PREFIX) :])
    if spec.startswith(verifiers_env.PREFIX):
        return verifiers_env.verifiers_agent(spec, kwargs)
    if spec.startswith(textarena_env.PREFIX):
        return textarena_env.textarena_agent(spec, kwargs)
    if mini_swe.is_mini_swe_spec(spec):
        return mini_swe.mini_swe_agent(spec, kwargs)
    if spec.startswith(openenv_env.PREFIX):
        return openenv_env.openenv_agent(spec, _load_module, kwargs)
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"agent spec must be TARGET:ATTR (a module or .py file, then a name), got {spec!r}")
    module = _load_module(target)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"agent spec {spec!r}: {target} has no attribute {attr!r}") from None
    if inspect.isclass(obj):
        obj = obj(**(kwargs or {}))
    elif kwargs:
        raise ValueError(f"agent spec {spec!r}: agent_kwargs {sorted(kwargs)} need a class to build, and {attr!r} is not one")
    return agent_run(obj, f"agent spec {spec!r}")


def load_reward_fn(spec: str) -> Callable[..., float]:
    """The reward function named by ``spec`` (``MODULE:ATTR`` or ``file.py:name``), called as AReaL
    calls one: ``fn(prompt, completions, prompt_ids, completion_ids, **row)`` -> a number."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"reward must be MODULE:ATTR or file.py:name, got {spec!r}")
    fn = getattr(_load_module(target), attr, None)
    if not callable(fn):
        raise ValueError(f"reward {spec!r}: {target} has no function {attr!r}")
    return fn


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

    async def run(data: dict, **_: Any) -> Any:
        env = dict(os.environ)  # the episode's endpoint variables among them, inline too (areal/agent/environment.py)
        proc = await asyncio.create_subprocess_exec(str(path), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env)
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


FLOAT_RANGE = (-sys.float_info.max, sys.float_info.max)  # what a float can hold: the range before the run's own
_NAMED = 5  # bad entries quoted in one error message; the rest are counted


def outcome_from_result(episode_id: str, result: Any, wall_s: float = 0.0) -> EpisodeOutcome:
    """Map ``run()``'s return value: a number is the episode reward, a dict maps completion ids
    to rewards, ``None`` leaves the reward to the gateway (``set_reward``) or to the run's
    ``reward`` function (the controller checks that one of them gave it). Anything else, a
    non-finite number, or a dict with a non-string key or a value that is not a finite number,
    is an error outcome naming the bad entries (not trained on).

    Whether the ids are this episode's and the rewards within ``rollout.reward_range`` is checked
    by the controller (``check_episode_rewards``), which alone knows both."""

    def error(message: str) -> EpisodeOutcome:
        return EpisodeOutcome(episode_id, "error", error=message, wall_s=wall_s)

    if isinstance(result, dict):
        problems = []
        for k, v in result.items():
            why = [f"key of type {type(k).__name__}, not a completion id string"] if not isinstance(k, str) else []
            why += [w for w in [_reward_problem(v, *FLOAT_RANGE)] if w]
            if why:
                problems.append(f"{_quote(k)} -> {_quote(v)} ({'; '.join(why)})")
        if problems:
            return error(f"run() returned a {{completion_id: reward}} dict with bad entries: {_listed(problems)}")
        return EpisodeOutcome(episode_id, "ok", rewards_by_id={k: float(v) for k, v in result.items()}, wall_s=wall_s)
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        if why := _reward_problem(result, *FLOAT_RANGE):
            return error(f"run() returned the reward {_quote(result)} ({why})")
        return EpisodeOutcome(episode_id, "ok", reward=float(result), wall_s=wall_s)
    if result is None:
        return EpisodeOutcome(episode_id, "ok", wall_s=wall_s)
    return error(
        f"run() returned {_quote(result)} of type {type(result).__name__}; expected a float, a {{completion_id: reward}} dict or None"
    )


def check_episode_rewards(outcome: EpisodeOutcome, recorded: Mapping[str, float | None], reward_range: Sequence[float]) -> EpisodeOutcome:
    """``outcome`` if every reward of this ok episode is one it may give, else an error outcome
    (not trained on) naming each bad entry with its id and value.

    ``recorded`` maps the episode's own completion ids (its gateway session's interactions) to the
    reward already set on it (``set_reward`` through the gateway or a client), None when unset.
    Checked: the float reward, every entry of a {completion_id: reward} dict (the id must be one
    of ``recorded``), and every reward already set: each a finite number within ``reward_range`` ([low, high]). The
    controller calls this for every outcome, whoever produced it: a sandboxed agent's outcome is
    the agent's word, and ``outcome_from_result`` cannot know the episode's ids or the range.
    """
    if outcome.status != "ok":
        return outcome
    low, high = reward_range
    problems = []
    if outcome.reward is not None and (why := _reward_problem(outcome.reward, low, high)):
        problems.append(f"the episode reward {_quote(outcome.reward)} ({why})")
    for k, v in outcome.rewards_by_id.items():
        whys = [] if isinstance(k, str) and k in recorded else ["not a completion id of this episode"]
        whys += [w for w in [_reward_problem(v, low, high)] if w]
        if whys:
            problems.append(f"{_quote(k)} -> {_quote(v)} ({'; '.join(whys)})")
    for k, v in recorded.items():
        if v is not None and (why := _reward_problem(v, low, high)):
            problems.append(f"{_quote(k)} -> {_quote(v)} set with set_reward ({why})")
    if not problems:
        return outcome
    ids = list(recorded)
    own = ", ".join(_quote(i) for i in ids[:_NAMED]) + (f" and {len(ids) - _NAMED} more" if len(ids) > _NAMED else "")
    return msgspec.structs.replace(
        outcome,
        status="error",
        reward=None,
        rewards_by_id={},
        error=f"rewards this episode cannot give (rollout.reward_range [{low:g}, {high:g}]; its completion ids: "
        f"{own or 'none'}): {_listed(problems)}",
    )


def _reward_problem(value: Any, low: float, high: float) -> str | None:
    """Why ``value`` cannot be a reward within [low, high], or None when it can."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"of type {type(value).__name__}, not a number"
    if isinstance(value, float) and not math.isfinite(value):
        return "not finite"
    if not low <= value <= high:  # exact for ints of any size (float(10**400) would overflow)
        return f"outside [{low:g}, {high:g}]"
    return None


def _quote(x: Any) -> str:
    """``repr`` cut to a readable length: an agent's key or value may be any size."""
    text = repr(x)
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} chars)"


def _listed(problems: list[str]) -> str:
    more = len(problems) - _NAMED
    return "; ".join(problems[:_NAMED]) + (f"; and {more} more" if more > 0 else "")


def outcome_from_exception(episode_id: str, exc: BaseException, wall_s: float) -> EpisodeOutcome:
    """An error outcome holding the traceback and the failure's class (``areal/agent/failures.py``)."""
    text = "".join(traceback.format_exception(exc))
    failure_class, failure_cause = classify_exception(exc)
    return EpisodeOutcome(
        episode_id,
        "error",
        error=text[-8000:],
        wall_s=wall_s,
        failure_class=failure_class,
        failure_cause=failure_cause,
        raised=raised_types(exc),
    )


def class_spec(cls: type) -> str | None:
    """``module:Class`` (or ``script.py:Class``) when the class can be rebuilt with no arguments."""
    required = [
        p
        for p in inspect.signature(cls).parameters.values()
        if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if required or "<locals>" in cls.__qualname__:
        return None
    if cls.__module__ == "__main__":
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        return f"{Path(main_file).resolve()}:{cls.__qualname__}" if main_file else None
    return f"{cls.__module__}:{cls.__qualname__}"


def agent_object_spec(agent: Any) -> str | None:
    """``module:Class`` (or ``file.py:Class``) rebuilding an agent object in another process, or
    None when its class needs constructor arguments or is not importable (defined in a function)."""
    return None if inspect.isfunction(agent) or inspect.isclass(agent) else class_spec(type(agent))


def hand_out(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """``client``, noted as the ``http_client`` the runners hand agents, so that SDKs built on
    ``httpx2`` (anthropic >= 2.11), which refuse httpx clients, take it too: they get an httpx2
    client sending through it (``areal/agent/httpx2_bridge.py``). Without httpx2 every SDK takes it."""
    if importlib.util.find_spec("httpx2") is not None:
        from areal.agent import httpx2_bridge

        httpx2_bridge.install()
        httpx2_bridge.HANDED.add(client)
    return client


class InlineRunner:
    """Runs trusted agents in the controller's own event loop (``rollout.openai.mode=inline``).
    ``agent`` is a spec (``TARGET:ATTR``) or an object with ``async run(data, **extra_kwargs)``."""

    def __init__(self, agent: str | Any, base_url: str, agent_kwargs: dict[str, Any] | None = None):
        self.run_agent = load_agent(agent, agent_kwargs) if isinstance(agent, str) else agent_run(agent, f"agent object {agent!r}")
        self.root = base_url
        # The session is in the URL path, so an agent that builds its client with no key (AReaL's
        # guide-era agents) needs only a placeholder to get past its SDK's own "missing key" check,
        # as AReaL's client module sets one. A key the user set is left alone.
        for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
            os.environ.setdefault(name, "none")
        # Each episode reads its own OPENAI_BASE_URL/..._API_KEY (and Anthropic's) from os.environ,
        # as a sandboxed one does; outside an episode they name this gateway (areal/agent/environment.py).
        environment.install()
        self.saved_environment = environment.point_at(base_url)
        self.http = hand_out(httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=256)))

    async def run_episode(self, episode_id: str, data: dict, api_key: str, deadline_s: float) -> EpisodeOutcome:
        t0 = time.monotonic()
        variables = environment.endpoint_variables(self.root, api_key)
        try:
            with environment.episode_environment(variables):
                result = await asyncio.wait_for(
                    # the session in the URL too: agents that send no key, or a placeholder, reach it
                    self.run_agent(data, base_url=variables["OPENAI_BASE_URL"], api_key=api_key, http_client=self.http),
                    deadline_s,
                )
        except TimeoutError:
            return EpisodeOutcome(
                episode_id, "timeout", error=f"episode exceeded its deadline of {deadline_s} s", wall_s=time.monotonic() - t0
            )
        except Exception as e:  # the agent's own failure: becomes the episode's outcome
            return outcome_from_exception(episode_id, e, time.monotonic() - t0)
        return outcome_from_result(episode_id, result, time.monotonic() - t0)

    async def close(self) -> None:
        environment.restore(self.saved_environment)
        await self.http.aclose()


def workflow_kind(obj: Any) -> str:
    """``"rollout"`` for an object with ``async arun_episode``, ``"agent"`` for one with
    ``async run`` (or an async function); ``TypeError`` naming what was found otherwise."""
    if inspect.iscoroutinefunction(getattr(obj, "arun_episode", None)):
        return "rollout"
    if inspect.iscoroutinefunction(getattr(obj, "run", None)) or (inspect.iscoroutinefunction(obj) and not inspect.isclass(obj)):
        return "agent"
    raise TypeError(
        f"{obj!r} is not a workflow: it needs `async def run(data, **extra_kwargs)` (AgentWorkflow) "
        f"or `async def arun_episode(engine, data)` (RolloutWorkflow)"
    )
