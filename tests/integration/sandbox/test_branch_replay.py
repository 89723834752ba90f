"""Branching by replay (``rollout.branch.replay``, areal/gateway/branching.py and
``Episodes._replay_branches``) where the episode cannot fork: an ``exec:`` agent in another
language (tests/support/node_agent/agent.mjs, the official `openai` npm client, a tool call then
an answer, both streamed), sandboxed, through a real gateway and the controller's ``Episodes``,
with a scripted engine. The trunk goes on as branch 0; each other branch is the same agent run
anew on the row, its first call answered from the trunk's record, its second sampled for it. An
agent that does not repeat its calls (a number from os.urandom in its prompt) gets its branches
stopped, the divergence named, and none of them trained."""

from __future__ import annotations

import re
import shutil
import tempfile
import uuid

import pytest
from gateway_harness import scripted_gateway
from paths import SUPPORT
from scripted_engine import ScriptedEngine
from world_tasks import make_task
from zygote_harness import zygote_env

from areal.agent.failures import trained
from areal.config import RolloutConfig
from areal.controller.branches import own_interactions, tree_of
from areal.controller.episodes import Episodes
from areal.gateway.branching import BranchConfig
from sandbox.isolation import SandboxConfig
from sandbox.zygote_client import Zygote

NODE = "exec:tests/support/node_agent/agent.mjs"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'


@pytest.fixture(scope="module")
def served():
    yield from scripted_gateway()  # its engine replaced by a scripted one per test


class _ByCall(ScriptedEngine):
    """Replies by what the call is (branch_agents.BranchAgent's three): its first, a choice for
    each call after "next" in the order they come, "done" to its report; so that branches run
    at once get their choices whatever the order of their calls."""

    def __init__(self, tok, first: str, choices: list[str]) -> None:
        super().__init__(tok, [])
        self.first, self.choices = first, list(choices)

    def _next(self, input_ids, params):
        text = self.tok.decode(input_ids)
        reply = "done" if "report" in text else self.choices.pop(0) if "next" in text else self.first
        self.replies.append((reply, "<|im_end|>"))
        return super()._next(input_ids, params)


def _branched(gw, agent: str, replies: list[str] | ScriptedEngine, branch: BranchConfig, row: dict):
    """One episode of ``agent`` run and settled by the controller's Episodes: (its outcome, the
    settled outcome, the tree session, the engine)."""
    engine = replies if isinstance(replies, ScriptedEngine) else ScriptedEngine(gw.tok, [(r, "<|im_end|>") for r in replies])
    gw.call(lambda: (setattr(gw.gateway, "engine", engine), setattr(gw.gateway, "branching", branch)))
    log_dir = tempfile.mkdtemp(prefix="replay-branch-")

    async def go():
        with zygote_env():
            zygote = await Zygote.start(agent, gw.zmq, SandboxConfig(), log_dir)
        episodes = Episodes(zygote, gw.gateway, RolloutConfig(), None, "", gw.tok, print, pytest.fail, zygote=zygote)
        try:
            outcome, trunk = await episodes.run(f"ep-{uuid.uuid4().hex[:8]}", row)
            settled, session = await episodes.settle_episode(outcome, trunk, row)
            return outcome, settled, session
        finally:
            await zygote.close()

    try:
        return (*gw.run(go(), timeout=300), engine)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def test_an_exec_agent_in_node_is_branched_by_replay_at_its_tool_result(served):
    gw = served
    if shutil.which("node") is None or not (SUPPORT / "node_agent" / "node_modules" / "openai").is_dir():
        pytest.fail("needs node and tests/support/node_agent/node_modules (make test runs npm ci there)")
    replies = [CALL, "\\boxed{42}", "\\boxed{41}", "\\boxed{42}"]  # the trunk's two calls, then one per other branch
    row = {"question": "What is 6*7?", "answer": "42"}
    outcome, settled, session, engine = _branched(gw, NODE, replies, BranchConfig(n=3, at_tool_result=True, replay=True), row)
    assert outcome.branch_point.startswith("call 2 of ") and "by replay (the call did not come through" in outcome.branch_point
    assert [b.status for b in outcome.branches] == ["ok"] * 3, [(b.error, b.log_tail) for b in outcome.branches]
    assert engine.replies == [] and len(engine.prompts) == 4  # the replayed first calls asked the engine nothing

    tree = tree_of(session)
    assert tree is not None and [b.tag.index for b in tree.branches] == [0, 1, 2]
    (shared,) = tree.branches[0].tag.shared  # the trunk's first call (the tool call), one interaction id for all
    texts = []
    for b in tree.branches:
        first, second = b.session.interactions.values()
        assert first.id == shared and second.parent_id == shared
        assert (first.prompt_ids, first.output_ids) == (tree.branches[0].session.interactions[shared].prompt_ids, engine_ids(gw, CALL))
        text = gw.tok.decode(second.output_ids, skip_special_tokens=True)
        texts.append(text)
        assert b.outcome.reward == (1.0 if text == "\\boxed{42}" else 0.0)  # each branch's reward is its own sample's
        assert own_interactions(b) == (second.id,)
    assert texts[0] == "\\boxed{42}" and sorted(texts[1:]) == ["\\boxed{41}", "\\boxed{42}"]
    assert len(session.interactions) == 4 and tree.fork == 0  # the shared call once, then each branch's own
    assert settled.reward == pytest.approx(2 / 3)


def engine_ids(gw, text: str) -> list[int]:
    return gw.tok.encode(text, add_special_tokens=False) + [gw.tok.convert_tokens_to_ids("<|im_end|>")]


def test_branches_of_an_agent_that_does_not_repeat_its_calls_are_stopped_and_named(served):
    gw = served
    outcome, settled, session, engine = _branched(
        gw, "branch_agents:NoisyAgent", ["one", "two", "unused"], BranchConfig(n=3, at_call=2, replay=True), {"q": 1}
    )
    assert outcome.branch_point.endswith(
        "by replay (refused by the episode: the episode runs other threads (held): fork copies only the calling one)"
    )
    assert outcome.branches[0].status == "ok"
    for b in outcome.branches[1:]:
        assert b.status == "crashed" and b.error.startswith("branch replay diverged: the replay's call 1 differs from the trunk's ")
    assert [t for t, _ in engine.replies] == ["unused"]  # nothing was sampled for the diverged branches
    tree = tree_of(session)
    assert [trained(b.outcome, "exclude") for b in tree.branches] == [True, False, False]
    assert len(tree.own) == 1 and settled.reward == 1.0  # only branch 0 is trained


def test_a_world_episode_branched_by_replay_is_graded_per_branch_on_a_workspace_of_its_own(served, tmp_path):
    """A world episode that cannot fork (it holds a thread): each replaying branch is an episode
    with a workspace and a grader of its own, redoing the trunk's work before the branch point;
    a branch that fixes the bug is rewarded 1, the one that rewrites the protected test 0 with
    its own tripwires, and none sees another's files."""
    gw = served
    engine = _ByCall(gw.tok, "first 1", ["choice 5 fix", "choice 6 tamper", "choice 7 fix"])
    row = {"case": "world-replay", "world": make_task(str(tmp_path / "library"))}
    outcome, settled, session, _ = _branched(gw, "branch_agents:BranchAgent", engine, BranchConfig(n=3, at_call=2, replay=True), row)
    assert "by replay (refused by the episode: the episode runs other threads (held)" in outcome.branch_point
    assert [b.status for b in outcome.branches] == ["ok"] * 3, [(b.error, b.log_tail) for b in outcome.branches]
    tree = tree_of(session)
    for b in tree.branches:
        first, own, report = b.session.interactions.values()
        assert first.id == b.tag.shared[0]
        choice = gw.tok.decode(own.output_ids, skip_special_tokens=True)
        tampered = "tamper" in choice
        assert b.outcome.reward == (0.0 if tampered else 1.0), (choice, b.outcome.grader)
        assert bool(b.outcome.tripwires) == tampered, b.outcome.tripwires
        said = re.findall(r"report [^<]*", gw.tok.decode(report.prompt_ids))[-1]  # what it saw of its workspace
        assert said.endswith(f"workspace=['mine-{choice.replace(' ', '-')}', 'trunk.txt']"), said
    assert sorted(b.outcome.reward for b in tree.branches) == [0.0, 1.0, 1.0]
