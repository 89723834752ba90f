"""Controller pieces: episodes -> trajectories, agent loading, result mapping, statistics."""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pytest
from run_checks import read_jsonl

from areal.agent.spec import load_agent, outcome_from_result
from areal.api.workflow_api import RolloutWorkflow
from areal.config import TrainConfig
from areal.controller.evaluation import paired_test, reward_trend
from areal.controller.loop import Controller, train
from areal.controller.trajectories import trajectory_from_episode, trajectory_from_row
from areal.dataclass_config import build_dataclass
from areal.experimental.openai import ArealOpenAI
from areal.gateway import Interaction, Session
from areal.gateway.tree import InteractionWithTokenLogpReward
from areal.protocol import EpisodeOutcome, decode_trajectory, encode_trajectory


def _session() -> Session:
    s = Session(key="k", episode_id="e")
    s.interactions["a"] = Interaction("a", [1, 2, 3], [7, 8], [-0.5, -0.25], 3, "stop", 0.0)
    s.interactions["b"] = Interaction("b", [1, 2, 3, 7, 8, 4], [9], [-1.0], 4, "stop", 0.0)
    return s


def test_float_reward_applies_to_every_row_and_tokens_are_exact():
    t = decode_trajectory(encode_trajectory(trajectory_from_episode(EpisodeOutcome("e", "ok", reward=1.0), _session(), "g", 3)))
    rows = t.rows()
    assert [r.reward for r in rows] == [1.0, 1.0]
    assert rows[0].input_ids.tolist() == [1, 2, 3, 7, 8]
    assert rows[0].loss_mask.tolist() == [0, 0, 0, 1, 1]
    assert rows[0].logprobs.tolist() == [0, 0, 0, -0.5, -0.25]
    assert rows[0].versions.tolist() == [-1, -1, -1, 3, 3]
    assert rows[1].input_ids.tolist() == [1, 2, 3, 7, 8, 4, 9]
    assert rows[1].versions.tolist()[-1] == 4
    assert (t.group_id, t.group_size, t.reward, t.status) == ("g", 3, 1.0, "ok")


def test_reward_dict_rewards_named_rows_only():
    o = EpisodeOutcome("e", "ok", rewards_by_id={"b": 2.0})
    t = trajectory_from_episode(o, _session(), "g", 1)
    assert t.array("row_rewards").tolist() == [0.0, 2.0]
    assert t.reward == 2.0


@pytest.mark.parametrize(
    "result, status, reward",
    [
        (1, "ok", 1.0),
        (0.5, "ok", 0.5),
        ({"x": 1}, "ok", None),
        (None, "ok", None),  # the reward comes from set_reward or the run's reward function
        (True, "error", None),
        (float("nan"), "error", None),
        ("1.0", "error", None),
        ({"x": "high"}, "error", None),
    ],
)
def test_run_results_map_to_outcomes(result, status, reward):
    o = outcome_from_result("e", result, 0.1)
    assert o.status == status and o.reward == reward
    if status == "error":
        assert "run() returned" in o.error


def test_agent_specs(tmp_path):
    f = tmp_path / "my_agent.py"
    f.write_text(
        "class A:\n    async def run(self, data, **kw):\n        return 1.0\nasync def fn(data, **kw):\n    return 2.0\ndef sync(data):\n    return 3\n"
    )
    assert load_agent(f"{f}:A").__name__ == "run"
    assert load_agent(f"{f}:fn").__name__ == "fn"
    with pytest.raises(ValueError, match="async"):
        load_agent(f"{f}:sync")
    with pytest.raises(ValueError, match="no attribute"):
        load_agent(f"{f}:missing")
    with pytest.raises(ValueError, match="does not exist"):
        load_agent("nowhere/agent.py:A")
    with pytest.raises(ValueError, match="TARGET:ATTR"):
        load_agent("just_a_module")
    assert load_agent("agents/openai_math.py:MathAgent").__qualname__ == "MathAgent.run"


def test_statistics():
    flat = reward_trend([0.3] * 20)
    assert flat["diff"] == 0 and flat["p_value"] > 0.5
    rising = reward_trend(list(np.linspace(0.1, 0.6, 40)))
    assert rising["diff"] > 0.3 and rising["p_value"] < 0.01
    assert math.isnan(reward_trend([0.5])["p_value"])
    before = [0.0, 0.25, 0.5, 0.25] * 50
    up = paired_test(before, [b + 0.25 for b in before])
    assert up["diff"] == pytest.approx(0.25) and up["p_value"] < 1e-3
    assert paired_test(before, [b - 0.25 for b in before])["p_value"] > 0.99
    noise = np.random.default_rng(1).choice([-0.25, 0.25], size=200)
    assert paired_test(before, list(np.add(before, noise)))["p_value"] > 0.01


def test_stratified_order_gives_every_step_the_same_level_mix() -> None:
    from areal.dataset import stratified_order

    levels = [1] * 30 + [2] * 35 + [3] * 25 + [4] * 10
    order = stratified_order(levels, block=8, seed=3)
    assert len(order) >= len(levels) and len(order) % 8 == 0  # whole steps
    mixes = {tuple(sorted(levels[i] for i in order[k : k + 8])) for k in range(0, 96, 8)}
    assert mixes == {(1, 1, 2, 2, 2, 3, 3, 4)}
    # The first pass over each level visits every problem of it once before repeating any.
    assert set(order[: 8 * 12]) >= {i for i, lv in enumerate(levels) if lv == 4}
    assert stratified_order(levels, 8, 3) == order != stratified_order(levels, 8, 4)


def test_agents_get_only_the_keyword_arguments_their_run_declares(tmp_path):
    f = tmp_path / "plain_agent.py"
    f.write_text(
        "class Plain:\n    async def run(self, data):\n        return float(data['x'])\n"
        "class Some:\n    async def run(self, data, *, api_key=None):\n        return {'k': float(api_key == 'key')}\n"
    )
    extra = {"base_url": "http://127.0.0.1:1/v1", "api_key": "key", "http_client": None}
    assert asyncio.run(load_agent(f"{f}:Plain")({"x": 3}, **extra)) == 3.0
    assert asyncio.run(load_agent(f"{f}:Some")({}, **extra)) == {"k": 1.0}


def test_rollout_workflow_rows_become_one_row_trajectories():
    inter = Interaction("a", [1, 2], [5, 6, 7], [-0.1, -0.2, -0.3], 2, "stop", 0.5)
    row = InteractionWithTokenLogpReward(
        interaction=inter,
        input_ids=[1, 2, 5, 6, 7],
        loss_mask=[0, 0, 1, 1, 1],
        logprobs=[0, 0, -0.1, -0.2, -0.3],
        versions=[-1, -1, 2, 2, 3],
        reward=0.5,
    )
    t = decode_trajectory(encode_trajectory(trajectory_from_row(row, "g-r0", "g", 4)))
    (r,) = t.rows()
    assert r.input_ids.tolist() == [1, 2, 5, 6, 7] and r.loss_mask.tolist() == [0, 0, 1, 1, 1]
    assert (t.group_size, t.reward, t.policy_version_start, t.policy_version_end) == (4, 0.5, 2, 3)


def test_subproc_mode_refuses_an_agent_object_it_cannot_import(tmp_path):
    class Local:  # defined in a function: the sandbox cannot rebuild it
        async def run(self, data, **kw):
            return 1.0

    cfg = build_dataclass(TrainConfig, {"rollout": {"openai": {"mode": "subproc"}}})
    with pytest.raises(ValueError, match="rollout.openai.mode=subproc needs an agent"):
        Controller(cfg, tmp_path, agent=Local())
    with pytest.raises(ValueError, match="dataset is empty"):
        Controller(cfg, tmp_path, dataset=[])


class EchoWorkflow(RolloutWorkflow):
    """Two ArealOpenAI clients per group, one call each; reward 1 for the first, 0.25 for the second."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.seen: list[dict] = []

    async def arun_episode(self, engine, data):
        self.seen.append(data)
        out = {}
        for reward in (1.0, 0.25):
            client = ArealOpenAI(engine=engine, tokenizer=self.tokenizer)
            await client.chat.completions.create(model="m", messages=data["messages"], max_tokens=8)
            client.set_final_reward(reward)
            out.update(client.export_interactions("individual"))
        return out


@pytest.mark.e2e
def test_rollout_workflow_object_with_a_custom_dataset_trains(tmp_path):
    """Real engine and trainer: a RolloutWorkflow object, custom train rows and held-out rows."""
    from areal.utils.hf_utils import load_hf_tokenizer

    workflow = EchoWorkflow(load_hf_tokenizer("embedded"))
    rows = [{"question": f"What is {a} plus {a}?", "answer": str(2 * a), "tag": a} for a in (2, 3, 4)]
    cfg = build_dataclass(
        TrainConfig,
        {
            "trainer": {"steps": 2},
            "rollout": {"groups_per_step": 1, "openai": {"mode": "inline"}},
            "data": {"eval_size": 0, "eval_samples": 1},
        },
    )
    summary = asyncio.run(train(cfg, tmp_path, agent=workflow, dataset=rows, eval_dataset=rows[:2]))
    assert summary["steps"] == 2 and summary["eval_before"]["n"] == 2 and summary["eval_after"]["n"] == 2
    assert {d["tag"] for d in workflow.seen} <= {2, 3, 4} and all(d["messages"][-1]["content"] == d["question"] for d in workflow.seen)
    episodes = read_jsonl(tmp_path / "episodes.jsonl")
    assert episodes and all(e["status"] == "ok" and e["interactions"] == 2 and e["reward"] == 0.625 for e in episodes)


def test_the_gateway_advertises_no_more_context_than_the_model_holds(tmp_path):
    from areal.controller.run_setup import gateway_config

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    gw = gateway_config(TrainConfig().gateway, tmp_path / "model", print)
    assert (gw.context_length, gw.max_tokens_cap, gw.default_max_tokens) == (512, 512, 256)
    (tmp_path / "model" / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    assert gateway_config(TrainConfig().gateway, tmp_path / "model", print) == TrainConfig().gateway  # a larger model: as configured
