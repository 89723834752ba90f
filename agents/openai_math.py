"""A single-turn math agent written with the plain OpenAI SDK.

Nothing here knows about RL: it is an ordinary agent. The system hands it `base_url`, `api_key`
and an `http_client` (in a sandbox the environment's OPENAI_BASE_URL / OPENAI_API_KEY work too);
every call it makes is recorded token by token by the gateway, and the float it returns is the
episode's reward.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from areal.embedded.corpus import math_reward


class MathAgent:
    async def run(self, data: dict, **extra_kwargs: Any) -> float:
        client = AsyncOpenAI(
            base_url=extra_kwargs.get("base_url"),
            api_key=extra_kwargs.get("api_key"),
            http_client=extra_kwargs.get("http_client"),
            max_retries=0,
        )
        completion = await client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": data["question"]}],
            temperature=1.0,
            max_tokens=64,
        )
        return math_reward(completion.choices[0].message.content or "", data["answer"])
