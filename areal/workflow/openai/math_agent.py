"""Math agents on the plain OpenAI SDK: ``MathAgent`` (one call) and ``MathToolAgent`` (calculator).

``workflow=areal.workflow.openai.math_agent.MathAgent`` in the proxy-mode and agent-workflow
guides. Both are ordinary agents: an ``AsyncOpenAI`` client on the gateway the system hands
them (``base_url`` / ``api_key`` / ``http_client``, or the environment), a reward at the end.

``MathToolAgent`` offers the embedded model's calculator (the tool schema and system prompt it
was trained with), executes every tool call it makes, and answers the tool result back until
the model gives a final answer or ``max_turns`` calls are spent. Its reward is the final
answer's; every call of the episode is recorded by the gateway and trained on.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from areal.api.workflow_api import AgentWorkflow
from areal.workflow.common import gateway_kwargs, math_reward, question, solve_with_calculator


def _client(extra_kwargs: dict[str, Any]) -> AsyncOpenAI:
    return AsyncOpenAI(**gateway_kwargs(extra_kwargs), max_retries=0)


class MathAgent(AgentWorkflow):
    def __init__(self, temperature: float = 1.0, max_tokens: int = 64) -> None:
        self.temperature, self.max_tokens = temperature, max_tokens

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        completion = await _client(extra_kwargs).chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": question(data)}],
            temperature=self.temperature,
            max_tokens=self.max_tokens,
        )
        return await math_reward(completions=completion.choices[0].message.content or "", answer=data["answer"])


class MathToolAgent(AgentWorkflow):
    def __init__(self, temperature: float = 1.0, max_tokens: int = 64, max_turns: int = 4) -> None:
        self.temperature, self.max_tokens, self.max_turns = temperature, max_tokens, max_turns

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        answer = await solve_with_calculator(_client(extra_kwargs), data, self.max_turns, self.temperature, self.max_tokens)
        return await math_reward(completions=answer, answer=data["answer"])
