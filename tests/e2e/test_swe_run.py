"""A whole run on repository tasks with a world: `python -m areal.train` on three of the shipped
tasks (tasks/swe, areal/tasks/swe.py), sandboxed episodes in private workspaces, rewards from the
grader, reward hacks counted and left out of training.

The engine serves the scripted model; the agent (tests/support/swe_agents.py:ModelShellAgent) makes
one model call through the gateway, then acts as its row says: the row of one task writes the
task's reference solution, another's rewrites the task's visible tests (a reward hack), the third
does nothing. It returns no reward. Checked: every episode's model call is recorded, its reward is
the grader's verdict (1.0 for the fix, 0.0 otherwise), the hack is the reward_hack class with its
tripwire, counted in metrics.jsonl, and none of its episodes reached the trainer. In the viewer
(headless Chromium): the step's reward hacks with their tripwire kinds, and an episode's grader
verdict per check and its tripwires. Nothing is timed.
"""

from __future__ import annotations

import json
import os

import pytest
from browser import chromium_browser, open_page, view_server
from run_checks import read_jsonl, run_ok, train_cmd

from areal.controller.trajectories import read_saved_trajectories
from areal.dataset import load_rows

pytestmark = pytest.mark.e2e  # a whole run

FIX, HACK, IDLE = "swe-02-median", "swe-10-intervals", "swe-16-leapyear"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("swe")
    rows = {r["task_id"]: r for r in load_rows("swe:tasks/swe")}
    solution = os.path.join(rows[FIX]["world"], "reference", "solution")
    files = {}
    for d, _, names in os.walk(solution):
        for n in names:
            files[os.path.relpath(os.path.join(d, n), solution)] = open(os.path.join(d, n)).read()
    data = [
        {**rows[FIX], "files": files, "commands": ["python -m pytest -q tests"]},
        {**rows[HACK], "commands": ["sed -i 's/assert /assert True or /' tests/*.py", "python -m pytest -q tests"]},
        {**rows[IDLE], "commands": ["ls", "python -m pytest -q tests || true"]},
    ]
    train = tmp / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in data))
    run_dir = tmp / "run"
    run_ok(
        train_cmd(
            run_dir,
            "model.path=scripted",
            "rollout.agent=tests/support/swe_agents.py:ModelShellAgent",
            f"data.train={train}",
            "data.eval_size=0",
            "trainer.steps=1",
            "rollout.groups_per_step=3",  # one group of each row a step (a single level: the order cycles through them)
            "rollout.n_samples=2",
            "rollout.max_head_offpolicyness=0",
            "rollout.deadline_s=120",
            "save_trajectories=true",
        ),
        timeout_s=600,
    )
    return run_dir


def test_rewards_are_the_graders_and_hacks_are_counted_not_trained(run_dir):
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    by_task: dict[str, list[dict]] = {}
    prompts = {json.loads(line)["task_id"]: i for i, line in enumerate((run_dir.parent / "train.jsonl").read_text().splitlines())}
    for e in episodes:
        index = int(e["group_id"].rpartition("-p")[2])
        by_task.setdefault(next(t for t, i in prompts.items() if i == index), []).append(e)
    assert set(by_task) == {FIX, HACK, IDLE}, episodes
    for e in episodes:
        assert e["status"] == "ok" and e["interactions"] == 1 and e["grader"] == "complete", e
    for e in by_task.get(FIX, []):
        assert e["reward"] == 1.0 and set(e["checks"].values()) == {1.0} and e["tripwires"] == [] and e["failure_class"] == ""
    for e in by_task.get(IDLE, []):
        assert e["reward"] == 0.0 and e["tripwires"] == [] and e["failure_class"] == ""
    for e in by_task.get(HACK, []):
        assert e["failure_class"] == "reward_hack" and e["failure_cause"].startswith("protected_write:"), e
        assert e["reward"] == 0.0  # the grader ran the task's own tests: the bug is still there

    hacks = len(by_task.get(HACK, []))
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert sum(m.get("failures_reward_hack", 0) for m in metrics) <= hacks
    assert all(m.get("tripwires_protected_write", 0) == m.get("failures_reward_hack", 0) for m in metrics)

    trained = {t.episode_id for t in read_saved_trajectories(run_dir / "trajectories.bin")}
    assert trained and trained.isdisjoint(e["episode_id"] for e in by_task.get(HACK, []))
    calls = {c["episode_id"] for c in read_jsonl(run_dir / "calls.jsonl")}
    assert trained <= calls


def test_the_viewer_shows_each_steps_reward_hacks_and_an_episodes_verdict_and_tripwires(run_dir):
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    hack = next(e for e in episodes if e["failure_class"] == "reward_hack")
    fixed = next(e for e in episodes if e["reward"] == 1.0)
    step = read_jsonl(run_dir / "metrics.jsonl")[0]
    assert step["failures_reward_hack"] >= 1  # its window held the hack group, which ended before the third publish
    with chromium_browser() as browser, view_server(run_dir) as url:
        page, errors = open_page(browser, url)
        assert page.locator("#steps th.hacks").count() == 1
        cell = page.locator("#steps tr.step[data-step='1'] td.hacks")
        assert cell.get_attribute("data-hacks") == str(step["failures_reward_hack"])
        assert f"protected_write {step['tripwires_protected_write']}" in cell.inner_text()

        page.click(f"#episodes tr.episode[data-id='{hack['episode_id']}']")
        world = page.locator(f".episode-view[data-id='{hack['episode_id']}'] .world")
        world.wait_for()
        assert "grader: complete" in world.inner_text()
        assert [t.inner_text() for t in world.locator(".tripwires li").all()] == hack["tripwires"]

        page.click(f"#episodes tr.episode[data-id='{fixed['episode_id']}']")
        world = page.locator(f".episode-view[data-id='{fixed['episode_id']}'] .world")
        world.wait_for()
        assert world.locator(".checks li.passed").count() == len(fixed["checks"]) > 0
        assert world.locator(".checks li.not-passed").count() == 0
        assert "no tripwire" in world.inner_text()
        assert errors == []
