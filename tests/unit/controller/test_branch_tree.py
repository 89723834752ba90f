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

from areal.agent.failures import classify_outcome, trained
from areal.config import compose
from areal.controller.branches import close_branches, expand, settle_tree, tree_of, tree_session
from areal.controller.dapo import branches_differ, has_signal
from areal.controller.episodes import episode_calls, episode_lines
from areal.controller.records import row_rewards
from areal.controller.trajectories import trajectory_from_episode
from areal.embedded import ensure_embedded_model
from areal.gateway import Gateway, GatewayConfig, Session
from areal.gateway.branching import BRANCHABLE, BranchConfig, never_branch, refusal
from areal.gateway.server import handle
from areal.protocol import EpisodeOutcome, GatewayRequest, decode_trajectory, encode_trajectory
from areal.trainer.credit import branched_turn_advantages, fork_baselines, tree_depths, tree_returns
from areal.view.data import RunView, call_tree_line
from areal.view.server import make_app


def _call(gw: Gateway, key: str, messages: list[dict], branchable: bool = True) -> dict:
    body = json.dumps({"messages": messages, "max_tokens": 8}).encode()
    headers = {"authorization": f"Bearer {key}", **({BRANCHABLE: "1"} if branchable else {})}
    reply = asyncio.run(handle(gw, GatewayRequest(1, "POST", "/v1/chat/completions", headers, body)))
    assert reply.status == 200, reply.body
    return json.loads(reply.body)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_embedded_model())


FIRST = [{"role": "user", "content": "hi"}]
SECOND = [*FIRST, {"role": "assistant", "content": "one"}, {"role": "user", "content": "again"}]


def _branched(tok, n: int, at_call: int = 2) -> tuple[Gateway, Session, list[str]]:
    """A gateway whose episode "ep" branched at ``at_call`` (1 or 2) into ``n`` branches of two
    calls each: the gateway, the trunk session (closed) and the branch keys (still open)."""
    replies = (["one"] if at_call == 2 else []) + [r for i in range(n) for r in (f"b{i}", f"b{i} end")]
    gw = Gateway(ScriptedEngine(tok, [(r, "<|im_end|>") for r in replies]), tok, GatewayConfig())
    gw.branching = BranchConfig(n=n, at_call=at_call)
    trunk_key = gw.open_session("ep")
    prompt = SECOND if at_call == 2 else FIRST
    if at_call == 2:
        _call(gw, trunk_key, FIRST)
    keys = _call(gw, trunk_key, prompt)["branch"]["keys"]
    for key in keys:
        text = _call(gw, key, prompt)["choices"][0]["message"]["content"]
        _call(gw, key, [*prompt, {"role": "assistant", "content": text}, {"role": "user", "content": "end"}])
    return gw, gw.close_session(trunk_key), keys


async def _settled(o: EpisodeOutcome, s: Session) -> EpisodeOutcome:
    return classify_outcome(o, bool(s.interactions))


def _settle(gw: Gateway, outcome: EpisodeOutcome, trunk: Session) -> tuple[EpisodeOutcome, Session]:
    return asyncio.run(settle_tree(gw, outcome, trunk, _settled, lambda o: trained(o, "exclude")))


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


def test_a_branched_episode_settles_to_one_tree_trained_once_and_logged_per_branch(tok):
    gw, trunk, keys = _branched(tok, 3)
    branches = [
        EpisodeOutcome("ep/b0", "ok", reward=1.0),
        EpisodeOutcome("ep/b1", "error", error="boom"),  # an agent failure: logged, not trained
        EpisodeOutcome("ep/b2", "ok", reward=0.5),
    ]
    outcome, session = _settle(gw, EpisodeOutcome("ep", "ok", branches=branches, branch_point="call 2 of ep"), trunk)
    assert not gw.sessions and not gw.expired  # every branch session closed
    assert (outcome.episode_id, outcome.status, outcome.failure_class) == ("ep", "ok", "")
    assert outcome.reward == pytest.approx(0.75)  # the mean of the trained branches' rewards, not their sum
    tree = tree_of(session)
    assert tree is not None and tree.fork == 0 and len(tree.branches) == 3 and len(tree.own) == 2
    assert [b.outcome.status for b in tree.branches] == ["ok", "error", "ok"]
    assert len(session.interactions) == 1 + 2 * 2  # the prefix once, the trained branches' own calls

    traj = decode_trajectory(encode_trajectory(trajectory_from_episode(outcome, session, "g", 1)))
    assert traj.array("row_forks").tolist() == [0]
    assert traj.array("row_parents").tolist() == [-1, 0, 1, 0, 3]
    assert traj.array("row_rewards").tolist() == [0.0, 0.0, 1.0, 0.0, 0.5]  # each branch's reward on its leaf
    assert traj.reward == pytest.approx(0.75)

    lines = episode_lines(outcome, session, "g", {"question": "q"})
    assert [r["episode_id"] for r, _, _ in lines] == ["ep/b0", "ep/b1", "ep/b2"]
    assert [(r["branch_of"], r["branch_call"], r["branch_index"], r["shared_interactions"]) for r, _, _ in lines] == [
        ("ep", 2, i, 1) for i in range(3)
    ]
    assert [r["status"] for r, _, _ in lines] == ["ok", "error", "ok"]
    assert all(len(inters) == 3 and r["interactions"] == 3 for r, _, inters in lines)  # a branch's line: its own session
    assert episode_calls(session)[0] == 1 + 3 * 2  # each call once: the prefix is not counted per branch


def test_branches_at_the_first_call_are_roots_and_a_tree_with_no_trained_branch_is_not_trained(tok):
    gw, trunk, _ = _branched(tok, 2, at_call=1)
    branches = [EpisodeOutcome(f"ep/b{i}", "ok", reward=float(i)) for i in range(2)]
    outcome, session = _settle(gw, EpisodeOutcome("ep", "ok", branches=branches), trunk)
    traj = trajectory_from_episode(outcome, session, "g", 1)
    assert traj.array("row_forks").tolist() == [-1] and traj.array("row_parents").tolist() == [-1, 0, -1, 2]
    assert outcome.reward == traj.reward == 0.5
    assert episode_calls(session)[0] == 4

    gw, trunk, _ = _branched(tok, 2, at_call=1)
    failed = [EpisodeOutcome(f"ep/b{i}", "crashed", error="killed") for i in range(2)]
    outcome, session = _settle(gw, EpisodeOutcome("ep", "ok", branches=failed), trunk)
    assert not gw.sessions
    assert (outcome.status, outcome.failure_class) == ("crashed", "infrastructure") and not trained(outcome, "exclude")
    assert len(episode_lines(outcome, session, "g")) == 2


def test_a_refused_branch_point_is_recorded_and_the_episode_settles_unbranched(tok):
    gw = Gateway(ScriptedEngine(tok, [("one", "<|im_end|>")]), tok, GatewayConfig())
    gw.branching = BranchConfig(n=2, at_call=1)
    key = gw.open_session("ep")
    assert "choices" in _call(gw, key, FIRST, branchable=False)  # the loopback relay, the HTTP door: served
    outcome, session = _settle(gw, EpisodeOutcome("ep", "ok", reward=1.0), gw.close_session(key))
    assert tree_of(session) is None and "did not come through the client handed" in outcome.branch_refused
    ((record, _, inters),) = episode_lines(outcome, session, "g")
    assert record["branch_refused"] == outcome.branch_refused and len(inters) == 1 and "branch_of" not in record
    traj = trajectory_from_episode(outcome, session, "g", 1)
    assert len(traj.row_forks) == 0 and traj.reward == 1.0

    outcome, session = _settle(gw, EpisodeOutcome("ep2", "ok", reward=1.0), Session(key="", episode_id="ep2"))
    assert "branch_refused" not in episode_lines(outcome, session, "g")[0][0]  # no branch point reached: no key


def test_never_branch_and_close_branches(tok):
    gw = Gateway(ScriptedEngine(tok, [("one", "<|im_end|>")]), tok, GatewayConfig())
    gw.branching = BranchConfig(n=2, at_call=1)
    key = gw.open_session("eval")
    never_branch(gw.sessions[key], "a held-out evaluation episode is never branched")
    assert "choices" in _call(gw, key, FIRST)  # a branchable call at the branch point, served as usual
    assert refusal(gw.close_session(key)) == "a held-out evaluation episode is never branched"

    gw, trunk, keys = _branched(tok, 2)
    assert set(keys) <= set(gw.sessions)
    close_branches(gw, trunk)  # an episode cancelled or failed before it was settled
    assert not gw.sessions


def test_rollout_branch_is_the_runs_setting():
    config = compose(overrides=["rollout.branch.n=2", "rollout.branch.at_call=1"])
    assert config.rollout.branch == BranchConfig(n=2, at_call=1) and config.rollout.branch.enabled
    assert not compose().rollout.branch.enabled  # off by default
    assert compose(overrides=["rollout.branch.n=2", "rollout.branch.entropy=0.8"]).rollout.branch == BranchConfig(n=2, entropy=0.8)
    for overrides, error in [
        (["rollout.branch.n=17", "rollout.branch.at_call=1"], "rollout.branch.n must be 0"),
        (["rollout.branch.n=2"], "no branch point is: set rollout.branch.at_call"),
        (["rollout.branch.n=2", "rollout.branch.at_call=1", "rollout.openai.mode=inline"], "needs rollout.openai.mode=subproc"),
        (["rollout.branch.n=2", "rollout.branch.at_call=1", "rollout.openai.mode=online"], "needs rollout.openai.mode=subproc"),
        (
            ["rollout.branch.n=2", "rollout.branch.at_call=1", "cluster.kind=ray", "cluster.rollout_workers=1"],
            "needs cluster.gateway=controller",
        ),
    ]:
        with pytest.raises(ValueError, match=error):
            compose(overrides=overrides)


def test_the_viewer_shows_each_branch_with_its_shared_prefix_and_its_siblings(tok, tmp_path):
    gw, trunk, _ = _branched(tok, 2)
    branches = [EpisodeOutcome(f"ep/b{i}", "ok", reward=float(i)) for i in range(2)]
    outcome, session = _settle(gw, EpisodeOutcome("ep", "ok", branches=branches), trunk)
    lines = episode_lines(outcome, session, "g")
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r, _, _ in lines))
    (tmp_path / "calls.jsonl").write_text("".join(call_tree_line(r["episode_id"], i, row_rewards(o, i)) for r, o, i in lines))
    view = RunView(tmp_path)
    assert [e["branch"] for e in view.episodes()] == [{"of": "ep", "index": i, "call": 2, "entropy": None} for i in range(2)]
    ep = view.episode("ep/b1")
    assert ep["branch"] == {"of": "ep", "call": 2, "index": 1, "entropy": None, "siblings": ["ep/b0"]}
    assert [bool(n.get("shared")) for n in ep["nodes"]] == [True, False, False]  # the call before the branch point
    assert [n.get("branch_point", {}).get("index") for n in ep["nodes"]] == [None, 1, None]
    assert view.episode("ep/b0")["branch"]["siblings"] == ["ep/b1"]

    async def served(path: str) -> tuple[int, dict]:  # the page asks for /api/episode/ep/b1: the id holds "/"
        from aiohttp.test_utils import TestClient, TestServer

        async with TestClient(TestServer(make_app(view))) as client:
            r = await client.get(path)
            return r.status, await r.json()

    status, body = asyncio.run(served("/api/episode/ep/b1"))
    assert status == 200 and body["record"]["episode_id"] == "ep/b1" and body["branch"]["siblings"] == ["ep/b0"]
    assert asyncio.run(served("/api/compare/ep/b0"))[0] == 200


def test_dynamic_sampling_keeps_a_group_whose_only_signal_is_between_sibling_branches(tok):
    trajectories = []
    for rewards in ([1.0, 0.0], [1.0, 0.0], [1.0, 1.0]):
        gw, trunk, _ = _branched(tok, 2)
        branches = [EpisodeOutcome(f"ep/b{i}", "ok", reward=r) for i, r in enumerate(rewards)]
        trajectories.append(trajectory_from_episode(*_settle(gw, EpisodeOutcome("ep", "ok", branches=branches), trunk), "g", 2))
    assert [branches_differ(t) for t in trajectories] == [True, True, False]
    assert has_signal(trajectories[:2])  # equal samples, but each one's branches differ
    assert not has_signal([trajectories[2], trajectories[2]])
