"""An agent and a reward function for the replay tests (tests/e2e/test_replay.py).

``ThreeTurnAgent`` makes three calls whatever the model answers: two in flight at once (their
order at the engine may differ between the run and its replay), then a follow-up turn that
extends the first; each call is rewarded 0.5. ``completion_length`` scores an episode by its last
reply's token count, a reward any recorded call lets a test check without reading model text."""

from __future__ import annotations

import asyncio
from typing import Any

from openai import AsyncOpenAI

from areal.workflow.common import gateway_kwargs


class ThreeTurnAgent:
    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> dict[str, float]:
        client = AsyncOpenAI(**gateway_kwargs(extra_kwargs), max_retries=0)
        question = [{"role": "user", "content": data["question"]}]

        async def ask(messages: list[dict[str, str]]) -> Any:
            return await client.chat.completions.create(model="default", messages=messages, max_tokens=16)

        first, second = await asyncio.gather(ask(question), ask([*question, {"role": "user", "content": "Answer briefly."}]))
        reply = first.choices[0].message.content or ""
        follow = await ask([*question, {"role": "assistant", "content": reply}, {"role": "user", "content": "Are you sure?"}])
        return {c.id: 0.5 for c in (first, second, follow)}


def completion_length(prompt: str, completions: str, prompt_ids: list[int], completion_ids: list[int], **row: Any) -> float:
    return float(len(completion_ids))
