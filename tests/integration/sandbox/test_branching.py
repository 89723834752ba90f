"""Branching a live sandboxed episode at a model call (sandbox/branch.py, areal/gateway/branching.py).

A real zygote runs tests/support/branch_agents.py (an OpenAI-SDK agent over the handed client)
against a real gateway (ZeroMQ door) whose engine is tests/support/scripted_engine.py: replies
come in request order, so which branch sampled what is known, never a model's choice. The branch
point is the agent's second call; branches run one after another (sandbox/branch.py says why).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import uuid

import pytest
from gateway_harness import scripted_gateway
from scripted_engine import ScriptedEngine
from world_tasks import CHECKS, make_task
from zygote_harness import zygote_env

from areal.controller.branches import expand, why_not
from areal.gateway.branching import BranchConfig
from areal.gateway.server import handle
from areal.protocol import EpisodeOutcome, GatewayRequest
from sandbox.isolation import SandboxConfig
from sandbox.zygote_client import Zygote

N = 3
SPEC = "branch_agents:BranchAgent"


@pytest.fixture(scope="module")
def served():
    yield from scripted_gateway()  # its engine replaced by a scripted one per test


def _episode(
    gw, case: str, replies: list[str], branch: BranchConfig, logprobs: list[float] | None = None, world: str = ""
) -> tuple[EpisodeOutcome, object, ScriptedEngine]:
    """One sandboxed episode of ``case``; its outcome, its (trunk) session, closed, and the engine
    (``logprobs``: each reply's tokens', as ScriptedEngine takes them; ``world``: its task directory)."""
    engine = ScriptedEngine(gw.tok, [(r, "<|im_end|>") for r in replies], logprobs)
    gw.call(lambda: (setattr(gw.gateway, "engine", engine), setattr(gw.gateway, "branching", branch)))
    log_dir = tempfile.mkdtemp(prefix="branch-")
    episode = f"ep-{uuid.uuid4().hex[:8]}"
    key = gw.open_session(episode)

    async def go() -> EpisodeOutcome:
        with zygote_env():
            zygote = await Zygote.start(SPEC, gw.zmq, SandboxConfig(warm_slots=0), log_dir)
        try:
            return await zygote.run_episode(episode, {"case": case, **({"world": world} if world else {})}, key, 120.0)
        finally:
            await zygote.close()

    try:
        outcome = gw.run(go(), timeout=300)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    return outcome, key, engine


def _report(gw, interactions) -> str:
    """The report the agent's third call carried (the last user message of its prompt)."""
    text = gw.tok.decode(interactions[-1].prompt_ids)
    return re.findall(r"report [^<]*", text)[-1]


@pytest.mark.parametrize("sdk", ["plain", "anthropic", "own", "sync", "mixed", "anthropic-own", "anthropic-sync"])
def test_an_episode_branched_at_its_second_call_runs_three_branches_from_one_state(served, sdk):
    gw = served
    replies = ["first 1"] + [r for i in range(N) for r in (f"choice {i + 5}", "done")]
    outcome, key, engine = _episode(gw, sdk, replies, BranchConfig(n=N, at_call=2))
    assert outcome.status == "ok", (outcome.error, outcome.log_tail)
    refused = gw.call(lambda: why_not(outcome, gw.gateway.sessions[key]))
    assert refused == "" and outcome.branch_point.startswith("call 2 of "), refused
    assert [b.episode_id for b in outcome.branches] == [f"{outcome.episode_id}/b{i}" for i in range(N)]
    assert [b.status for b in outcome.branches] == ["ok"] * N, outcome.branches[0].error
    assert [b.reward for b in outcome.branches] == [5.0, 6.0, 7.0]  # each its own sample's reward
    assert engine.replies == []  # 1 trunk call + 2 per branch: the branch point sampled once per branch

    # The retired trunk key: a 409, never a branch's session.
    retired = GatewayRequest(
        1,
        "POST",
        "/v1/chat/completions",
        {"authorization": f"Bearer {key}"},
        json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(),
    )
    reply = gw.run(handle(gw.gateway, retired))
    assert reply.status == 409, reply.body

    trunk = gw.call(lambda: gw.gateway.close_session(key))
    prefix = list(trunk.interactions.values())
    assert len(prefix) == 1
    branches = gw.call(lambda: expand(gw.gateway, outcome, trunk))
    assert [b.tag.index for b in branches] == list(range(N))
    assert all(b.tag.parent == trunk.episode_id and b.tag.call == 2 for b in branches)
    assert gw.call(lambda: [k for k, s in gw.gateway.sessions.items() if s.episode_id.startswith(trunk.episode_id)]) == []
    seen_points = set()
    for i, b in enumerate(branches):
        inters = list(b.session.interactions.values())
        assert len(inters) == 3  # the shared call, then its own two
        assert inters[0].prompt_ids == prefix[0].prompt_ids and inters[0].output_ids == prefix[0].output_ids
        own = gw.tok.decode(inters[1].output_ids, skip_special_tokens=True)
        assert own == f"choice {i + 5}"
        seen_points.add(tuple(inters[1].prompt_ids))
        assert inters[1].parent_id == inters[0].id  # the branch's call extends the shared prefix's tokens
        # Identical state at the branch point, and nothing of another branch after it: the counter
        # (memory), the notes file (its private temp dir), the other branches' files, their keys.
        assert _report(gw, inters) == f"report counter=3 notes=before 1;before 2;before 3; seen=['mine-choice-{i + 5}'] keys=0"
    assert len(seen_points) == 1  # every branch's branch-point call had the same prompt


def test_an_episode_branches_at_the_first_call_sampled_at_high_entropy(served):
    """The branch point found by the sample's entropy (rollout.branch.entropy): call 1 is sampled
    at 0.1 nats per token and served; call 2's sample, at 2.0, is discarded and the episode forked
    there, each branch sampling call 2 afresh."""
    gw = served
    replies = ["first 1", "discarded 9"] + [r for i in range(N) for r in (f"choice {i + 5}", "done")]
    logprobs = [-0.1, -2.0] + [-0.1] * (2 * N)
    outcome, key, engine = _episode(gw, "plain", replies, BranchConfig(n=N, entropy=1.0), logprobs)
    assert outcome.status == "ok", (outcome.error, outcome.log_tail)
    assert outcome.branch_point.startswith("call 2 of ") and [b.status for b in outcome.branches] == ["ok"] * N
    assert [b.reward for b in outcome.branches] == [5.0, 6.0, 7.0]  # each its own sample's, none the discarded one's
    assert engine.replies == [] and engine.prompts[1:2] * N == engine.prompts[2::2]  # call 2 sampled on one prompt, N + 1 times
    trunk = gw.call(lambda: gw.gateway.close_session(key))
    assert len(trunk.interactions) == 1  # the discarded sample is in no session
    branches = gw.call(lambda: expand(gw.gateway, outcome, trunk))
    assert [b.tag.entropy for b in branches] == [pytest.approx(2.0)] * N and branches[0].tag.record()["branch_entropy"] == 2.0
    for i, b in enumerate(branches):
        texts = [gw.tok.decode(x.output_ids, skip_special_tokens=True) for x in b.session.interactions.values()]
        assert texts == ["first 1", f"choice {i + 5}", "done"]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("child", "refused by the episode: the episode has child processes"),
        ("thread", "refused by the episode: the episode runs other threads"),
        ("sync-thread", "refused by the episode: the call was made from a thread other than the main one"),
        ("relay", "the call did not come through the client handed to a sandboxed agent"),  # urllib, to the loopback relay
    ],
)
def test_a_branch_point_the_episode_cannot_take_is_refused_with_its_reason(served, case, reason):
    gw = served
    outcome, key, engine = _episode(gw, case, ["first 1", "choice 5", "done"], BranchConfig(n=N, at_call=2))
    assert outcome.status == "ok", (outcome.error, outcome.log_tail)
    assert outcome.branches == [] and outcome.reward == 5.0  # the episode went on, unbranched
    assert engine.replies == []
    trunk = gw.call(lambda: gw.gateway.close_session(key))
    assert len(trunk.interactions) == 3
    assert why_not(outcome, trunk).startswith(reason), why_not(outcome, trunk)
    assert gw.call(lambda: expand(gw.gateway, outcome, trunk)) == []
    assert gw.call(lambda: [s for s in gw.gateway.sessions.values() if s.episode_id.startswith(trunk.episode_id)]) == []


def test_a_branch_can_neither_read_nor_stop_the_state_its_siblings_start_from(served):
    """One escape attempt per branch, after the branch point: read the supervisor's memory, kill
    it, leave a daemon for the next branch; and its processes count in the trunk's cgroup."""
    gw = served
    replies = ["first 1"] + [r for i in range(N) for r in (f"choice {i + 5}", "done")]
    outcome, key, _ = _episode(gw, "attack", replies, BranchConfig(n=N, at_call=2))
    assert [b.status for b in outcome.branches] == ["ok"] * N, outcome.branches[0].error if outcome.branches else outcome
    trunk = gw.call(lambda: gw.gateway.close_session(key))
    for i, b in enumerate(gw.call(lambda: expand(gw.gateway, outcome, trunk))):
        report = _report(gw, list(b.session.interactions.values()))
        assert report.endswith(
            f"seen=['mine-choice-{i + 5}'] keys=0 strays=0 supervisor-memory=denied(PermissionError) same-cgroup=True"
        ), report


def test_a_world_episode_branches_and_each_branch_is_graded_on_the_workspace_it_left(served, tmp_path):
    """Branch 0 fixes the bug, branch 1 rewrites the protected test and reads the decoy checks,
    branch 2 fixes it: each branch starts from the trunk's workspace, sees none of its siblings'
    files, and its grader sees only its own changes (its reward, its tripwires)."""
    gw = served
    replies = ["first 1", "choice 5 fix", "done", "choice 6 tamper", "done", "choice 7 fix", "done"]
    outcome, key, _ = _episode(gw, "world", replies, BranchConfig(n=N, at_call=2), world=make_task(str(tmp_path / "library")))
    assert outcome.status == "ok", (outcome.error, outcome.log_tail)
    assert outcome.branch_point.startswith("call 2 of ") and outcome.branch_refused == "", outcome.branch_refused
    assert outcome.reward is None and outcome.grader == "graded per branch (3)"
    assert [b.status for b in outcome.branches] == ["ok"] * N, outcome.branches[0].error
    assert [b.reward for b in outcome.branches] == [1.0, 0.0, 1.0], [b.grader for b in outcome.branches]
    assert [b.checks for b in outcome.branches][1] == dict.fromkeys(CHECKS, 0.0) | {"checks/test_hidden.py::test_commutes_on_equal": 1.0}
    assert [b.tripwires for b in outcome.branches] == [
        [],
        ["checks_read: /checks/test_checks.py", "protected_write: 'tests/test_calc.py' written"],
        [],
    ]
    trunk = gw.call(lambda: gw.gateway.close_session(key))
    for i, b in enumerate(gw.call(lambda: expand(gw.gateway, outcome, trunk))):
        report = _report(gw, list(b.session.interactions.values()))
        mine = replies[1 + 2 * i].replace(" ", "-")
        assert report.endswith(f"workspace=['mine-{mine}', 'trunk.txt']"), report


def test_a_world_episode_that_forges_a_request_on_its_branch_channel_is_rewarded_nothing(served, tmp_path):
    gw = served
    replies = ["first 1", "choice 5 fix", "done", "choice 6 fix", "done", "choice 7 fix", "done"]
    outcome, key, _ = _episode(gw, "world-forge", replies, BranchConfig(n=N, at_call=2), world=make_task(str(tmp_path / "library")))
    assert outcome.status == "ok", (outcome.error, outcome.log_tail)
    assert outcome.branches, outcome.branch_refused
    assert [b.reward for b in outcome.branches] == [0.0] * len(outcome.branches)
    assert all("out of order" in b.grader for b in outcome.branches), outcome.branches[0].grader
    gw.call(lambda: gw.gateway.close_session(key))
