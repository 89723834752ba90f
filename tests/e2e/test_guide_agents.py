"""A guide agent as a whole training run calls it (tests/integration/agents/test_guide_agent_episodes.py runs
every guide agent's episodes, sandboxed and inline, on a gateway alone): AReaL's own Anthropic agent's
shape, sandboxed, handed AReaL's ``workflow_kwargs`` through the command line, one step trained."""

from __future__ import annotations

import math

import pytest
from run_checks import read_jsonl, run_in_repo, train_cmd

# What AReaL's examples/agent_workflow/train.py hands every agent class (workflow_kwargs).
AREAL_KWARGS = "++rollout.agent_kwargs={temperature:1.0,top_p:1.0,max_tokens:256,max_completion_tokens:32,max_turns:2}"


@pytest.mark.e2e
def test_areal_shaped_anthropic_agent_trains_a_step_sandboxed(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_in_repo(
        train_cmd(
            run_dir,
            "model.path=scripted",
            "rollout.agent=tests/support/areal_shaped_agents.py:AnthropicMathAgent",
            AREAL_KWARGS,
            "rollout.openai.mode=subproc",
            "trainer.steps=1",
            "rollout.groups_per_step=1",
            "rollout.n_samples=2",
            "data.eval_size=0",
        ),
        timeout_s=400,
    )
    assert (run_dir / "episodes.jsonl").is_file(), proc.stderr[-3000:]
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    assert episodes and all(e["status"] == "ok" for e in episodes), [e.get("error", "")[-2000:] for e in episodes]
    assert all(e["interactions"] == 2 for e in episodes), episodes  # its two calls, each recorded
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["version"] for m in steps] == [1] and math.isfinite(steps[0]["loss"]), steps  # one step trained
