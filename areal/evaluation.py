"""Held-out evaluation and the statistics that say whether the reward really rose.

``evaluate`` scores the policy the engine serves now on held-out problems, straight through the
engine (chat template -> /generate), once sampled at the training temperature and once greedy.
``reward_trend`` and ``proportion_test`` turn "the curve went up" into a number with a p-value,
so a run's summary can say whether the rise is more than noise.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

from areal.embedded.corpus import math_reward
from areal.engine.client import EngineClient


async def evaluate(engine: EngineClient, tokenizer: Any, problems: list[dict], temperature: float, max_tokens: int = 64) -> dict[str, Any]:
    """Accuracy on ``problems`` (rows with question/answer), sampled and greedy."""
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>")]

    async def score(problem: dict, temp: float, seed: int) -> float:
        text = tokenizer.apply_chat_template([{"role": "user", "content": problem["question"]}], tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        params = {"max_new_tokens": max_tokens, "temperature": temp, "stop_token_ids": stop, "sampling_seed": seed}
        result = await engine.generate(ids, params, return_logprob=False)
        return math_reward(tokenizer.decode(result.output_ids, skip_special_tokens=True), problem["answer"])

    sampled = await asyncio.gather(*(score(p, temperature, i) for i, p in enumerate(problems)))
    greedy = await asyncio.gather(*(score(p, 0.0, i) for i, p in enumerate(problems)))
    n = len(problems)
    return {"n": n, "sampled_acc": sum(sampled) / n, "greedy_acc": sum(greedy) / n, "sampled_correct": int(sum(sampled)), "greedy_correct": int(sum(greedy))}


def proportion_test(correct_a: int, n_a: int, correct_b: int, n_b: int) -> dict[str, float]:
    """Two-proportion z-test of b > a (one-sided p-value)."""
    pa, pb = correct_a / n_a, correct_b / n_b
    pooled = (correct_a + correct_b) / (n_a + n_b)
    se = math.sqrt(max(pooled * (1 - pooled) * (1 / n_a + 1 / n_b), 1e-12))
    z = (pb - pa) / se
    return {"diff": pb - pa, "z": z, "p_value": 0.5 * math.erfc(z / math.sqrt(2))}


def reward_trend(step_rewards: list[float], seed: int = 0, permutations: int = 5000) -> dict[str, float]:
    """Mean reward of the last quarter of steps minus the first quarter, with a one-sided
    permutation p-value: how often a random split of the same step rewards shows a gap as large."""
    k = max(1, len(step_rewards) // 4)
    if len(step_rewards) < 2 * k or len(step_rewards) < 2:
        return {"first_mean": float("nan"), "last_mean": float("nan"), "diff": float("nan"), "p_value": float("nan"), "window": k}
    first, last = step_rewards[:k], step_rewards[-k:]
    observed = sum(last) / k - sum(first) / k
    pool = first + last
    rng = random.Random(seed)
    hits = 0
    for _ in range(permutations):
        rng.shuffle(pool)
        hits += (sum(pool[k:]) / k - sum(pool[:k]) / k) >= observed - 1e-12
    return {"first_mean": sum(first) / k, "last_mean": sum(last) / k, "diff": observed, "p_value": (hits + 1) / (permutations + 1), "window": k}
