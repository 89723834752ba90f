"""The run's problems: the training rows with their difficulty levels, and the held-out rows.

    dataset= / eval_dataset= (objects)  ─┐
    data.train / data.eval (files)      ─┼─► user_rows ─► (train, held_out), normalised, or None
    neither: the embedded task          ─┘        │
                                                  ├─► train_problems     rows + levels (the rollout order mixes levels)
                                                  └─► held_out_problems  the rows the evaluations score

Invariants: every row is in the common shape (``areal.dataset.normalize_row``: ``question`` and
``messages`` both present); the user's rows have one difficulty level, so their order is a
shuffle; the embedded task's splits never share a question and depend only on the seed.
What is not covered: the user's data without a held-out split is not scored (no rows are taken
out of the training set for it).
"""

from __future__ import annotations

from areal.config import DataConfig
from areal.dataset import load_rows, normalize_row


def user_rows(data: DataConfig, dataset: list[dict] | None, eval_dataset: list[dict] | None) -> tuple[list[dict] | None, list[dict] | None]:
    """The user's training and held-out rows, normalised: given as objects (``dataset``,
    ``eval_dataset``), else read from ``data.train`` / ``data.eval`` (a file or a folder, with
    the splits and keys ``data`` names). ``None`` for the training rows: the embedded task's; for
    the held-out rows: none given."""
    if dataset is not None and not dataset:
        raise ValueError("dataset is empty: give at least one {question|messages, answer} row")
    d = data
    if dataset is None and d.train:  # data.train: the user's file or folder (areal/dataset.py)
        dataset = load_rows(d.train, d.train_split, d.prompt_key, d.answer_key)
        if eval_dataset is None and d.eval:
            eval_dataset = load_rows(d.eval, d.eval_split, d.prompt_key, d.answer_key)
    rows = [normalize_row(r, i) for i, r in enumerate(dataset)] if dataset is not None else None
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
    """The training problems and the difficulty level of each: the user's rows at one level, else
    ``train_size`` problems of the embedded task's train split."""
    if rows is not None:  # no difficulty levels: one level, so the order is a shuffle
        return rows, [0] * len(rows)
    from areal.embedded.corpus import make_leveled_problems

    train_set = make_leveled_problems("train", train_size, seed=seed)
    # ``messages`` too: AReaL-style workflows read data["messages"], ours data["question"].
    problems = [normalize_row({"question": p.question, "answer": p.answer}, i) for i, p in enumerate(train_set)]
    return problems, [p.level for p in train_set]
