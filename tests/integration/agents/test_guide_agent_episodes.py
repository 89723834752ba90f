"""The guide's agents run their episodes the way a training run does: sandboxed (a real zygote, the
relay and the ZeroMQ door of a real gateway on the scripted model) and inline, handed the runner's
``http_client`` (an ``httpx`` client) and AReaL's ``workflow_kwargs``. anthropic >= 2.11 is built on
``httpx2`` and refuses httpx clients, which failed every episode of an Anthropic agent that passes
the handed client on, as AReaL's does (80 of 80); areal/agent/httpx2_bridge.py gives the SDK a
bridge to that very client. One of these agents also runs as a whole training run
(tests/e2e/test_guide_agents.py)."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import httpx2
import pytest
from zygote_harness import sandboxed_episodes

from areal.agent.spec import InlineRunner, hand_out
from areal.aio import run as run_loop

MESSAGE = {
    "id": "m1",
    "type": "message",
    "role": "assistant",
    "model": "default",
    "stop_reason": "end_turn",
    "content": [{"type": "text", "text": "\\boxed{4}"}],
    "usage": {"input_tokens": 3, "output_tokens": 2},
}


def test_anthropic_takes_the_handed_client_and_no_other():
    seen: list[tuple[str, str, str]] = []

    def reply(request: httpx.Request) -> httpx.Response:
        if request.headers.get("x-fail") == "timeout":
            raise httpx.ReadTimeout("no reply", request=request)
        seen.append((request.url.path, request.headers["authorization"], json.loads(request.content)["messages"][0]["content"]))
        return httpx.Response(200, json=MESSAGE)

    async def go() -> None:
        handed = hand_out(httpx.AsyncClient(transport=httpx.MockTransport(reply), timeout=30.0))
        async with anthropic.AsyncAnthropic(base_url="http://gw/sessions/k/v1", api_key="k", http_client=handed, max_retries=0) as client:
            message = await client.messages.create(model="default", max_tokens=4, messages=[{"role": "user", "content": "2+2?"}])
            assert message.content[0].text == "\\boxed{4}" and client.timeout == httpx2.Timeout(30.0)  # the handed client's timeouts
            with pytest.raises(anthropic.APITimeoutError):  # an httpx timeout stays a timeout for the SDK
                await client.messages.create(
                    model="default", max_tokens=4, messages=[{"role": "user", "content": "x"}], extra_headers={"x-fail": "timeout"}
                )
        assert seen == [("/sessions/k/v1/v1/messages", "Bearer k", "2+2?")]  # through the handed client's own transport
        assert not handed.is_closed  # closing the SDK's client leaves the runner's, shared by episodes, open
        await handed.aclose()

    run_loop(go())
    with pytest.raises(TypeError, match="httpx2"):  # a client the agent made itself is not touched
        anthropic.AsyncAnthropic(api_key="k", http_client=httpx.AsyncClient())
    own = httpx2.AsyncClient()
    assert anthropic.AsyncAnthropic(api_key="k", http_client=own)._client is own


# What AReaL's examples/agent_workflow/train.py hands every agent class (workflow_kwargs).
AREAL_KWARGS = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 256, "max_completion_tokens": 32, "max_turns": 2}
GUIDE_AGENTS = [  # (agent, model calls per episode; None: as many as the agent's turns take; 0: see below)
    ("areal.workflow.openai.math_agent:MathAgent", 1),
    ("areal.workflow.openai.math_agent:MultiTurnMathAgent", None),
    ("areal.workflow.openai.math_agent:MathToolAgent", None),
    ("areal.workflow.anthropic.math_agent:MathAgent", 1),
    ("areal.workflow.langchain.math_agent:MathAgent", 1),
    ("areal.workflow.langchain.math_agent:MathToolAgent", None),
    # handoffs only: the scripted model answers any tool list with a `calculator` call, which the
    # SDK refuses after the round trip (see the test); the default model hands off (test_examples.py)
    ("areal.workflow.openai_agent.math_agent:MathAgent", 0),
    ("areal.workflow.openai_agent.math_agent:MathToolAgent", None),
    ("tests/support/areal_shaped_agents.py:AnthropicMathAgent", 2),  # AReaL's own Anthropic agent's shape
]
# Two rows of the embedded task's shape (what the agents read: the last message, the answer).
ROWS = [
    {"messages": [{"role": "user", "content": "What is 3 + 4? Put the answer in \\boxed{}."}], "answer": "7"},
    {"messages": [{"role": "user", "content": "What is 12 - 5? Put the answer in \\boxed{}."}], "answer": "7"},
]
DEADLINE_S = 120.0


# Every agent runs sandboxed, the path with the most between the agent and the gateway (relay,
# ZeroMQ door). Inline, the runner hands the same client straight to the SDK: that is run for the
# SDK whose client the runner must adapt (the Anthropic SDK on httpx2, both of its agents); an
# OpenAI SDK agent runs inline in test_examples.py.
INLINE_TOO = {"areal.workflow.anthropic.math_agent:MathAgent", "tests/support/areal_shaped_agents.py:AnthropicMathAgent"}
CASES = [
    (agent, calls, mode) for agent, calls in GUIDE_AGENTS for mode in ("subproc", "inline") if mode == "subproc" or agent in INLINE_TOO
]


def _inline(gw, spec: str, rows: list[dict]) -> list[tuple]:
    """Each row as one episode in this process (``rollout.openai.mode=inline``), on the same gateway."""

    async def episodes() -> list[tuple]:
        runner = InlineRunner(spec, gw.http, AREAL_KWARGS)
        try:
            out = []
            for i, row in enumerate(rows):
                key = gw.gateway.open_session(f"inline-{i}")
                out.append((await runner.run_episode(f"inline-{i}", row, key, DEADLINE_S), key))
            return out
        finally:
            await runner.close()

    return [(outcome, gw.interactions(key)) for outcome, key in asyncio.run(episodes())]


@pytest.mark.parametrize(
    ("agent", "calls", "mode"),
    CASES,
    ids=[f"{a.rpartition('/')[2].removeprefix('areal.workflow.').replace(':', '.')}-{m}" for a, _, m in CASES],
)
def test_guide_agents_run_their_episodes_as_a_run_calls_them(served_scripted, mode, agent, calls):
    if mode == "subproc":
        episodes = sandboxed_episodes(served_scripted, agent, ROWS, AREAL_KWARGS, deadline_s=DEADLINE_S)
    else:
        episodes = _inline(served_scripted, agent, ROWS)
    assert len(episodes) == len(ROWS)
    if calls == 0:  # the model was reached and answered; its answer names a tool the agent lacks
        assert all(len(interactions) >= 1 for _, interactions in episodes)
        assert all("Tool calculator not found in agent Math Problem Solver" in outcome.error for outcome, _ in episodes), episodes
        return
    assert all(outcome.status == "ok" for outcome, _ in episodes), [(o.error[-2000:], o.log_tail[-2000:]) for o, _ in episodes]
    assert all(len(interactions) == calls if calls else len(interactions) >= 1 for _, interactions in episodes), episodes
    # every call the agent made is one the gateway recorded for its episode, and the reward reached it
    for outcome, interactions in episodes:
        assert outcome.reward is not None or set(outcome.rewards_by_id) <= {i.id for i in interactions}
