"""Agents written the way AReaL's agent modules are, for tests/integration/agents/test_guide_agent_episodes.py
and tests/e2e/test_guide_agents.py.

``AnthropicMathAgent`` has the shape of AReaL's ``areal/workflow/anthropic/math_agent.py``: the
client built from ``extra_kwargs`` exactly as handed (``base_url`` with its ``/v1``, the
runner's ``http_client``), the environment's values as the fallback, the system message moved
to ``system=``, the sampling settings (``temperature``, ``top_p``) passed as keywords, which the
pinned anthropic SDK takes only through ``areal/agent/anthropic_compat.py``. It makes one plain and
one streamed call, so both ways a body comes back cross the runner's client.
"""

from __future__ import annotations

import os
from typing import Any

import anthropic

from areal.reward.gsm8k import gsm8k_reward_fn


class AnthropicMathAgent:
    def __init__(self, max_tokens: int = 32, **kwargs: Any) -> None:
        # AReaL's train.py passes max_completion_tokens and max_turns too; this agent drops them
        self.max_tokens = max_tokens
        self.sampling = {k: v for k, v in kwargs.items() if k not in ("max_completion_tokens", "max_turns")}

    async def run(self, data: dict, **extra_kwargs: Any) -> float:
        client = anthropic.AsyncAnthropic(
            api_key=extra_kwargs.get("api_key") or os.getenv("ANTHROPIC_API_KEY"),
            base_url=extra_kwargs.get("base_url") or os.getenv("ANTHROPIC_BASE_URL"),
            http_client=extra_kwargs.get("http_client"),
            max_retries=0,
        )
        messages = data.get("messages") or [{"role": "user", "content": data["question"]}]
        system = next((m["content"] for m in messages if m["role"] == "system"), anthropic.NOT_GIVEN)
        turns = [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"]
        args = dict(model="default", max_tokens=self.max_tokens, system=system, messages=turns, **self.sampling)
        reply = await client.messages.create(**args)
        async with client.messages.stream(**args) as stream:
            streamed = await stream.get_final_text()
        text = "".join(block.text for block in reply.content if block.type == "text")
        return gsm8k_reward_fn(completions=text + streamed, answer=data["answer"])
