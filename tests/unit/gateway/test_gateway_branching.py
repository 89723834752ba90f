"""The gateway's half of a branch point (areal/gateway/branching.py), through the real request
path (``server.handle``) with a scripted engine: the order, the retired trunk key, each branch's
own session and rewards, refusals, and the settings' validation."""

from __future__ import annotations

import asyncio
import json

import pytest
from scripted_engine import ScriptedEngine
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.gateway import Gateway, GatewayConfig
from areal.gateway.branching import (
    BRANCHABLE,
    ORDER,
    REFUSED,
    BranchConfig,
    branch_keys,
    branch_of,
    ends_with_tool_result,
    refusal,
    replay_divergence,
    replay_point,
    split_replayed,
)
from areal.gateway.server import handle
from areal.protocol import GatewayRequest


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_embedded_model())


def _gateway(tok, replies: list[str], branch: BranchConfig | None) -> Gateway:
    gw = Gateway(ScriptedEngine(tok, [(r, "<|im_end|>") for r in replies]), tok, GatewayConfig())
    gw.branching = branch
    return gw


def _call(gw: Gateway, key: str, messages: list[dict], stream: bool = False, **headers: str) -> tuple[int, dict, dict]:
    """(status, body, headers); a stream's body is its events' data, in order, under "events"."""
    req = GatewayRequest(
        1,
        "POST",
        "/v1/chat/completions",
        {"authorization": f"Bearer {key}", **headers},
        json.dumps({"messages": messages, "max_tokens": 8, "stream": stream}).encode(),
    )
    reply = asyncio.run(handle(gw, req))
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[6:] for line in reply.body.decode().splitlines() if line.startswith("data: ")]
        return reply.status, {"events": [json.loads(d) for d in data if d != "[DONE]"]}, reply.headers
    return reply.status, json.loads(reply.body), reply.headers


FIRST = [{"role": "user", "content": "hi"}]


def _second(first_reply: str) -> list[dict]:
    return [*FIRST, {"role": "assistant", "content": first_reply}, {"role": "user", "content": "again"}]


def test_the_kth_call_is_answered_with_an_order_and_each_branch_samples_it_in_its_own_session(tok):
    gw = _gateway(tok, ["one", "b0", "b1", "b2", "b0 again"], BranchConfig(n=3, at_call=2))
    trunk = gw.open_session("ep")
    assert _call(gw, trunk, FIRST, **{BRANCHABLE: "1"})[0] == 200  # call 1: served
    status, body, headers = _call(gw, trunk, _second("one"), **{BRANCHABLE: "1"})
    assert status == 200 and headers.get(ORDER) == "order" and body["branch"]["call"] == 2
    keys = body["branch"]["keys"]
    assert keys == branch_keys(gw.sessions[trunk]) and len(set(keys)) == 3
    assert [text for text, _ in gw.engine.replies] == ["b0", "b1", "b2", "b0 again"]  # the order sampled nothing
    status, body, _ = _call(gw, trunk, _second("one"), **{BRANCHABLE: "1"})
    assert status == 409 and body["error"]["type"] == "branch_conflict"  # the trunk's key is retired
    prefix = next(iter(gw.sessions[trunk].interactions))
    for i, key in enumerate(keys):
        status, body, headers = _call(gw, key, _second("one"), **{BRANCHABLE: "1"})  # a branch never branches again
        assert status == 200 and ORDER not in headers and body["choices"][0]["message"]["content"] == f"b{i}"
        session = gw.sessions[key]
        assert branch_of(session).index == i and session.episode_id == f"ep/b{i}"
        own = list(session.interactions.values())
        assert [x.id for x in own][0] == prefix and own[1].parent_id == prefix
    gw.sessions[keys[2]].last_used = 0.0
    _call(gw, keys[0], _second("one"))  # a call in one branch keeps its waiting siblings alive
    assert gw.sessions[keys[2]].last_used == gw.sessions[keys[0]].last_used > 0.0
    gw.sessions[keys[0]].set_final_reward(1.0)
    gw.sessions[keys[0]].set_reward(prefix, 0.5)  # a prefix reward set in one branch is that branch's
    assert gw.sessions[keys[1]].interactions[prefix].reward is None
    assert gw.sessions[trunk].interactions[prefix].reward is None


def test_a_call_that_cannot_fork_is_served_and_the_refusal_kept(tok):
    gw = _gateway(tok, ["one", "two"], BranchConfig(n=2, at_call=2))
    trunk = gw.open_session("ep")
    _call(gw, trunk, FIRST)
    status, body, headers = _call(gw, trunk, _second("one"))  # no x-areal-branchable: the relay, HTTP, inline
    assert status == 200 and ORDER not in headers and body["choices"][0]["message"]["content"] == "two"
    assert refusal(gw.sessions[trunk]).startswith("the call did not come through the client handed")
    assert branch_keys(gw.sessions[trunk]) == [] and len(gw.sessions) == 1


def test_an_episode_that_refuses_the_order_goes_on_in_its_own_session(tok):
    gw = _gateway(tok, ["one", "two"], BranchConfig(n=2, at_call=2))
    trunk = gw.open_session("ep")
    _call(gw, trunk, FIRST, **{BRANCHABLE: "1"})
    keys = _call(gw, trunk, _second("one"), **{BRANCHABLE: "1"})[1]["branch"]["keys"]
    status, body, _ = _call(gw, trunk, _second("one"), **{BRANCHABLE: "1", REFUSED: "it runs threads"})
    assert status == 200 and body["choices"][0]["message"]["content"] == "two"
    assert refusal(gw.sessions[trunk]) == "refused by the episode: it runs threads"
    assert not any(k in gw.sessions for k in keys)  # the branch sessions are gone


def test_off_by_default_nothing_branches(tok):
    gw = _gateway(tok, ["one", "two"], None)
    trunk = gw.open_session("ep")
    _call(gw, trunk, FIRST, **{BRANCHABLE: "1"})
    assert _call(gw, trunk, _second("one"), **{BRANCHABLE: "1"})[1]["choices"][0]["message"]["content"] == "two"
    assert refusal(gw.sessions[trunk]) == "" and branch_keys(gw.sessions[trunk]) == []


def test_tool_result_boundaries_in_each_api():
    assert ends_with_tool_result("/v1/chat/completions", {"messages": [{"role": "tool", "content": "4"}]})
    assert not ends_with_tool_result("/v1/chat/completions", {"messages": [{"role": "user", "content": "4"}]})
    assert ends_with_tool_result("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "4"}]}]})
    assert not ends_with_tool_result("/v1/messages", {"messages": [{"role": "user", "content": "4"}]})
    assert ends_with_tool_result("/v1/responses", {"input": [{"type": "function_call_output", "output": "4"}]})
    assert not ends_with_tool_result("/v1/responses", {"input": "4"})


def _entropy_gateway(tok, replies: list[tuple[str, float]], threshold: float = 1.0) -> Gateway:
    engine = ScriptedEngine(tok, [(text, "<|im_end|>") for text, _ in replies], [lp for _, lp in replies])
    gw = Gateway(engine, tok, GatewayConfig())
    gw.branching = BranchConfig(n=2, entropy=threshold)
    return gw


def test_a_call_sampled_at_high_entropy_becomes_the_branch_point_and_its_sample_is_discarded(tok):
    gw = _entropy_gateway(tok, [("sure", -0.2), ("maybe", -1.5), ("b0", -2.0), ("b1", -0.1)])
    trunk = gw.open_session("ep")
    status, body, headers = _call(gw, trunk, FIRST, **{BRANCHABLE: "1"})  # 0.2 nats per token: served
    assert status == 200 and ORDER not in headers and body["choices"][0]["message"]["content"] == "sure"
    session = gw.sessions[trunk]
    calls, charged = session.calls_made, session.tokens_charged
    status, body, headers = _call(gw, trunk, _second("sure"), **{BRANCHABLE: "1"})  # 1.5: the branch point
    assert status == 200 and headers.get(ORDER) == "order" and body["branch"]["call"] == 2
    keys = body["branch"]["keys"]
    assert keys == branch_keys(session) and len(keys) == 2
    assert len(session.interactions) == 1  # the deciding sample was not recorded
    assert (session.calls_made, session.tokens_charged) == (calls, charged)  # nor charged
    assert len(gw.engine.prompts) == 2  # call 2 sampled once, for the decision
    for i, key in enumerate(keys):  # each branch samples call 2 afresh, and never branches again (b0 is at 2.0 nats)
        status, body, headers = _call(gw, key, _second("sure"), **{BRANCHABLE: "1"})
        assert status == 200 and ORDER not in headers and body["choices"][0]["message"]["content"] == f"b{i}"
        branch = gw.sessions[key]
        assert branch_of(branch).entropy == pytest.approx(1.5) and branch.calls_made == calls + 1
        assert gw.engine.prompts[2 + i] == gw.engine.prompts[1]  # the same prompt the decision was sampled on
    assert _call(gw, trunk, _second("sure"), **{BRANCHABLE: "1"})[0] == 409  # the trunk's key is retired


def test_an_entropy_candidate_that_cannot_fork_is_served_and_the_refusal_kept(tok):
    gw = _entropy_gateway(tok, [("maybe", -1.5), ("again", -3.0)])
    trunk = gw.open_session("ep")
    status, body, headers = _call(gw, trunk, FIRST)  # no x-areal-branchable: served as sampled
    assert status == 200 and ORDER not in headers and body["choices"][0]["message"]["content"] == "maybe"
    assert refusal(gw.sessions[trunk]).startswith("the call did not come through the client handed")
    status, body, headers = _call(gw, trunk, _second("maybe"), **{BRANCHABLE: "1"})  # a session's one branch point is settled
    assert status == 200 and ORDER not in headers and branch_keys(gw.sessions[trunk]) == []


def test_a_streamed_entropy_candidate_is_streamed_whole_below_the_threshold_and_ordered_above(tok):
    gw = _entropy_gateway(tok, [("sure thing", -0.2), ("maybe", -1.5)])
    trunk = gw.open_session("ep")
    status, body, headers = _call(gw, trunk, FIRST, stream=True, **{BRANCHABLE: "1"})
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in body["events"] if e["choices"])
    assert status == 200 and ORDER not in headers and text == "sure thing"
    session = gw.sessions[trunk]
    (only,) = session.interactions.values()
    assert only.output_logprobs == [-0.2] * len(only.output_ids)
    assert session.tokens_charged == len(only.output_ids)  # refunded once, to what was sampled
    calls = session.calls_made
    status, body, headers = _call(gw, trunk, _second("sure thing"), stream=True, **{BRANCHABLE: "1"})
    assert status == 200 and headers.get(ORDER) == "order" and len(body["branch"]["keys"]) == 2
    assert (session.calls_made, session.tokens_charged) == (calls, len(only.output_ids))  # the discarded call uncharged


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"n": 1, "at_call": 2}, "rollout.branch.n"),
        ({"n": 3}, "rollout.branch.at_call"),
        ({"at_call": -1}, "rollout.branch.at_call"),
        ({"n": 2, "entropy": -0.5}, "rollout.branch.entropy"),
        ({"n": 2, "entropy": float("nan")}, "rollout.branch.entropy"),
    ],
)
def test_settings_are_checked_naming_the_field(fields, named):
    with pytest.raises(ValueError, match=named):
        BranchConfig(**fields)


def _third(first_reply: str, second_reply: str) -> list[dict]:
    return [*_second(first_reply), {"role": "assistant", "content": second_reply}, {"role": "user", "content": "last"}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_that_cannot_fork_is_branched_by_replay(tok, stream):
    """BranchConfig.replay: the trunk goes on as branch 0; each other branch's session answers its
    calls before the branch point from the trunk's record (same tokens, logprobs and ids, no
    engine call), samples the branch point afresh, and ``split_replayed`` leaves the trunk with the
    prefix its branches share."""
    gw = _gateway(tok, ["one", "b0", "b0 end", "b1", "b1 end"], BranchConfig(n=2, at_call=2, replay=True))
    trunk = gw.open_session("ep")
    _call(gw, trunk, FIRST)
    status, body, headers = _call(gw, trunk, _second("one"))  # not branchable (no header): served, branched by replay
    assert status == 200 and ORDER not in headers and body["choices"][0]["message"]["content"] == "b0"
    assert refusal(gw.sessions[trunk]) == "" and not replay_point(gw.sessions[trunk]).split
    _call(gw, trunk, _third("one", "b0"))
    (key,) = branch_keys(gw.sessions[trunk])
    prefix = list(gw.sessions[trunk].interactions.values())[0]
    assert gw.sessions[key].interactions == {} and branch_of(gw.sessions[key]).index == 1

    status, body, _ = _call(gw, key, FIRST, stream=stream)  # replayed: from the record, the engine not asked
    text = (
        "".join(e["choices"][0]["delta"].get("content") or "" for e in body["events"])
        if stream
        else body["choices"][0]["message"]["content"]
    )
    assert status == 200 and text == "one" and [t for t, _ in gw.engine.replies] == ["b1", "b1 end"]
    replayed = gw.sessions[key].interactions[prefix.id]  # under the trunk's id: the prefix is shared, trained once
    assert (replayed.prompt_ids, replayed.output_ids, replayed.output_logprobs) == (
        prefix.prompt_ids,
        prefix.output_ids,
        prefix.output_logprobs,
    )
    assert _call(gw, key, _second("one"))[1]["choices"][0]["message"]["content"] == "b1"  # the branch point: sampled
    assert _call(gw, key, _third("one", "b1"))[1]["choices"][0]["message"]["content"] == "b1 end"
    assert replay_divergence(gw.sessions[key]) == "" and gw.engine.replies == []
    own = [x for iid, x in gw.sessions[key].interactions.items() if iid != prefix.id]
    assert own[0].parent_id == prefix.id and own[0].prompt_ids[: len(prefix.prompt_ids)] == prefix.prompt_ids

    split_replayed(gw, gw.sessions[trunk])
    keys = branch_keys(gw.sessions[trunk])
    assert keys[1] == key and [branch_of(gw.sessions[k]).index for k in keys] == [0, 1]
    assert list(gw.sessions[trunk].interactions) == [prefix.id] and len(gw.sessions[keys[0]].interactions) == 3
    assert replay_point(gw.sessions[trunk]).split


def test_a_replaying_branch_that_makes_another_call_is_stopped_and_the_divergence_named(tok):
    gw = _gateway(tok, ["one", "b0"], BranchConfig(n=3, at_call=2, replay=True))
    trunk = gw.open_session("ep")
    _call(gw, trunk, FIRST)
    _call(gw, trunk, _second("one"))
    first, second = branch_keys(gw.sessions[trunk])
    status, body, _ = _call(gw, first, [{"role": "user", "content": "hello"}])  # not the trunk's first call
    assert status == 409 and body["error"]["type"] == "branch_replay_diverged"
    why = replay_divergence(gw.sessions[first])
    assert why.startswith("the replay's call 1 differs from the trunk's ") and "at prompt token" in why
    assert gw.engine.replies == []  # nothing sampled for it
    # A branch that ended before making the trunk's calls: named too.
    assert replay_divergence(gw.sessions[second]) == "the replay ended with 1 of the trunk's 1 calls before the branch point not made"
