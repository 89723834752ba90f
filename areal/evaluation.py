"""Held-out evaluation and the statistics that say whether the reward really rose.

``evaluate`` scores the policy the engine serves now on held-out problems, straight through the
engine (chat template -> /generate), once sampled at the training temperature and once greedy.
``reward_trend`` and ``paired_test`` turn "the curve went up" into a number with a p-value,
so a run's summary can say whether the rise is more than noise.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import numpy as np

from areal.embedded.corpus import math_reward
from areal.engine.client import EngineClient


async def evaluate(
    engine: EngineClient, tokenizer: Any, problems: list[dict], temperature: float, samples: int = 4, max_tokens: int = 64
) -> dict[str, Any]:
    """Accuracy on ``problems`` (rows with question/answer): ``samples`` seeded draws at the
    training temperature per problem, plus one greedy answer. Per-problem scores are kept so a
    later evaluation of the same problems can be compared pairwise."""
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>")]

    async def score(problem: dict, temp: float, seed: int) -> float:
        text = tokenizer.apply_chat_template([{"role": "user", "content": problem["question"]}], tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        params = {"max_new_tokens": max_tokens, "temperature": temp, "stop_token_ids": stop, "sampling_seed": seed}
        result = await engine.generate(ids, params, return_logprob=False)
        return math_reward(tokenizer.decode(result.output_ids, skip_special_tokens=True), problem["answer"])

    sampled = await asyncio.gather(*(score(p, temperature, i * samples + j) for i, p in enumerate(problems) for j in range(samples)))
    greedy = await asyncio.gather(*(score(p, 0.0, i) for i, p in enumerate(problems)))
    per_problem = [sum(sampled[i * samples : (i + 1) * samples]) / samples for i in range(len(problems))]
    n = len(problems)
    return {"n": n, "samples": samples, "sampled_acc": sum(per_problem) / n, "greedy_acc": sum(greedy) / n,
            "per_problem_sampled": per_problem, "per_problem_greedy": list(greedy)}


def paired_test(before: list[float], after: list[float], seed: int = 0, permutations: int = 10000) -> dict[str, float]:
    """Did per-problem accuracy rise? Mean of (after - before) over the same problems, with a
    one-sided sign-flip permutation p-value (under no effect, each difference is as likely to
    have the opposite sign)."""
    d = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    observed = float(d.mean())
    signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(permutations, len(d)))
    null = (signs * d).mean(axis=1)
    return {"diff": observed, "p_value": float(((null >= observed - 1e-12).sum() + 1) / (permutations + 1)), "n": len(d)}


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
