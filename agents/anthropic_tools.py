"""A calculator-tool math agent on the Anthropic SDK (Messages API ``tool_use`` / ``tool_result``).

    user ─► assistant: [tool_use calculator{expression}] ─► user: [tool_result value] ─► assistant: \\boxed{answer}

``AsyncAnthropic`` points at the gateway's Messages API. The SDK appends ``/v1/messages`` to its
base URL itself, so the URL is the bare gateway address: ``base_url`` without its ``/v1`` (in
the sandbox, the in-sandbox relay), else ``ANTHROPIC_BASE_URL``. No ``http_client`` is passed
(passing the handed one works too, see areal/agent/httpx2_bridge.py): the SDK makes its own pool,
closed with the client, and the relay carries plain HTTP to the gateway.

The tool is the embedded model's calculator (its schema as an Anthropic ``input_schema``) under
the system prompt it was trained with, so the model really emits calls and this agent really
executes them; a bad call is answered with an ``error: ...`` result (is_error), not a crash.
Invariants: at most ``max_turns`` calls; the reward (a float, shared by every recorded call) is
the math-answer verifier's verdict on the last text answer.
"""

from __future__ import annotations

import os
from typing import Any

from anthropic import AsyncAnthropic

from areal.reward.gsm8k import gsm8k_reward_fn
from areal.workflow.common import CALCULATOR_TOOL, TOOL_SYSTEM_PROMPT, Sampling, calculator, question

CALCULATOR = {
    "name": "calculator",
    "description": CALCULATOR_TOOL["function"]["description"],
    "input_schema": CALCULATOR_TOOL["function"]["parameters"],
}


def anthropic_client(extra_kwargs: dict[str, Any]) -> AsyncAnthropic:
    """A client on the gateway's Messages API: ``base_url``/``api_key`` from the system when given
    (never a stray ANTHROPIC_BASE_URL of the user's shell in inline mode), else the sandbox's."""
    if extra_kwargs.get("base_url"):
        base_url, api_key = extra_kwargs["base_url"].rstrip("/").removesuffix("/v1"), extra_kwargs.get("api_key")
    else:
        base_url, api_key = os.environ.get("ANTHROPIC_BASE_URL"), os.environ.get("ANTHROPIC_API_KEY")
    if not base_url or not api_key:
        raise ValueError("no gateway address: pass base_url/api_key in extra_kwargs or set ANTHROPIC_BASE_URL/ANTHROPIC_API_KEY")
    return AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=0)


def execute_tool_use(name: str, tool_input: Any) -> tuple[str, bool]:
    """(result text, is_error) for one ``tool_use`` block."""
    if name != "calculator":
        return f"error: unknown tool {name!r}", True
    if not isinstance(tool_input, dict):
        return "error: input must be an object", True
    result = calculator(tool_input.get("expression", ""))
    return result, result.startswith("error:")


class AnthropicCalculatorAgent:
    def __init__(self, max_turns: int = 4, temperature: float = 1.0, max_tokens: int = 64) -> None:
        self.sampling = Sampling(temperature=temperature, max_tokens=max_tokens, max_turns=max_turns)

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        async with anthropic_client(extra_kwargs) as client:  # its own httpx2 pool: closed before the loop ends
            return await self._episode(client, data)

    async def _episode(self, client: AsyncAnthropic, data: dict[str, Any]) -> float:
        messages: list[dict[str, Any]] = [{"role": "user", "content": question(data)}]
        answer = ""
        for _ in range(self.sampling.max_turns):
            reply = await client.messages.create(
                model="default",
                max_tokens=self.sampling.max_tokens,
                system=TOOL_SYSTEM_PROMPT,
                tools=[CALCULATOR],
                messages=messages,
                extra_body={"temperature": self.sampling.temperature},  # anthropic 2.x dropped the keyword; the API keeps the field
            )
            answer = "".join(block.text for block in reply.content if block.type == "text")
            uses = [block for block in reply.content if block.type == "tool_use"]
            if not uses:
                break
            messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]})
            results = []
            for use in uses:
                text, is_error = execute_tool_use(use.name, use.input)
                results.append({"type": "tool_result", "tool_use_id": use.id, "content": text, "is_error": is_error})
            messages.append({"role": "user", "content": results})
        return gsm8k_reward_fn(completions=answer, answer=data["answer"])
