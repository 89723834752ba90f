"""A benchmark agent that emulates tool latency: sleep, then one call through the gateway.

Used by ``benchmarks/async_rl.py`` as ``rollout.agent=benchmarks/slow_agent.py:SlowAgent``. Real
agents spend most of an episode waiting on tools (code execution, search, a browser); this one
waits ``SLOW_AGENT_TOOL_S`` seconds (default 1.0; ``asyncio.sleep``, so it costs no CPU and
inline episodes overlap) and then makes a single short chat completion, so that its episode is
recorded token by token and the trainer has something to learn from. Its reward is the embedded
task's: 1.0 for a right boxed answer.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from openai import AsyncOpenAI

from areal.embedded.corpus import math_reward


class SlowAgent:
    async def run(self, data: dict, **extra_kwargs: Any) -> float:
        await asyncio.sleep(float(os.environ.get("SLOW_AGENT_TOOL_S", "1.0")))  # the emulated tool call
        client = AsyncOpenAI(
            base_url=extra_kwargs.get("base_url"),
            api_key=extra_kwargs.get("api_key"),
            http_client=extra_kwargs.get("http_client"),
            max_retries=0,
        )
        completion = await client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": data["question"]}], temperature=1.0, max_tokens=32
        )
        return math_reward(completion.choices[0].message.content or "", data["answer"])
