"""Math agents on the plain OpenAI SDK: ``MathAgent`` (one call), ``MultiTurnMathAgent`` (retries
after a wrong answer, AReaL's) and ``MathToolAgent`` (calculator).

``workflow=areal.workflow.openai.math_agent.MathAgent`` in the proxy-mode and agent-workflow
guides. All are ordinary agents: an ``AsyncOpenAI`` client on the gateway the system hands them
(``base_url`` / ``api_key`` / ``http_client``, or the environment), a reward at the end. Each
takes AReaL's ``workflow_kwargs`` (``temperature``, ``top_p``, ``max_tokens``,
``max_completion_tokens``, ``max_turns``; ``areal.workflow.common.Sampling``).

``MultiTurnMathAgent`` asks again, up to ``max_turns`` times, after an answer the reward rejects,
and rewards each reply by itself (``{completion_id: reward}``). ``MathToolAgent`` offers the
embedded model's calculator, executes every tool call and answers it back until the model gives a
final answer or ``max_turns`` calls are spent.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from areal.api.workflow_api import AgentWorkflow
from areal.workflow.common import SamplingKwargs, gateway_kwargs, math_reward, question, solve_with_calculator

RETRY_PROMPT = "Your answer is wrong or could not be read. Read the question again and give the final answer in \\boxed{}."


def _client(extra_kwargs: dict[str, Any]) -> AsyncOpenAI:
    return AsyncOpenAI(**gateway_kwargs(extra_kwargs), max_retries=0)


class MathAgent(SamplingKwargs, AgentWorkflow):
    MAX_TURNS = 1

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        completion = await _client(extra_kwargs).chat.completions.create(
            model="default", messages=[{"role": "user", "content": question(data)}], **self.sampling.openai_args()
        )
        return await math_reward(completions=completion.choices[0].message.content or "", answer=data["answer"])


class MultiTurnMathAgent(SamplingKwargs, AgentWorkflow):
    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> dict[str, float]:
        client = _client(extra_kwargs)
        messages: list[dict[str, Any]] = [{"role": "user", "content": question(data)}]
        rewards: dict[str, float] = {}
        used = 0
        for _ in range(self.sampling.max_turns):
            completion = await client.chat.completions.create(model="default", messages=messages, **self.sampling.openai_args(used))
            used = completion.usage.total_tokens if completion.usage else used
            text = completion.choices[0].message.content or ""
            rewards[completion.id] = reward = await math_reward(completions=text, answer=data["answer"])
            if reward == 1 or not self.sampling.budget_left(used):
                break
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": RETRY_PROMPT}]
        return rewards


class MathToolAgent(SamplingKwargs, AgentWorkflow):
    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        answer = await solve_with_calculator(_client(extra_kwargs), data, self.sampling)
        return await math_reward(completions=answer, answer=data["answer"])
