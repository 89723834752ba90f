"""Clients and transport floors of the gateway benchmark: blocking clients of a few µs per call
(a raw keep-alive HTTP socket, a pyzmq DEALER) for the latency rows, asyncio clients for the load,
echo servers for the transport floors, and the turn-taking timer every latency row uses.

    python -m benchmarks.gateway_clients echo zmq|tcp ADDRESS
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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
        self.payload = msgspec.msgpack.encode(
            GatewayRequest(request_id=1, method="POST", path="/v1/chat/completions", headers=headers, body=body)
        )

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
        self.request = (
            f"POST {u.path} HTTP/1.1\r\nhost: {u.hostname}:{u.port}\r\ncontent-type: application/json\r\n"
            f"{auth}content-length: {len(body)}\r\n\r\n"
        ).encode() + body
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
        self.buf = self.buf[end + 4 + length :]

    def close(self) -> None:
        self.sock.close()


class BlockingZmqClient:
    """A blocking pyzmq DEALER: send one GatewayRequest, receive frames until ``more`` is false."""

    def __init__(self, address: str, key: str, body: bytes) -> None:
        import msgspec
        import zmq

        from areal.protocol import GatewayMessage, GatewayRequest

        self.decoder = msgspec.msgpack.Decoder(GatewayMessage)
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        self.payload = msgspec.msgpack.encode(
            GatewayRequest(request_id=1, method="POST", path="/v1/chat/completions", headers=headers, body=body)
        )
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def call(self) -> None:
        self.sock.send(self.payload)
        while True:
            reply = self.decoder.decode(self.sock.recv())
            assert reply.status == 200, reply.body[:300]
            if not reply.more:
                return

    def close(self) -> None:
        self.sock.close(0)


# ---- transport floors: the same hops with no gateway and no engine ------------------------------


def _serve_echo(kind: str, address: str) -> None:
    """A blocking echo server: ``zmq`` is a libzmq ROUTER (the gateway's socket type) answering
    each DEALER message with itself; ``tcp`` echoes bytes on a TCP_NODELAY connection. Prints its
    address once it listens."""
    import socket

    import zmq

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
        cmd = [sys.executable, "-m", "benchmarks.gateway_clients", "echo", kind, f"ipc://{self.tmp}/echo.sock"]
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
        else:
            host, port = address.rsplit(":", 1)
            self.conn = socket.create_connection((host, int(port)))
            self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.call = self._call_tcp

    def _call_zmq(self) -> None:
        self.sock.send(self.payload)
        self.sock.recv()

    def _call_tcp(self) -> None:
        self.conn.sendall(self.payload)
        got = 0
        while got < len(self.payload):
            got += len(self.conn.recv(1 << 16))

    def close(self) -> None:
        from areal.process import stop_group

        if hasattr(self, "sock"):
            self.sock.close(0)
        else:
            self.conn.close()
        stop_group(self.popen, grace_s=5)
        for name in os.listdir(self.tmp):
            os.unlink(os.path.join(self.tmp, name))
        os.rmdir(self.tmp)


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


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


if __name__ == "__main__":
    if sys.argv[1:2] != ["echo"]:
        raise SystemExit(f"usage: python -m benchmarks.gateway_clients echo zmq|tcp ADDRESS, got {sys.argv[1:]}")
    _serve_echo(sys.argv[2], sys.argv[3])
