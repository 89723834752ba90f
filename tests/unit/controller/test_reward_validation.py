"""Rewards that lie: each is its own episode's error, named; the run, the trainer and the logs hold.

An agent's ``run()`` returns a float or a {completion_id: reward} dict. A reward that is not a
finite number, lies outside ``rollout.reward_range``, is of a wrong type, or names a completion
that is not the episode's own makes THAT episode an error whose message names the bad entries
(id and value); it is not trained on, and healthy episodes and groups go on. Every JSONL file
the run writes is strict JSON (a NaN metric is null). The trainer's advantages do not overflow
on large rewards the range allows.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from run_checks import run_ok, train_cmd

from areal.agent.spec import check_episode_rewards, outcome_from_result
from areal.config import RolloutConfig, TrainConfig
from areal.controller.loop import Controller
from areal.dataclass_config import build_dataclass
from areal.gateway import Interaction, Session, tree
from areal.jsonl import json_line
from areal.protocol import EpisodeOutcome, TokenRow, TrainerReport, Trajectory
from areal.trainer.step import compute_advantages

RANGE = [-1e4, 1e4]
OWN = {"c1": None, "c2": None}  # the episode's completion ids -> reward set with set_reward
NAN, INF = float("nan"), float("inf")


def _strict(line: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"not strict JSON: bare {name} in {line[:200]!r}")

    return json.loads(line, parse_constant=refuse)


def _mapped(result: object, recorded: dict | None = None) -> EpisodeOutcome:
    """What the controller keeps of run()'s return value: mapped, then checked against the episode."""
    return check_episode_rewards(outcome_from_result("e1", result, 0.5), OWN if recorded is None else recorded, RANGE)


@pytest.mark.parametrize(
    "result, named",
    [
        ({"not-an-id": 1.0}, ["'not-an-id' -> 1.0", "not a completion id of this episode"]),
        ({"not-an-id": 1e308, "other": NAN}, ["'other' -> nan (not finite)"]),  # the reported case: the NaN fails it first
        ({"not-an-id": 1e308, "c1": 1.0}, ["'not-an-id' -> 1e+308 (not a completion id of this episode; outside [-10000, 10000])"]),
        ({"c1": NAN}, ["'c1' -> nan (not finite)"]),
        ({"c1": INF}, ["'c1' -> inf (not finite)"]),
        ({"c1": -INF}, ["'c1' -> -inf (not finite)"]),
        ({"c1": 1e300}, ["'c1' -> 1e+300 (outside [-10000, 10000])"]),
        ({"c1": 0.5, "c2": -20000}, ["'c2' -> -20000.0 (outside [-10000, 10000])"]),
        ({"c1": True}, ["'c1' -> True", "bool"]),
        ({"c1": "1.0"}, ["'c1' -> '1.0'", "str"]),
        ({"c1": None}, ["'c1' -> None", "NoneType"]),
        ({"c1": [1.0]}, ["'c1' -> [1.0]", "list"]),
        ({"c1": {"c2": 1.0}}, ["'c1' -> {'c2': 1.0}", "dict"]),
        ({1: 1.0}, ["1 -> 1.0", "key of type int"]),
        ({("c1",): 1.0}, ["('c1',) -> 1.0", "key of type tuple"]),
        (NAN, ["nan", "not finite"]),
        (INF, ["inf", "not finite"]),
        (-INF, ["-inf", "not finite"]),
        (1e300, ["1e+300", "outside [-10000, 10000]"]),
        pytest.param(10**400, ["outside"], id="int-10**400"),  # no float holds it (an exec agent's JSON may carry one)
        (True, ["True", "bool"]),
        ("1.0", ["'1.0'", "str"]),
        ([1.0], ["[1.0]", "list"]),
    ],
)
def test_a_lying_reward_is_its_episodes_error_naming_the_entry(result, named):
    o = _mapped(result)
    assert (o.status, o.reward, o.rewards_by_id, o.episode_id, o.wall_s) == ("error", None, {}, "e1", 0.5)
    for text in named:
        assert text in o.error, o.error


@pytest.mark.parametrize("result", [0.5, -1e4, 1e4, 7, {"c1": 1.0}, {"c1": 0.25, "c2": -3}, {}])
def test_honest_rewards_pass_unchanged(result):
    o = _mapped(result)
    assert o.status == "ok" and o.error == ""
    assert o == outcome_from_result("e1", result, 0.5)


def test_rewards_set_with_set_reward_are_checked_too():
    o = _mapped({"c1": 1.0}, recorded={"c1": None, "c2": 1e9})
    assert o.status == "error" and "'c2' -> 1000000000.0 set with set_reward" in o.error


def test_a_forged_outcome_is_checked_as_strictly_as_a_mapped_one():
    """A sandboxed episode sends its own EpisodeOutcome: the controller's check cannot trust it."""
    forged = EpisodeOutcome("e1", "ok", reward=NAN)
    assert "not finite" in check_episode_rewards(forged, OWN, RANGE).error
    forged = EpisodeOutcome("e1", "ok", rewards_by_id={"someone-else": 1.0})
    assert "'someone-else' -> 1.0 (not a completion id" in check_episode_rewards(forged, OWN, RANGE).error
    failed = EpisodeOutcome("e1", "timeout", error="deadline")
    assert check_episode_rewards(failed, OWN, RANGE) is failed  # already failed: its own reason stays


def test_many_bad_entries_are_counted_and_long_ones_cut():
    o = _mapped({"k" * 10_000: NAN} | {f"x{i}": NAN for i in range(40)})
    assert o.status == "error" and "'kkkk" in o.error and "(10002 chars) -> nan" in o.error
    assert "'x3' -> nan" in o.error and "'x4' -> nan" not in o.error and "and 36 more" in o.error and len(o.error) < 1000


def test_reward_range_is_a_validated_config_field():
    assert RolloutConfig().reward_range == [-1e4, 1e4]
    cfg = build_dataclass(TrainConfig, {"rollout": {"reward_range": [-1, 2]}})
    assert cfg.rollout.reward_range == [-1.0, 2.0]
    assert check_episode_rewards(EpisodeOutcome("e", "ok", reward=3.0), {}, cfg.rollout.reward_range).status == "error"
    for bad in ([1, 0], [0, 0], [NAN, 1], [0, INF], [0], [0, 1, 2], ["a", 1], [True, 2], [0, 1e39], 5):
        with pytest.raises(ValueError, match=r"rollout\.reward_range"):
            RolloutConfig(reward_range=bad)


def test_the_tree_refuses_non_finite_rewards():
    inters = {"a": Interaction("a", [1], [2], [-0.1], 0, "stop", 0.0)}
    for bad in (NAN, INF, -INF, 10**400):
        with pytest.raises(ValueError, match="finite"):
            tree.set_reward(inters, "a", bad)
    with pytest.raises(TypeError, match="str"):
        tree.set_final_reward(inters, "1.0")
    assert inters["a"].reward is None


def test_json_line_is_strict_json_with_null_for_non_finite_floats():
    line = json_line({"loss": NAN, "nested": {"x": [1.5, INF, (-INF, 2)]}, "n": 3, "s": "NaN"})
    assert line.endswith("\n") and line.count("\n") == 1
    assert _strict(line) == {"loss": None, "nested": {"x": [1.5, None, [None, 2]]}, "n": 3, "s": "NaN"}


def test_the_controllers_jsonl_writers_write_strict_json(tmp_path):
    """The writers themselves, fed NaN: metrics.jsonl and episodes.jsonl stay parseable as strict JSON."""
    c = Controller(TrainConfig(), tmp_path)
    s = Session(key="k", episode_id="e")
    s.interactions["a"] = Interaction("a", [1, 2], [3], [-0.5], 0, "stop", 0.0, reward=1.0)
    c._log_episode(EpisodeOutcome("e", "ok", reward=NAN, wall_s=INF), s, "g")
    c._log_episode(EpisodeOutcome("e2", "ok", rewards_by_id={"a": NAN}), s, "g")
    c.window.append(EpisodeOutcome("e", "ok"))
    c._record_step(TrainerReport(step=1, version=1, consumed=2, metrics={"loss": NAN, "reward_mean": 0.5, "grad_norm": INF}))
    c.records.close(finished=True)
    episodes = [_strict(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert [(e["episode_id"], e["reward"], e["wall_s"]) for e in episodes] == [("e", None, None), ("e2", None, 0.0)]
    (metrics,) = [_strict(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert (metrics["loss"], metrics["reward_mean"], metrics["grad_norm"], metrics["episodes_ok"]) == (None, 0.5, None, 1)


def _traj(episode_id: str, group_id: str, rewards: list[float], episode_reward: float) -> Trajectory:
    rows = [
        TokenRow(
            input_ids=np.array([1, 2, 3], np.int32),
            loss_mask=np.array([0, 1, 1], np.uint8),
            logprobs=np.array([0, -0.5, -0.5], np.float32),
            versions=np.array([-1, 0, 0], np.int32),
            reward=r,
        )
        for r in rewards
    ]
    return Trajectory.from_rows(episode_id=episode_id, group_id=group_id, group_size=2, reward=episode_reward, status="ok", rows=rows)


@pytest.mark.parametrize("big", [1e4, 1e20, 3e38])
def test_advantages_do_not_overflow_on_large_rewards(big):
    """A group's variance squares its rewards: in float32 that overflows from ~1.8e19 on."""
    float_rewards = [_traj("a", "g", [big, big], big), _traj("b", "g", [-big], -big)]
    own_rewards = [_traj("c", "h", [big, 0.0], big), _traj("d", "h", [0.0, 0.0], 0.0)]  # per-row rewards: turn returns
    adv = compute_advantages(float_rewards + own_rewards, turn_discount=1.0, eps=1e-6)
    assert all(a.dtype == torch.float32 for a in adv)
    assert adv[0].tolist() == pytest.approx([1.0, 1.0]) and adv[1].tolist() == pytest.approx([-1.0])
    assert all(bool(a.isfinite().all()) for a in adv)
    assert adv[2][0] > 0 and adv[3][0] < 0


def test_a_non_finite_reward_reaching_the_trainer_names_its_episode():
    with pytest.raises(ValueError, match="episode bad .*group g.*non-finite"):
        compute_advantages([_traj("ok", "g", [1.0], 1.0), _traj("bad", "g", [1.0], NAN)], turn_discount=1.0, eps=1e-6)


LYING_AGENT = '''
import itertools
import json

from openai import AsyncOpenAI

CALLS = itertools.count()
LOG = {log!r}
LIES = [
    lambda own: {{"not-an-id": 1.0}},  # a completion that is not this episode's
    lambda own: {{own: float("nan")}},  # its own completion, NaN (this killed the run)
    lambda own: {{own: 1e300}},  # finite, far outside rollout.reward_range (this killed the trainer)
    lambda own: {{"not-an-id": float("nan")}},  # the reported case (was recorded as ok)
]


class LyingAgent:
    """Every even call lies, each kind in turn; odd calls return an honest float."""

    async def run(self, data, base_url, api_key, http_client):
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        out = await client.chat.completions.create(model="default", max_tokens=4,
                                                   messages=[{{"role": "user", "content": data["question"]}}])
        n = next(CALLS)
        lie = None if n % 2 else (n // 2) % len(LIES)
        with open(LOG, "a") as f:
            f.write(json.dumps({{"n": n, "id": out.id, "lie": lie}}) + "\\n")
        return 0.5 * (n % 4) if lie is None else LIES[lie](out.id)
'''

# What the episode's error must say for each kind of lie: the entry's id and value, and why.
NAMED = {
    0: r"'(not-an-id)' -> 1\.0 \(not a completion id of this episode\)",
    1: r"'(chatcmpl-\w+)' -> nan \(not finite\)",
    2: r"'(chatcmpl-\w+)' -> 1e\+300 \(outside \[-10000, 10000\]\)",
    3: r"'(not-an-id)' -> nan \(not finite\)",
}


@pytest.mark.e2e
def test_a_run_with_lying_episodes_goes_on_and_logs_strict_json(tmp_path):
    """Real `python -m areal.train` (inline agents, embedded engine, trainer): the lying episodes
    are errors naming their entries, the honest ones ok and trained on, the run exits 0."""
    calls = tmp_path / "calls.jsonl"
    agent = tmp_path / "lying_agent.py"
    agent.write_text(LYING_AGENT.format(log=str(calls)))
    run_dir = tmp_path / "run"
    cmd = train_cmd(
        run_dir,
        f"rollout.agent={agent}:LyingAgent",
        "rollout.openai.mode=inline",
        "trainer.steps=1",
        "rollout.groups_per_step=2",
        "rollout.n_samples=4",
        "rollout.max_head_offpolicyness=0",
        "data.eval_size=0",
    )
    run_ok(cmd, timeout_s=600)

    made = [_strict(line) for line in calls.read_text().splitlines()]
    assert {c["lie"] for c in made} == {None, 0, 1, 2, 3}, made  # every kind of lie was told
    episodes = [_strict(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == len(made)  # every call's episode was logged (no group was cancelled)
    honest, told = set(), []
    for e in episodes:
        if e["status"] == "ok":
            honest.add(e["episode_id"])
            assert e["error"] == "" and e["reward"] in (0.5, 1.5), e
            continue
        assert e["status"] == "error" and e["reward"] == 0, e
        ((kind, named),) = [(k, m[1]) for k, pattern in NAMED.items() if (m := re.search(pattern, e["error"]))]
        if kind in (1, 2):  # the entry named is its own completion, the one its agent lied about
            assert [c["lie"] for c in made if c["id"] == named] == [kind], (e, made)
        told.append(kind)
    assert sorted(told) == sorted(c["lie"] for c in made if c["lie"] is not None)
    assert len(honest) == sum(c["lie"] is None for c in made)

    trained = [_strict(line) for line in (run_dir / "trained_episodes-r0.jsonl").read_text().splitlines()]
    assert trained and {ep for t in trained for ep in t["episodes"]} <= honest
    for name in ("metrics.jsonl", "trainer_metrics.jsonl"):
        rows = [_strict(line) for line in (run_dir / name).read_text().splitlines()]
        assert [r["step"] for r in rows] == [1] and math.isfinite(rows[0]["loss"])


def test_none_leaves_the_reward_to_the_gateway_or_the_reward_function():
    """``run()`` returning None is no reward of its own: the controller then takes the rewards set
    through the gateway, else the run's ``reward`` function, else makes it the episode's error
    (tests/e2e/test_user_data.py runs the last two)."""
    o = _mapped(None)
    assert (o.status, o.reward, o.rewards_by_id) == ("ok", None, {})
