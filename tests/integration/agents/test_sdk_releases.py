"""The official SDK clients users have now, in strict mode, against a real gateway: the lock's
(``openai`` 2.44, ``anthropic`` 2.11, the project's venv) and the newest of each line
(tests/support/sdk_venvs.py: ``openai`` 3.x and the newest 2.x, each with the newest
``anthropic``), so that a user's up-to-date environment works whichever line it holds.

The gateway serves HTTP on a port from ``bind(0)`` with the embedded tokenizer and a scripted
engine stand-in (a prompt offering the ``calc`` tool samples a call, any other a short answer);
tests/support/sdk_client.py runs in a subprocess of the interpreter under test and reports what
each call returned (text, tool calls, stream events, the SDK's error class for a refusal), or
what it raised. A reply the SDK's types refuse raises there (``_strict_response_validation``).
tests/support/sdk_handed_client.py does the same with the async clients built on the httpx client a
runner hands an agent (anthropic, built on httpx2, takes it through areal/agent/httpx2_bridge.py),
and tests/support/sdk_types_check.py has each release's types check, strict, every reply and stream
event of the conformance matrix (tests/support/api_cases.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
import sdk_client
import sdk_handed_client
import sdk_types_check
from api_cases import CASES, replies_of_every_case
from paths import ROOT
from scripted_engine import ScriptedEngine
from sdk_venvs import need_sdk, pinned_versions
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.gateway import Gateway, GatewayConfig, serve_http

LOCK = {"openai": "2.44.0", "anthropic": "2.11.0"}
EXPECTED = {
    "chat_plain": ["Seven.", "stop", True],
    "chat_stream": ["Seven.", True],
    "chat_tools": ["calc", {"expr": "3+4"}, "tool_calls"],
    "chat_refused": ["BadRequestError", 400, ["code", "message", "param", "type"]],  # the SDK's body is the error object
    "responses_plain": ["Seven.", "completed"],
    "responses_stream": ["Seven.", "response.created", "response.completed"],
    "responses_tools": ["calc", {"expr": "3+4"}],
    "messages_plain": ["Seven.", "end_turn"],
    "messages_stream": ["Seven.", "Seven.", True],
    "messages_tools": ["calc", {"expr": "3+4"}, "tool_use"],
    "count_tokens": True,
    "messages_refused": ["BadRequestError", 400, "invalid_request_error"],
}


class ToolOrTextEngine(ScriptedEngine):
    """Answers a prompt that offers the calc tool with a call, any other with a short text."""

    def _next(self, input_ids, params) -> list[int]:
        reply = sdk_client.CALL if '"calc"' in self.tok.decode(input_ids) else sdk_client.TEXT
        self.replies.append((reply, "<|im_end|>"))
        return super()._next(input_ids, params)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_embedded_model())


def _run_clients(tok, python: str, script: str) -> dict:
    """``script`` run by ``python`` against a fresh gateway (the project's root on its path): its JSON."""

    async def run() -> dict:
        gw = Gateway(ToolOrTextEngine(tok, []), tok, GatewayConfig())
        runner, url = await serve_http(gw)
        try:
            proc = await asyncio.create_subprocess_exec(
                python,
                script,
                url,
                gw.open_session("ep"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            out, err = await asyncio.wait_for(proc.communicate(), 300)  # a bound on a hang, not a timing
        finally:
            await runner.cleanup()
        assert proc.returncode == 0, err.decode()[-3000:]
        return json.loads(out)

    return asyncio.run(run())


@pytest.mark.parametrize("line", ["lock", "openai3", "openai2"])
def test_the_official_clients_accept_every_reply(tok, line):
    python = sys.executable if line == "lock" else need_sdk(line)
    report = _run_clients(tok, python, sdk_client.__file__)
    assert report["versions"] == (LOCK if line == "lock" else pinned_versions(line))
    assert report["results"] == EXPECTED


@pytest.mark.parametrize("line", ["lock", "openai3", "openai2"])
def test_clients_built_on_the_handed_httpx_client_work_with_every_release(tok, line):
    """The runners hand agents an httpx client: openai takes it as it is (3.x, built on httpx2, still
    accepts one), anthropic >= 2.11 only through areal/agent/httpx2_bridge.py (as the zygote and the
    inline runner install it)."""
    python = sys.executable if line == "lock" else need_sdk(line)
    report = _run_clients(tok, python, sdk_handed_client.__file__)
    assert report == {"chat": "Seven.", "chat_stream": "Seven.", "responses": "Seven.", "messages": "Seven."}


@pytest.fixture(scope="module")
def every_reply(tok) -> list[tuple[str, bool, dict]]:
    return asyncio.run(replies_of_every_case(tok))


@pytest.mark.parametrize("line", ["lock", "openai3", "openai2"])
def test_each_releases_types_accept_every_reply_of_the_conformance_matrix(every_reply, line):
    """The replies and stream events of tests/support/api_cases.py's matrix (every request feature
    the conformance tests send), checked by the release's own types in strict mode."""
    python = sys.executable if line == "lock" else need_sdk(line)
    assert len(every_reply) > 3 * sum(status == 200 for *_, status in CASES) // 2  # the streams' events are in
    done = subprocess.run([python, sdk_types_check.__file__], input=json.dumps(every_reply), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    refused = json.loads(done.stdout)
    assert refused == [], [(every_reply[i][:2], every_reply[i][2].get("type"), why) for i, why in refused[:5]]
