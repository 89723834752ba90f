"""What every SDK's math agent shares: the question, the gateway address, the calculator, the reward.

- ``question(data)``: AReaL rows carry ``messages`` (the last user turn is the question); this
  project's rows carry ``question``. Both work.
- ``gateway_kwargs(extra_kwargs)``: ``base_url`` / ``api_key`` / ``http_client`` from the
  system (``extra_kwargs``), else from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (set inside the
  sandbox), so an agent also runs by hand against any OpenAI-compatible server.
- ``calculator(expression)``, ``execute_tool_call``: the embedded model's tool (areal/embedded/calculator.py).
- ``math_reward``: ``gsm8k_reward_fn`` in a process pool (``AsyncRewardWrapper``), one pool per process.
- ``Sampling``: the keyword arguments every agent class takes, AReaL's ``workflow_kwargs``
  (``temperature``, ``top_p``, ``max_tokens``, ``max_completion_tokens``, ``max_turns``);
  ``SamplingKwargs``: the constructor that takes them, for an agent class to inherit.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from areal.api.reward_api import AsyncRewardWrapper
from areal.embedded.calculator import calculator, execute_tool_call
from areal.embedded.corpus import CALCULATOR_TOOL, TOOL_SYSTEM_PROMPT
from areal.reward.gsm8k import gsm8k_reward_fn

__all__ = [
    "CALCULATOR_TOOL",
    "TOOL_SYSTEM_PROMPT",
    "Sampling",
    "SamplingKwargs",
    "calculator",
    "execute_tool_call",
    "gateway_kwargs",
    "math_reward",
    "question",
]

math_reward = AsyncRewardWrapper(gsm8k_reward_fn, timeout_seconds=15.0, max_workers=1)


@dataclasses.dataclass
class Sampling:
    """How an agent samples. ``max_tokens`` alone is the limit of one call (this project's
    agents); with ``max_completion_tokens`` also given (AReaL's ``train.py`` passes both), that is
    the limit of one call and ``max_tokens`` the budget of the whole trajectory, as in AReaL."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    max_completion_tokens: int | None = None
    max_turns: int = 4

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"temperature must be >= 0 and top_p in (0, 1], got {self.temperature}, {self.top_p}")
        for name in ("max_tokens", "max_completion_tokens", "max_turns"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")

    def call_tokens(self, used: int = 0) -> int:
        """The max_tokens of the next call, ``used`` tokens into the trajectory."""
        if self.max_completion_tokens is None:
            return self.max_tokens
        return max(1, min(self.max_completion_tokens, self.max_tokens - used))

    def budget_left(self, used: int) -> bool:
        return self.max_completion_tokens is None or used < self.max_tokens

    def openai_args(self, used: int = 0) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.call_tokens(used)}


class SamplingKwargs:
    """The constructor of an agent class: AReaL's ``workflow_kwargs`` (by keyword) as
    ``self.sampling``. ``MAX_TURNS`` is the class's default ``max_turns``."""

    MAX_TURNS = 4

    def __init__(
        self,
        *,
        temperature: float = 1.0,
        max_tokens: int = 64,
        max_turns: int | None = None,
        top_p: float = 1.0,
        max_completion_tokens: int | None = None,
    ) -> None:
        turns = self.MAX_TURNS if max_turns is None else max_turns
        self.sampling = Sampling(temperature, top_p, max_tokens, max_completion_tokens, turns)


def question(data: dict[str, Any]) -> str:
    if "messages" in data:
        return data["messages"][-1]["content"]
    return data["question"]


def gateway_kwargs(extra_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``base_url`` (ending in /v1), ``api_key`` and ``http_client`` for an OpenAI-style client."""
    base_url = extra_kwargs.get("base_url") or os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        raise ValueError("no gateway address: pass base_url in extra_kwargs or set OPENAI_BASE_URL")
    return {
        "base_url": base_url,
        "api_key": extra_kwargs.get("api_key") or os.environ.get("OPENAI_API_KEY", "none"),
        "http_client": extra_kwargs.get("http_client"),
    }


async def solve_with_calculator(client: Any, data: dict[str, Any], sampling: Sampling) -> str:
    """Chat Completions with the calculator tool: execute every call, answer it back, until the
    model answers without a call, ``max_turns`` calls are spent or the token budget is. Returns
    the last answer text."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": TOOL_SYSTEM_PROMPT}, {"role": "user", "content": question(data)}]
    answer, used = "", 0
    for _ in range(sampling.max_turns):
        completion = await client.chat.completions.create(
            model="default", messages=messages, tools=[CALCULATOR_TOOL], **sampling.openai_args(used)
        )
        used = completion.usage.total_tokens if completion.usage else used
        message = completion.choices[0].message
        answer = message.content or ""
        if not message.tool_calls or not sampling.budget_left(used):
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": execute_tool_call(call.function.name, call.function.arguments)}
            )
    return answer
