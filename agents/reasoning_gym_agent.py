"""A reasoning-gym agent on the plain OpenAI SDK: one call, no reward of its own.

    data["messages"]: reasoning-gym's system prompt (think, then <answer>...</answer>) + the question
        ─► one chat completion ─► returns None: the run scores the reply with the task's own scorer

Rows of ``data.train=reasoning-gym:...`` (areal/tasks/reasoning_gym.py) carry the task's entry,
and the run, finding none returned here, scores the episode's reply with
``areal.reward.reasoning_gym.reasoning_gym_reward``: the task's scorer on the last <answer> of
the reply the gateway recorded. That happens in the controller, outside the sandbox, so nothing
here can reach the scorer or change what it scores. Sandboxed (rollout.openai.mode=subproc, the
default) or inline alike: it imports only the OpenAI SDK, which the sandbox preloads.

Keyword arguments (rollout.agent_kwargs): ``temperature`` (1.0), ``max_tokens`` (512: room to
think before answering); ``system``: a system prompt of yours in place of reasoning-gym's (a small
model follows a short one better); ``examples``: worked examples put before the question as
earlier turns, each ``{question, reply}`` (a reply ending in ``<answer>...</answer>``), so that a
model that never saw the tag sees it used (conf/smollm2.yaml).
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI


class ReasoningGymAgent:
    def __init__(
        self, temperature: float = 1.0, max_tokens: int = 512, system: str | None = None, examples: list[dict[str, str]] | None = None
    ) -> None:
        self.temperature, self.max_tokens, self.system = temperature, max_tokens, system
        self.shots = [{"role": r, "content": e[k]} for e in examples or [] for r, k in (("user", "question"), ("assistant", "reply"))]

    def messages(self, data: dict[str, Any]) -> list[dict[str, str]]:
        """The row's messages, with the system prompt replaced and the examples before the question."""
        system, *rest = data["messages"] if data["messages"][0]["role"] == "system" else [None, *data["messages"]]
        if self.system is not None:
            system = {"role": "system", "content": self.system}
        return [*([system] if system else []), *self.shots, *rest]

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> None:
        client = AsyncOpenAI(
            base_url=extra_kwargs.get("base_url"),
            api_key=extra_kwargs.get("api_key"),
            http_client=extra_kwargs.get("http_client"),
            max_retries=0,
        )
        await client.chat.completions.create(
            model="default", messages=self.messages(data), temperature=self.temperature, max_tokens=self.max_tokens
        )
        return None  # the run's reward (the task's scorer) scores the reply
