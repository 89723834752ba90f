"""A real Gateway serving HTTP and ZeroMQ from its own event-loop thread, for tests whose clients
block (sync SDKs, hypothesis) or run their own loops (async SDKs via asyncio.run).

The thread runs the loop production runs the gateway on (``areal.aio.loop_factory``:
uvloop), so every SDK, fuzz and multi-turn test goes through the same loop as a training run.

Only this thread touches the Gateway; tests read its state through ``call`` (which runs a
function on the gateway's loop and waits), so nothing races with a request being served.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from areal.aio import loop_factory
from areal.engine.client import EngineClient
from areal.gateway import Gateway, GatewayConfig, serve_http, serve_zmq
from areal.gateway.server import handle
from areal.protocol import GatewayRequest

# One calculator tool in the OpenAI shape, for tests of tool rendering and calls.
CALC_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "evaluate arithmetic",
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}},
        },
    }
]


class GatewayThread:
    def __init__(self, engine_url: str, model_dir: str | Path, **config: Any) -> None:
        self.loop = (loop_factory() or asyncio.new_event_loop)()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.ipc_dir = tempfile.mkdtemp(prefix="gwtest-")
        self.zmq = f"ipc://{self.ipc_dir}/gateway.sock"
        tokenizer = AutoTokenizer.from_pretrained(model_dir)

        async def start() -> tuple[Gateway, Any, str, asyncio.Task]:
            gateway = Gateway(EngineClient(engine_url), tokenizer, GatewayConfig(**config))
            runner, url = await serve_http(gateway)
            ready = asyncio.Event()
            task = asyncio.ensure_future(serve_zmq(gateway, self.zmq, ready))
            await ready.wait()
            return gateway, runner, url, task

        self.gateway, self._runner, self.http, self._zmq_task = self.run(start())

    def run(self, coro: Any, timeout: float = 120) -> Any:
        """Run a coroutine on the gateway's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        async def wrapped() -> Any:
            return fn()

        return self.run(wrapped())

    def open_session(self, episode_id: str = "test") -> str:
        return self.call(lambda: self.gateway.open_session(episode_id))

    def interactions(self, key: str) -> list:
        return self.call(lambda: list(self.gateway.sessions[key].interactions.values()))

    def generate_direct(self, prompt_ids: list[int], max_tokens: int) -> Any:
        """Greedy /generate straight to the engine, as the gateway would send it."""
        params = {"max_new_tokens": max_tokens, "temperature": 0.0, "stop_token_ids": self.gateway.stop_token_ids}
        return self.run(self.gateway.engine.generate(prompt_ids, params, return_logprob=True))

    def stop(self) -> None:
        async def stop() -> None:
            self._zmq_task.cancel()
            await self._runner.cleanup()
            await self.gateway.engine.close()

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        for p in Path(self.ipc_dir).iterdir():
            p.unlink()
        Path(self.ipc_dir).rmdir()


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds; an AssertionError naming ``what`` after ``timeout_s``
    (a bound on a hang, not a timing assertion: the condition is the engine's or gateway's state)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.05)


def post_chat(gw: Gateway, key: str, body: dict) -> dict:
    """A chat completion through ``gw``'s request handler, in this thread (no sockets): the
    answer's body, asserting a 200."""
    req = GatewayRequest(
        request_id=1, method="POST", path="/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, body=json.dumps(body).encode()
    )
    reply = asyncio.run(handle(gw, req))
    assert reply.status == 200, reply.body
    return json.loads(reply.body)
