"""Math agents on LangChain: ``ChatOpenAI`` plain (``PlainMathAgent``) and with the calculator
bound as a tool (``ToolMathAgent``, ``bind_tools``).

    PlainMathAgent: [HumanMessage] ─ainvoke─► AIMessage \\boxed{answer}
    ToolMathAgent:  [System, Human] ─ainvoke─► AIMessage.tool_calls ─► ToolMessage(value) ─ainvoke─► answer

``ChatOpenAI`` points at the gateway (``base_url`` ending in ``/v1``, the session key as
``api_key``) and sends its requests through the ``http_client`` the system hands out (in the
sandbox, straight over ZeroMQ). Without a client of ours, langchain-openai would share one
process-wide httpx client bound to the first event loop that used it; each episode therefore
builds its own.

The tool agent uses the tool schema and system prompt the embedded model was trained with, so
the model really emits calls and the agent really executes them (``error: ...`` for a call it
cannot execute). Invariants: at most ``max_turns`` calls; the reward (a float, shared by every
recorded call) is the math-answer verifier's verdict on the last answer.
"""

from __future__ import annotations

from typing import Any

import httpx
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI

from areal.reward.gsm8k import gsm8k_reward_fn
from areal.workflow.common import CALCULATOR_TOOL, TOOL_SYSTEM_PROMPT, Sampling, calculator, gateway_kwargs, question


def chat_model(extra_kwargs: dict[str, Any], temperature: float, max_tokens: int) -> ChatOpenAI:
    gw = gateway_kwargs(extra_kwargs)
    http_client = gw["http_client"] or httpx.AsyncClient(timeout=httpx.Timeout(600.0))
    return ChatOpenAI(
        model="default",
        base_url=gw["base_url"],
        api_key=gw["api_key"],
        http_async_client=http_client,
        temperature=temperature,
        max_tokens=max_tokens,
        max_retries=0,
    )


def final_text(message: AIMessage) -> str:
    return message.content if isinstance(message.content, str) else str(message.content)


class PlainMathAgent:
    def __init__(self, temperature: float = 1.0, max_tokens: int = 64) -> None:
        self.temperature, self.max_tokens = temperature, max_tokens

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        reply = await chat_model(extra_kwargs, self.temperature, self.max_tokens).ainvoke([HumanMessage(question(data))])
        return gsm8k_reward_fn(completions=final_text(reply), answer=data["answer"])


class ToolMathAgent:
    def __init__(self, max_turns: int = 4, temperature: float = 1.0, max_tokens: int = 64) -> None:
        self.sampling = Sampling(temperature=temperature, max_tokens=max_tokens, max_turns=max_turns)

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        llm = chat_model(extra_kwargs, self.sampling.temperature, self.sampling.max_tokens).bind_tools([CALCULATOR_TOOL])
        messages: list[BaseMessage] = [SystemMessage(TOOL_SYSTEM_PROMPT), HumanMessage(question(data))]
        answer = ""
        for _ in range(self.sampling.max_turns):
            reply = await llm.ainvoke(messages)
            answer = final_text(reply)
            if not reply.tool_calls:
                break
            messages.append(reply)
            for call in reply.tool_calls:
                result = (
                    calculator(str(call["args"].get("expression", "")))
                    if call["name"] == "calculator"
                    else f"error: unknown tool {call['name']!r}"
                )
                messages.append(ToolMessage(result, tool_call_id=call["id"]))
        return gsm8k_reward_fn(completions=answer, answer=data["answer"])
