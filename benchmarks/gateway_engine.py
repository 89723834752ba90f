"""The processes the gateway benchmark runs: the instant engine (a stand-in that speaks SGLang's
``/generate``: non-streamed and cumulative SSE streams, ``output_token_logprobs``, finish reasons,
with a fixed reply and no model, on raw asyncio so that it costs far less per call than the
gateway it measures; tests use it too) and the gateway under test, each in its own process group.

    python -m benchmarks.gateway_engine instant-engine IDS [--cpu N]
    python -m benchmarks.gateway_engine gateway ENGINE_URL IPC_DIR full|none|raw [--cpu N]
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any, Self

from areal.aio import run as run_loop
from benchmarks.gateway_clients import _engine_body, _prompt_ids

# ---- the instant engine ----------------------------------------------------------------------

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
        cmd = [sys.executable, "-m", "benchmarks.gateway_engine", "instant-engine", ",".join(map(str, reply_ids))]
        if cpu is not None:
            cmd += ["--cpu", str(cpu)]
        root = Path(__file__).resolve().parent.parent
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, cwd=root, start_new_session=True, text=True)
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


# ---- the gateway under test, in its own process -------------------------------------------


async def _serve_gateway(engine_url: str, ipc_dir: str, core: str = "full") -> None:
    """A gateway serving ZeroMQ and HTTP; prints its addresses and a session key, then serves.

    ``core="none"`` keeps the front doors and the engine client and takes the gateway's core out:
    every request makes one ``/generate`` call with the benchmark's prompt ids and the params a
    real request sends, and is answered with a small fixed body. Timed next to the full gateway,
    it splits the added latency into the plumbing (ZMTP door, task, HTTP hop to the engine, on
    this loop) and the core (parsing, validation, the prompt, tool parsing, recording, the reply).

    ``core="raw"`` takes the engine client out too: each request writes a prebuilt ``/generate``
    request on one keep-alive connection and reads the answer's bytes (the engine client's
    connection protocol, nothing above it), one request at a time as the latency rows send them.
    That is the least this gateway's door can add while still making the engine call, measured
    in the same run.
    """
    from transformers import AutoTokenizer

    from areal.embedded import ensure_embedded_model
    from areal.engine.client import EngineClient
    from areal.gateway import Gateway, GatewayConfig, serve_http, serve_zmq
    from areal.gateway.contract import Reply

    tokenizer = AutoTokenizer.from_pretrained(ensure_embedded_model())
    # one session carries the whole benchmark: no lifetime budgets
    gateway = Gateway(
        EngineClient(engine_url),
        tokenizer,
        GatewayConfig(session_idle_s=0, max_inflight_per_session=1024, max_calls_per_session=0, max_sampled_tokens_per_session=0),
    )
    if core == "none":
        prompt_ids = _prompt_ids()
        params = {"max_new_tokens": 64, "temperature": 0.0, "top_p": 1.0, "stop_token_ids": gateway.stop_token_ids}

        async def engine_only(req: Any) -> Reply:
            result = await gateway.engine.generate(prompt_ids, params, return_logprob=True)
            return Reply(status=200, body={"completion_tokens": len(result.output_ids)})

        gateway.dispatch = engine_only  # type: ignore[method-assign]  (this process only)
    elif core == "raw":
        from areal.engine.http1 import Connection  # the engine client's connection, without the client

        url = urllib.parse.urlsplit(engine_url)
        body = _engine_body(_prompt_ids(), 64)
        head = (
            f"POST /generate HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: Connection(loop), url.hostname, url.port)

        async def raw_exchange(req: Any) -> Reply:
            try:
                status, answer = await conn.send(head, body)
            finally:
                conn.waiter = None
            return Reply(status=200, body={"engine_status": status, "engine_bytes": len(answer)})

        gateway.dispatch = raw_exchange  # type: ignore[method-assign]  (this process only)
    elif core != "full":
        raise ValueError(f"core must be 'full', 'none' or 'raw', got {core!r}")
    runner, http_url = await serve_http(gateway)
    address = f"ipc://{ipc_dir}/gateway.sock"
    ready = asyncio.Event()
    server = asyncio.ensure_future(serve_zmq(gateway, address, ready))
    await ready.wait()
    print(json.dumps({"http": http_url, "zmq": address, "key": gateway.open_session("bench")}), flush=True)
    try:
        await server
    finally:
        await runner.cleanup()


class GatewayProcess:
    """A gateway serving ZeroMQ and HTTP in its own process group, with one open session."""

    def __init__(self, engine_url: str, cpu: int | None = None, core: str = "full") -> None:
        self.ipc_dir = tempfile.mkdtemp(prefix="gwbench-")
        cmd = [sys.executable, "-m", "benchmarks.gateway_engine", "gateway", engine_url, self.ipc_dir, core]
        if cpu is not None:
            cmd += ["--cpu", str(cpu)]
        root = Path(__file__).resolve().parent.parent
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, cwd=root, start_new_session=True, text=True)
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        if not line.startswith("{"):
            self.stop()
            raise RuntimeError(f"gateway did not start (exit {self.popen.poll()})")
        info = json.loads(line)
        self.http, self.zmq, self.key = info["http"], info["zmq"], info["key"]

    def stop(self) -> None:
        from areal.process import stop_group

        stop_group(self.popen, grace_s=5)
        for name in os.listdir(self.ipc_dir):
            os.unlink(os.path.join(self.ipc_dir, name))
        os.rmdir(self.ipc_dir)


def _pin(argv: list[str]) -> list[str]:
    if "--cpu" in argv:
        i = argv.index("--cpu")
        os.sched_setaffinity(0, {int(argv[i + 1])})
        argv = argv[:i] + argv[i + 2 :]
    return argv


if __name__ == "__main__":
    args = _pin(sys.argv[1:])
    if args[:1] == ["instant-engine"]:
        run_loop(_serve_instant([int(x) for x in args[1].split(",")], 0))
    elif args[:1] == ["gateway"]:
        run_loop(_serve_gateway(args[1], args[2], args[3]))
    else:
        raise SystemExit(f"usage: python -m benchmarks.gateway_engine instant-engine|gateway ..., got {args}")
