"""``python -m areal.replay``: a recorded episode's agent re-run against its recorded completions.

Two short runs on the scripted model: the built-in agent in the sandbox, and a three-call agent
(two calls in flight at once, then a follow-up turn) inline. Each replay must make exactly the
recorded calls; a re-score writes the new function's rewards; a recorded prompt token changed
makes the replay name the call and the token. Nothing here reads what the model said."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from run_checks import one_step_run, read_jsonl, run_in_repo, run_ok, train_cmd

from areal.controller.episodes import DATA_RECORD_BYTES, data_field
from areal.replay import recorded_calls

SHORT = ("trainer.steps=1", "rollout.groups_per_step=1", "rollout.n_samples=2", "data.eval_size=0")


@pytest.fixture(scope="module")
def sandboxed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("replay") / "sandboxed"
    run_ok(train_cmd(run_dir, "model.path=scripted", *SHORT))
    return run_dir


@pytest.fixture(scope="module")
def three_turn_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("replay") / "three_turn"
    run_ok(one_step_run(run_dir, *SHORT, "rollout.agent=tests/support/replay_agents.py:ThreeTurnAgent"))
    return run_dir


def replay(run_dir: Path, *args: str):
    return run_in_repo([sys.executable, "-m", "areal.replay", str(run_dir), *args], timeout_s=120)


def trees(run_dir: Path) -> dict[str, list[dict]]:
    return {t["episode_id"]: t["calls"] for t in read_jsonl(run_dir / "calls.jsonl")}


@pytest.mark.e2e
def test_sandboxed_episode_replays_its_calls(sandboxed_run):
    records = read_jsonl(sandboxed_run / "episodes.jsonl")
    assert all(r["data"]["question"] and "answer" in r["data"] for r in records)  # the row is recorded
    episode = records[0]["episode_id"]
    proc = replay(sandboxed_run, episode)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "1/1 replayed episodes made their recorded calls" in proc.stdout
    [row] = read_jsonl(sandboxed_run / "replay.jsonl")
    assert row["episode_id"] == episode and row["divergence"] == ""
    assert row["calls_matched"] == row["calls_recorded"] == len(trees(sandboxed_run)[episode]) >= 1
    assert row["new_reward"] == row["old_reward"] == records[0]["reward"]  # the agent scores its replay as it scored the run


@pytest.mark.e2e
def test_three_turn_agent_replays_every_call(three_turn_run):
    proc = replay(three_turn_run, "--all")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = read_jsonl(three_turn_run / "replay.jsonl")
    assert [r["episode_id"] for r in rows] == [r["episode_id"] for r in read_jsonl(three_turn_run / "episodes.jsonl")]
    assert all(r["calls_matched"] == r["calls_recorded"] == 3 and r["divergence"] == "" for r in rows)
    assert all(r["old_reward"] == r["new_reward"] == 1.5 for r in rows)
    assert all(r["episode_id"] in proc.stdout for r in rows)  # the table


@pytest.mark.e2e
def test_reward_rescores_every_episode(sandboxed_run):
    proc = replay(sandboxed_run, "--all", "--reward", "tests/support/replay_agents.py:completion_length")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows, calls = read_jsonl(sandboxed_run / "replay.jsonl"), trees(sandboxed_run)
    assert len(rows) == 2
    for r in rows:
        assert r["new_reward"] == len(calls[r["episode_id"]][-1]["output_ids"])  # the last reply's length
        assert r["calls_matched"] == r["calls_recorded"]


@pytest.mark.e2e
def test_changed_prompt_token_names_the_call_and_token(three_turn_run, tmp_path):
    run_dir = tmp_path / "tampered"
    shutil.copytree(three_turn_run, run_dir)
    lines = read_jsonl(run_dir / "calls.jsonl")
    episode, tree = lines[0]["episode_id"], lines[0]["calls"]
    whole = recorded_calls(tree)[2].prompt_ids  # the follow-up turn: the last call, made after the two others
    own = tree[2]["prompt_ids"]
    was = own[1]
    own[1] = was + 1 if was + 1 < len(json.loads((run_dir / "vocab.json").read_text())) else was - 1
    (run_dir / "calls.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    vocab = json.loads((run_dir / "vocab.json").read_text())

    proc = replay(run_dir, episode)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-5000:]
    position = len(whole) - len(own) + 1
    expected = (
        f"call 2 ({tree[2]['id']}) differs at prompt token {position}: recorded {own[1]} {vocab[own[1]]!r}, replayed {was} {vocab[was]!r}"
    )
    assert expected in proc.stdout
    [row] = read_jsonl(run_dir / "replay.jsonl")
    assert row["calls_matched"] == 2 and row["calls_recorded"] == 3 and expected in row["divergence"]


@pytest.mark.e2e
def test_unrecorded_row_is_not_replayed(sandboxed_run, tmp_path):
    assert data_field({"question": "x" * DATA_RECORD_BYTES}) == {"data_recorded": False}  # over the bound
    assert data_field({"question": "2+2", "answer": "4"}) == {"data": {"question": "2+2", "answer": "4"}}
    run_dir = tmp_path / "unrecorded"
    shutil.copytree(sandboxed_run, run_dir)
    records = read_jsonl(run_dir / "episodes.jsonl")
    del records[0]["data"]
    records[0]["data_recorded"] = False
    (run_dir / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = replay(run_dir, records[0]["episode_id"])
    assert proc.returncode == 2 and "data_recorded is false" in proc.stderr, proc.stdout[-3000:] + proc.stderr[-5000:]
