"""``reasoning_gym_reward``: a reasoning-gym task's own scorer on the reply's final answer.

    reply ─► the last <answer>...</answer> (reasoning_gym.utils.extract_answer; None when there is none)
          ─► score_answer(answer, entry) of the row's task, built with the row's task_config
             (areal/tasks/reasoning_gym.py: scorer), entry = the row's question, answer, metadata
          ─► the reward (0.0 .. 1.0, the scorer's own scale: partial credit where it gives some)

No verifier is written here: the number is the scorer's. The answer is taken the way
reasoning-gym's own training code takes it, from the last ``<answer>`` tag, which its default
system prompt (the rows' system message) asks for; a reply without one is scored as ``None``
(most scorers give 0, some a small format score). A scorer that raises on the answer it was
given (prime_factorization's ``int()`` of a non-number) scores it 0.0: a malformed answer is a
wrong answer, the policy's mistake, not a failed episode. A scorer that gives something other than
a finite number is the task's defect: a ``ValueError`` naming the task (the episode's error).

The run selects it on its own when its rows are reasoning-gym tasks, ``reward=`` is empty and
the agent returns no reward (areal/controller/problems.py: ``run_reward``). It runs in the
controller, outside the sandbox, on the reply the gateway recorded token by token: a sandboxed
agent gets a JSON copy of its row (answer included, as every row is handed over) but cannot reach
the scorer, the row it scores against or the reply it scores; what it returns is no reward.

Signature: AReaL's, ``fn(prompt, completions, prompt_ids, completion_ids, **row)``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from areal.tasks.reasoning_gym import import_reasoning_gym, scorer


def final_answer(completion: str) -> str | None:
    """The content of the reply's last ``<answer>...</answer>``, stripped (reasoning-gym's rule)."""
    import_reasoning_gym()
    from reasoning_gym.utils import extract_answer

    return extract_answer(completion, tag_name="answer")


def reasoning_gym_reward(
    prompt: Any = None,
    completions: str | None = None,
    prompt_ids: Any = None,
    completion_ids: Any = None,
    *,
    question: str,
    answer: Any,
    metadata: dict[str, Any],
    task_config: dict[str, Any] | None = None,
    **row: Any,
) -> float:
    """The row's task scorer's verdict on the final answer of ``completions``."""
    if completions is None:
        raise TypeError("reasoning_gym_reward needs the reply as `completions`")
    entry = {"question": question, "answer": answer, "metadata": metadata}
    task = metadata["source_dataset"]
    score, given = scorer(task, task_config or {}), final_answer(completions)
    try:
        value = score(given, entry)
    except Exception:  # the scorer could not parse the model's answer: a wrong answer (module docstring)
        return 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"the scorer of reasoning-gym task {task!r} gave {value!r:.80} for the answer {given!r:.80}, not a finite number")
    return float(value)
