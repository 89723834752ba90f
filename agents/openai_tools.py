"""A calculator-tool math agent on the plain OpenAI SDK (Chat Completions ``tools``).

    system + user ─► assistant: tool_calls[calculator(expression)] ─► tool: value ─► assistant: \\boxed{answer}

The tool schema and system prompt are the ones the embedded model was SFT-trained with
(``areal.embedded.corpus.CALCULATOR_TOOL`` / ``TOOL_SYSTEM_PROMPT``), so the model really emits
calls (Qwen2.5 ``<tool_call>{json}</tool_call>``, parsed by the gateway into ``tool_calls``) and
this agent really executes them. A call it cannot execute (unknown tool, arguments that are not
a JSON object, an expression outside + - * / and parentheses) is answered with an ``error: ...``
tool message: a bad call is the policy's mistake, scored by the final answer, not a crash.

``make demo`` trains this agent (``conf/agentic.yaml``) on the embedded model's agentic
variant (``areal/embedded/agentic.py``), SFT-trained to use the tool unreliably: RL teaches it
to call, with well-formed arguments, and to answer with the result.

Invariants: at most ``max_turns`` model calls; every call's tokens are recorded by the gateway
(the tool turns included, each a row of the episode); the reward (a float, shared by every row)
is the math-answer verifier's verdict on the last answer.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from areal.reward.gsm8k import gsm8k_reward_fn
from areal.workflow.common import Sampling, gateway_kwargs, solve_with_calculator


class CalculatorAgent:
    def __init__(self, max_turns: int = 4, temperature: float = 1.0, max_tokens: int = 64) -> None:
        self.sampling = Sampling(temperature=temperature, max_tokens=max_tokens, max_turns=max_turns)

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        client = AsyncOpenAI(**gateway_kwargs(extra_kwargs), max_retries=0)
        answer = await solve_with_calculator(client, data, self.sampling)
        return gsm8k_reward_fn(completions=answer, answer=data["answer"])
