"""Math agents on LangChain (``langchain-openai``'s ``ChatOpenAI`` pointed at the gateway).

``MathAgent``: one ``ainvoke``. ``MathToolAgent``: the model bound to the embedded model's
calculator tool; every tool call it makes is executed and answered with a ``ToolMessage`` until
it gives a final answer or ``max_turns`` calls are spent. Rewards as in the OpenAI-SDK agents.
"""

from __future__ import annotations

from typing import Any

import httpx
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI

from areal.api.workflow_api import AgentWorkflow
from areal.workflow.common import (
    CALCULATOR_TOOL,
    TOOL_SYSTEM_PROMPT,
    Sampling,
    SamplingKwargs,
    calculator,
    gateway_kwargs,
    math_reward,
    question,
)


def _llm(extra_kwargs: dict[str, Any], sampling: Sampling) -> ChatOpenAI:
    gw = gateway_kwargs(extra_kwargs)
    # Without a client of ours, langchain-openai reuses one process-wide httpx client, which is
    # bound to the first event loop that used it: give each episode its own instead.
    if gw["http_client"] is None:
        gw["http_client"] = httpx.AsyncClient(timeout=httpx.Timeout(600.0))
    return ChatOpenAI(
        model="default",
        base_url=gw["base_url"],
        api_key=gw["api_key"],
        http_async_client=gw["http_client"],
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=sampling.call_tokens(),
        max_retries=0,
    )


class MathAgent(SamplingKwargs, AgentWorkflow):
    MAX_TURNS = 1

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        reply = await _llm(extra_kwargs, self.sampling).ainvoke([HumanMessage(question(data))])
        return await math_reward(completions=str(reply.content), answer=data["answer"])


class MathToolAgent(SamplingKwargs, AgentWorkflow):
    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        llm = _llm(extra_kwargs, self.sampling).bind_tools([CALCULATOR_TOOL])
        messages: list[Any] = [SystemMessage(TOOL_SYSTEM_PROMPT), HumanMessage(question(data))]
        answer = ""
        for _ in range(self.sampling.max_turns):
            reply = await llm.ainvoke(messages)
            answer = str(reply.content)
            if not reply.tool_calls:
                break
            messages.append(reply)
            for call in reply.tool_calls:
                result = (
                    calculator(call["args"].get("expression", ""))
                    if call["name"] == "calculator"
                    else f"error: unknown tool {call['name']!r}"
                )
                messages.append(ToolMessage(result, tool_call_id=call["id"]))
        return await math_reward(completions=answer, answer=data["answer"])
