"""mini-swe-agent as the agent (areal/agent/mini_swe.py): ``rollout.agent=mini-swe`` in real
sandboxed episodes with a world (a shipped task of tasks/swe), mini-swe-agent 2.4.6 running its
own DefaultAgent loop, unchanged, in its private venv (make mini-swe-venv) inside the sandbox, its
litellm client through the episode's relay to a real gateway.

Two models behind the gateway:
- the scripted model on the real engine: it cannot speak mini-swe-agent's format (what it writes to
  a prompt as long as mini-swe-agent's is outside its contract, a build's own text), so mini-swe-
  agent's loop ends by its own rules (three format errors in a row, or its step limit). Asserted:
  the task and the bash tool in the first prompt, every call recorded, the reward the grader's
  verdict (0.0: the bug is still there), none of the agent's own; never what the model wrote;
- a stand-in engine on loopback speaking SGLang's ``/generate`` (tests/support/instant_engine.py)
  that answers as a SWE model would, with fixed bash tool calls in the scripted tokenizer's Qwen
  format, chosen by how many tool results the prompt holds: look around and run the tests, write
  the task's fix (its reference solution) and a note, run the tests again, submit. Asserted: every
  call recorded, each command's output (the working directory, the failing then passing tests,
  the note) in the next call's prompt, so each ran in /workspace and its result went back through
  mini-swe-agent; the grader, on the final workspace, passes every check: reward 1.0.

Skipped without the private venv; ``AREAL_REQUIRE_MINI_SWE=1`` makes that a failure.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from gateway_harness import GatewayThread
from instant_engine import start_instant_engine
from mini_swe_venv import need_mini_swe
from transformers import AutoTokenizer
from zygote_harness import loop_thread, run, sandboxed_episodes

from areal.agent import mini_swe
from areal.agent.mini_swe import MiniSweError
from areal.agent.spec import load_agent
from areal.dataset import load_rows
from areal.embedded import ensure_scripted_model

TASK = "swe-02-median"
DEADLINE_S = 240.0  # litellm imports for seconds of CPU, on a loaded two-core machine
NOTE = "fixed-by-mini-swe"


@pytest.fixture(scope="module")
def venv() -> str:
    return need_mini_swe()


@pytest.fixture(scope="module")
def row(venv: str) -> dict:
    return next(r for r in load_rows("swe:tasks/swe") if r["task_id"] == TASK)


def _commands(world: str) -> list[str]:
    """What the stand-in model runs, one command a turn (mini-swe-agent's submit command last)."""
    with open(os.path.join(world, "reference", "solution", "statkit", "center.py")) as f:
        fix = f.read()
    return [
        "pwd && python -m pytest -q tests 2>&1 | tail -1",
        f"cat > statkit/center.py <<'EOF'\n{fix}EOF\necho {NOTE} > NOTES.txt",
        "python -m pytest -q tests 2>&1 | tail -1; cat NOTES.txt",
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
    ]


def _tool_call(command: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"


def _command_of(reply: str) -> str:
    """The bash command of a stand-in reply, as sampled (the gateway recorded its tokens)."""
    return json.loads(reply.strip().removeprefix("<tool_call>").removesuffix("</tool_call>"))["arguments"]["command"]


@pytest.fixture(scope="module")
def swe_model(row: dict) -> Iterator[tuple[GatewayThread, list[str]]]:
    """A gateway (scripted tokenizer and template) over the stand-in engine; the prompts it saw."""
    model_dir = ensure_scripted_model()
    tok = AutoTokenizer.from_pretrained(model_dir)
    commands, prompts = _commands(row["world"]), []

    def answer(body: dict) -> str:
        prompt = tok.decode(body["input_ids"])
        prompts.append(prompt)
        return _tool_call(commands[min(prompt.count("<tool_response>"), len(commands) - 1)])

    with loop_thread() as loop:
        engine = run(loop, start_instant_engine(tok, answer))
        gw = GatewayThread(f"http://127.0.0.1:{engine.addresses[0][1]}", model_dir)
        try:
            yield gw, prompts
        finally:
            gw.stop()
            run(loop, engine.cleanup())


def test_on_the_scripted_model_its_loop_runs_and_ends_by_its_own_rule(served_scripted, row):
    ((outcome, calls),) = sandboxed_episodes(served_scripted, "mini-swe", [row], deadline_s=DEADLINE_S)
    assert outcome.status == "ok", outcome.error or outcome.log_tail
    # What the scripted model writes to a prompt as long as mini-swe-agent's is outside its contract
    # (a build's own text, not asserted); mini-swe-agent's loop ends by its own rules (three format
    # errors in a row, or its step limit) and every call it made is recorded in the episode's session.
    assert 1 <= len(calls) <= mini_swe.STEP_LIMIT, outcome.log_tail
    tok = AutoTokenizer.from_pretrained(ensure_scripted_model())
    first = tok.decode(calls[0].prompt_ids)
    assert row["messages"][0]["content"].splitlines()[-1] in first and "Execute a bash command" in first  # the task, the bash tool
    assert all(call.output_ids for call in calls)
    assert outcome.grader == "complete" and outcome.tripwires == []
    assert outcome.reward == 0.0 and 0.0 in outcome.checks.values()  # the grader's: the bug is still there


def test_every_command_runs_in_the_workspace_and_the_grader_rewards_the_fix(swe_model, row):
    gw, prompts = swe_model
    ((outcome, calls),) = sandboxed_episodes(gw, "mini-swe", [row], deadline_s=DEADLINE_S)
    assert outcome.status == "ok", outcome.error or outcome.log_tail
    commands = _commands(row["world"])
    assert len(calls) == len(commands) == len(prompts)  # every call mini-swe-agent made, recorded
    tok = AutoTokenizer.from_pretrained(ensure_scripted_model())
    for call, command in zip(calls, commands):
        assert call.tool_calls == 1
        assert _command_of(tok.decode(call.output_ids, skip_special_tokens=True)) == command
    # each command's output came back in the next prompt: where it ran, the tests before and after the fix, the note
    assert "/workspace" in prompts[1] and " failed" in prompts[1].split("<tool_response>")[-1]
    assert "passed" in prompts[3].split("<tool_response>")[-1] and NOTE in prompts[3].split("<tool_response>")[-1]
    # the grader ran the hidden checks on the workspace the commands left: the fix passes them all
    assert outcome.grader == "complete" and outcome.tripwires == []
    assert outcome.checks and set(outcome.checks.values()) == {1.0}
    assert outcome.reward == 1.0


def test_a_config_that_does_not_load_fails_at_load_naming_it(venv):
    with pytest.raises(MiniSweError, match="no-such-config"):
        load_agent("mini-swe:no-such-config")


def test_without_its_venv_the_agent_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.setenv("AREAL_MINI_SWE_VENV", str(tmp_path / "absent"))
    with pytest.raises(MiniSweError, match="make mini-swe-venv"):
        load_agent("mini-swe")
