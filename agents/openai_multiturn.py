"""A multi-turn math agent on the plain OpenAI SDK: answer; if wrong, say so and ask again.

    user: question ─► assistant: answer₁ ─(wrong)─► user: "That is not correct. ..." ─► answer₂ ...

This is the retry pattern the embedded model was SFT-trained on (``areal.embedded.corpus``: a
wrong answer, the user's complaint, a corrected answer). Each response is judged on its own by
the math-answer verifier, and ``run()`` returns ``{completion_id: reward}``: the gateway's
completion id *is* the id of the interaction it recorded, so every turn is trained with its own
return (``trainer.credit=turn``: with ``trainer.turn_discount`` < 1, a wrong first answer that
the retry fixed is credited less than a right first answer; at 1 they are credited the same).

Invariants: the conversation only grows (the agent never rewrites an earlier turn), so the
gateway builds each prompt by appending the complaint's tokens to the previous prompt and the
tokens it sampled; at most ``max_turns`` calls; the loop stops at the first correct answer.

The reward is computed in-process with ``gsm8k_reward_fn``: the episode already runs in its own
sandboxed process, and the verifier is cheap, so a reward process pool per episode would only
add a process start.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from areal.embedded.corpus import RETRY_PROMPTS
from areal.reward.gsm8k import gsm8k_reward_fn
from areal.workflow.common import Sampling, gateway_kwargs, question


class MultiTurnMathAgent:
    def __init__(self, max_turns: int = 3, temperature: float = 1.0, max_tokens: int = 64) -> None:
        self.sampling = Sampling(temperature=temperature, max_tokens=max_tokens, max_turns=max_turns)

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> dict[str, float]:
        client = AsyncOpenAI(**gateway_kwargs(extra_kwargs), max_retries=0)
        messages: list[dict[str, str]] = [{"role": "user", "content": question(data)}]
        rewards: dict[str, float] = {}
        for turn in range(self.sampling.max_turns):
            completion = await client.chat.completions.create(
                model="default",
                messages=messages,
                temperature=self.sampling.temperature,
                max_tokens=self.sampling.max_tokens,
            )
            text = completion.choices[0].message.content or ""
            rewards[completion.id] = gsm8k_reward_fn(completions=text, answer=data["answer"])
            if rewards[completion.id] == 1.0:
                break
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": RETRY_PROMPTS[turn % len(RETRY_PROMPTS)]}]
        return rewards
