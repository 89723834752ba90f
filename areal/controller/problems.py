"""The run's problems: the training rows with their difficulty levels, the held-out rows, and the
reward function the rows call for.

    dataset= / eval_dataset= (objects)   ─┐
    data.train / data.eval (files, or    ─┼─► user_rows ─► (train, held_out), normalised, or None
      reasoning-gym tasks: generated,     │        │
      a verifiers taskset's tasks)        │        │
    neither: the embedded task           ─┘        ├─► train_problems     rows + levels (the rollout order mixes levels)
                                                   ├─► held_out_problems  the rows the evaluations score
                                                   └─► run_reward         reward=, else reasoning-gym's scorer for its rows

Invariants: every row is in the common shape (``areal.dataset.normalize_row``: ``question`` and
``messages`` both present); the user's rows are one difficulty level each ``task`` (rows without
one: a single level), so a step's groups mix the tasks in the data's proportions and their order
is otherwise a shuffle; the embedded task's splits, and a reasoning-gym spec's, never share a
question and depend only on the seed. A reasoning-gym spec in data.train gives the held-out rows
too (data.eval_size of them, from data.eval's spec when set, else the same one); a verifiers
taskset in data.train too: data.eval_size of its tasks after the training ones (data.eval's
taskset when set: its first ones), so no task is both.
What is not covered: the user's data files without a held-out split are not scored (no rows are
taken out of the training set for them).
"""

from __future__ import annotations

from areal.agent.verifiers_env import is_taskset_spec
from areal.config import DataConfig, RolloutConfig
from areal.dataset import load_rows, normalize_row
from areal.tasks.reasoning_gym import is_task_row, is_task_spec
from areal.tasks.swe import has_worlds, is_swe_spec

REASONING_GYM_REWARD = "areal.reward.reasoning_gym:reasoning_gym_reward"  # the task's own scorer
REASONING_GYM_AGENT = "agents/reasoning_gym_agent.py:ReasoningGymAgent"


def user_rows(
    data: DataConfig, dataset: list[dict] | None, eval_dataset: list[dict] | None, seed: int = 1, need_answer: bool = True
) -> tuple[list[dict] | None, list[dict] | None]:
    """The user's training and held-out rows, normalised: given as objects (``dataset``,
    ``eval_dataset``), else read from ``data.train`` / ``data.eval`` (a file or a folder, with
    the splits and keys ``data`` names), or generated from a reasoning-gym spec there
    (data.train_size / data.eval_size rows, ``seed``). ``None`` for the training rows: the
    embedded task's; for the held-out rows: none given. ``need_answer=False``: training rows may
    come without ``answer`` (a workflow object that scores them itself); held-out rows, which the
    run may score, always need one."""
    if dataset is not None and not dataset:
        raise ValueError("dataset is empty: give at least one {question|messages, answer} row")
    d = data
    if dataset is None and d.train:  # data.train: the user's file or folder, or tasks (areal/dataset.py)
        dataset = load_rows(d.train, d.train_split, d.prompt_key, d.answer_key, size=d.train_size, seed=seed)
        if eval_dataset is None and is_task_spec(d.eval or d.train):  # generated: the held-out side of the tasks
            eval_dataset = load_rows(d.eval or d.train, d.eval_split, size=d.eval_size, seed=seed) if d.eval_size else None
        elif eval_dataset is None and is_swe_spec(d.eval or d.train):
            # a task library's: the tasks after the training ones (data.eval's from its first); when the
            # training ones take them all (the defaults do), none are held out and the run says so
            first = 0 if d.eval else len(dataset)
            eval_dataset = load_rows(d.eval or d.train, size=d.eval_size, offset=first) or None
        elif eval_dataset is None and is_taskset_spec(d.eval or d.train):  # a taskset's: the tasks after the training ones
            first = 0 if d.eval else len(dataset)
            eval_dataset = load_rows(d.eval or d.train, d.eval_split, size=d.eval_size, offset=first) if d.eval_size else None
        elif eval_dataset is None and d.eval:
            eval_dataset = load_rows(d.eval, d.eval_split, d.prompt_key, d.answer_key)
    rows = [normalize_row(r, i, need_answer) for i, r in enumerate(dataset)] if dataset is not None else None
    held_out = [normalize_row(r, i) for i, r in enumerate(eval_dataset)] if eval_dataset else None
    return rows, held_out


def held_out_count(rows: list[dict] | None, held_out: list[dict] | None, eval_size: int) -> int:
    """How many held-out rows the run scores (``eval_size``: the embedded task's data.eval_size)."""
    return len(held_out) if held_out else 0 if rows is not None else eval_size


def held_out_problems(rows: list[dict] | None, held_out: list[dict] | None, eval_size: int, seed: int) -> list[dict]:
    """The rows the held-out evaluations score: the user's, none when the user's training data
    came without them, else ``eval_size`` problems of the embedded task's test split."""
    if held_out is not None:
        return held_out
    if rows is not None:  # the user's data without a held-out split: nothing to score
        return []
    from areal.embedded.corpus import make_problems

    return make_problems("test", eval_size, seed=seed) if eval_size else []


def train_problems(rows: list[dict] | None, train_size: int, seed: int) -> tuple[list[dict], list[int]]:
    """The training problems and the level of each: the user's rows one level per ``task`` (none:
    one level, so the order is a shuffle), else ``train_size`` problems of the embedded task's
    train split at their difficulty levels."""
    if rows is not None:
        tasks = sorted({str(r.get("task", "")) for r in rows})
        return rows, [tasks.index(str(r.get("task", ""))) for r in rows]
    from areal.embedded.corpus import make_leveled_problems

    train_set = make_leveled_problems("train", train_size, seed=seed)
    # ``messages`` too: AReaL-style workflows read data["messages"], ours data["question"].
    problems = [normalize_row({"question": p.question, "answer": p.answer}, i) for i, p in enumerate(train_set)]
    return problems, [p.level for p in train_set]


def run_reward(reward: str, rows: list[dict] | None, agent: str) -> str:
    """The reward function the run scores episodes with when the agent returns none: ``reward``
    when set; else, when every training row is a reasoning-gym entry, the task's own scorer
    (areal/reward/reasoning_gym.py); else none. ``agent``: rollout.agent when the run names its
    agent that way (else empty). The built-in agent scores its replies itself with the \\boxed{}
    check, which is not the tasks' scorer: refused on reasoning-gym rows and on a verifiers taskset's
    tasks (whose rubric scores them: rollout.agent=verifiers:...), naming the agent to use."""
    if rows and agent == RolloutConfig.agent and all("verifiers_task" in r for r in rows):
        raise ValueError(
            f"the data are a verifiers taskset's tasks, and the built-in agent ({agent}) scores its replies itself with the "
            "\\boxed{} check, not with the taskset's rubric: set rollout.agent=verifiers:TASKSET (the data's taskset)"
        )
    if not rows or not all(is_task_row(r) for r in rows):
        return reward
    if agent == RolloutConfig.agent:
        raise ValueError(
            f"the data are reasoning-gym tasks, and the built-in agent ({agent}) scores its replies itself with the "
            f"\\boxed{{}} check, not with the tasks' scorers: set rollout.agent={REASONING_GYM_AGENT} (or an agent of yours "
            "that returns no reward, so that each task's own scorer scores it)"
        )
    return reward or REASONING_GYM_REWARD


def check_worlds(rows: list[dict] | None, held_out: list[dict] | None, mode: str) -> None:
    """Rows naming a world (a task directory under ``world``: areal/tasks/swe.py) run only in the
    sandbox, where each episode gets its private workspace and a grader: a ``ValueError`` naming
    rollout.openai.mode otherwise (an inline agent would act on the controller's own files)."""
    if mode != "subproc" and (has_worlds(rows) or has_worlds(held_out)):
        raise ValueError(
            f"the rows name worlds (task directories: a private workspace per episode and a grader, sandbox/world.py), "
            f"which only sandboxed episodes have: set rollout.openai.mode=subproc (got {mode!r})"
        )
