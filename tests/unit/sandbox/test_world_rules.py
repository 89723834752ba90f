"""The rules of tasks with a world, in-process: the task format, what a workspace's upper layer says
was changed and what is discarded, how the grader's report becomes checks and a reward, how the
controller classifies and trains reward hacks, and the shipped task library as data rows. The real
mounts, graders and episodes are tests/integration/sandbox/test_world.py's."""

from __future__ import annotations

import dataclasses
import json
import os

import msgspec
import pytest
from world_tasks import CHECKS, make_task

from areal.agent.failures import REWARD_HACK, classify_outcome, trained
from areal.config import DataConfig, RolloutConfig
from areal.controller.metrics import step_row
from areal.controller.problems import check_worlds, user_rows
from areal.dataset import load_rows
from areal.protocol import EpisodeOutcome, Grade, TrainerReport
from sandbox import grader, world
from sandbox.rootfs import RootPlan


def test_a_task_directory_is_read_with_its_checks_named(tmp_path):
    task = world.load_task(make_task(str(tmp_path)))
    assert task.id == "calc-add" and task.protected == ("tests",) and task.tests == ("tests",) and task.reward == "all"
    assert task.checks == CHECKS
    classy = tmp_path / "calc-add" / "checks" / "test_more.py"
    classy.write_text("class TestX:\n    def test_a(self):\n        pass\n\n    def helper(self):\n        pass\n")
    assert "checks/test_more.py::TestX::test_a" in world.load_task(str(tmp_path / "calc-add")).checks


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"tests": ["tests"], "protected": []}, "not under a protected path"),
        ({"protected": ["/etc"]}, "relative paths"),
        ({"protected": ["../x"]}, "relative paths"),
        ({"reward": "most"}, "reward must be one of"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"prompt": ""}, "prompt"),
        ({"grader": "mine"}, "keys among"),
    ],
)
def test_a_bad_task_json_is_named(tmp_path, change, error):
    d = make_task(str(tmp_path))
    spec = json.loads(open(os.path.join(d, "task.json")).read())
    with open(os.path.join(d, "task.json"), "w") as f:
        json.dump({**spec, **change}, f)
    with pytest.raises(ValueError, match=error):
        world.load_task(d)


def test_a_task_without_checks_or_repo_is_refused(tmp_path):
    d = make_task(str(tmp_path))
    os.rename(os.path.join(d, "checks"), os.path.join(d, "gone"))
    with pytest.raises(ValueError, match="no checks/"):
        world.load_task(d)


def test_the_library_is_masked_where_an_exposed_path_holds_it(tmp_path):
    task = world.load_task(make_task(str(tmp_path / "pkg" / "library")))
    inside = RootPlan(binds=(str(tmp_path / "pkg"),), links=(), hide=())
    assert world.hidden_paths(task, inside) == (str(tmp_path / "pkg" / "library"),)
    assert world.hidden_paths(task, RootPlan(binds=("/usr",), links=(), hide=())) == ()
    with pytest.raises(ValueError, match="exposed to episodes as a whole"):
        world.hidden_paths(task, RootPlan(binds=(str(tmp_path / "pkg" / "library"),), links=(), hide=()))


def test_changes_to_protected_paths_and_runner_hooks_are_discarded_and_named(tmp_path):
    task = world.load_task(make_task(str(tmp_path)))
    changes = [
        ("calc/__init__.py", "written"),  # the fix: kept
        ("tests/test_calc.py", "written"),
        ("tests", "replaced"),
        ("pkg/conftest.py", "written"),
        ("sitecustomize.py", "written"),
        ("evil.pth", "written"),
        ("notes/setup.cfg", "deleted"),
    ]
    tripwires, restore = grader.changes_to_discard(task, changes)
    assert restore == ["evil.pth", "sitecustomize.py", "tests", "notes/setup.cfg", "pkg/conftest.py"]
    assert [t.split(":")[0] for t in tripwires].count("protected_write") == 2
    assert [t.split(":")[0] for t in tripwires].count("runner_replaced") == 4
    assert not any("calc/__init__.py" in t for t in tripwires)
    # a directory above a protected path, deleted: the protected path comes back
    one_file = dataclasses.replace(task, protected=("tests/test_calc.py",), tests=("tests/test_calc.py",))
    assert grader.changes_to_discard(one_file, [("tests", "deleted")])[1] == ["tests/test_calc.py"]


@pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts and trusted xattrs need root")
def test_an_upper_layer_is_read_as_written_deleted_and_replaced(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("x")  # inside a directory only passed through
    (tmp_path / "tests").mkdir()
    os.setxattr(tmp_path / "tests", "trusted.overlay.opaque", b"y")
    (tmp_path / "tests" / "new.py").write_text("x")
    os.mknod(tmp_path / "gone.txt", 0o600 | 0o020000, os.makedev(0, 0))  # a whiteout
    os.symlink("/etc", tmp_path / "link")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_text("x")
    found = sorted(grader.scan(str(tmp_path)))
    assert found == [
        ("gone.txt", "deleted"),
        ("link", "written"),
        ("pkg/mod.py", "written"),
        ("tests", "replaced"),
        ("tests/new.py", "written"),
    ]


def test_check_results_need_every_run_of_a_check_passed():
    task = world.Task("t", "/x", "p", ("tests",), ("tests",), (".",), 10.0, "all", ("checks/a.py::t1", "checks/a.py::t2", "tests/b.py::t3"))
    reports = [
        {"nodeid": "checks/a.py::t1[1]", "when": "call", "outcome": "passed"},
        {"nodeid": "checks/a.py::t1[2]", "when": "call", "outcome": "passed"},
        {"nodeid": "checks/a.py::t2", "when": "call", "outcome": "passed"},
        {"nodeid": "checks/a.py::t2", "when": "teardown", "outcome": "failed"},
        {"nodeid": "workspace/tests/b.py::t3", "when": "call", "outcome": "passed"},
    ]
    assert grader.check_results(task, reports) == {"checks/a.py::t1": 1.0, "checks/a.py::t2": 0.0, "tests/b.py::t3": 1.0}
    assert grader.check_results(task, []) == dict.fromkeys(task.checks, 0.0)
    assert world.task_reward(task, {"checks/a.py::t1": 1.0, "tests/b.py::t3": 1.0}) == 0.0
    assert world.task_reward(dataclasses.replace(task, reward="fraction"), {"checks/a.py::t1": 1.0, "tests/b.py::t3": 1.0}) == 2 / 3


def test_the_grade_replaces_what_the_episode_said_of_itself(tmp_path):
    res = world.WorldResources(world.load_task(make_task(str(tmp_path))), "", {})
    said = EpisodeOutcome("e", "ok", reward=0.9, rewards_by_id={"c": 1.0})
    grade = Grade("complete", dict.fromkeys(CHECKS, 1.0), ["protected_write: 'tests/test_calc.py' written"])
    out = world.apply_grade(said, grade, res, ["checks_read: /checks/test_checks.py"])
    assert (out.reward, out.rewards_by_id, out.grader) == (1.0, {}, "complete")
    assert out.tripwires == ["checks_read: /checks/test_checks.py", "protected_write: 'tests/test_calc.py' written"]
    failed = world.apply_grade(msgspec.structs.replace(said, status="error"), grade, res, [])
    assert failed.reward is None and failed.checks == dict.fromkeys(CHECKS, 1.0)


def test_a_tripwire_makes_a_reward_hack_trained_only_under_the_penalty():
    hack = EpisodeOutcome("e", "ok", reward=1.0, tripwires=["checks_listed: /checks"])
    classified = classify_outcome(hack, sampled=True)
    assert (classified.failure_class, classified.failure_cause) == (REWARD_HACK, "checks_listed: /checks")
    assert classify_outcome(hack, True, hack_tripwires=["checks_read"]).failure_class == ""  # not a kind that counts
    assert not trained(classified, "exclude") and trained(classified, "penalty")
    assert trained(classify_outcome(EpisodeOutcome("e", "ok"), True), "exclude")


def test_reward_hack_settings_are_checked():
    assert RolloutConfig().reward_hack == "exclude"
    with pytest.raises(ValueError, match="rollout.reward_hack must be"):
        RolloutConfig(reward_hack="ignore")
    with pytest.raises(ValueError, match="reward_hack_penalty"):
        RolloutConfig(reward_hack_penalty=-1e9)
    with pytest.raises(ValueError, match="unknown kind"):
        RolloutConfig(reward_hack_tripwires=["sniffing"])


def test_a_steps_row_counts_reward_hacks_and_each_kind_of_tripwire():
    outcomes = [
        EpisodeOutcome("a", "ok", failure_class=REWARD_HACK, tripwires=["protected_write: 'x'", "protected_write: 'y'"]),
        EpisodeOutcome("b", "ok", failure_class=REWARD_HACK, tripwires=["checks_read: /checks/t"]),
        EpisodeOutcome("c", "ok"),
    ]
    row = step_row(TrainerReport(step=1, version=1, consumed=3, metrics={}), outcomes, [])
    assert row["failures_reward_hack"] == 2
    assert (row["tripwires_protected_write"], row["tripwires_checks_read"]) == (1, 1)


def test_the_shipped_library_is_rows_naming_their_worlds():
    rows = load_rows("swe:tasks/swe")
    assert len(rows) >= 20 and len({r["task_id"] for r in rows}) == len(rows)
    for r in rows:
        task = world.load_task(r["world"])
        assert task.id == r["task_id"] and r["question"].endswith(task.prompt) and r["answer"] == ""
        assert os.path.isdir(task.reference_dir) and task.checks
    assert len(load_rows("swe:tasks/swe", size=3)) == 3
    # a run's held-out tasks: those after its training ones (data.eval_size of them, as many as are
    # left); with the defaults the training rows take every task and none is held out
    train, held_out = user_rows(DataConfig(train="swe:tasks/swe", train_size=20, eval_size=3), None, None)
    assert [r["task_id"] for r in train] == [r["task_id"] for r in rows[:20]]
    assert [r["task_id"] for r in held_out] == [r["task_id"] for r in rows[20:23]]
    assert [r["task_id"] for r in user_rows(DataConfig(train="swe:tasks/swe", train_size=22), None, None)[1]] == [
        r["task_id"] for r in rows[22:]
    ]
    assert user_rows(DataConfig(train="swe:tasks/swe"), None, None) == (rows, None)
    assert load_rows("swe:tasks/swe", offset=len(rows)) == [] and load_rows("swe:tasks/swe", size=2, offset=1) == rows[1:3]
    check_worlds(rows, None, "subproc")
    with pytest.raises(ValueError, match="rollout.openai.mode=subproc"):
        check_worlds(rows, None, "inline")
