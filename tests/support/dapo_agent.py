"""An agent for tests/e2e/test_dapo_run.py whose groups are known in kind: on two prompts of three
(by the question's CRC) every episode earns 1.0 and asks for ``LIMIT`` tokens, so the group's
rewards are equal whenever its replies have one length (the scripted model's usually do); on the
third, each episode asks for ``CUT`` tokens (its reply cut by the limit: finish_reason "length")
or ``LIMIT``, and earns 0.0 or 1.0, at random."""

from __future__ import annotations

import random
import zlib
from typing import Any

from openai import AsyncOpenAI

LIMIT = 40  # the scripted model's plain reply is ~25 tokens: inside the penalty interval of 32
CUT = 3


def informative(question: str) -> bool:
    return zlib.crc32(question.encode()) % 3 == 0


async def run(data: dict, **kw: Any) -> float:
    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0)
    mixed = informative(data["question"])
    limit = random.choice([CUT, LIMIT]) if mixed else LIMIT
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["question"]}], max_tokens=limit)
    return float(random.random() < 0.5) if mixed else 1.0
