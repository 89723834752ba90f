"""Rewards of the AReaL import paths over ``areal.reward.math_verify`` (``math-verify`` first).

``areal.reward.gsm8k.gsm8k_reward_fn``; ``get_math_verify_worker().verify(response, truth)`` (1.0 or
0.0), the worker AReaL's current scripts call; ``areal.reward.math_parser.process_results``, the
one its older scripts call.
"""

from __future__ import annotations

from typing import Any


class MathVerifyWorker:
    """AReaL's worker shape: ``verify(response, ground_truth) -> 1.0 | 0.0`` by ``math_equal``."""

    def verify(self, response: str, ground_truth: str) -> float:
        from areal.reward.math_verify import math_equal  # deferred: sympy is slow to import

        return 1.0 if math_equal(str(response), str(ground_truth)) else 0.0


_WORKER = MathVerifyWorker()


def get_math_verify_worker() -> MathVerifyWorker:
    """The process's worker (stateless, so one is enough)."""
    return _WORKER


def __getattr__(name: str) -> Any:
    if name == "gsm8k_reward_fn":
        from areal.reward.gsm8k import gsm8k_reward_fn

        return gsm8k_reward_fn
    raise AttributeError(f"module 'areal.reward' has no attribute {name!r}")
