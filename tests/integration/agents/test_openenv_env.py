"""OpenEnv environments as the agent (areal/agent/openenv_env.py): ``rollout.agent=openenv:MODULE:CLASS``
in real sandboxed episodes (the environment's state in the episode's process) and inline, against a
real gateway on the scripted model.

The environments (tests/support/openenv_envs.py) are written on openenv-core as a user writes one,
and end the same way whatever the model writes. Asserted: one recorded call per move, each call
extending its parent's tokens; each move's reply reaching the environment (the next observation
repeats it); each call rewarded with the reward of the step its move made; what fails names the
environment.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from openenv_envs import MOVES, REWARD_STEP, SAID
from transformers import AutoTokenizer
from zygote_harness import sandboxed_episodes

from areal.agent.spec import InlineRunner, load_agent
from areal.embedded import ensure_scripted_model

DEADLINE_S = 120.0
COUNTING = "openenv:openenv_envs:CountingEnv"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(ensure_scripted_model())


def _inline(gw, spec: str, row: dict, kwargs: dict | None = None) -> tuple:
    """One episode in this process (``rollout.openai.mode=inline``), against the same gateway."""

    async def episode() -> tuple:
        runner = InlineRunner(spec, gw.http, kwargs)
        try:
            key = gw.gateway.open_session("oe-inline")
            return await runner.run_episode("oe-inline", row, key, DEADLINE_S), key
        finally:
            await runner.close()

    outcome, key = asyncio.run(episode())
    return outcome, gw.interactions(key)


def test_each_move_is_a_call_rewarded_with_its_steps_reward_sandboxed_and_inline(served_scripted, tokenizer):
    row = {"question": "count", "answer": "", "seed": 5}
    (sandboxed,) = sandboxed_episodes(served_scripted, COUNTING, [row], deadline_s=DEADLINE_S)
    for outcome, calls in [sandboxed, _inline(served_scripted, COUNTING, row)]:
        assert outcome.status == "ok", (outcome.error, outcome.log_tail)
        assert len(calls) == MOVES and outcome.reward is None
        assert outcome.rewards_by_id == {c.id: REWARD_STEP * (k + 1) for k, c in enumerate(calls)}
        assert "Turn 0 of 3, seed 5." in tokenizer.decode(calls[0].prompt_ids)  # reset with the row's seed
        for parent, child in zip(calls, calls[1:]):
            reply = tokenizer.decode(parent.output_ids, skip_special_tokens=True)
            assert SAID + reply in tokenizer.decode(child.prompt_ids)  # the move reached the env, which answered
            assert child.prompt_ids[: len(parent.prompt_ids) + len(parent.output_ids)] == parent.prompt_ids + parent.output_ids


def test_an_env_that_scores_nothing_scores_nan_or_never_ends_fails_naming_it(served_scripted):
    row = {"question": "x", "answer": ""}
    for cls, kwargs, says, n in [
        ("UnscoredEnv", None, "'openenv:openenv_envs:UnscoredEnv' gave no reward: no step's observation had one", 1),
        ("NanEnv", None, "'openenv:openenv_envs:NanEnv' gave move 1 the reward nan, not a finite number", 1),
        ("EndlessEnv", {"max_moves": 2}, "'openenv:openenv_envs:EndlessEnv' did not end within max_moves=2 moves", 2),
    ]:
        ((outcome, calls),) = sandboxed_episodes(served_scripted, f"openenv:openenv_envs:{cls}", [row], kwargs, deadline_s=DEADLINE_S)
        assert outcome.status == "error" and says in outcome.error, (outcome.error, outcome.log_tail)
        assert len(calls) == n  # the calls were made and recorded


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        ("openenv:no_such_envs:Env", None, r"'openenv:no_such_envs:Env': no_such_envs does not import: ModuleNotFoundError"),
        ("openenv:openenv_envs:Missing", None, r"openenv_envs.Missing is None, not a subclass of openenv's Environment"),
        ("openenv:openenv_envs:Say", None, r"openenv_envs.Say is <class .*Say'>, not a subclass of openenv's Environment"),
        (
            "openenv:openenv_envs:UndeclaredEnv",
            None,
            r"UndeclaredEnv does not declare its action type: write class UndeclaredEnv\(Environment\[",
        ),
        ("openenv:openenv_envs:TwoTextEnv", None, r"TwoText has 2 str fields \(message, note\); name the one .*action_field"),
        ("openenv:openenv_envs:TwoTextEnv", {"action_field": "text"}, r"TwoText has no field 'text'; its fields: metadata, message, note"),
        (
            "openenv:openenv_envs:CountingEnv",
            {"env": {"size": 3}},
            r"'openenv:openenv_envs:CountingEnv': CountingEnv\(\*\*rollout.agent_kwargs.env\) failed",
        ),
        (
            "openenv:openenv_envs:CountingEnv",
            {"turns": 3},
            r"unexpected keyword argument 'turns'; its agent_kwargs are \['env', 'action_field'",
        ),
        ("openenv:CountingEnv", None, r"write openenv:MODULE:CLASS"),
    ],
)
def test_what_cannot_run_fails_at_load_naming_the_env(spec, kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_agent(spec, kwargs)


def test_the_action_field_named_is_the_one_the_reply_fills(served_scripted, tokenizer):
    outcome, calls = _inline(
        served_scripted, "openenv:openenv_envs:TwoTextEnv", {"question": "x", "answer": ""}, {"action_field": "message"}
    )
    assert outcome.status == "ok" and len(calls) == MOVES, (outcome.error, outcome.log_tail)
    reply = tokenizer.decode(calls[0].output_ids, skip_special_tokens=True)
    assert SAID + reply in tokenizer.decode(calls[1].prompt_ids)  # the env read its move from `message`


def test_without_openenv_the_error_names_the_env_and_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "openenv" or m.startswith("openenv.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "openenv", None)  # import openenv raises ImportError
    with pytest.raises(
        ValueError, match=r"'openenv:openenv_envs:CountingEnv': openenv does not import .*: pip install 'areal-lite\[envs\]'"
    ):
        load_agent(COUNTING)
