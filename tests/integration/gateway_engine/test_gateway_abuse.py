"""An episode cannot starve the gateway (issue 18, item 6): one test per way an episode tried.

Real sockets and real processes throughout: the abusers are separate processes (a sandboxed
episode is one, and the gateway tells peers apart by their pid), the healthy client is the
sandbox relay's own ``GatewayChannel`` on the gateway's ipc:// socket, and the gateway is real,
over the embedded engine. Each test shows a healthy request still answered correctly while the
abuse is going on, and fails on a gateway without the budgets (it exhausted its fds, held
partial frames for as long as the episode liked, tokenised a multi-MiB prompt on its loop and
cached it, and did not answer deep JSON over ZeroMQ at all). The abusers speak raw ZMTP
(``raw_zmtp``): libzmq's own DEALER never sends what they send.

Covered: idle connections up to the fd limit (a gateway process at nofile=1024), partial frames
held on many connections (closed by the door's heartbeat), a never-ending multipart message from
a session (cut by the door's memory guard, the gateway's memory bounded), a session over its
requests in flight or its connections, a multi-MiB prompt (refused from its length; tokenised off
the loop where its length alone cannot refuse it) and the render cache after the sessions close,
JSON nested 5,000 levels over HTTP and ZeroMQ (and msgpack nested as deep in a ZeroMQ frame).
Not covered: many abusive processes at once (the door-wide caps), an endless message behind a
request in flight (tests/integration/gateway_door/test_gateway_door.py), and CPU fairness.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from gateway_harness import GatewayThread, wait_for
from paths import ROOT, support_env
from raw_zmtp import PeakMemory, RawDealer, frame_header
from transformers import AutoTokenizer

from areal.protocol import GatewayMessage, GatewayReply, GatewayRequest
from sandbox.relay import GatewayChannel

QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"


# ---- clients --------------------------------------------------------------------------------------


def _chat_body(content: str, max_tokens: int = 8) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0.0}
    ).encode()


async def _relay(channel: GatewayChannel, key: str, body: bytes, path: str = "/v1/chat/completions", method: str = "POST") -> GatewayReply:
    """One request through the relay's channel; its last reply (bounded: a gateway that never
    answers fails the test instead of hanging it)."""

    async def last() -> GatewayReply:
        replies = [r async for r in channel.request(method, path, {"authorization": f"Bearer {key}"}, body)]
        return replies[-1]

    return await asyncio.wait_for(last(), 60)


def _relay_once(address: str, key: str, body: bytes, path: str = "/v1/chat/completions", method: str = "POST") -> GatewayReply:
    async def go() -> GatewayReply:
        channel = GatewayChannel(address, connect_timeout_s=5.0)
        try:
            return await _relay(channel, key, body, path, method)
        finally:
            channel.close()

    return asyncio.run(go())


def _assert_answered_correctly(reply: GatewayReply, interactions: list, tokenizer: Any, content: str = QUESTION) -> None:
    """A 200 whose usage matches the recorded interaction, whose prompt is the template's render."""
    assert reply.status == 200, reply.body
    body = json.loads(reply.body)
    (inter,) = [i for i in interactions if i.id == body["id"]]
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)
    assert inter.prompt_ids == tokenizer.encode(text, add_special_tokens=False)
    assert body["usage"]["prompt_tokens"] == len(inter.prompt_ids)
    assert body["usage"]["completion_tokens"] == len(inter.output_ids) >= 1


def _post_raw(url: str, body: bytes, key: str) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"content-type": "application/json", "authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# ---- abusers (separate processes: one episode each) -----------------------------------------------

_IDLE_CONNECTIONS = r"""
import resource, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 256), hard))
held, deadline = [], time.monotonic() + 60
while len(held) < n and time.monotonic() < deadline:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(path)
    except BlockingIOError:  # the listen backlog is full until the gateway accepts
        s.close()
        time.sleep(0.005)
        continue
    held.append(s)
print(f"opened {len(held)}", flush=True)
sys.stdin.read()  # hold every connection, idle, until the test closes stdin
"""

_PARTIAL_FRAMES = r"""
import select, socket, sys
from raw_zmtp import READY, frame_header, handshake
path, n, declared, sent = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
held, failed = [], 0
for _ in range(n):
    s = handshake(path)
    try:  # READY, then a frame that says `declared` bytes and stops after `sent`
        s.sendall(READY + frame_header(declared) + bytes(sent))
    except (BrokenPipeError, ConnectionResetError):
        failed += 1
    held.append(s)
print(f"sent {n}", flush=True)
for line in sys.stdin:  # "check": how many of the connections has the gateway closed?
    closed = 0
    for s in held:
        try:
            while select.select([s], [], [], 0)[0]:
                if not s.recv(1 << 16):
                    raise ConnectionResetError
        except (ConnectionResetError, BrokenPipeError, OSError):
            closed += 1
    print(f"closed {closed}", flush=True)
"""


def _abuser(script: str, *args: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=ROOT,
        env=support_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    """Close its stdin (it exits), else terminate it: by PID, never by name."""
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(timeout=10)


# ---- (a) idle connections up to the fd limit ------------------------------------------------------

_GATEWAY_PROCESS = r"""
import asyncio, logging, resource, sys
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))  # the common default a controller runs with
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
from transformers import AutoTokenizer
from areal.engine.client import EngineClient
from areal.gateway import Gateway, GatewayConfig, serve_http, serve_zmq
from areal.aio import run
engine_url, model_dir, address, admin_key = sys.argv[1:5]

async def main() -> None:
    gateway = Gateway(EngineClient(engine_url), AutoTokenizer.from_pretrained(model_dir), GatewayConfig(admin_key=admin_key))
    runner, url = await serve_http(gateway)
    ready = asyncio.Event()
    door = asyncio.ensure_future(serve_zmq(gateway, address, ready))
    await ready.wait()
    print(url, flush=True)
    await door

run(main())
"""


def test_idle_connections_from_one_episode_do_not_cut_off_another_session(engine_url: str, model_dir: Path, tmp_path: Path) -> None:
    """A gateway process at nofile=1024 (the controller's common limit) and one episode opening
    1,010 idle connections to its socket: another session's request through the relay is still
    answered, the gateway's fds stay far from the limit, and its log names the abuser's pid."""
    address = f"ipc://{tmp_path}/gateway.sock"
    admin_key = "sk-admin-" + "x" * 24
    log_path = tmp_path / "gateway.log"
    with open(log_path, "w") as log_file:
        gateway = subprocess.Popen(
            [sys.executable, "-c", _GATEWAY_PROCESS, engine_url, str(model_dir), address, admin_key],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )
    abuser = None
    try:
        assert gateway.stdout is not None
        url = gateway.stdout.readline().strip()
        assert url.startswith("http://"), f"the gateway did not start: {log_path.read_text()}"
        req = urllib.request.Request(
            url + "/admin/sessions",
            data=json.dumps({"episode_id": "healthy"}).encode(),
            method="POST",
            headers={"authorization": f"Bearer {admin_key}"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            key = json.loads(resp.read())["key"]

        abuser = _abuser(_IDLE_CONNECTIONS, address[len("ipc://") :], 1010)
        assert abuser.stdout is not None
        assert abuser.stdout.readline().strip() == "opened 1010"

        reply = _relay_once(address, key, _chat_body(QUESTION))
        assert reply.status == 200, reply.body
        body = json.loads(reply.body)
        assert body["usage"]["completion_tokens"] >= 1 and body["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
        open_fds = len(os.listdir(f"/proc/{gateway.pid}/fd"))
        assert open_fds < 512, f"the gateway holds {open_fds} fds with nofile=1024"
        log = log_path.read_text()
        abuser_lines = [line for line in log.splitlines() if f"pid {abuser.pid} " in line]
        assert abuser_lines and all(line.startswith("WARNING areal.gateway.door") for line in abuser_lines), log
        assert "max_connections_per_session=64" in abuser_lines[0]
        cuts = [line for line in abuser_lines if "cut off a connection" in line]
        assert len(cuts) <= 11, "one log line per cut connection floods the log"  # 1st, 2nd, 4th, ... 1024th cut
    finally:
        if abuser is not None:
            _stop(abuser)
        gateway.terminate()
        gateway.wait(timeout=30)


# ---- (b) partial frames on many connections -------------------------------------------------------


def test_partial_frames_are_closed_by_the_heartbeat(
    gateway: Callable[..., GatewayThread], model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An episode finishes the handshake on 60 connections and leaves a 2 MiB partial frame on
    each (a frame may be 3 MiB here): libzmq's heartbeat closes every one of them (no frame
    completes, so no PONG comes), the WARNINGs name the process, and a healthy session's request
    is answered correctly meanwhile. A frame declared over the limit is dropped at its header."""
    caplog.set_level(logging.WARNING, logger="areal.gateway.door")
    gw = gateway(max_body_bytes=1 << 20)
    key = gw.open_session("healthy")
    frame = gw.gateway.config.zmq_frame_bytes
    abuser = _abuser(_PARTIAL_FRAMES, gw.zmq[len("ipc://") :], 60, frame, 2 << 20)
    try:
        assert abuser.stdout is not None and abuser.stdin is not None
        assert abuser.stdout.readline().strip() == "sent 60"
        reply = _relay_once(gw.zmq, key, _chat_body(QUESTION))
        _assert_answered_correctly(reply, gw.interactions(key), AutoTokenizer.from_pretrained(model_dir))

        def all_closed() -> bool:
            abuser.stdin.write("check\n")
            abuser.stdin.flush()
            return int(abuser.stdout.readline().split()[1]) == 60

        wait_for(all_closed, "the gateway closes all 60 connections holding partial frames")
        named = [r for r in caplog.records if r.name == "areal.gateway.door" and f"pid {abuser.pid} " in r.getMessage()]
        assert named and all(r.levelno == logging.WARNING and "closed by libzmq" in r.getMessage() for r in named)
        assert gw.call(gw.gateway.metrics)["zmq_connections"] == 0
    finally:
        _stop(abuser)

    oversized = RawDealer(gw.zmq)
    try:
        oversized.send_raw(frame_header(frame + 1))
        with pytest.raises(ConnectionError):
            oversized.recv()  # dropped at the header, nothing buffered
    finally:
        oversized.close()


# ---- (b2) a never-ending multipart message ------------------------------------------------------

_ENDLESS = r"""
import sys
from raw_zmtp import endless_message
sent, cut = endless_message(sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3]))
print(f"sent {sent} cut {cut}", flush=True)
"""


def test_never_ending_message_is_cut_and_the_gateway_memory_stays_bounded(
    gateway: Callable[..., GatewayThread], model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An episode's process sends a request with its session key, then empty frames flagged MORE
    without end (48 MiB on the wire: 1.5 GiB in libzmq's pipe, unbounded by libzmq): the door's
    memory guard (256 MiB here) cuts its connection, the gateway's process stays under its
    reference + budget + 128 MiB, a WARNING names the session, and a healthy session's requests
    through the relay are all answered correctly meanwhile."""
    caplog.set_level(logging.WARNING, logger="areal.gateway.door")
    budget, wire = 256 << 20, 48 << 20
    gw = gateway(door_memory_bytes=budget)
    abuser_key, healthy = gw.open_session("abuser"), gw.open_session("healthy")
    reference = gw.call(lambda: gw.gateway.doors[0].reference)
    first = msgspec.msgpack.encode(GatewayRequest(0, "GET", "/v1/models", {"authorization": f"Bearer {abuser_key}"}, b""))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    async def healthy_while(report: asyncio.Future) -> int:
        channel = GatewayChannel(gw.zmq)
        answered = 0
        try:
            while not report.done() or answered == 0:
                _assert_answered_correctly(await _relay(channel, healthy, _chat_body(QUESTION)), gw.interactions(healthy), tokenizer)
                answered += 1
        finally:
            channel.close()
        return answered

    async def attack(abuser: subprocess.Popen) -> tuple[str, int]:
        report = asyncio.get_running_loop().run_in_executor(None, abuser.stdout.read)
        answered = await healthy_while(report)
        return await report, answered

    with PeakMemory() as memory:
        abuser = subprocess.Popen(
            [sys.executable, "-c", _ENDLESS, gw.zmq[len("ipc://") :], str(wire), first.hex()],
            cwd=ROOT,
            env=support_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            report, answered = asyncio.run(attack(abuser))
        finally:
            abuser.kill()  # by PID; it has exited already unless the test failed
            abuser.wait(10)
    sent, cut = int(report.split()[1]), report.split()[3]
    assert cut == "True" and sent < wire, f"the abuser was not cut: {report}"
    assert memory.peak < reference + budget + (128 << 20), f"peak {(memory.peak - reference) >> 20} MiB over the reference"
    assert answered >= 1 and gw.call(gw.gateway.metrics)["zmq_cut_for_memory"] >= 1
    named = [r.getMessage() for r in caplog.records if "session 'abuser'" in r.getMessage()]
    assert named and all("cut off a connection" in m and "memory_budget=256 MiB" in m for m in named), named
    assert [i for i in gw.interactions(abuser_key)] == []


# ---- (c) a multi-MiB prompt ---------------------------------------------------------------------


def test_multi_mib_prompt_is_refused_cheaply_and_the_loop_keeps_serving(gateway: Callable[..., GatewayThread], model_dir: Path) -> None:
    """3 MiB of prompt text: at a 2,048-token context it is refused from its length alone (a 400
    naming the limit, nothing tokenised); at a context its length cannot rule out, it is
    tokenised in a worker thread while the loop answers another session first. No rendered ids
    of either stay in the render cache once the sessions are closed."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    huge = " ".join(f"w{i % 9973}x" for i in range(480_000))  # ~3.3 MB of words the cache never saw
    assert 3 << 20 < len(huge) < 4 << 20

    gw = gateway(context_length=2048)
    abuser, healthy = gw.open_session("abuser"), gw.open_session("healthy")

    async def both() -> tuple[GatewayReply, GatewayReply]:
        a, h = GatewayChannel(gw.zmq), GatewayChannel(gw.zmq)
        try:
            return await asyncio.gather(_relay(a, abuser, _chat_body(huge)), _relay(h, healthy, _chat_body(QUESTION)))
        finally:
            a.close()
            h.close()

    refused, answered = asyncio.run(both())
    assert refused.status == 400, refused.body
    error = json.loads(refused.body)["error"]
    assert "characters" in error["message"] and "context length of 2048" in error["message"], error
    assert error["type"] == "invalid_request_error" and error["param"] == "messages"
    _assert_answered_correctly(answered, gw.interactions(healthy), tokenizer)
    metrics = gw.call(gw.gateway.metrics)
    assert metrics["tokenized_off_loop"] == 0 and metrics["render_cache_entries"] == 1  # the healthy render only
    for key in (abuser, healthy):
        gw.call(lambda key=key: gw.gateway.close_session(key))
    metrics = gw.call(gw.gateway.metrics)
    assert metrics["render_cache_entries"] == 0 and metrics["render_cache_bytes"] == 0

    wide = gateway(context_length=1_000_000, tokenize_off_loop_chars=1 << 16)  # its length cannot refuse 3 MiB
    abuser, healthy = wide.open_session("abuser"), wide.open_session("healthy")

    async def racing() -> tuple[list[str], GatewayReply, GatewayReply, GatewayReply]:
        a, h = GatewayChannel(wide.zmq), GatewayChannel(wide.zmq)
        order: list[str] = []

        async def tracked(name: str, call: Any) -> GatewayReply:
            reply = await call
            order.append(name)
            return reply

        try:
            big = asyncio.ensure_future(tracked("huge", _relay(a, abuser, _chat_body(huge))))
            loop = asyncio.get_running_loop()
            # the gateway's loop answers this poll while the text is being tokenised: it is not blocked
            while (await loop.run_in_executor(None, wide.call, wide.gateway.metrics))["tokenizing_off_loop"] == 0:
                assert not big.done(), big.result().body
                await asyncio.sleep(0.01)
            models = await tracked("models", _relay(h, healthy, b"", "/v1/models", "GET"))
            chat = await _relay(h, healthy, _chat_body(QUESTION))
            return order, await big, models, chat
        finally:
            a.close()
            h.close()

    order, refused, models, answered = asyncio.run(racing())
    assert order == ["models", "huge"]
    assert models.status == 200 and json.loads(models.body)["data"][0]["id"] == "areal"
    _assert_answered_correctly(answered, wide.interactions(healthy), tokenizer)
    assert refused.status == 400 and "context length of 1000000" in json.loads(refused.body)["error"]["message"]
    metrics = wide.call(wide.gateway.metrics)
    assert metrics["tokenized_off_loop"] == 1 and metrics["render_cache_entries"] == 1  # refused: its ids not kept
    for key in (abuser, healthy):
        wide.call(lambda key=key: wide.gateway.close_session(key))
    metrics = wide.call(wide.gateway.metrics)
    assert metrics["render_cache_entries"] == 0 and metrics["render_cache_bytes"] == 0


# ---- (d) deeply nested JSON -----------------------------------------------------------------------


def test_json_nested_5000_levels_gets_a_400_over_http_and_zeromq(gateway: Callable[..., GatewayThread], model_dir: Path) -> None:
    """5,000 levels of nesting: a 400 in the API's own error shape over HTTP (OpenAI's and
    Anthropic's) and an error reply over ZeroMQ, for nested JSON in the body and for nested
    msgpack in the frame itself; a healthy request is answered correctly in between."""
    gw = gateway()
    abuser, healthy = gw.open_session("abuser"), gw.open_session("healthy")
    nested = b'{"model": "m", "max_tokens": 8, "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"

    status, raw = _post_raw(gw.http + "/v1/chat/completions", nested, abuser)
    assert status == 400, raw
    error = json.loads(raw)["error"]
    assert "nested too deeply" in error["message"] and error["type"] == "invalid_request_error"
    status, raw = _post_raw(gw.http + "/v1/messages", nested, abuser)
    assert status == 400, raw
    body = json.loads(raw)
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "nested too deeply" in body["error"]["message"]

    async def over_zmq() -> tuple[GatewayReply, GatewayReply]:
        a, h = GatewayChannel(gw.zmq), GatewayChannel(gw.zmq)
        try:
            return await asyncio.gather(_relay(a, abuser, nested), _relay(h, healthy, _chat_body(QUESTION)))
        finally:
            a.close()
            h.close()

    refused, answered = asyncio.run(over_zmq())
    assert refused.status == 400 and not refused.more, refused.body
    assert "nested too deeply" in json.loads(refused.body)["error"]["message"]
    _assert_answered_correctly(answered, gw.interactions(healthy), AutoTokenizer.from_pretrained(model_dir))

    # the frame itself: a GatewayRequest map with an extra field nested 5,000 levels in msgpack
    frame = msgspec.msgpack.encode(GatewayRequest(7, "GET", "/v1/models", {}, b""))
    frame = bytes((frame[0] + 1,)) + frame[1:] + b"\xa1z" + b"\x91" * 5000 + b"\xc0"  # fixmap of one more key
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 30_000)
    try:
        dealer.connect(gw.zmq)
        dealer.send(frame)
        reply_frame = dealer.recv()
    finally:
        dealer.close(0)
    reply = msgspec.msgpack.Decoder(GatewayMessage).decode(reply_frame)
    assert isinstance(reply, GatewayReply) and reply.status == 400 and reply.request_id == -1
    assert "recursion" in json.loads(reply.body)["error"]["message"]
    assert gw.interactions(abuser) == []


# ---- per-session budgets: requests in flight, connections ------------------------------------------


def test_session_over_its_budgets_gets_429s_that_name_it(
    gateway: Callable[..., GatewayThread], model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A session with 2 requests in flight (its limit here) gets a 429 for the 3rd and 4th, sent
    in the same write; a 2nd connection of a session allowed 1 gets a 429 and is closed; the
    WARNINGs name the session's episode; another session is answered correctly meanwhile."""
    caplog.set_level(logging.WARNING, logger="areal.gateway.door")
    gw = gateway(max_inflight_per_session=2, max_connections_per_session=1)
    greedy, healthy = gw.open_session("greedy"), gw.open_session("healthy")
    decode = msgspec.msgpack.Decoder(GatewayMessage).decode
    dealer = RawDealer(gw.zmq)
    try:
        requests = [
            msgspec.msgpack.encode(
                GatewayRequest(i, "POST", "/v1/chat/completions", {"authorization": f"Bearer {greedy}"}, _chat_body(QUESTION))
            )
            for i in range(4)
        ]
        dealer.send_raw(b"".join(frame_header(len(r)) + r for r in requests))
        replies = {r.request_id: r for r in (decode(dealer.recv()) for _ in range(4))}
        assert sorted(r.status for r in replies.values()) == [200, 200, 429, 429]
        for reply in (r for r in replies.values() if r.status == 429):
            message = json.loads(reply.body)["error"]["message"]
            assert "session 'greedy'" in message and "max_inflight_per_session=2" in message

        second = RawDealer(gw.zmq)
        try:
            second.send(requests[0])
            reply = decode(second.recv())
            assert reply.status == 429 and "max_connections_per_session" in json.loads(reply.body)["error"]["message"]
            with pytest.raises(ConnectionError):
                second.recv()  # closed by the gateway after its answer
        finally:
            second.close()
        dealer.send(requests[1])  # the first connection is still the session's
        assert decode(dealer.recv()).status == 200
    finally:
        dealer.close()
    _assert_answered_correctly(
        _relay_once(gw.zmq, healthy, _chat_body(QUESTION)), gw.interactions(healthy), AutoTokenizer.from_pretrained(model_dir)
    )
    named = [r.getMessage() for r in caplog.records if r.name == "areal.gateway.door" and "session 'greedy'" in r.getMessage()]
    assert any("refused a request" in m for m in named) and any("cut off a connection" in m for m in named)
    assert len(gw.interactions(greedy)) == 3


def test_door_budgets_are_validated_by_name() -> None:
    from areal.gateway import GatewayConfig

    with pytest.raises(ValueError, match="gateway.max_buffered_bytes_per_session"):
        GatewayConfig(max_body_bytes=16 << 20)  # a largest frame (33 MiB) no longer fits the 32 MiB default
    with pytest.raises(ValueError, match="gateway.max_buffered_bytes "):
        GatewayConfig(max_buffered_bytes=16 << 20)
    with pytest.raises(ValueError, match="gateway.door_memory_bytes "):
        GatewayConfig(door_memory_bytes=128 << 20)  # below max_buffered_bytes (256 MiB), which counts in it
    for name in ("max_connections_per_session", "max_inflight_per_session", "tokenize_threads", "render_cache_bytes", "door_memory_bytes"):
        with pytest.raises(ValueError, match=f"gateway.{name} must be positive"):
            GatewayConfig(**{name: 0})
    with pytest.raises(ValueError, match="gateway.max_connections must be >= 0"):
        GatewayConfig(max_connections=-1)
