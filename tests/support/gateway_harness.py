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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from areal.aio import loop_factory
from areal.engine.client import EngineClient
from areal.gateway import Gateway, GatewayConfig, serve_http, serve_zmq
from areal.gateway.contract import Choice, ChoiceDelta
from areal.gateway.parsers import ParsedOutput, ToolCall
from areal.gateway.server import handle
from areal.protocol import GatewayReply, GatewayRequest

# One calculator tool in the OpenAI shape, for tests of tool rendering and calls.


def function_tool(name: str, description: str, properties: dict, required: list[str] | None = None) -> dict:
    """A function tool of the chat API: ``name``, ``description``, and parameters that are an object
    of ``properties`` (``required`` listed, if given)."""
    parameters = {"type": "object", "properties": properties, **({"required": required} if required is not None else {})}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def assistant_call(content: str, reasoning: str, call_id: str, name: str, arguments: str) -> dict:
    """An assistant chat message: ``content``, its ``reasoning``, and one call ``call_id`` of the
    function ``name`` with ``arguments`` (JSON text)."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": [call]}


CALC_TOOLS = [function_tool("calc", "evaluate arithmetic", {"expr": {"type": "string"}})]


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


def handled(gw: Gateway, key: str, body: dict, path: str = "/v1/chat/completions", headers: dict | None = None) -> GatewayReply:
    """The reply of ``gw``'s request handler, in this thread (no sockets), to a POST of ``body`` to
    ``path`` with ``key`` as its bearer token (and ``headers``, if given)."""
    headers = {"authorization": f"Bearer {key}", **(headers or {})}
    return asyncio.run(handle(gw, GatewayRequest(request_id=1, method="POST", path=path, headers=headers, body=json.dumps(body).encode())))


def post_chat(gw: Gateway, key: str, body: dict) -> dict:
    """A chat completion through ``gw``'s request handler, in this thread (no sockets): the
    answer's body, asserting a 200."""
    reply = handled(gw, key, body)
    assert reply.status == 200, reply.body
    return json.loads(reply.body)


def front_choice(
    content: str,
    calls: list[ToolCall] | None,
    reasoning: str | None,
    finish: str,
    interaction_id: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> Choice:
    """A finished choice as an API front receives it from the gateway: ``content``, ``reasoning``
    and ``calls`` parsed; its finish reason ``tool_calls`` where it has calls and ``finish`` is
    ``stop``, else ``finish``."""
    parsed = ParsedOutput(content=content, reasoning=reasoning, tool_calls=calls or [])
    finish = "tool_calls" if calls and finish == "stop" else finish
    return Choice(
        index=0,
        interaction_id=interaction_id,
        parsed=parsed,
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )


def calculator_stream(
    choice: Callable[..., Choice], call_id: str, content: str, cut: int
) -> tuple[list[ToolCall], Choice, list[ChoiceDelta]]:
    """The deltas of an answer that calls the calculator on 6*7: the reasoning "mult" in two
    pieces, ``content`` in two (split at ``cut``), then the finished choice ``choice(content,
    calls, reasoning="mult")``, its call's id ``call_id``: (the calls, that choice, the deltas)."""
    calls = [ToolCall(id=call_id, name="calculator", arguments='{"expression": "6*7"}')]
    done = choice(content, calls, reasoning="mult")
    pieces = [("reasoning", "mu"), ("reasoning", "lt"), ("content", content[:cut]), ("content", content[cut:])]
    return calls, done, [*(ChoiceDelta(0, kind, text) for kind, text in pieces), ChoiceDelta(0, "done", choice=done)]


def scripted_gateway() -> Iterator[GatewayThread]:
    """A GatewayThread over the embedded model's tokenizer whose engine each test replaces with a
    scripted one (tests/support/scripted_engine.py); ``.tok`` is that tokenizer. For a module
    fixture: ``yield from scripted_gateway()``; the real engine client is put back at the end."""
    from areal.embedded import ensure_embedded_model

    model = ensure_embedded_model()
    gw = GatewayThread("http://127.0.0.1:9", model)
    gw.tok = AutoTokenizer.from_pretrained(model)
    real = gw.gateway.engine
    yield gw
    gw.call(lambda: setattr(gw.gateway, "engine", real))
    gw.stop()
