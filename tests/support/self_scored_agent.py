"""A user's own agent and reward, for tests/e2e/test_eval_auto.py: the agent asks the model and
scores its episode itself, with rewards no built-in check gives (0.375), or returns nothing on the
rows marked ``"scored_by": "reward"``, which the run's ``reward=`` function (``reward`` below)
scores 0.125. An evaluation scored by the built-in \\boxed{} check gives only 0s and 1s."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

AGENT_REWARD = 0.375
FUNCTION_REWARD = 0.125


async def run(data: dict, **kw: Any) -> float | None:
    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["question"]}], max_tokens=8)
    return None if data.get("scored_by") == "reward" else AGENT_REWARD


def reward(prompt: str, completions: str, prompt_ids: list[int], completion_ids: list[int], **row: Any) -> float:
    return FUNCTION_REWARD
