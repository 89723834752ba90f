"""Gateway overhead: added latency per call against calling the engine directly, requests/s per
core, and the CPU cost of building prompts for a 200-turn episode. Every figure has a same-run
baseline.

    client ──ZeroMQ DEALER / HTTP──► gateway process ──HTTP /generate──► engine process
    client ──────────────────────────HTTP /generate──────────────────────► engine process  (baseline)

- Latency: sequential calls through the gateway (ZeroMQ and HTTP front doors) and straight to
  the engine with the same prompt, the three taking turns call by call. "added p50" is the
  gateway's p50 minus the direct p50; "added p99" is the p99 of per-call differences (each
  gateway call minus the direct call made just before it). Run against the instant engine
  (below) and against the embedded CPU engine (greedy, 8 tokens). All three paths use blocking
  clients of a few µs each (a raw keep-alive HTTP socket, a blocking DEALER), so the difference
  is the gateway's, not the client libraries': with aiohttp's client on the direct path, ~200 µs
  of client CPU inflated the baseline. The blocking DEALER waits for replies in ``poll()``, as
  the relay's event loop does: blocked in ``recv()`` on the Unix socket it was also woken each
  time the gateway read a request (``areal.zmtp.Dealer``), which cost ~12 µs a call that no
  agent pays. With the instant engine, the gateway process's CPU per
  call (all its threads, from /proc schedstat in ns) is reported too, against the engine's CPU
  per direct call. Transport floors take turns with the rest: a request-sized message to an echo
  server and back over the gateway's own ZMTP code (``areal.zmtp`` at both ends), over libzmq at
  both ends, and over TCP. A gateway call makes the ZeroMQ hop on top of the TCP hop a direct
  call makes, so no gateway can add less than the ZMTP echo. On this 2-vCPU KVM guest, where
  waking a thread on an idle vCPU costs ~20 µs, libzmq's echo measured 120-240 µs p50 (each
  message crosses an I/O thread on each side) and the ZMTP echo 62-71 µs (uvloop). The ZeroMQ
  door is also timed through libzmq's own DEALER (the "with libzmq's client" row), and through
  a second gateway process with its core taken out (``_serve_gateway(core="none")``: the door, a
  task, one ``/generate`` over the engine client, a fixed reply): the "plumbing only" row, so the
  added latency splits into plumbing and core in the same run. A third gateway process takes the
  engine client out as well (``core="raw"``: a prebuilt ``/generate`` written and its answer read
  on one connection): the "door + raw engine exchange" row is the floor under this gateway's
  request path (its door, a task, one engine exchange). Unpinned it added 101-194 µs in the runs
  of 2026-11-21 (118 µs in a quick bench where the full gateway added 238 and plumbing only 129),
  so on this path little or nothing is left of the 150 µs target for the engine client and core.
- Where the time goes, as measured (2 vCPUs, idle machine): the three processes of a call run
  one after the other, mostly on one vCPU (each write wakes the next process on the writer's
  CPU), so the latency a gateway adds is about its own CPU per call, user plus kernel. With the
  instant engine that was ~210-230 µs of gateway CPU per call: ~80 µs in the kernel (two reads,
  two writes, two epoll waits, the context switches; the TCP send to the engine alone ~20 µs),
  and in user space the core's Python run cold between calls (the same code warm, in a loop,
  costs 26-46 µs) plus the loop, ZMTP and HTTP plumbing. Gateway variants timed in turns against
  one engine (client on vCPU 0, the rest on vCPU 1; medians of 4 rounds of 1,500 calls, added
  latency / gateway CPU per call): the door alone, answering without an engine call, -27 µs /
  69 µs; door + a raw HTTP exchange with the engine +79 / 113; door + the engine client (decode
  included) +117 / 134; the full gateway +201 / 227. All processes run on uvloop
  (``areal.utils.aio``), ~20-30 µs better than asyncio's loop. Tried without gain in such A/B
  runs: ``gc.freeze()``, a busy-polling loop (pinned or not), pinning the gateway alone, glibc
  malloc on transparent huge pages, and the gateway's modules compiled to C with Cython (within
  ±10 µs: the cost is the work itself, allocations, library calls and cold caches, not bytecode
  dispatch). Debian's statically linked python3.11 ran the same gateway 19-28 µs faster than
  this venv's pyenv build (shared libpython).
- Placement: unpinned, the scheduler now and then wakes a process on the other, idle vCPU, which
  costs tens of µs on this guest (halt polling off); a gateway call has four wake-ups where a
  direct call has two, so the unpinned figure carries more of that and swings by ±30 µs between
  runs. ``one_vcpu_rows`` pins all three processes to one vCPU and measures again in the same
  run (~150 µs added where unpinned gave ~245 in one run): the gap is placement, not work.
- Requests/s on one core: several client processes keep the gateway busy; the figure is calls
  answered per CPU-second of the gateway process (read from /proc, every thread), so other load on this shared
  2-core machine does not count against it. Baseline: the instant engine's own calls per
  CPU-second serving the same load directly.
- Prompt building: 200 turns of one episode, each turn's prompt built incrementally on the
  parent's recorded tokens (``PromptBuilder.build``) vs rendering and tokenising the whole
  history every turn, as AReaL does. CPU time in total per episode, the least of 3 (see
  ``prompt_building_rows``).

The instant engine is a stand-in that speaks SGLang's ``/generate`` (non-streamed and cumulative
SSE streams, ``output_token_logprobs``, finish reasons) with a fixed reply and no model, written
on raw asyncio so that it costs far less per call than the gateway it measures. Tests use it too
(``launch_instant_engine``).

    python -m benchmarks.run gateway [--quick]
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from areal.utils.aio import run as run_loop

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
        "id": req.get("rid") or "instant", "finish_reason": finish, "prompt_tokens": len(prompt),
        "completion_tokens": len(ids), "cached_tokens": 0, "weight_version": "default",
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
        cmd = [sys.executable, "-m", "benchmarks.gateway", "instant-engine", ",".join(map(str, reply_ids))]
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

    def __enter__(self) -> InstantEngineProcess:
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
    gateway = Gateway(EngineClient(engine_url), tokenizer, GatewayConfig(session_idle_s=0))
    if core == "none":
        prompt_ids = _prompt_ids()
        params = {"max_new_tokens": 64, "temperature": 0.0, "top_p": 1.0, "stop_token_ids": gateway.stop_token_ids}

        async def engine_only(req: Any) -> Reply:
            result = await gateway.engine.generate(prompt_ids, params, return_logprob=True)
            return Reply(status=200, body={"completion_tokens": len(result.output_ids)})

        gateway.dispatch = engine_only  # type: ignore[method-assign]  (this process only)
    elif core == "raw":
        from areal.engine.client import _Answer  # the engine client's connection, without the client

        url = urllib.parse.urlsplit(engine_url)
        body = _engine_body(_prompt_ids(), 64)
        head = (f"POST /generate HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: _Answer(loop), url.hostname, url.port)

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
        cmd = [sys.executable, "-m", "benchmarks.gateway", "gateway", engine_url, self.ipc_dir, core]
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


# ---- clients ---------------------------------------------------------------------------------

MESSAGES = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}]


def _chat_body(max_tokens: int) -> bytes:
    return json.dumps({"model": "m", "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0.0}).encode()


class ZmqClient:
    def __init__(self, address: str, key: str, body: bytes) -> None:
        import msgspec
        import zmq
        import zmq.asyncio

        from areal.protocol import GatewayMessage, GatewayRequest

        self.sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.decoder = msgspec.msgpack.Decoder(GatewayMessage)
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        self.payload = msgspec.msgpack.encode(GatewayRequest(request_id=1, method="POST", path="/v1/chat/completions", headers=headers, body=body))

    async def call(self) -> None:
        await self.sock.send(self.payload)
        while True:
            reply = self.decoder.decode(await self.sock.recv())
            assert reply.status == 200, reply.body[:300]
            if not reply.more:
                return

    async def aclose(self) -> None:
        self.sock.close(0)


class HttpClient:
    def __init__(self, url: str, body: bytes, key: str | None = None) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession()
        self.url, self.body = url, body
        self.headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {key}"} if key else {})

    async def call(self) -> None:
        async with self.session.post(self.url, data=self.body, headers=self.headers) as resp:
            data = await resp.read()
            assert resp.status == 200, data[:300]

    async def aclose(self) -> None:
        await self.session.close()


def _engine_body(prompt_ids: list[int], max_tokens: int) -> bytes:
    params = {"max_new_tokens": max_tokens, "temperature": 0.0}
    return json.dumps({"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True}).encode()


class BlockingHttpClient:
    """HTTP/1.1 keep-alive POST on a plain blocking socket: a few µs of client CPU per call, so
    that latency rows compare the servers, not client libraries (aiohttp's client alone spent
    ~200 µs of CPU per call, which inflated the direct baseline)."""

    def __init__(self, url: str, body: bytes, key: str | None = None) -> None:
        import socket
        import urllib.parse

        u = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((u.hostname, u.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        auth = f"authorization: Bearer {key}\r\n" if key else ""
        self.request = (f"POST {u.path} HTTP/1.1\r\nhost: {u.hostname}:{u.port}\r\ncontent-type: application/json\r\n"
                        f"{auth}content-length: {len(body)}\r\n\r\n").encode() + body
        self.buf = b""

    def call(self) -> None:
        self.sock.sendall(self.request)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self.buf += self.sock.recv(65536)
        head = self.buf[:end].decode("latin-1").lower()
        assert head.startswith("http/1.1 200"), head
        length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
        while len(self.buf) < end + 4 + length:
            self.buf += self.sock.recv(65536)
        self.buf = self.buf[end + 4 + length:]

    def close(self) -> None:
        self.sock.close()


class BlockingZmqClient:
    """A blocking DEALER: send one GatewayRequest, receive frames until ``more`` is false.
    ``libzmq=False`` (the default) is ``areal.zmtp.Dealer``, the protocol code the sandbox relay
    uses; ``libzmq=True`` is a pyzmq socket, for the row that shows what libzmq's own client
    costs on top."""

    def __init__(self, address: str, key: str, body: bytes, libzmq: bool = False) -> None:
        import msgspec

        from areal.protocol import GatewayMessage, GatewayRequest

        self.decoder = msgspec.msgpack.Decoder(GatewayMessage)
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        self.payload = msgspec.msgpack.encode(GatewayRequest(request_id=1, method="POST", path="/v1/chat/completions",
                                                             headers=headers, body=body))
        if libzmq:
            import zmq

            self.sock = zmq.Context.instance().socket(zmq.DEALER)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.connect(address)
            self.recv = self.sock.recv
        else:
            from areal.zmtp import Dealer

            self.sock = Dealer(address)
            self.recv = lambda: self.sock.recv()[0]

    def call(self) -> None:
        self.sock.send(self.payload)
        while True:
            reply = self.decoder.decode(self.recv())
            assert reply.status == 200, reply.body[:300]
            if not reply.more:
                return

    def close(self) -> None:
        if hasattr(self.sock, "setsockopt"):
            self.sock.close(0)
        else:
            self.sock.close()


# ---- transport floors: the same hops with no gateway and no engine ------------------------------


def _serve_echo(kind: str, address: str) -> None:
    """A blocking echo server: ``zmq`` is a libzmq ROUTER (the gateway's socket type) answering
    each DEALER message with itself, ``zmtp`` the same on ``areal.zmtp``'s asyncio ROUTER (the
    gateway's own front door); ``tcp`` echoes bytes on a TCP_NODELAY connection. Prints its
    address once it listens."""
    import socket

    import zmq

    if kind == "zmtp":  # this project's ROUTER, on an event loop like the gateway's
        from areal.zmtp import Router

        async def serve() -> None:
            await Router.bind(address, lambda peer, frames: peer.send(frames[0]))
            print(address, flush=True)
            await asyncio.get_running_loop().create_future()

        run_loop(serve())
    if kind == "zmq":
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.bind(address)
        print(address, flush=True)
        while True:
            sock.send_multipart(sock.recv_multipart())
    listener = socket.create_server(("127.0.0.1", 0))
    print(f"127.0.0.1:{listener.getsockname()[1]}", flush=True)
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := conn.recv(1 << 16):
        conn.sendall(data)


class EchoProcess:
    """An echo server (``_serve_echo``) in its own process group, and a blocking client whose
    ``call`` sends ``size`` bytes and waits for all of them to come back."""

    def __init__(self, kind: str, size: int) -> None:
        import socket

        import zmq

        self.tmp = tempfile.mkdtemp(prefix="gwecho-")
        cmd = [sys.executable, "-m", "benchmarks.gateway", "echo", kind, f"ipc://{self.tmp}/echo.sock"]
        root = Path(__file__).resolve().parent.parent
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, cwd=root, start_new_session=True, text=True)
        assert self.popen.stdout is not None
        address = self.popen.stdout.readline().strip()
        self.payload = b"x" * size
        if kind == "zmq":
            self.sock = zmq.Context.instance().socket(zmq.DEALER)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.connect(address)
            self.call = self._call_zmq
        elif kind == "zmtp":
            from areal.zmtp import Dealer

            self.dealer = Dealer(address)
            self.call = self._call_zmtp
        else:
            host, port = address.rsplit(":", 1)
            self.conn = socket.create_connection((host, int(port)))
            self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.call = self._call_tcp

    def _call_zmq(self) -> None:
        self.sock.send(self.payload)
        self.sock.recv()

    def _call_zmtp(self) -> None:
        self.dealer.send(self.payload)
        self.dealer.recv()

    def _call_tcp(self) -> None:
        self.conn.sendall(self.payload)
        got = 0
        while got < len(self.payload):
            got += len(self.conn.recv(1 << 16))

    def close(self) -> None:
        from areal.process import stop_group

        if hasattr(self, "sock"):
            self.sock.close(0)
        elif hasattr(self, "dealer"):
            self.dealer.close()
        else:
            self.conn.close()
        stop_group(self.popen, grace_s=5)
        for name in os.listdir(self.tmp):
            os.unlink(os.path.join(self.tmp, name))
        os.rmdir(self.tmp)


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


_FLOORS = {
    "zmtp": "the hop a gateway call adds, on the gateway's own ZMTP code at both ends (the least it could add)",
    "zmq": "the same hop through libzmq at both ends (an I/O thread on each side)",
    "tcp": "the hop both paths make to the engine",
}


def take_turns(clients: dict[str, Any], n: int, warmup: int = 10) -> dict[str, list[float]]:
    """Seconds per call of each client, over ``n`` rounds in which every client makes one call
    in turn (after ``warmup`` untimed calls each), so all of them share the same background."""
    for client in clients.values():
        for _ in range(warmup):
            client.call()
    lat: dict[str, list[float]] = {k: [] for k in clients}
    for _ in range(n):
        for name, client in clients.items():
            t0 = time.perf_counter()
            client.call()
            lat[name].append(time.perf_counter() - t0)
    return lat


def latency_rows(engine: str, engine_url: str, gateway: GatewayProcess, prompt_ids: list[int], n: int, max_tokens: int,
                 engine_pid: int | None = None, floors: bool = False) -> list[dict]:
    """Latency added per call over ZeroMQ and HTTP against direct engine calls, and (with
    ``engine_pid``) CPU per call of the gateway process against the engine's per direct call.

    Latency: the three clients take turns call by call (direct, zmq, http, direct, ...), so each
    gateway call has a direct call made just before it under the same background load. "added
    p50" is the gateway's p50 minus the direct p50; "added p99" is the p99 of the per-call
    differences (gateway call minus the direct call paired with it): a difference of two p99s
    is not an added latency, and under noise it even came out negative.
    CPU: in blocks of calls per door, from /proc/<pid>/task/*/schedstat (ns, every thread of the
    process, ZeroMQ's I/O thread included); clock-tick counters were too coarse for the engine.
    Floors (``floors``): the round trip of a request-sized message to a ZeroMQ ROUTER echo and to
    a TCP echo, taking turns with the rest. A gateway call over ZeroMQ makes both hops (client to
    gateway, gateway to engine) where a direct call makes the TCP one, so the ZeroMQ echo is the
    least any gateway could add on this machine before doing any work.
    """
    clients = {
        "direct": BlockingHttpClient(engine_url + "/generate", _engine_body(prompt_ids, max_tokens)),
        "zmq": BlockingZmqClient(gateway.zmq, gateway.key, _chat_body(max_tokens)),
        "http": BlockingHttpClient(gateway.http + "/v1/chat/completions", _chat_body(max_tokens), gateway.key),
    }
    echoes: dict[str, EchoProcess] = {}
    stripped: dict[str, GatewayProcess] = {}  # client name -> gateway with parts taken out
    try:
        if floors:
            echoes = {f"{kind} echo": EchoProcess(kind, len(_chat_body(max_tokens))) for kind in _FLOORS}
            clients.update(echoes)
            # the same gateway door through libzmq's own DEALER instead of areal.zmtp's
            clients["zmq libzmq"] = BlockingZmqClient(gateway.zmq, gateway.key, _chat_body(max_tokens), libzmq=True)
            for name, core in (("zmq no core", "none"), ("zmq raw exchange", "raw")):
                stripped[name] = GatewayProcess(engine_url, core=core)
                clients[name] = BlockingZmqClient(stripped[name].zmq, stripped[name].key, _chat_body(max_tokens))
        lat = take_turns(clients, n)
    finally:
        for name in ("zmq libzmq", *stripped):
            if name in clients:
                clients.pop(name).close()
        for name, echo in echoes.items():  # an echo is its own client
            clients.pop(name, None)
            echo.close()
        for process in stripped.values():
            process.stop()
    rows = []
    direct50, direct99 = _p(lat["direct"], 0.5) * 1e6, _p(lat["direct"], 0.99) * 1e6
    for door in ("zmq", "http"):
        rows.append({"benchmark": "gateway", "metric": f"added p50 {door}, {engine} engine", "value": _p(lat[door], 0.5) * 1e6 - direct50,
                     "unit": "us", "baseline": f"direct {engine} p50", "baseline_value": direct50})
    for door in ("zmq", "http"):
        paired = [g - d for g, d in zip(lat[door], lat["direct"])]
        rows.append({"benchmark": "gateway", "metric": f"added p99 {door}, {engine} engine", "value": _p(paired, 0.99) * 1e6,
                     "unit": "us", "baseline": f"direct {engine} p99", "baseline_value": direct99,
                     "note": "p99 of per-call differences, each gateway call minus the direct call just before it"})
    for kind, note in _FLOORS.items() if floors else ():
        rows.append({"benchmark": "gateway", "metric": f"{kind} echo round trip p50 (transport floor)",
                     "value": _p(lat[f"{kind} echo"], 0.5) * 1e6, "unit": "us", "baseline": f"direct {engine} p50",
                     "baseline_value": direct50,
                     "note": "a request-sized message to an echo server and back, no gateway, no engine: " + note})
    if floors:
        rows.append({"benchmark": "gateway", "metric": f"added p50 zmq with libzmq's client, {engine} engine",
                     "value": _p(lat["zmq libzmq"], 0.5) * 1e6 - direct50, "unit": "us",
                     "baseline": f"direct {engine} p50", "baseline_value": direct50,
                     "note": "the ZeroMQ door called through a pyzmq DEALER instead of areal.zmtp's"})
        rows.append({"benchmark": "gateway", "metric": f"added p50 zmq, plumbing only (no core), {engine} engine",
                     "value": _p(lat["zmq no core"], 0.5) * 1e6 - direct50, "unit": "us",
                     "baseline": f"direct {engine} p50", "baseline_value": direct50,
                     "note": "a gateway process with its core taken out: the ZMTP door, a task, one /generate over "
                             "the engine client, a fixed reply; the rest of 'added p50 zmq' is the core's"})
        rows.append({"benchmark": "gateway", "metric": f"added p50 zmq, door + raw engine exchange, {engine} engine",
                     "value": _p(lat["zmq raw exchange"], 0.5) * 1e6 - direct50, "unit": "us",
                     "baseline": f"direct {engine} p50", "baseline_value": direct50,
                     "note": "a gateway process with its core and its engine client taken out: the ZMTP door, a task, "
                             "a prebuilt /generate written and its answer read on one connection, a fixed reply: the "
                             "least this door adds while making the engine call"})
    if engine_pid is not None:
        cpu = {}
        for name, client in clients.items():
            pid = engine_pid if name == "direct" else gateway.popen.pid
            cpu0 = proc_cpu_ns(pid)
            for _ in range(n):
                client.call()
            cpu[name] = (proc_cpu_ns(pid) - cpu0) / n / 1e3
        for door in ("zmq", "http"):
            rows.append({"benchmark": "gateway", "metric": f"gateway CPU per call, {door}, {engine} engine", "value": cpu[door],
                         "unit": "us CPU", "baseline": f"{engine} engine CPU per direct call", "baseline_value": cpu["direct"]})
    for client in clients.values():
        client.close()
    return rows


def _threads(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def one_vcpu_rows(engine: str, engine_url: str, gateway: GatewayProcess, engine_pid: int, prompt_ids: list[int], n: int,
                  max_tokens: int) -> list[dict]:
    """Added latency with the client, the gateway and the engine pinned to one vCPU, direct and
    ZeroMQ calls taking turns; every thread's affinity is put back afterwards.

    Unpinned, the three processes of a gateway call mostly run one after another on one vCPU, but
    now and then the scheduler wakes one on the other, idle vCPU. On this KVM guest (guest halt
    polling off) such a wake-up costs tens of µs, and a gateway call has four wake-ups where a
    direct call has two, so the unpinned figure carries more of that cost and swings from run to
    run. Pinned, no call wakes another vCPU: what is left is the gateway's own cost (its CPU,
    user and kernel). This row is the same-run measure of that part, next to the unpinned one.
    """
    pids = (os.getpid(), gateway.popen.pid, engine_pid)
    saved = {tid: os.sched_getaffinity(tid) for pid in pids for tid in _threads(pid)}
    cpu = min(os.sched_getaffinity(0))
    clients = {"direct": BlockingHttpClient(engine_url + "/generate", _engine_body(prompt_ids, max_tokens)),
               "zmq": BlockingZmqClient(gateway.zmq, gateway.key, _chat_body(max_tokens))}
    try:
        for tid in saved:
            os.sched_setaffinity(tid, {cpu})
        lat = take_turns(clients, n)
    finally:
        for tid, cpus in saved.items():
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
        for client in clients.values():
            client.close()
    direct50 = _p(lat["direct"], 0.5) * 1e6
    return [{"benchmark": "gateway", "metric": f"added p50 zmq, all on one vCPU, {engine} engine",
             "value": _p(lat["zmq"], 0.5) * 1e6 - direct50, "unit": "us", "baseline": f"direct {engine} p50, one vCPU",
             "baseline_value": direct50,
             "note": "client, gateway and engine pinned to one vCPU: no call wakes a process on another vCPU "
                     "(one_vcpu_rows); the unpinned row is the headline"}]


def _load_client(door: str, url: str, key: str | None, body: bytes, concurrency: int, start_at: float, stop_at: float,
                 queue: Any) -> None:
    """Closed-loop load from ``start_at`` to ``stop_at`` (wall clock); puts the calls answered."""

    async def go() -> int:
        # one DEALER carries one request at a time in ZmqClient: one client per worker
        clients = [ZmqClient(url, key or "", body) if door == "zmq" else HttpClient(url, body, key) for _ in range(concurrency)]
        await clients[0].call()  # connect before the clock starts
        await asyncio.sleep(max(0.0, start_at - time.time()))
        done = 0

        async def worker(client: Any) -> None:
            nonlocal done
            while time.time() < stop_at:
                await client.call()
                done += 1

        await asyncio.gather(*(worker(c) for c in clients))
        for c in clients:
            await c.aclose()
        return done

    queue.put(asyncio.run(go()))


def proc_cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process so far, in ns (``/proc/<pid>/task/*/schedstat``: exact,
    where ``/proc/<pid>/stat`` counts clock ticks of 10 ms). A thread that exits meanwhile drops
    out of the sum; the processes measured here keep theirs."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # the thread ended between listing and reading
            pass
    return total


def throughput(door: str, url: str, key: str | None, body: bytes, server_pid: int, seconds: float, clients: int = 3) -> tuple[float, float]:
    """(calls per CPU-second of the server process, calls per wall second) under a closed-loop load."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start_at = time.time() + 4.0  # after the clients' spawn and imports
    procs = [ctx.Process(target=_load_client, args=(door, url, key, body, 16, start_at, start_at + seconds, queue))
             for _ in range(clients)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = proc_cpu_ns(server_pid)
    time.sleep(seconds)
    cpu1 = proc_cpu_ns(server_pid)
    total = sum(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    return total / max((cpu1 - cpu0) / 1e9, 1e-9), total / seconds


# ---- prompt building for a long episode --------------------------------------------------------


def prompt_building_rows(turns: int, repeats: int = 1) -> list[dict]:
    """CPU time to build every prompt of a ``turns``-turn episode: incremental vs full re-render.

    Each way is timed ``repeats`` times, interleaved, after an untimed 10-turn warm-up of both;
    the figure is the least of each way's times (as ``timeit`` reports): CPU time is inflated by
    whatever else shares the caches and cores, which on this shared 2-core machine varied the
    same code between 24 and 45 ms from run to run, and the least is the best estimate of the
    code's own cost. Both ways get the same number of repeats, so the ratio stays fair."""
    from transformers import AutoTokenizer

    from areal.embedded import ensure_embedded_model
    from areal.gateway.render import PromptBuilder, PromptIndex
    from areal.gateway.tree import Interaction

    tok = AutoTokenizer.from_pretrained(ensure_embedded_model())
    tok.model_max_length = 1 << 30  # a 200-turn history passes the model's context; only its length is measured here
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    builder = PromptBuilder(tok, [im_end])
    reply_text = "The calculator says 42, so the answer is \\boxed{42}."
    reply_ids = tok.encode(reply_text, add_special_tokens=False) + [im_end]

    def episode(incremental: bool, turns: int) -> tuple[float, int]:
        index, interactions = PromptIndex(), {}
        messages: list[dict] = [{"role": "system", "content": "You are a helpful assistant."}]
        total_ids = 0
        t0 = time.process_time()
        for t in range(turns):
            messages.append({"role": "user", "content": f"Step {t}: what is {t} * 7 plus 3?"})
            if incremental:
                prompt = builder.build(index, interactions, messages, None)
                ids = prompt.ids
                inter = Interaction(id=f"i{t}", prompt_ids=ids, output_ids=reply_ids, output_logprobs=[0.0] * len(reply_ids),
                                    version=0, finish_reason="stop", created=0.0, parent_id=prompt.parent_id)
                interactions[inter.id] = inter
                reply = {"role": "assistant", "content": reply_text}
                builder.record(index, prompt, inter, reply)
            else:  # AReaL's way: the whole history through the chat template and the tokenizer
                ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"]
                reply = {"role": "assistant", "content": reply_text}
            total_ids += len(ids)
            messages.append(reply)
        elapsed = time.process_time() - t0
        if incremental:
            assert index.incremental == turns - 1, (index.incremental, index.drift)
        return elapsed, total_ids

    episode(True, 10)
    episode(False, 10)
    inc, full = float("inf"), float("inf")
    for _ in range(repeats):
        inc_s, inc_ids = episode(True, turns)
        full_s, full_ids = episode(False, turns)
        assert inc_ids == full_ids  # same prompts, token for token in length (equality is tested in tests/)
        inc, full = min(inc, inc_s), min(full, full_s)
    return [{"benchmark": "gateway", "metric": f"prompt building, {turns}-turn episode", "value": inc * 1e3, "unit": "ms CPU",
             "baseline": "full re-render every turn (apply_chat_template, as AReaL)", "baseline_value": full * 1e3}]


# ---- main ----------------------------------------------------------------------------------------


def _reply_ids() -> list[int]:
    from transformers import AutoTokenizer

    from areal.embedded import ensure_embedded_model

    tok = AutoTokenizer.from_pretrained(ensure_embedded_model())
    return tok.encode("He has 7 apples. The answer is \\boxed{7}.", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]


def _prompt_ids() -> list[int]:
    from transformers import AutoTokenizer

    from areal.embedded import ensure_embedded_model

    tok = AutoTokenizer.from_pretrained(ensure_embedded_model())
    return tok.encode(tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True), add_special_tokens=False)


def main(quick: bool) -> list[dict]:
    from areal.embedded import ensure_embedded_model
    from areal.engine.client import launch_embedded_engine

    rows: list[dict] = []
    prompt_ids = _prompt_ids()
    n = 200 if quick else 2000
    with launch_instant_engine(_reply_ids()) as engine:
        gateway = GatewayProcess(engine.url)
        try:
            rows += latency_rows("instant", engine.url, gateway, prompt_ids, n, max_tokens=64, engine_pid=engine.popen.pid,
                                 floors=True)
            rows += one_vcpu_rows("instant", engine.url, gateway, engine.popen.pid, prompt_ids, n, max_tokens=64)
            seconds = 3.0 if quick else 10.0
            gw_rate, gw_wall = throughput("zmq", gateway.zmq, gateway.key, _chat_body(64), gateway.popen.pid, seconds)
            eng_rate, eng_wall = throughput("http", engine.url + "/generate", None, _engine_body(prompt_ids, 64), engine.popen.pid, seconds)
            rows.append({"benchmark": "gateway", "metric": "requests/s per gateway core, zmq, instant", "value": gw_rate,
                         "unit": "req/s", "baseline": "instant engine, direct", "baseline_value": eng_rate})
            rows.append({"benchmark": "gateway", "metric": "requests/s wall, zmq, 3 clients, instant", "value": gw_wall,
                         "unit": "req/s", "baseline": "instant engine wall, direct", "baseline_value": eng_wall})
        finally:
            gateway.stop()
    embedded = launch_embedded_engine(str(ensure_embedded_model()))
    try:
        gateway = GatewayProcess(embedded.url)
        try:
            rows += latency_rows("embedded", embedded.url, gateway, prompt_ids, 20 if quick else 100, max_tokens=8)
        finally:
            gateway.stop()
    finally:
        embedded.stop()
    rows += prompt_building_rows(200, repeats=3)
    return rows


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
    elif args[:1] == ["echo"]:
        _serve_echo(args[1], args[2])
    else:
        for row in main(quick="--quick" in args):
            print(row)
