"""reasoning-gym tasks as data and reward: the spec's syntax and its errors, the rows (reasoning-gym's
entries, train and held-out sides that never share a question), and the reward, which is the
task's own scorer on the reply's last <answer> tag."""

from __future__ import annotations

import collections
import dataclasses
import math
import sys

import pytest
import reasoning_gym
from reasoning_gym.utils import SYSTEM_PROMPTS

from areal.dataset import DatasetConfig, get_custom_dataset, load_rows
from areal.reward.reasoning_gym import final_answer, reasoning_gym_reward
from areal.tasks.reasoning_gym import HELD_OUT_SEED_OFFSET, TaskSpec, held_out_side, parse_spec, task_rows

MIX = "reasoning-gym:chain_sum@2/max_terms:3+leg_counting+fraction_simplification"


def test_a_spec_names_tasks_weights_and_config_overrides():
    assert parse_spec("reasoning-gym:chain_sum") == [TaskSpec("chain_sum")]
    assert parse_spec("reasoning-gym:chain_sum@2/min_terms:2/max_terms:3+basic_arithmetic@0.5+leg_counting/allow_x:true/name:abc") == [
        TaskSpec("chain_sum", 2.0, {"min_terms": 2, "max_terms": 3}),
        TaskSpec("basic_arithmetic", 0.5),
        TaskSpec("leg_counting", 1.0, {"allow_x": True, "name": "abc"}),
    ]
    assert parse_spec("reasoning-gym:decimal_chain_sum/min_value:-1.5")[0].config == {"min_value": -1.5}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("reasoning-gym:", "names no task"),
        ("reasoning-gym:chain_sum+", "empty task name"),
        ("reasoning-gym:chain_sum@x", "weight of 'chain_sum' must be a positive number .* got 'x'"),
        ("reasoning-gym:chain_sum@0", "weight of 'chain_sum' must be a positive number .* got '0'"),
        ("reasoning-gym:chain_sum@-1+leg_counting", "got '-1'"),
        ("reasoning-gym:chain_sum@inf", "got 'inf'"),
        ("reasoning-gym:chain_sum@nan", "got 'nan'"),
        ("reasoning-gym:chain_sum/max_terms", "write /KEY:VALUE"),
        ("reasoning-gym:chain_sum/size:10", "'size', which the run sets: sizes are data.train_size"),
        ("reasoning-gym:chain_sum/seed:3", "'seed', which the run sets"),
        ("reasoning-gym:chain_sum+leg_counting+chain_sum@2", "names 'chain_sum' twice"),
        ("reasoning-gym:chain_sum/max_terms:3/max_terms:4", "sets 'max_terms' twice"),
    ],
)
def test_a_malformed_spec_is_refused_naming_the_part(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_spec(spec)


def test_an_unknown_task_is_refused_with_the_close_names():
    with pytest.raises(ValueError, match=r"unknown reasoning-gym task 'chain_sums'; close names: chain_sum, decimal_chain_sum"):
        task_rows("reasoning-gym:chain_sums", "train", 4, seed=1)
    with pytest.raises(ValueError, match=r"unknown reasoning-gym task 'zzzz'; the \d+ tasks: ab, acre, .*chain_sum"):
        task_rows("reasoning-gym:leg_counting+zzzz", "train", 4, seed=1)
    with pytest.raises(ValueError, match=r"'chain_sum' has no config field 'max_term'; its fields: min_terms, max_terms"):
        task_rows("reasoning-gym:chain_sum/max_term:3", "train", 4, seed=1)
    with pytest.raises(ValueError, match="reasoning-gym refused the config"):  # the task's own check (min <= max)
        task_rows("reasoning-gym:chain_sum/min_terms:5/max_terms:2", "train", 4, seed=1)


def test_without_reasoning_gym_the_error_says_how_to_install_it(monkeypatch):
    for name in [m for m in sys.modules if m == "reasoning_gym" or m.startswith("reasoning_gym.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'areal-lite\[envs\]' \(or pip install reasoning-gym==0.1.25"):
        load_rows(MIX, "train", size=4)


def test_rows_are_the_generators_entries_in_reasoning_gyms_convention():
    rows = load_rows(MIX, "train", size=200, seed=5)
    tasks = collections.Counter(r["task"] for r in rows)
    assert set(tasks) == {"chain_sum", "leg_counting", "fraction_simplification"}
    assert tasks == {"chain_sum": 100, "leg_counting": 50, "fraction_simplification": 50}  # weights 2:1:1, exactly
    # each task's rows: the entries of its generator, seeded as reasoning-gym's composite seeds its
    # members (seed + position + 1), in order, the held-out side's left out
    for position, (name, config) in enumerate([("chain_sum", {"max_terms": 3}), ("leg_counting", {}), ("fraction_simplification", {})]):
        member = reasoning_gym.create_dataset(name, seed=5 + position + 1, size=10_000, **config)
        entries = [e for e in (member[i] for i in range(200)) if not held_out_side(e["question"])][: tasks[name]]
        mine = [(r["question"], r["answer"], r["metadata"]) for r in rows if r["task"] == name]
        assert mine == [(e["question"], e["answer"], e["metadata"]) for e in entries]
    row = rows[0]
    assert row["messages"] == [{"role": "system", "content": SYSTEM_PROMPTS["default"]}, {"role": "user", "content": row["question"]}]
    assert row["task"] == row["metadata"]["source_dataset"]
    assert all(r["metadata"]["num_terms"] <= 3 for r in rows if r["task"] == "chain_sum")  # the override reached the generator
    assert [r["task_config"] for r in rows if r["task"] == "chain_sum"][0] == {"max_terms": 3}
    assert load_rows(MIX, "train", size=200, seed=5) == rows  # deterministic
    assert load_rows(MIX, "train", size=200, seed=6) != rows


def test_train_and_held_out_rows_never_share_a_question():
    # A small question space (one-digit sums of two terms: at most 100 distinct questions) so that
    # both sides would draw the same questions if nothing kept them apart.
    spec = "reasoning-gym:chain_sum/min_terms:2/max_terms:2/min_digits:1/max_digits:1"
    train = load_rows(spec, "train", size=300, seed=1)
    held_out = load_rows(spec, "test", size=40, seed=1)
    assert {r["question"] for r in train}.isdisjoint({r["question"] for r in held_out})
    assert len({r["question"] for r in held_out}) > 5 and len({r["question"] for r in train}) > 30
    assert not any(held_out_side(r["question"]) for r in train) and all(held_out_side(r["question"]) for r in held_out)

    # the held-out rows come from a disjoint seed: the held-out side of the generator seeded as the
    # composite seeds its member from seed + HELD_OUT_SEED_OFFSET (+ position + 1), not from seed
    def held_out_side_of(member_seed: int) -> list[str]:
        member = reasoning_gym.create_dataset(
            "chain_sum", seed=member_seed, size=10_000, min_terms=2, max_terms=2, min_digits=1, max_digits=1
        )
        return [e["question"] for e in (member[i] for i in range(1000)) if held_out_side(e["question"])][:40]

    assert [r["question"] for r in held_out] == held_out_side_of(1 + HELD_OUT_SEED_OFFSET + 1)
    assert held_out_side_of(1 + HELD_OUT_SEED_OFFSET + 1) != held_out_side_of(1 + 1)  # which the train seed would give
    # AReaL's loader: the same rows, its splits named as AReaL names them
    valid = get_custom_dataset("valid", DatasetConfig(path=spec, size=40), seed=1)
    assert [r["question"] for r in valid] == [r["question"] for r in held_out]
    assert len(get_custom_dataset("train", DatasetConfig(path=spec, size=7), seed=1)) == 7


def test_a_side_the_tasks_questions_do_not_fill_is_an_error_not_a_hang(monkeypatch):
    import areal.tasks.reasoning_gym as tasks

    monkeypatch.setattr(tasks, "held_out_side", lambda question: False)  # as a task whose every question is train-side
    with pytest.raises(ValueError, match=r"only 0 of 3 held-out problems of 'chain_sum' after 1030 draws .* ask for fewer"):
        load_rows("reasoning-gym:chain_sum", "test", size=3)


def test_the_reward_is_the_tasks_own_scorer_on_the_last_answer_tag():
    rows = load_rows(MIX, "test", size=24, seed=2)
    for row in rows:
        score = reasoning_gym.get_score_answer_fn(row["task"])
        entry = {k: row[k] for k in ("question", "answer", "metadata")}
        right = f"<think>so</think>\n<answer>wrong</answer> no, wait: <answer>{row['answer']}</answer>"
        assert reasoning_gym_reward("p", right, [1], [2], **row) == score(row["answer"], entry) == 1.0
        for reply in ("The answer is \\boxed{42}.", "<answer>  17 </answer>", "<answer>1/2</answer>", ""):
            assert reasoning_gym_reward("p", reply, [1], [2], **row) == score(final_answer(reply), entry), (row["task"], reply)
    # partial credit and a format score are the scorers' own, not ours
    frac = next(r for r in rows if r["task"] == "fraction_simplification")
    assert reasoning_gym_reward(completions="no tag at all", **frac) == 0.01
    assert final_answer("a <answer> 3/4 </answer> b") == "3/4" and final_answer("none") is None


def test_an_answer_the_scorer_cannot_parse_scores_zero():
    row = load_rows("reasoning-gym:prime_factorization", "train", size=1, seed=1)[0]
    with pytest.raises(ValueError):  # prime_factorization's scorer int()s the answer's factors
        reasoning_gym.get_score_answer_fn("prime_factorization")("two times three", row)
    assert reasoning_gym_reward(completions="<answer>two times three</answer>", **row) == 0.0
    assert reasoning_gym_reward(completions=f"<answer>{row['answer']}</answer>", **row) == 1.0


@dataclasses.dataclass
class _EchoConfig:
    seed: int | None = None
    size: int = 500


class _BadScorerDataset(reasoning_gym.dataset.ProceduralDataset):
    """A task written as reasoning-gym's own are (registered in its factory), whose scorer gives
    something other than a finite number: what ``reward`` holds."""

    reward: object = None

    def __init__(self, config: _EchoConfig):
        super().__init__(config=config, seed=config.seed, size=config.size)

    def __getitem__(self, idx: int) -> dict:
        return {"question": f"echo {self.seed + idx}", "answer": str(self.seed + idx), "metadata": {"source_dataset": "bad_scorer"}}

    def score_answer(self, answer, entry):
        return self.reward


@pytest.mark.parametrize("reward", [math.nan, math.inf, "1.0", None, True])
def test_a_scorer_that_gives_no_finite_number_fails_naming_its_task(monkeypatch, reward):
    monkeypatch.setitem(reasoning_gym.factory.DATASETS, "bad_scorer", (_BadScorerDataset, _EchoConfig))
    monkeypatch.setattr(_BadScorerDataset, "reward", reward)
    (row,) = load_rows("reasoning-gym:bad_scorer", "train", size=1, seed=3)
    assert row["task"] == "bad_scorer"
    with pytest.raises(ValueError, match=r"the scorer of reasoning-gym task 'bad_scorer' gave .* for the answer '7', not a finite number"):
        reasoning_gym_reward(completions="<answer>7</answer>", **row)
    monkeypatch.setattr(_BadScorerDataset, "reward", 0.5)  # the same task with a number: that number
    assert reasoning_gym_reward(completions="<answer>7</answer>", **row) == 0.5
