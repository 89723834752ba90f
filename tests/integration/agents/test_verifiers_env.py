"""verifiers environments as the agent (areal/agent/verifiers_env.py): ``rollout.agent=verifiers:...``
in real sandboxed episodes, verifiers 0.4.0 running in its private venv (make verifiers-venv) inside
the sandbox, its client through the episode's relay to a real gateway on the scripted model.

The environments (tests/support/verifiers_envs/): the single-turn taskset of verifiers' docs, a
taskset with an MCP tool server (the docs' "Adding Tools"), verifiers' own best-of-n env over the
docs' taskset, a two-seat multi-turn env written here, and tasksets that score nothing or NaN.
Asserted: every call verifiers made is recorded, multi-turn calls extend their parent's tokens,
each reward reaches the calls of the trace it scored, what fails names the env, and a taskset named
as the run's data (``data.train=verifiers:...``) gives its own tasks as the rows. Nothing is
asserted on what the model writes beyond the scripted model's contract (a tool offered is called).

Skipped without the private venv; ``AREAL_REQUIRE_VERIFIERS=1`` makes that a failure.
"""

from __future__ import annotations

import os

import pytest
from paths import SUPPORT
from transformers import AutoTokenizer
from verifiers_venv import need_verifiers
from zygote_harness import sandboxed_episodes

from areal.agent.spec import load_agent
from areal.agent.verifiers_env import VerifiersError, taskset_rows
from areal.config import DataConfig, RolloutConfig
from areal.controller.problems import run_reward, user_rows
from areal.embedded import ensure_scripted_model

ENVS = SUPPORT / "verifiers_envs"
NULL_HARNESS = {"agent": {"harness": {"id": "null"}}}
SEAT_MARK = "You are seat {seat}."  # tests/support/verifiers_envs/vf_seats
SEAT_REWARD = {"first": 0.25, "second": 0.75}
TOOL_RESULT = "calculator result:"  # tests/support/verifiers_envs/vf_calculator/tools.py
DEADLINE_S = 240.0  # verifiers imports for seconds of CPU per process, on a loaded two-core machine


@pytest.fixture(autouse=True)
def envs_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test tasksets importable, as a user's would be from their project (PYTHONPATH)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ENVS), os.environ.get("PYTHONPATH")])))


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(ensure_scripted_model())


def _episodes(gw, spec: str, rows: list[dict], kwargs: dict | None = None) -> list[tuple]:
    """Each row as one sandboxed episode of ``spec``: [(outcome, the gateway's interactions)]."""
    return sandboxed_episodes(gw, spec, rows, kwargs, deadline_s=DEADLINE_S)


def _extends(parent, child) -> bool:
    """``child``'s prompt is ``parent``'s exact prompt and sampled tokens, then more."""
    return child.parent_id == parent.id and child.prompt_ids[: len(parent.prompt_ids) + len(parent.output_ids)] == (
        parent.prompt_ids + parent.output_ids
    )


def test_the_documented_taskset_runs_sandboxed_from_its_own_rows(served_scripted, tokenizer):
    need_verifiers()
    rows = taskset_rows("verifiers:vf-addition", 2, offset=3)  # the taskset's own load(): tasks 3 and 4
    assert [r["verifiers_task"]["answer"] for r in rows] == [6, 8] and [r["answer"] for r in rows] == ["6", "8"]
    results = _episodes(served_scripted, "verifiers:vf-addition", rows, NULL_HARNESS)
    for row, (outcome, calls) in zip(rows, results):
        assert outcome.status == "ok", (outcome.error, outcome.log_tail)
        assert outcome.reward in (0.0, 1.0) and not outcome.rewards_by_id  # one trace: the episode's float
        (call,) = calls  # the null harness: one chat turn, no tools
        assert row["question"] in tokenizer.decode(call.prompt_ids)


def test_verifiers_default_harness_and_a_plain_dataset_row(served_scripted, tokenizer):
    """No harness named: verifiers' default for a taskset (bash, with its bash and edit tools); the
    row a plain {question, answer} one, turned into the taskset's TaskData by its fields."""
    need_verifiers()
    row = {"question": "What is 5 + 5?", "answer": 10, "messages": [{"role": "user", "content": "What is 5 + 5?"}]}
    ((outcome, calls),) = _episodes(served_scripted, "verifiers:vf-addition", [row], {"agent": {"max_turns": 3}})
    assert outcome.status == "ok", (outcome.error, outcome.log_tail)
    assert outcome.reward in (0.0, 1.0)
    assert 1 <= len(calls) <= 3 and "What is 5 + 5?" in tokenizer.decode(calls[0].prompt_ids)
    assert all(_extends(a, b) for a, b in zip(calls, calls[1:]))  # the tool loop, token by token


def test_a_tool_taskset_runs_its_mcp_server_in_the_sandbox(served_scripted, tokenizer):
    need_verifiers()
    rows = taskset_rows("verifiers:vf-calculator", 1)
    ((outcome, calls),) = _episodes(served_scripted, "verifiers:vf-calculator", rows, NULL_HARNESS)
    assert outcome.status == "ok", (outcome.error, outcome.log_tail)
    assert outcome.reward in (0.0, 1.0)
    first, second = calls  # the scripted model calls the offered tool, then answers its result
    assert _extends(first, second)
    assert TOOL_RESULT in tokenizer.decode(second.prompt_ids[len(first.prompt_ids) + len(first.output_ids) :])


def test_each_seats_reward_reaches_the_calls_that_seat_made(served_scripted, tokenizer):
    need_verifiers()
    rows = taskset_rows("verifiers:vf-seats", 2)
    for outcome, calls in _episodes(served_scripted, "verifiers:vf-seats", rows):
        assert outcome.status == "ok", (outcome.error, outcome.log_tail)
        assert outcome.reward is None and set(outcome.rewards_by_id) == {c.id for c in calls}
        seats = {c.id: next(s for s in SEAT_REWARD if SEAT_MARK.format(seat=s) in tokenizer.decode(c.prompt_ids)) for c in calls}
        assert sorted(seats.values()) == ["first", "first", "second", "second"]  # two turns each
        assert {cid: SEAT_REWARD[seat] for cid, seat in seats.items()} == outcome.rewards_by_id
        by_seat = {s: [c for c in calls if seats[c.id] == s] for s in SEAT_REWARD}
        assert all(_extends(*pair) for pair in by_seat.values())


def test_verifiers_own_best_of_n_env_rewards_each_attempt(served_scripted):
    need_verifiers()
    rows = taskset_rows("verifiers:vf-addition", 1)
    ((outcome, calls),) = _episodes(served_scripted, "verifiers:best-of-n+vf-addition", rows, {"n": 3, **NULL_HARNESS})
    assert outcome.status == "ok", (outcome.error, outcome.log_tail)
    assert len(calls) == 3 and set(outcome.rewards_by_id) == {c.id for c in calls}
    assert set(outcome.rewards_by_id.values()) <= {0.0, 1.0}


def test_a_taskset_without_a_scorer_or_with_a_nan_reward_fails_naming_it(served_scripted):
    need_verifiers()
    row = {"question": "hi", "answer": "", "messages": [{"role": "user", "content": "hi"}]}
    for spec, says in [
        ("verifiers:vf-unscored", "'verifiers:vf-unscored' gave no reward: its taskset has no scorer"),
        ("verifiers:vf-nan", "'verifiers:vf-nan': its reward 'broken' is nan, not a finite number"),
    ]:
        ((outcome, calls),) = _episodes(served_scripted, spec, [row], NULL_HARNESS)
        assert outcome.status == "error" and says in outcome.error, (outcome.error, outcome.log_tail)
        assert "VerifiersError" in outcome.failure_cause and len(calls) == 1  # the call was made and recorded


def test_an_env_that_does_not_import_fails_at_load_naming_it():
    need_verifiers()
    with pytest.raises(VerifiersError, match=r"'verifiers:vf-missing' failed to load: ModuleNotFoundError: taskset 'vf-missing'"):
        load_agent("verifiers:vf-missing")
    with pytest.raises(VerifiersError, match=r"(?s)'verifiers:vf-addition' failed to load: ValidationError: .*taskset.no_such_field"):
        load_agent("verifiers:vf-addition", {"taskset": {"no_such_field": 1}})


def test_without_its_venv_the_agent_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.setenv("AREAL_VERIFIERS_VENV", str(tmp_path / "absent"))
    with pytest.raises(VerifiersError, match="make verifiers-venv"):
        load_agent("verifiers:vf-addition")
    with pytest.raises(ValueError, match="verifiers:TASKSET or verifiers:ENV\\+TASKSET"):
        load_agent("verifiers:best-of-n+")


def test_a_taskset_as_the_runs_data_gives_its_tasks_and_holds_out_the_ones_after_them():
    need_verifiers()
    train, held_out = user_rows(DataConfig(train="verifiers:vf-addition", train_size=90, eval_size=5), None, None)
    own = taskset_rows("verifiers:vf-addition", 2)  # what `python -m areal.agent.verifiers_env rows` writes
    assert train[:2] == [dict(row, messages=[{"role": "user", "content": row["question"]}]) for row in own]
    assert [r["verifiers_task"]["answer"] for r in train] == [2 * i for i in range(90)]  # its load(): tasks 0..89
    assert [r["verifiers_task"]["answer"] for r in held_out] == [2 * i for i in range(90, 95)]  # the 5 after them
    assert run_reward("", train, "verifiers:vf-addition") == ""  # the taskset's rubric scores: the agent's reward
    with pytest.raises(ValueError, match=r"a verifiers taskset's tasks, and the built-in agent .*rollout.agent=verifiers:TASKSET"):
        run_reward("", train, RolloutConfig.agent)
    # its 100 tasks all taken for training: none left to hold out, said so
    with pytest.raises(ValueError, match=r"'?verifiers:vf-addition'?: its taskset has no task from task 100 on .*lower data.train_size"):
        user_rows(DataConfig(train="verifiers:vf-addition", train_size=4000, eval_size=5), None, None)
