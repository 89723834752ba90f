"""The held-out evaluation of a run that trains a user's own agent (data.eval_mode=auto, the
default): scored by that agent's episodes, as its training episodes are, not by the built-in
\\boxed{} check; its progress and summary lines on the console, its cost in evals.jsonl.

The agent (tests/support/self_scored_agent.py) gives its own reward (0.375) on one held-out row
and leaves the other to the run's reward= function (0.125): rewards a single-turn evaluation,
scored 0 or 1 per reply, cannot give. Nothing is timed.
"""

from __future__ import annotations

import json

import pytest
from paths import SUPPORT
from run_checks import one_step_run, read_jsonl, run_ok

pytestmark = pytest.mark.e2e  # a whole run

AGENT = SUPPORT / "self_scored_agent.py"


def test_auto_scores_the_held_out_rows_with_the_users_agent_and_reward(tmp_path):
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    held_out = [{"question": "What is 7 + 7?", "answer": "14"}, {"question": "What is 8 + 8?", "answer": "16", "scored_by": "reward"}]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held_out))
    run_dir = tmp_path / "run"
    proc = run_ok(
        one_step_run(
            run_dir,
            f"rollout.agent={AGENT}:run",
            f"reward={AGENT}:reward",
            f"data.train={tmp_path / 'train.jsonl'}",
            f"data.eval={tmp_path / 'eval.jsonl'}",
            "data.eval_samples=1",  # 2 problems x (1 sampled + 1 greedy): 4 episodes an evaluation
            "rollout.groups_per_step=1",
            "rollout.n_samples=2",
        ),
        timeout_s=600,
    )
    evals = {e["name"]: e for e in read_jsonl(run_dir / "evals.jsonl")}
    assert set(evals) == {"before", "after"}
    for e in evals.values():  # per problem: the agent's 0.375, the reward function's 0.125
        assert (e["n"], e["sampled_acc"], e["greedy_acc"]) == (2, 0.25, 0.25), e
        assert e["wall_s"] >= 0 and e["sampled_tokens"] > 0 and e["calls_per_episode"] == 1.0  # what it cost
    episodes = read_jsonl(run_dir / "eval_episodes.jsonl")  # the agent's own episodes, never trained
    assert sorted((e["eval"], e["problem"], e["score"]) for e in episodes) == sorted(
        (name, p, score) for name in ("before", "after") for p, score in ((0, 0.375), (1, 0.125)) for _ in range(2)
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_mode"] == "agent" and summary["eval_before"]["per_problem_sampled"] == [0.375, 0.125]
    out = proc.stdout
    assert f"[eval] 2 held-out problems; data.eval_mode=auto: the run's own agent (rollout.agent={AGENT}:run)" in out, out[-3000:]
    for line in ("[eval] before training: 0/4 episodes (the run's agent", "[eval] before training: 4/4 episodes, "):
        assert line in out, out[-3000:]
    for name in ("before training", "after training (v1)"):
        assert f"[eval] {name}: done in " in out and "(4 episodes, " in out, out[-3000:]
    assert "sampled_acc 0.250, greedy_acc 0.250 (agent)" in out, out[-3000:]
