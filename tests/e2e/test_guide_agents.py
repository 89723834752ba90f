"""The guide's agents run the way a training run calls them: handed the runner's ``http_client``
(an ``httpx`` client), inline and sandboxed. anthropic >= 2.11 is built on ``httpx2`` and refuses
httpx clients, which failed every episode of an Anthropic agent that passes the handed client on,
as AReaL's does (80 of 80); areal/agent/httpx2_bridge.py gives the SDK a bridge to that very client."""

from __future__ import annotations

import json

import anthropic
import httpx
import httpx2
import pytest
from run_checks import read_jsonl, run_in_repo, train_cmd

from areal.agent.spec import hand_out
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
AREAL_KWARGS = "++rollout.agent_kwargs={temperature:1.0,top_p:1.0,max_tokens:256,max_completion_tokens:32,max_turns:2}"
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


# Every agent runs sandboxed, the path with the most between the agent and the gateway (relay,
# ZeroMQ door). Inline, the runner hands the same client straight to the SDK: that is run for the
# SDK whose client the runner must adapt (the Anthropic SDK on httpx2, both of its agents); an
# OpenAI SDK agent runs inline in test_examples.py.
INLINE_TOO = {"areal.workflow.anthropic.math_agent:MathAgent", "tests/support/areal_shaped_agents.py:AnthropicMathAgent"}
CASES = [
    (agent, calls, mode) for agent, calls in GUIDE_AGENTS for mode in ("subproc", "inline") if mode == "subproc" or agent in INLINE_TOO
]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("agent", "calls", "mode"),
    CASES,
    ids=[f"{a.rpartition('/')[2].removeprefix('areal.workflow.').replace(':', '.')}-{m}" for a, _, m in CASES],
)
def test_guide_agents_run_their_episodes_as_a_run_calls_them(tmp_path, mode, agent, calls):
    run_dir = tmp_path / "run"
    proc = run_in_repo(
        train_cmd(
            run_dir,
            "model.path=scripted",
            f"rollout.agent={agent}",
            AREAL_KWARGS,
            f"rollout.openai.mode={mode}",
            "trainer.steps=1",
            "rollout.groups_per_step=1",
            "rollout.n_samples=2",
            "data.eval_size=0",
        ),
        timeout_s=400,
    )
    assert (run_dir / "episodes.jsonl").is_file(), proc.stderr[-3000:]
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    if calls == 0:  # the model was reached and answered; its answer names a tool the agent lacks
        assert episodes and all("Tool calculator not found in agent Math Problem Solver" in e["error"] for e in episodes), episodes
        return
    assert episodes and all(e["status"] == "ok" for e in episodes), [e.get("error", "")[-2000:] for e in episodes]
    assert all(e["interactions"] == calls if calls else 1 <= e["interactions"] for e in episodes), episodes
    assert proc.returncode == 0, proc.stderr[-3000:]
