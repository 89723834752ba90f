"""An OpenEnv environment as the agent (``rollout.agent=openenv:MODULE:CLASS``): the environment's own
reset/step loop in the episode's process, the model making every move through the gateway, each
step's reward going to the call that made the move.

    rollout.agent=openenv:my_envs.echo:EchoEnvironment     an openenv ``Environment`` subclass
    rollout.agent=openenv:envs/echo.py:EchoEnvironment      or one in a file
    '+rollout.agent_kwargs.env={size: 3}'                    its constructor's arguments

    row {seed}  ─► env = CLASS(**env); observation = reset(seed)        the env's state: this process's
    loop:          messages += [user: the observation's text]
                   call ─► gateway: [system?, user, assistant, user, ...] ─► reply (recorded)
                   observation = step(ACTION(<action field>=reply))      the call's move
                   the call's reward: observation.reward                 until observation.done
    end:           close()  ─►  {completion_id: the reward of the step that call's move made}

OpenEnv (``openenv-core``) serves an ``Environment`` over HTTP or WebSocket from a container; here
the same class runs in-process, in the episode's sandbox, with no server and no network: a user
points ``rollout.agent`` at the class their server would wrap. The conversation grows turn by turn
(each call extends its parent's tokens). The action is the env's action type (its
``Environment[Action, Observation, State]`` parameter) built from the reply: its one ``str`` field,
or ``action_field``. The observation's text is ``observation_field``, else its one ``str`` field
(besides ``done``, ``reward``, ``metadata``), else its fields as JSON. The episode is seeded from
the row's ``seed`` (else a hash of the row), so the samples of one prompt start the same way.

Invariants: at most ``max_moves`` calls (an env still running after them is an error, no reward
guessed); a step without a reward gives its move 0.0, an episode none of whose steps gave a reward
is an error (the env scores nothing); a reward that is not a finite number is an error. Every
error names the env: a module that does not import, a class that is not an ``Environment`` or
whose action cannot be built from text, constructor arguments it refuses (these at start, before
any episode).

What is covered: environments written on ``openenv-core``'s ``Environment`` (sync, or with
``reset_async``/``step_async``) whose actions take text. What is not: OpenEnv's HTTP/WebSocket
clients and Docker images (the sandbox has no network: run the class itself), MCP-tool
environments (``MCPEnvironment``'s tool calls), actions that are not text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import typing
from collections.abc import Awaitable, Callable
from typing import Any

PREFIX = "openenv:"
INSTALL = "pip install 'areal-lite[envs]' (or pip install openenv-core==0.2.1; make installs it from requirements.lock)"
_BASE_FIELDS = ("done", "reward", "metadata")  # openenv's Observation's own fields, not the env's content


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """``rollout.agent_kwargs`` of an OpenEnv agent."""

    env: dict[str, Any] = dataclasses.field(default_factory=dict)  # the environment class's constructor arguments
    action_field: str = ""  # the action's field the reply fills; empty: its one str field
    observation_field: str = ""  # the observation's field shown to the model; empty: its one str field, else JSON
    system: str = ""  # a system message before the first observation (none when empty)
    max_moves: int = 64  # the most calls an episode makes; an env still running after them is an error
    max_tokens: int = 64  # the limit of one move's completion
    temperature: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_moves", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.agent_kwargs.{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"rollout.agent_kwargs.temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.env, dict):
            raise ValueError(f"rollout.agent_kwargs.env must be a mapping (the constructor's arguments), got {self.env!r}")


def openenv_agent(spec: str, load_module: Callable[[str], Any], kwargs: dict[str, Any] | None = None) -> Callable[..., Awaitable[Any]]:
    """The agent run of ``spec`` (module docstring); ``load_module`` imports MODULE (a module name
    or a .py file). Checks now (in the zygote, before any fork) that the class is an OpenEnv
    environment whose action takes text and that it accepts ``env``: a ``ValueError`` naming it."""
    target, sep, attr = spec[len(PREFIX) :].rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"rollout.agent={spec!r}: write openenv:MODULE:CLASS (a module or .py file, then the Environment class)")
    try:
        config = EnvConfig(**(kwargs or {}))
    except TypeError as e:
        raise ValueError(f"rollout.agent={spec!r}: {e}; its agent_kwargs are {[f.name for f in dataclasses.fields(EnvConfig)]}") from None
    try:
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import Action
    except ImportError as e:
        raise ValueError(f"rollout.agent={spec!r}: openenv does not import ({e}): {INSTALL}") from None
    try:
        module = load_module(target)
    except Exception as e:  # the user's module failing to import, whatever it raises: named here, at start
        raise ValueError(f"OpenEnv environment {spec!r}: {target} does not import: {type(e).__name__}: {e}") from e
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"OpenEnv environment {spec!r}: {target}.{attr} is {cls!r:.100}, not a subclass of openenv's Environment")
    action_cls = _action_class(spec, cls, Environment, Action)
    field = _action_field(spec, action_cls, config.action_field)
    try:
        cls(**config.env).close()
    except TypeError as e:  # the constructor refused rollout.agent_kwargs.env
        raise ValueError(f"OpenEnv environment {spec!r}: {attr}(**rollout.agent_kwargs.env) failed: {e}") from None

    async def run(data: dict, base_url: str, api_key: str, http_client: Any = None, **_: Any) -> dict[str, float]:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        env = cls(**config.env)
        try:
            observation = await env.reset_async(seed=_seed(data))
            messages = [{"role": "system", "content": config.system}] if config.system else []
            rewards: dict[str, float] = {}
            scored = False
            while not observation.done:
                if len(rewards) == config.max_moves:
                    raise RuntimeError(f"OpenEnv environment {spec!r} did not end within max_moves={config.max_moves} moves")
                messages.append({"role": "user", "content": _text(observation, config.observation_field)})
                completion = await client.chat.completions.create(
                    model="default", messages=messages, max_tokens=config.max_tokens, temperature=config.temperature
                )
                reply = completion.choices[0].message.content or ""
                messages.append({"role": "assistant", "content": reply})
                observation = await env.step_async(action_cls(**{field: reply}))
                rewards[completion.id] = _reward(spec, observation.reward, len(rewards) + 1)
                scored = scored or observation.reward is not None
        finally:
            env.close()
        if not scored:
            raise RuntimeError(f"OpenEnv environment {spec!r} gave no reward: no step's observation had one (the env scores nothing)")
        return rewards

    return run


def _action_class(spec: str, cls: type, environment: type, action: type) -> type:
    """The action type ``cls`` declares (``Environment[ActionType, ...]``, on it or a base)."""
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin, args = typing.get_origin(base), typing.get_args(base)
            if isinstance(origin, type) and issubclass(origin, environment) and args:
                if isinstance(args[0], type) and issubclass(args[0], action):
                    return args[0]
    raise ValueError(
        f"OpenEnv environment {spec!r}: {cls.__name__} does not declare its action type: "
        f"write class {cls.__name__}(Environment[MyAction, MyObservation, State])"
    )


def _action_field(spec: str, action_cls: type, named: str) -> str:
    """The action's field that takes the reply: ``named``, else its one ``str`` field; every other
    field must have a default (the reply is all there is to build it from)."""
    fields = action_cls.model_fields  # pydantic: openenv's Action is a BaseModel
    text = [n for n, f in fields.items() if n != "metadata" and f.annotation is str]
    if named and named not in fields:
        raise ValueError(f"OpenEnv environment {spec!r}: {action_cls.__name__} has no field {named!r}; its fields: {', '.join(fields)}")
    if not named and len(text) != 1:
        raise ValueError(
            f"OpenEnv environment {spec!r}: {action_cls.__name__} has {len(text)} str fields ({', '.join(text) or 'none'}); "
            "name the one the model's reply fills with rollout.agent_kwargs.action_field"
        )
    field = named or text[0]
    required = [n for n, f in fields.items() if n != field and f.is_required()]
    if required:
        raise ValueError(
            f"OpenEnv environment {spec!r}: {action_cls.__name__} also requires {', '.join(required)}, which a reply cannot give"
        )
    return field


def _text(observation: Any, field: str) -> str:
    """What the model reads of an observation (module docstring)."""
    if field:
        return str(getattr(observation, field))
    content = {k: v for k, v in observation.model_dump().items() if k not in _BASE_FIELDS}
    text = [v for v in content.values() if isinstance(v, str)]
    return text[0] if len(text) == 1 else json.dumps(content, default=str)


def _reward(spec: str, value: Any, move: int) -> float:
    """A step's reward as its move's: 0.0 when it gave none; a number, finite, else an error."""
    if value is None:
        return 0.0
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RuntimeError(f"OpenEnv environment {spec!r} gave move {move} the reward {value!r:.80}, not a finite number")
    return float(value)  # a bool (openenv's Observation allows one) is 0.0 or 1.0


def _seed(data: dict) -> int:
    if isinstance(data.get("seed"), int):
        return data["seed"]
    return int.from_bytes(hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).digest()[:4], "little")
