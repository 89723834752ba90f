"""A training run that branches its episodes at a model call (docs/branching.md): sandboxed
episodes of tests/support/branch_agents.py's TwoCallAgent, each branched at its first call into
two, on the scripted model. Checked from the run's files: each episode is logged as one line per
branch with its tag, trained as one tree record carrying its fork row (the shared prefix once),
its reward the mean of its branches'; the trainer's steps are recorded; no branch session is left
open; calls are counted once per episode; each branch replays its recorded calls."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from run_checks import read_jsonl, run_in_repo, run_ok, train_cmd

from areal.controller.trajectories import read_saved_trajectories

pytestmark = pytest.mark.e2e

N, CALLS = 2, 2  # branches per episode, calls per branch


def _branched_run(run_dir: Path, *overrides: str) -> None:
    """Two synchronous steps of one group of 2 TwoCallAgent episodes on the scripted model, each branched in N."""
    run_ok(
        train_cmd(
            run_dir,
            "rollout.agent=tests/support/branch_agents.py:TwoCallAgent",
            "model.path=scripted",
            f"rollout.branch.n={N}",
            *overrides,
            "trainer.steps=2",
            "rollout.groups_per_step=1",
            "rollout.n_samples=2",
            "rollout.max_head_offpolicyness=0",
            "data.eval_size=0",
            "save_trajectories=true",
        ),
        timeout_s=600,
    )


def test_a_run_branches_each_episode_and_trains_it_as_one_tree(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _branched_run(run_dir, "rollout.openai.mode=subproc", "rollout.branch.at_call=1")
    lines = read_jsonl(run_dir / "episodes.jsonl")
    assert lines and all("branch_of" in e for e in lines), [e.get("error") or e.get("branch_refused") for e in lines][:3]
    by_trunk: dict[str, list[dict]] = {}
    for e in lines:
        assert e["episode_id"] == f"{e['branch_of']}/b{e['branch_index']}"
        assert (e["status"], e["branch_call"], e["shared_interactions"], e["interactions"]) == ("ok", 1, 0, CALLS)
        assert "branch_refused" not in e and "branches_cut" not in e
        by_trunk.setdefault(e["branch_of"], []).append(e)
    assert all(sorted(e["branch_index"] for e in es) == list(range(N)) for es in by_trunk.values())

    saved = read_saved_trajectories(run_dir / "trajectories.bin")
    assert saved and {t.episode_id for t in saved} <= set(by_trunk)
    for t in saved:
        assert t.array("row_forks").tolist() == [-1]  # branched at the first call: the branches are the roots
        assert t.array("row_parents").tolist() == [-1, 0, -1, 2]  # each branch's two calls, no prefix row
        branches = sorted(by_trunk[t.episode_id], key=lambda e: e["branch_index"])
        assert t.array("row_rewards").tolist() == [0.0, branches[0]["reward"], 0.0, branches[1]["reward"]]  # on each leaf
        assert t.reward == pytest.approx(np.mean([e["reward"] for e in branches]))  # the mean, not the sum
        assert t.group_size == 2

    trained = read_jsonl(run_dir / "trained_episodes-r0.jsonl")
    assert [s["step"] for s in trained] == [1, 2]
    counts = Counter(e for s in trained for e in s["episodes"])
    assert max(counts.values()) == 1 and set(counts) == {t.episode_id for t in saved}
    trainer = read_jsonl(run_dir / "trainer_metrics.jsonl")
    assert [m["step"] for m in trainer] == [1, 2] and all(np.isfinite(m["loss"]) for m in trainer)
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in steps] == [1, 2] and all(np.isfinite(m["loss"]) for m in steps)
    # Synchronous (bound 0): no episode is running at a step's report, so every branch session was closed.
    assert all(m["branch_sessions_open"] == 0 for m in steps)
    assert all(m["calls_per_episode"] == N * CALLS for m in steps)  # each call once per episode

    # Each branch replays as an episode of its own (python -m areal.replay): its agent, run again
    # unbranched against the branch's recorded calls (the shared ones, then its own), makes exactly
    # those calls. Its reward is a fresh coin flip (TwoCallAgent), so only the calls are compared.
    replayed = run_in_repo([sys.executable, "-m", "areal.replay", str(run_dir), "--all"], timeout_s=300)
    assert replayed.returncode == 0, replayed.stdout[-2000:] + replayed.stderr[-3000:]
    rows = read_jsonl(run_dir / "replay.jsonl")
    assert sorted(r["episode_id"] for r in rows) == sorted(e["episode_id"] for e in lines)
    assert all((r["status"], r["calls_recorded"], r["calls_matched"], r["divergence"]) == ("ok", CALLS, CALLS, "") for r in rows), rows


def test_an_inline_run_branches_by_replay_and_trains_each_episode_as_one_tree(tmp_path: Path) -> None:
    """rollout.branch.replay=true in a run whose agents cannot fork (inline, in the controller's
    process): each episode goes on as branch 0, the other branch runs the agent anew with its
    first call answered from the trunk's record, and the tree trains that call once."""
    run_dir = tmp_path / "run"
    _branched_run(run_dir, "rollout.openai.mode=inline", "rollout.branch.at_call=2", "rollout.branch.replay=true")
    lines = read_jsonl(run_dir / "episodes.jsonl")
    assert lines and all("branch_of" in e for e in lines), [e.get("error") or e.get("branch_refused") for e in lines][:3]
    by_trunk: dict[str, list[dict]] = {}
    for e in lines:
        assert (e["status"], e["branch_call"], e["shared_interactions"], e["interactions"]) == ("ok", 2, 1, CALLS), e
        assert e["branch_by_replay"].startswith("the call did not come through the client handed to a sandboxed agent"), e
        by_trunk.setdefault(e["branch_of"], []).append(e)
    assert all(sorted(e["branch_index"] for e in es) == list(range(N)) for es in by_trunk.values())
    saved = read_saved_trajectories(run_dir / "trajectories.bin")
    assert saved and {t.episode_id for t in saved} <= set(by_trunk)
    for t in saved:
        assert t.array("row_forks").tolist() == [0]  # the shared first call is the fork row
        assert t.array("row_parents").tolist() == [-1, 0, 0]  # the shared call once, then each branch's own
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in steps] == [1, 2] and all(np.isfinite(m["loss"]) for m in steps)
    assert all(m["branch_sessions_open"] == 0 for m in steps)
