"""AReaL's ``areal.reward.math_parser.process_results(answer, solution)`` over ``math_verify``."""

from __future__ import annotations

from areal.reward.math_verify import extract_answer, math_equal


def process_results(answer: str, solution: str) -> tuple[int, tuple[str, str]]:
    """``(1 if the completion's answer equals the solution's else 0, (answer read, solution read))``."""
    pred, ref = extract_answer(str(answer)), extract_answer(str(solution))
    return int(math_equal(str(answer), str(solution))), (str(pred), str(ref))
