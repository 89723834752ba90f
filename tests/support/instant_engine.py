"""Stand-in engines for tests (and benchmarks) whose engine must answer at once, not well: SGLang's
``/generate`` on loopback with a fixed reply and no model. For sandbox, fuzz and plumbing tests,
where the attack, the scan or the request is the subject and a real model would only add seconds.

- ``start_instant_engine(tok, answer)``: in this process's event loop (aiohttp), always sampling
  ``answer`` then ``<|im_end|>``; a test's ``on_call`` hook may hold each reply.
- ``launch_instant_engine(reply_ids)``: a process of its own (raw asyncio, so that it costs far
  less per call than a gateway it serves), answering non-streamed and cumulative SSE streams,
  ``output_token_logprobs``, finish reasons, health, model info and the control routes:

      python tests/support/instant_engine.py IDS [--cpu N]     # prints its URL, then serves
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Self

from aiohttp import web


async def start_instant_engine(
    tok: Any, answer: str | Callable[[dict], str] = "42", on_call: Callable[[], Awaitable[None] | None] | None = None
) -> web.AppRunner:
    """Serve on a free loopback port (``runner.addresses[0][1]``). ``answer``: the text of every
    reply, or a function of the request's body giving it (a test that answers in turn, or records
    what it was sent); ``on_call`` runs per request, before the reply (awaited if it is a
    coroutine function: a test may hold the reply)."""
    end = [tok.convert_tokens_to_ids("<|im_end|>")]

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        if on_call is not None and inspect.isawaitable(held := on_call()):
            await held
        text = answer(body) if callable(answer) else answer
        output_ids = tok.encode(text, add_special_tokens=False) + end
        return web.json_response(
            {
                "text": text,
                "output_ids": output_ids,
                "meta_info": {
                    "finish_reason": {"type": "stop"},
                    "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": len(output_ids),
                    "weight_version": "0",
                    "output_token_logprobs": [[-0.5, t, None] for t in output_ids],
                },
            }
        )

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found"}


class _InstantEngine(asyncio.Protocol):
    """HTTP/1.1 keep-alive server answering SGLang's ``/generate`` at once with ``reply_ids``."""

    def __init__(self, reply_ids: list[int]) -> None:
        self.reply_ids = reply_ids
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            method, path, _ = head[0].split(" ", 2)
            self._answer(method, path.split("?", 1)[0], body)

    def _answer(self, method: str, path: str, body: bytes) -> None:
        assert self.transport is not None
        if path == "/generate" and method in ("POST", "PUT"):
            req = json.loads(body)
            params = req.get("sampling_params") or {}
            max_new = params.get("max_new_tokens", 128)
            ids = self.reply_ids[:max_new]
            finish = {"type": "stop", "matched": ids[-1]} if len(ids) == len(self.reply_ids) else {"type": "length", "length": max_new}
            if req.get("stream"):
                self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                for n in range(1, len(ids) + 1):
                    chunk = _generate_body(req, ids[:n], finish if n == len(ids) else None)
                    self._chunk(b"data: " + chunk + b"\n\n")
                self._chunk(b"data: [DONE]\n\n")
                self.transport.write(b"0\r\n\r\n")
                return
            self._reply(200, _generate_body(req, ids, finish))
        elif path in ("/health", "/health_generate", "/ready"):
            self._reply(200, b"{}")
        elif path in ("/get_model_info", "/model_info"):
            self._reply(200, json.dumps({"model_path": "instant", "weight_version": "default", "is_generation": True}).encode())
        elif path in ("/abort_request", "/pause_generation", "/continue_generation", "/flush_cache"):
            self._reply(200, b'{"success": true}')
        else:
            self._reply(404, b'{"error": "not found"}')

    def _chunk(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _reply(self, status: int, body: bytes) -> None:
        assert self.transport is not None
        self.transport.write(
            f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body
        )


def _generate_body(req: dict, ids: list[int], finish: dict | None) -> bytes:
    prompt = req.get("input_ids") or []
    meta: dict[str, Any] = {
        "id": req.get("rid") or "instant",
        "finish_reason": finish,
        "prompt_tokens": len(prompt),
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "weight_version": "default",
    }
    if req.get("return_logprob"):
        meta["output_token_logprobs"] = [[-0.25, t, None] for t in ids]
    return json.dumps({"text": "", "output_ids": ids, "meta_info": meta}).encode()


async def _serve_instant(reply_ids: list[int], port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _InstantEngine(reply_ids), "127.0.0.1", port)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


class InstantEngineProcess:
    """The instant engine in its own process group; ``stop`` signals that group only."""

    def __init__(self, reply_ids: list[int], cpu: int | None = None) -> None:
        cmd = [sys.executable, __file__, ",".join(map(str, reply_ids))]
        if cpu is not None:
            cmd += ["--cpu", str(cpu)]
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, start_new_session=True, text=True)
        assert self.popen.stdout is not None
        self.url = self.popen.stdout.readline().strip()
        if not self.url.startswith("http://"):
            self.stop()
            raise RuntimeError(f"instant engine did not start (exit {self.popen.poll()})")

    def stop(self) -> None:
        from areal.process import stop_group

        stop_group(self.popen, grace_s=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_instant_engine(reply_ids: list[int], cpu: int | None = None) -> InstantEngineProcess:
    return InstantEngineProcess(reply_ids, cpu)


def pin_to_cpu(argv: list[str]) -> list[str]:
    """``--cpu N`` in ``argv``: pin this process to CPU N; returns ``argv`` without it."""
    if "--cpu" in argv:
        i = argv.index("--cpu")
        os.sched_setaffinity(0, {int(argv[i + 1])})
        argv = argv[:i] + argv[i + 2 :]
    return argv


if __name__ == "__main__":
    from areal.aio import run as run_loop

    args = pin_to_cpu(sys.argv[1:])
    run_loop(_serve_instant([int(x) for x in args[0].split(",")], 0))


def with_instant_engine(tok: Any, fn: Any) -> Any:
    """``fn(engine_client)`` (a coroutine function) run against a fresh instant engine for ``tok``,
    on a loop of its own; the engine and its client are closed after."""
    from areal.engine.client import EngineClient

    async def go() -> Any:
        runner = await start_instant_engine(tok)
        engine = EngineClient(f"http://127.0.0.1:{runner.addresses[0][1]}")
        try:
            return await fn(engine)
        finally:
            await engine.close()
            await runner.cleanup()

    return asyncio.run(go())
