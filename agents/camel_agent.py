"""A CAMEL-AI ``ChatAgent`` with the calculator as a tool, on ``AReaLOpenAICompatibleModel``.

    ChatAgent(system=TOOL_SYSTEM_PROMPT, tools=[calculator], model=AReaLOpenAICompatibleModel(
        openai_client=AsyncOpenAI(gateway), tokenizer=<policy tokenizer>, model_type="areal"))
      └─ await agent.astep(question): CAMEL calls the model, executes the tool calls, calls again

The model backend is the design documents' ``areal.experimental.camel.openai_model``: CAMEL's own
OpenAI-compatible backend over the client we give it, with an offline token counter built on
the policy's tokenizer (CAMEL's default counter downloads a tiktoken encoding, and the sandbox
has no network). CAMEL runs the tool loop itself (``max_iteration`` bounds it); each model call
is one request the gateway records token by token.

The tokenizer is loaded once, when the agent object is built: in subprocess mode that happens in
the sandbox zygote, before it forks the episodes, so no episode pays for it. ``tokenizer_path``
names an HF model directory, or ``embedded`` for the embedded default. CAMEL only uses the count
to trim history against the context window, so a near miss costs nothing but trimming.

Invariants: ``astep`` (async) only, since the client is async; the reward (a float, shared by
every recorded call) is the math-answer verifier's verdict on the final message.
"""

from __future__ import annotations

from typing import Any

from camel.agents import ChatAgent
from camel.toolkits import FunctionTool
from openai import AsyncOpenAI

from areal.experimental.camel.openai_model import AReaLOpenAICompatibleModel
from areal.reward.gsm8k import gsm8k_reward_fn
from areal.utils.hf_utils import load_hf_tokenizer
from areal.workflow.common import CALCULATOR_TOOL, TOOL_SYSTEM_PROMPT, calculator, gateway_kwargs, question


def calculator_tool(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * and parentheses."""
    return calculator(expression)


class CamelCalculatorAgent:
    def __init__(self, tokenizer_path: str = "embedded", max_iteration: int = 3, temperature: float = 1.0, max_tokens: int = 64) -> None:
        if max_iteration < 1:
            raise ValueError(f"max_iteration must be >= 1, got {max_iteration}")
        self.tokenizer = load_hf_tokenizer(tokenizer_path)
        self.max_iteration, self.temperature, self.max_tokens = max_iteration, temperature, max_tokens

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        client = AsyncOpenAI(**gateway_kwargs(extra_kwargs), max_retries=0)
        model = AReaLOpenAICompatibleModel(
            openai_client=client,
            tokenizer=self.tokenizer,
            model_type="areal",
            model_config_dict={"temperature": self.temperature, "max_tokens": self.max_tokens},
        )
        agent = ChatAgent(
            system_message=TOOL_SYSTEM_PROMPT,
            model=model,
            max_iteration=self.max_iteration,
            tools=[FunctionTool(calculator_tool, openai_tool_schema=CALCULATOR_TOOL)],
            retry_attempts=1,
        )  # a failed call is the episode's error, not a silent retry
        response = await agent.astep(question(data))
        text = response.msgs[0].content if response.msgs else ""
        return gsm8k_reward_fn(completions=text, answer=data["answer"])
