"""areal/agent/anthropic_compat.py: the anthropic SDK pinned here (which dropped ``temperature``,
``top_p`` and ``top_k`` from ``messages.create`` in 1.0) takes them again once the runners have
prepared the SDK, and sends them in the request body, as AReaL's Anthropic agents expect.

The SDK is the real one, against a local HTTP server that records each request's body and answers
with a minimal Messages reply. A whole run with an agent of AReaL's shape passing the keywords,
sandboxed and inline: tests/integration/agents/test_guide_agent_episodes.py (``AnthropicMathAgent``).
"""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator

import anthropic
import pytest

from areal.agent import httpx2_bridge

REPLY = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": "4"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 1},
}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, list[dict]]]:
    bodies: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            out = json.dumps(REPLY).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", bodies
    httpd.shutdown()


def test_the_pinned_sdk_refuses_the_keywords_until_prepared(server: tuple[str, list[dict]]) -> None:
    url, bodies = server
    args = dict(model="m", max_tokens=8, messages=[{"role": "user", "content": "2+2?"}])
    client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
    if not getattr(anthropic.resources.messages.Messages.create, "_areal_sampling", False):
        with pytest.raises(TypeError, match="temperature"):  # what AReaL's agents hit without it
            client.messages.create(**args, temperature=0.25)
    httpx2_bridge.install()  # what the runners do before an episode (hand_out)
    client.messages.create(**args, temperature=0.25, top_p=0.5, top_k=3)
    assert {k: bodies[-1][k] for k in ("temperature", "top_p", "top_k")} == {"temperature": 0.25, "top_p": 0.5, "top_k": 3}

    async def both_async_ways() -> None:
        aclient = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
        await aclient.messages.create(**args, temperature=0.75, extra_body={"temperature": 0.9})  # extra_body wins
        assert bodies[-1]["temperature"] == 0.9
        await aclient.messages.create(**args, top_p=0.3)
        assert bodies[-1]["top_p"] == 0.3 and "temperature" not in bodies[-1]

    asyncio.run(both_async_ways())
