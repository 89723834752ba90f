"""AReaL's two workflow shapes, as typing and API regulation (no behaviour lives here).

- ``AgentWorkflow``: ``async run(data, **extra_kwargs) -> float | dict[str, float]``. The agent
  talks to the gateway through ``extra_kwargs`` (``base_url``, ``api_key``, ``http_client``) or
  the environment (``OPENAI_BASE_URL`` ...) and returns the episode's reward, or a reward per
  completion/response id. This is the system's own agent interface (``areal/agent/spec.py``), so it
  runs sandboxed (``rollout.openai.mode=subproc``) or in the controller's loop (``inline``).
  Any object with such a ``run`` works; subclassing is optional.
- ``RolloutWorkflow``: ``async arun_episode(engine, data) -> {id: InteractionWithTokenLogpReward}``.
  The workflow gets the engine object itself and records its calls with ``ArealOpenAI(engine=,
  tokenizer=)``, returning the exported interactions (each carrying its reward). It needs the
  engine in-process, so it always runs in the controller's event loop.

``workflow_kind(obj)`` tells the two apart by their methods (duck typing, like AReaL), so
user classes that do not subclass these still work.
"""

from __future__ import annotations

import abc
from typing import Any

from areal.agent.spec import workflow_kind  # noqa: F401  -- AReaL's import path; the one implementation is areal/agent/spec.py
from areal.gateway.tree import InteractionWithTokenLogpReward


class AgentWorkflow(abc.ABC):
    """An agent: ``async run(data, **extra_kwargs)`` returning a reward or ``{id: reward}``."""

    @abc.abstractmethod
    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float | dict[str, float]:
        """Run one episode on ``data`` and return its reward (or a reward per completion id)."""


class RolloutWorkflow(abc.ABC):
    """An episode over an engine object: returns the exported interactions with rewards."""

    @abc.abstractmethod
    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, InteractionWithTokenLogpReward] | None:
        """Run one episode (possibly several trajectories) on ``data``; ``None`` rejects it."""
