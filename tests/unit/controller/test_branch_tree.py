"""A branch point's branches as one conversation tree (areal/controller/branches.py): the sessions
the gateway forked (areal/gateway/branching.py, through its real request path with a scripted
engine), expanded, merged so the shared prefix is one row, made a Trajectory, and credited
with the sibling baseline (areal/trainer/credit.py)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from scripted_engine import ScriptedEngine
from transformers import AutoTokenizer

from areal.controller.branches import expand, tree_session
from areal.controller.trajectories import trajectory_from_episode
from areal.embedded import ensure_embedded_model
from areal.gateway import Gateway, GatewayConfig
from areal.gateway.branching import BRANCHABLE, BranchConfig
from areal.gateway.server import handle
from areal.protocol import EpisodeOutcome, GatewayRequest
from areal.trainer.credit import branched_turn_advantages, fork_baselines, tree_depths, tree_returns


def _call(gw: Gateway, key: str, messages: list[dict]) -> dict:
    body = json.dumps({"messages": messages, "max_tokens": 8}).encode()
    req = GatewayRequest(1, "POST", "/v1/chat/completions", {"authorization": f"Bearer {key}", BRANCHABLE: "1"}, body)
    reply = asyncio.run(handle(gw, req))
    assert reply.status == 200, reply.body
    return json.loads(reply.body)


def test_three_branches_become_one_tree_with_the_prefix_once_and_sibling_credit():
    tok = AutoTokenizer.from_pretrained(ensure_embedded_model())
    replies = ["one"] + [r for i in range(3) for r in (f"b{i}", f"b{i} end")]
    gw = Gateway(ScriptedEngine(tok, [(r, "<|im_end|>") for r in replies]), tok, GatewayConfig())
    gw.branching = BranchConfig(n=3, at_call=2)
    trunk_key = gw.open_session("ep")
    first = [{"role": "user", "content": "hi"}]
    _call(gw, trunk_key, first)
    second = [*first, {"role": "assistant", "content": "one"}, {"role": "user", "content": "again"}]
    keys = _call(gw, trunk_key, second)["branch"]["keys"]
    for i, key in enumerate(keys):
        text = _call(gw, key, second)["choices"][0]["message"]["content"]
        _call(gw, key, [*second, {"role": "assistant", "content": text}, {"role": "user", "content": "end"}])
    rewards = [1.0, 0.0, 0.5]
    outcome = EpisodeOutcome("ep", "ok", branches=[EpisodeOutcome(f"ep/b{i}", "ok", reward=r) for i, r in enumerate(rewards)])
    trunk = gw.close_session(trunk_key)
    branches = expand(gw, outcome, trunk)
    assert not gw.sessions  # every branch session closed

    session, fork = tree_session(branches)
    assert fork == 0 and len(session.interactions) == 1 + 3 * 2  # the prefix once, then two calls per branch
    traj = trajectory_from_episode(EpisodeOutcome("ep", "ok"), session, "g", 1)
    parents = traj.array("row_parents").tolist()
    assert parents == [-1, 0, 1, 0, 3, 0, 5]
    assert traj.array("row_rewards").tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5]  # each branch's reward on its leaf
    assert (
        traj.rows()[0].input_ids.tolist()
        == list(trunk.interactions.values())[0].prompt_ids + list(trunk.interactions.values())[0].output_ids
    )

    returns = tree_returns(traj.array("row_rewards").astype(np.float64), parents, 1.0)
    assert returns[0] == pytest.approx(np.mean(rewards))  # the prefix is credited with the branches' mean
    base = fork_baselines(returns, parents, [fork])
    assert base[1] == pytest.approx((0.0 + 0.5) / 2) and base[2] == pytest.approx((0.0 + 0.5) / 2)  # its siblings, same depth
    adv = branched_turn_advantages([returns], [tree_depths(parents)], [parents], [[fork]], ["g"])[0]
    assert adv[0].item() == 0.0  # a group of one: the prefix has no baseline
    assert adv[1].item() > 0 > adv[3].item()  # the rewarded branch up, the unrewarded one down
