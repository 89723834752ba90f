"""Inline episodes see the endpoint variables a sandboxed one sees (areal/agent/environment.py).

An agent that builds its SDK clients from the environment (``AsyncOpenAI()``, ``AsyncAnthropic()``)
reaches its own gateway session inline as it does in the sandbox, while other inline episodes run
beside it in the same process; a placeholder key and base URL in the user's shell never send it
elsewhere. The gateway is real, over the instant stand-in engine (SGLang's /generate, always "42").
"""

from __future__ import annotations

import asyncio
import os
import stat

import pytest
from anthropic import AsyncAnthropic
from instant_engine import start_instant_engine
from openai import AsyncOpenAI
from transformers import AutoTokenizer

from areal.agent.environment import ENDPOINT_VARIABLES, endpoint_variables
from areal.agent.spec import InlineRunner
from areal.embedded import ensure_scripted_model
from areal.engine.client import EngineClient
from areal.gateway import Gateway, GatewayConfig, serve_http

EPISODES = 6


@pytest.fixture
def user_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user's shell may hold: placeholder keys, and a base URL naming the public endpoint."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-placeholder-from-the-shell")
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.openai.com/v1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-placeholder-from-the-shell")
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)


class FromTheEnvironment:
    """An agent written against the real APIs: both SDK clients built with no arguments."""

    async def run(self, data: dict, **extra_kwargs) -> float:
        openai = AsyncOpenAI(max_retries=0)
        await asyncio.sleep(0.01 * (data["i"] % 3))  # the other episodes build theirs meanwhile
        await openai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        claude = AsyncAnthropic(max_retries=0)
        await asyncio.sleep(0.01 * (data["i"] % 2))
        await claude.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        seen = data["seen"][data["i"]] = {name: os.environ[name] for name in ENDPOINT_VARIABLES}
        seen["thread"] = await asyncio.to_thread(os.environ.get, "OPENAI_API_KEY")  # a thread of the episode
        seen["executor"] = await asyncio.get_running_loop().run_in_executor(None, os.environ.get, "OPENAI_BASE_URL")
        return 1.0


def test_concurrent_inline_episodes_each_reach_their_own_session_through_the_environment(user_shell):
    tok = AutoTokenizer.from_pretrained(ensure_scripted_model())
    seen: dict[int, dict[str, str]] = {}

    async def go() -> tuple[str, list[str], list]:
        engine_runner = await start_instant_engine(tok)
        engine = EngineClient(f"http://127.0.0.1:{engine_runner.addresses[0][1]}")
        gateway = Gateway(engine, tok, GatewayConfig())
        http_runner, url = await serve_http(gateway)
        runner = InlineRunner(FromTheEnvironment(), url)
        try:
            keys = [gateway.open_session(f"e{i}") for i in range(EPISODES)]
            outcomes = await asyncio.gather(*(runner.run_episode(f"e{i}", {"i": i, "seen": seen}, key, 30.0) for i, key in enumerate(keys)))
            sessions = [gateway.close_session(key) for key in keys]
        finally:
            await runner.close()
            await http_runner.cleanup()
            await engine.close()
            await engine_runner.cleanup()
        return url, keys, list(zip(outcomes, sessions))

    url, keys, results = asyncio.run(go())
    for i, (outcome, session) in enumerate(results):
        assert (outcome.status, outcome.reward) == ("ok", 1.0), outcome.error
        assert len(session.interactions) == 2  # its Chat Completions call and its Messages call, in its own session
        # What a sandboxed episode sees (sandbox/episode.py), with the gateway's HTTP door as the root.
        expected = endpoint_variables(url, keys[i])
        assert {k: v for k, v in seen[i].items() if k in ENDPOINT_VARIABLES} == expected
        assert seen[i]["thread"] == keys[i]
        assert seen[i]["executor"] == f"{url}/v1"  # no context there: the gateway, never the shell's endpoint
    # The run over, the user's environment is as it was.
    assert os.environ["OPENAI_BASE_URL"] == "https://api.openai.com/v1" and "ANTHROPIC_BASE_URL" not in os.environ
    assert os.environ["OPENAI_API_KEY"] == "sk-placeholder-from-the-shell"


SCRIPT = """#!/bin/sh
cat > /dev/null
echo "{\\"$OPENAI_BASE_URL $OPENAI_API_KEY $ANTHROPIC_BASE_URL $ANTHROPIC_API_KEY\\": 1}"
"""


def test_an_inline_exec_agent_gets_its_sessions_variables_not_the_shells(user_shell, tmp_path):
    program = tmp_path / "agent.sh"
    program.write_text(SCRIPT)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    root = "http://127.0.0.1:9"

    async def go() -> list:
        runner = InlineRunner(f"exec:{program}", root)
        try:
            return await asyncio.gather(*(runner.run_episode(f"e{i}", {}, f"sk-areal-episode-{i}", 30.0) for i in range(3)))
        finally:
            await runner.close()

    for i, outcome in enumerate(asyncio.run(go())):
        assert outcome.status == "ok", outcome.error
        assert list(outcome.rewards_by_id) == [" ".join(endpoint_variables(root, f"sk-areal-episode-{i}").values())]
