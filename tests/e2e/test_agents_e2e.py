"""Every SDK's example agent in agents/, end to end: one short `python -m areal.train` run each,
sandboxed (`rollout.openai.mode=subproc`), through gateway, embedded engine, ring and trainer.

The engine serves the scripted model (``model.path=scripted``, ``areal/embedded/scripted.py``):
with the calculator offered it calls ``calculator("6*7")``, after a tool result and without tools
it answers in text; at the agents' temperature 1 it writes these replies with probability
>= 0.9999 on the embedded task's questions (checked when it is built). So what each agent is for
happens on every build of the model; the default model's own behaviour is emergent and differs
between CPUs.

Each run is one step of one group. The checks:
- the run succeeds and every episode's status is ok (the agents map the model's own mistakes,
  e.g. a call to a tool the agent lacks, to reward 0 rather than crash);
- every trained token is a token the engine generated, with the engine's logprob and weight
  version (the engine's request log joined with the saved trajectories, as in test_e2e.py);
- what each agent is for really happened: tool agents executed the calculator call the model
  made (the next call's prompt carries the calculator's value for that expression), the
  multi-turn agent rewarded each response on its own and asked again only after a wrong answer,
  and the plain agent made exactly one call.

- the handoff agent handed off in every episode: its first call ends with the whole forced
  call to ``transfer_to_math_agent`` (a named tool_choice of a tool without parameters) and the
  math agent (its own instructions and calculator tool) made at least one more call with that
  call and its result in its history.

Tool agents run 4 samples instead of 2, so that the check that some episode made a tool round
trip holds even if a sampled reply strays from the script (each does with probability <= 1e-4).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from run_checks import read_jsonl, run_in_repo, sampled_as_served, train_cmd

from areal.controller.trajectories import read_saved_trajectories
from areal.embedded import ensure_scripted_model
from areal.embedded.corpus import RETRY_PROMPTS
from areal.gateway.parsers import forced_tool_prefix
from areal.workflow.common import calculator

TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)

AGENTS = [  # (spec, kind): kind names the check of what the agent is for
    pytest.param("agents/openai_multiturn.py:MultiTurnMathAgent", "multiturn", id="openai-multiturn"),
    pytest.param("agents/openai_tools.py:CalculatorAgent", "tools", id="openai-tools"),
    pytest.param("agents/openai_agents_handoff.py:HandoffMathAgent", "handoff", id="openai-agents-handoff"),
    pytest.param("agents/anthropic_tools.py:AnthropicCalculatorAgent", "tools", id="anthropic-tools"),
    pytest.param("agents/langchain_agent.py:PlainMathAgent", "plain", id="langchain-plain"),
    pytest.param("agents/langchain_agent.py:ToolMathAgent", "tools", id="langchain-tools"),
    pytest.param("agents/camel_agent.py:CamelCalculatorAgent", "tools", id="camel-tools"),
]


@pytest.fixture(scope="module")
def tokenizer():
    from areal.utils.hf_utils import load_hf_tokenizer

    return load_hf_tokenizer(str(ensure_scripted_model()))


def _train(run_dir: Path, agent: str, n_samples: int) -> subprocess.CompletedProcess:
    cmd = train_cmd(
        run_dir,
        f"rollout.agent={agent}",
        "model.path=scripted",
        "rollout.openai.mode=subproc",
        "trainer.steps=1",
        "rollout.groups_per_step=1",
        f"rollout.n_samples={n_samples}",
        "rollout.max_head_offpolicyness=0",
        "data.eval_size=0",
        "save_trajectories=true",
        "engine.request_log=true",
    )
    return run_in_repo(cmd, timeout_s=600)


def _continues(prev, row) -> str:
    """The tokens ``row``'s prompt appends to ``prev``'s prompt + sampled tokens (asserting it does extend them)."""
    before, ids = prev.input_ids.tolist(), row.input_ids[: int((~row.loss_mask.astype(bool)).sum())].tolist()
    assert ids[: len(before)] == before, "a later call's prompt does not extend the earlier call's tokens"
    return ids[len(before) :]


def _check_tool_round_trips(trajectories: list, tokenizer) -> None:
    """Every call that was followed by another carried a tool call, and the next prompt answers it:
    with the calculator's value for a well-formed calculator call (the agent executed it), with an
    error for a call the model got wrong (an unknown tool name, arguments without an expression)."""
    round_trips = 0
    for traj in trajectories:
        rows = traj.rows()
        for prev, row in zip(rows, rows[1:]):
            said = tokenizer.decode(prev.input_ids[prev.loss_mask.astype(bool)].tolist())
            calls = [json.loads(m) for m in TOOL_CALL.findall(said)]
            assert calls, f"a call was followed by another without a tool call: {said!r}"
            told = tokenizer.decode(_continues(prev, row))
            assert "<tool_response>" in told, told  # the agent answered the call
            name, arguments = calls[0].get("name"), calls[0].get("arguments")
            if name != "calculator" or not isinstance(arguments, dict) or "expression" not in arguments:
                # the model's own mistake (seen: a call to 'calculatorcalculator'): answered with an
                # error ("error: unknown tool ..." from our agents, "Tool execution failed: ..." from CAMEL)
                assert re.search(r"error|failed", told, re.I), (calls[0], told)
                continue
            assert calculator(arguments["expression"]) in told, (arguments, told)
            round_trips += 1
    assert round_trips > 0, "no episode executed a well-formed calculator call"


def _check_multiturn(trajectories: list, tokenizer, max_turns: int = 3) -> None:
    """One reward per response; the agent asks again only after a wrong answer, with a complaint."""
    for traj in trajectories:
        rows = traj.rows()
        rewards = [r.reward for r in rows]
        assert 1 <= len(rows) <= max_turns and set(rewards) <= {0.0, 1.0}
        assert all(r == 0.0 for r in rewards[:-1]), rewards  # stopped at the first right answer
        assert rewards[-1] == 1.0 or len(rows) == max_turns, rewards
        for prev, row in zip(rows, rows[1:]):
            told = tokenizer.decode(_continues(prev, row))
            assert any(p in told for p in RETRY_PROMPTS), told


def _check_handoffs(trajectories: list, tokenizer) -> None:
    """Triage's call ends with the whole handoff call; the math agent then called with that history."""
    whole = tokenizer.encode(forced_tool_prefix("qwen25", "transfer_to_math_agent", no_arguments=True))
    for traj in trajectories:
        rows = traj.rows()
        assert len(rows) >= 2, "no call after the handoff"
        prompt = rows[0].input_ids[: int((~rows[0].loss_mask.astype(bool)).sum())].tolist()
        assert prompt[-len(whole) :] == whole
        # The math agent's call: its own system prompt and tools (so a new branch of the tree, not
        # an extension), with triage's handoff call and its result in the history.
        later = tokenizer.decode(rows[1].input_ids[: int((~rows[1].loss_mask.astype(bool)).sum())].tolist())
        assert '"name": "transfer_to_math_agent"' in later and "<tool_response>" in later and '"calculator"' in later


@pytest.mark.e2e
@pytest.mark.parametrize("agent,kind", AGENTS)
def test_agent_trains_end_to_end_in_the_sandbox(tmp_path, tokenizer, agent, kind):
    run_dir = tmp_path / "run"
    n_samples = 4 if kind == "tools" else 2
    proc = _train(run_dir, agent, n_samples)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    episodes = read_jsonl(run_dir / "episodes.jsonl")
    assert len(episodes) >= n_samples
    assert all(e["status"] == "ok" for e in episodes), [e for e in episodes if e["status"] != "ok"][:2]
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["version"] for m in steps] == [1] and np.isfinite(steps[0]["loss"])
    # What the agents did, per episode and per step: LLM calls and the well-formed tool calls they received.
    assert steps[0]["calls_per_episode"] == pytest.approx(np.mean([e["interactions"] for e in episodes]))
    assert steps[0]["tool_calls_per_episode"] == pytest.approx(np.mean([e["tool_calls"] for e in episodes]))
    if kind == "tools":  # the scripted model calls the calculator whenever tools are offered
        assert all(e["tool_calls"] >= 1 for e in episodes), [e["tool_calls"] for e in episodes]
    elif kind == "plain":
        assert all(e["tool_calls"] == 0 for e in episodes)

    trajectories = read_saved_trajectories(run_dir / "trajectories.bin")
    assert len(trajectories) == n_samples and all(t.status == "ok" for t in trajectories)
    assert all(len(t.rows()) >= 1 for t in trajectories)  # every episode recorded its calls
    assert sampled_as_served(run_dir, trajectories)[0] == {0}  # one synchronous step: version 0 sampled every token
    if kind == "tools":
        _check_tool_round_trips(trajectories, tokenizer)
    elif kind == "multiturn":
        _check_multiturn(trajectories, tokenizer)
    elif kind == "plain":
        assert all(len(t.rows()) == 1 for t in trajectories)
    elif kind == "handoff":
        _check_handoffs(trajectories, tokenizer)
