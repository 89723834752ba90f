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

import json
from typing import Any

from openai import AsyncOpenAI

from areal.api.workflow_api import AgentWorkflow
from areal.workflow.common import CALCULATOR_TOOL, TOOL_SYSTEM_PROMPT, calculator, gateway_kwargs, math_reward, question


def _client(extra_kwargs: dict[str, Any]) -> AsyncOpenAI:
    return AsyncOpenAI(**gateway_kwargs(extra_kwargs), max_retries=0)


class MathAgent(AgentWorkflow):
    def __init__(self, temperature: float = 1.0, max_tokens: int = 64) -> None:
        self.temperature, self.max_tokens = temperature, max_tokens

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        completion = await _client(extra_kwargs).chat.completions.create(
            model="default", messages=[{"role": "user", "content": question(data)}],
            temperature=self.temperature, max_tokens=self.max_tokens,
        )
        return await math_reward(completions=completion.choices[0].message.content or "", answer=data["answer"])


class MathToolAgent(AgentWorkflow):
    def __init__(self, temperature: float = 1.0, max_tokens: int = 64, max_turns: int = 4) -> None:
        self.temperature, self.max_tokens, self.max_turns = temperature, max_tokens, max_turns

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        client = _client(extra_kwargs)
        messages: list[dict[str, Any]] = [{"role": "system", "content": TOOL_SYSTEM_PROMPT},
                                          {"role": "user", "content": question(data)}]
        answer = ""
        for _ in range(self.max_turns):
            completion = await client.chat.completions.create(
                model="default", messages=messages, tools=[CALCULATOR_TOOL],
                temperature=self.temperature, max_tokens=self.max_tokens,
            )
            msg = completion.choices[0].message
            answer = msg.content or ""
            if not msg.tool_calls:
                break
            messages.append(msg.model_dump(exclude_none=True))
            for call in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": _run_tool(call.function.name, call.function.arguments)})
        return await math_reward(completions=answer, answer=data["answer"])


def _run_tool(name: str, arguments: str) -> str:
    if name != "calculator":
        return f"error: unknown tool {name!r}"
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as e:
        return f"error: arguments are not JSON ({e})"
    return calculator(args.get("expression", "")) if isinstance(args, dict) else "error: arguments must be an object"
