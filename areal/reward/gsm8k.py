"""``areal.reward.gsm8k.gsm8k_reward_fn``: 1.0 when the completion's final answer equals the reference.

AReaL calls reward functions as ``fn(prompt, completions, prompt_ids, completion_ids, answer,
**kwargs)`` (one completion string per call); its guides also call ``fn(result=..., answer=...)``.
Both work. The answer check is ``math_verify.math_equal`` (numeric / symbolic equivalence of the
boxed or final answer), so "1,000" == "1000" and "\\frac{1}{2}" == "0.5".
"""

from __future__ import annotations

from typing import Any

from areal.reward.math_verify import math_equal


def gsm8k_reward_fn(
    prompt: Any = None,
    completions: str | None = None,
    prompt_ids: Any = None,
    completion_ids: Any = None,
    answer: str | int | float | None = None,
    **kwargs: Any,
) -> float:
    """1.0 if the completion's final answer equals ``answer``, else 0.0."""
    text = completions if completions is not None else kwargs.pop("result", None)
    if text is None:
        raise TypeError("gsm8k_reward_fn needs the completion text as `completions` (or `result`)")
    if answer is None:
        raise TypeError("gsm8k_reward_fn needs the reference `answer`")
    return 1.0 if math_equal(str(text), str(answer)) else 0.0
