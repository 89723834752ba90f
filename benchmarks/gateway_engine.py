"""The gateway under test in its own process group, for the gateway benchmark. Its engine is the
instant engine of tests/support/instant_engine.py (``launch_instant_engine``: a stand-in that
speaks SGLang's ``/generate`` with a fixed reply and no model, at far less cost per call than the
gateway it measures).

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
from typing import Any

from instant_engine import pin_to_cpu

from areal.aio import run as run_loop
from benchmarks.gateway_clients import _engine_body, _prompt_ids

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


if __name__ == "__main__":
    args = pin_to_cpu(sys.argv[1:])
    if args[:1] == ["gateway"]:
        run_loop(_serve_gateway(args[1], args[2], args[3]))
    else:
        raise SystemExit(f"usage: python -m benchmarks.gateway_engine gateway ..., got {args}")
