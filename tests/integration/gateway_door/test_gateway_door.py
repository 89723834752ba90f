"""areal.gateway.door: libzmq's ROUTER with per-owner budgets, against real peers.

Covered: libzmq DEALERs served, replies routed to the right one of several peers, long frames;
hostile peers (not ZMTP, a frame over the limit, a wrong socket type) dropped by libzmq while
everyone else is served; an owner over its connections cut, named in a rate-limited WARNING;
at the door's cap the oldest connection of another owner that never carried a session key is
evicted for a new one; a raw idle socket closed at the handshake timeout; a never-ending
multipart message, with and without a request in flight on its connection, cut by the memory
guard, the process's memory bounded, another peer served meanwhile; the relay's channel failing
its waiting requests at once when the gateway goes away, and connecting again.
Not covered here: the gateway's request budgets (tests/integration/gateway_engine/test_gateway_abuse.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from paths import ROOT, support_env
from raw_zmtp import READY, PeakMemory, command, frame_header, handshake

from areal.gateway.door import Conn, Door, DoorLimits
from areal.protocol import GatewayReply, GatewayRequest

_SOCKETS = tempfile.TemporaryDirectory(prefix="door-test-")  # removed with this module's process


def _addr() -> str:
    return f"ipc://{tempfile.mkdtemp(dir=_SOCKETS.name)}/r.sock"


async def _echo_door(address: str, limits: DoorLimits | None = None, max_frame: int = 1 << 20) -> Door:
    """A door answering every message with b"echo:" + the message."""
    door: Door

    def echo(conn: Conn, payload: bytes) -> None:
        door.send(conn, b"echo:" + payload)

    door = await Door.bind(address, echo, max_frame=max_frame, limits=limits)
    return door


async def _until(condition: Any, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.02)


def test_libzmq_dealers_are_served_and_replies_reach_the_right_peer() -> None:
    async def main() -> None:
        address = _addr()
        door = await _echo_door(address)
        ctx = zmq.asyncio.Context()
        dealers = [ctx.socket(zmq.DEALER) for _ in range(3)]
        for d in dealers:
            d.connect(address)
        for round_ in range(5):
            for i, d in enumerate(dealers):
                await d.send(f"{i}-{round_}".encode())
            for i, d in enumerate(dealers):
                assert await asyncio.wait_for(d.recv(), 5) == f"echo:{i}-{round_}".encode()
        big = bytes(range(256)) * 1000  # 256,000 bytes: an 8-byte (LONG) length both ways
        await dealers[0].send(big)
        assert await asyncio.wait_for(dealers[0].recv(), 5) == b"echo:" + big
        assert door.open == 3 and door.refused == 0 and len(door.owners) == 1  # one process: one owner
        for d in dealers:
            d.close(0)
        ctx.term()
        await _until(lambda: door.open == 0, "the door sees the dealers go")
        door.close()

    asyncio.run(main())


def test_a_new_peers_first_message_read_before_its_fds_last_close_is_answered() -> None:
    """A peer hangs up and the next one connects on the same fd number and sends; the door reads
    the new peer's message before the monitor's DISCONNECTED (old) and ACCEPTED (new) events. The
    request must belong to the new connection, so the old one's close does not stop its work (the
    gateway answers after a delay, and cancels the work of a closed connection's requests)."""

    async def main() -> None:
        address = _addr()
        loop = asyncio.get_running_loop()
        door: Door
        pending: dict[int, list[asyncio.TimerHandle]] = {}
        fds: list[int] = []

        def answer_later(conn: Conn, payload: bytes) -> None:
            fds.append(conn.fd)
            pending.setdefault(id(conn), []).append(loop.call_later(0.05, door.send, conn, b"late:" + payload))

        def on_closed(conn: Conn) -> None:
            for handle in pending.pop(id(conn), ()):
                handle.cancel()

        door = await Door.bind(address, answer_later, on_closed=on_closed)
        ctx = zmq.asyncio.Context()
        first = ctx.socket(zmq.DEALER)
        first.connect(address)
        await first.send(b"one")
        assert await asyncio.wait_for(first.recv(), 5) == b"late:one"
        (old_fd,) = fds
        old_ino = os.fstat(old_fd).st_ino
        monitor_fd = door.monitor.getsockopt(zmq.FD)
        loop.remove_reader(monitor_fd)  # hold the monitor's events back: the door reads the message first
        first.close(0)

        def old_fd_closed() -> bool:
            try:
                return os.fstat(old_fd).st_ino != old_ino
            except OSError:
                return True

        await _until(old_fd_closed, "libzmq closes the first peer's connection")
        second = ctx.socket(zmq.DEALER)
        second.connect(address)
        await second.send(b"two")
        await _until(lambda: len(fds) == 2, "the door reads the second peer's message")
        assert fds[1] == old_fd  # the case under test: the fd number reused
        loop.add_reader(monitor_fd, door._watch)
        door._watch()
        assert await asyncio.wait_for(second.recv(), 5) == b"late:two"
        second.close(0)
        ctx.term()
        door.close()

    asyncio.run(main())


@pytest.mark.parametrize("case", ["not ZMTP", "oversized frame", "wrong socket type"])
def test_hostile_peer_is_dropped_and_others_are_still_served(case: str) -> None:
    async def main() -> None:
        address = _addr()
        door = await _echo_door(address, max_frame=1 << 20)
        path = address[len("ipc://") :]
        loop = asyncio.get_running_loop()

        def attack() -> bytes:
            if case == "not ZMTP":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(path)
                sock.sendall(b"GET / HTTP/1.1\r\n\r\n" + bytes(64))
            else:
                sock = handshake(path)
                push = command(b"READY", b"\x0bSocket-Type" + (4).to_bytes(4, "big") + b"PUSH")
                sock.sendall(push if case == "wrong socket type" else READY + frame_header((1 << 20) + 1))
            sock.settimeout(10)
            data = b""
            while chunk := sock.recv(1 << 16):  # until the door closes it
                data += chunk
            sock.close()
            return data

        await loop.run_in_executor(None, attack)
        good = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        good.connect(address)
        await good.send(b"still here")
        assert await asyncio.wait_for(good.recv(), 5) == b"echo:still here"
        good.close(0)
        door.close()

    asyncio.run(main())


def test_owner_over_its_connections_is_cut_and_named_once_per_power_of_two(caplog: pytest.LogCaptureFixture) -> None:
    """This process opens 4 + 20 raw connections with a cap of 4: 20 are cut, 5 WARNINGs (1st, 2nd,
    4th, 8th, 16th) name its pid; the 4 kept are closed at the handshake timeout; a DEALER of this
    same process is served once there is room again."""
    caplog.set_level(logging.WARNING, logger="areal.gateway.door")

    async def main() -> None:
        address = _addr()
        door = await _echo_door(address, DoorLimits(max_connections_per_session=4, handshake_s=1.0))
        path = address[len("ipc://") :]
        held = []
        for _ in range(24):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            held.append(sock)
        await _until(lambda: door.cut == 20, "20 connections cut")
        assert door.open == 4
        await _until(lambda: door.open == 0, "the idle ones closed at the handshake timeout")
        good = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        good.connect(address)
        await good.send(b"hello")
        assert await asyncio.wait_for(good.recv(), 5) == b"echo:hello"
        good.close(0)
        for sock in held:
            sock.close()
        door.close()

    asyncio.run(main())
    cuts = [r.getMessage() for r in caplog.records if "cut off a connection" in r.getMessage()]
    assert len(cuts) == 5 and all(f"pid {os.getpid()} " in m and "max_connections_per_session=4" in m for m in cuts)
    assert any("closed by libzmq" in r.getMessage() for r in caplog.records)


_HOLDER = r"""
import socket, sys
sys.stdin.readline()  # once the door listens
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    held.append(s)
sys.stdin.read()
"""


def test_at_the_door_cap_a_new_connection_evicts_another_owners_oldest_unclaimed_one() -> None:
    """Another process holds all 6 connections of the door, none carrying a session key: a DEALER
    of this process gets in (the oldest of the other's is evicted) and is served."""
    address = _addr()

    async def main(holder: subprocess.Popen) -> None:
        door = await _echo_door(address, DoorLimits(max_connections=6))
        holder.stdin.write("go\n")
        holder.stdin.flush()
        await _until(lambda: door.open == 6, "the door holds the other process's 6")
        good = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        good.connect(address)
        await good.send(b"room?")
        assert await asyncio.wait_for(good.recv(), 5) == b"echo:room?"
        assert door.cut == 1 and door.open == 6
        good.close(0)
        door.close()

    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, address[len("ipc://") :], "6"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        asyncio.run(main(holder))
    finally:
        holder.stdin.close()
        holder.wait(10)


_ENDLESS = r"""
import sys
from raw_zmtp import endless_message
sent, cut = endless_message(sys.argv[1], int(sys.argv[2]), sys.argv[3].encode() if len(sys.argv) > 3 else None)
print(f"sent {sent} cut {cut}", flush=True)
"""


@pytest.mark.parametrize("in_flight", [False, True], ids=["idle connection", "request in flight on it"])
def test_never_ending_message_is_cut_by_the_memory_guard_and_others_are_served(in_flight: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Another process streams empty frames flagged MORE: 48 MiB on the wire, 1.5 GiB in libzmq's
    pipe without the guard. With a 256 MiB budget its connection is cut (with its request in flight
    on it too: that one is never answered), this process stays under reference + budget +
    128 MiB, a WARNING names the abuser's pid, and a DEALER sending all along gets every answer."""
    caplog.set_level(logging.WARNING, logger="areal.gateway.door")
    budget, wire = 256 << 20, 48 << 20

    async def main() -> tuple[int, str, PeakMemory, int, int]:
        address = _addr()
        door: Door

        def serve(conn: Conn, payload: bytes) -> None:
            if payload == b"hold":
                door.begin(conn)  # a request in flight that is never answered
            else:
                door.send(conn, b"echo:" + payload)

        door = await Door.bind(address, serve, limits=DoorLimits(memory_budget=budget))
        reference = door.reference
        good = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        good.connect(address)
        args = [sys.executable, "-c", _ENDLESS, address[len("ipc://") :], str(wire), *(["hold"] if in_flight else [])]
        answered = 0
        with PeakMemory() as memory:
            abuser = await asyncio.create_subprocess_exec(*args, cwd=ROOT, env=support_env(), stdout=subprocess.PIPE)
            assert abuser.stdout is not None
            report = asyncio.ensure_future(abuser.stdout.read())
            while not report.done():
                await good.send(b"%d" % answered)
                assert await asyncio.wait_for(good.recv(), 10) == b"echo:%d" % answered
                answered += 1
            await asyncio.wait_for(abuser.wait(), 10)
        good.close(0)
        await _until(lambda: door.open == 0, "the abuser's connection gone")
        memory_cuts = door.memory_cuts
        door.close()
        return abuser.pid, report.result().decode(), memory, reference, memory_cuts

    pid, report, memory, reference, memory_cuts = asyncio.run(main())
    sent, cut = int(report.split()[1]), report.split()[3]
    assert cut == "True" and sent < wire, f"the abuser was not cut: {report}"
    assert memory.peak < reference + budget + (128 << 20), f"peak {(memory.peak - reference) >> 20} MiB over the reference"
    assert memory_cuts >= 1
    named = [r.getMessage() for r in caplog.records if f"pid {pid} " in r.getMessage()]
    assert named and all("cut off a connection" in m and "memory_budget=256 MiB" in m for m in named), named
    assert ("requests in flight" in named[0]) == in_flight


async def _gateway_answering(address: str, body: bytes) -> Door:
    """A stand-in gateway answering every GatewayRequest with status 200 and ``body``."""
    door: Door

    def answer(conn: Conn, payload: bytes) -> None:
        request_id = msgspec.msgpack.decode(payload, type=GatewayRequest).request_id
        door.send(conn, msgspec.msgpack.encode(GatewayReply(request_id=request_id, status=200, headers={}, body=body)))

    door = await Door.bind(address, answer)
    return door


async def _next_request_once_a_gateway_listens(channel: Any, address: str, body: bytes) -> GatewayReply:
    door = await _gateway_answering(address, body)
    try:
        return await asyncio.wait_for(anext(channel.request("GET", "/v1/models", {}, b"")), 5)
    finally:
        channel.close()
        door.close()


async def _lost_mid_request(channel: Any, address: str) -> GatewayReply:
    """The gateway takes the request and goes away before answering it."""
    received = asyncio.Event()
    door = await Door.bind(address, lambda conn, payload: received.set())  # never answered
    replies = channel.request("POST", "/v1/chat/completions", {}, b"{}")
    pending = asyncio.ensure_future(anext(replies))
    await asyncio.wait_for(received.wait(), 5)
    door.close()
    lost = await asyncio.wait_for(pending, 5)
    await replies.aclose()
    return lost


async def _nothing_listening(channel: Any, address: str) -> GatewayReply:
    replies = channel.request("GET", "/v1/models", {}, b"")
    refused = await asyncio.wait_for(anext(replies), 5)
    await replies.aclose()
    return refused


@pytest.mark.parametrize(
    ("first", "says"),
    [(_lost_mid_request, b"was lost"), (_nothing_listening, b"cannot be reached")],
    ids=["gateway goes away mid-request", "no gateway listens"],
)
def test_relay_channel_answers_502_without_a_gateway_and_connects_again_later(first: Any, says: bytes) -> None:
    """A waiting request gets its 502 at once (not a hang until the deadline), and the next
    request connects again, to a new gateway on the same path."""
    from sandbox.relay import GatewayChannel

    async def main() -> tuple[GatewayReply, GatewayReply]:
        address = _addr()
        channel = GatewayChannel(address, connect_timeout_s=0.3)
        failed = await first(channel, address)
        return failed, await _next_request_once_a_gateway_listens(channel, address, b"up")

    failed, later = asyncio.run(main())
    assert failed.status == 502 and says in failed.body and not failed.more
    assert later.status == 200 and later.body == b"up"


def test_lazy_relay_sets_up_its_server_on_the_first_connection_and_serves_it() -> None:
    """A slot's relay (``lazy=True``) builds no event loop, app or ZeroMQ context until an agent
    connects; the connection that wakes it is served, not dropped."""
    import threading as _threading
    import urllib.request

    from sandbox.relay import Relay

    async def main() -> tuple[bool, int, bytes]:
        address = _addr()
        door = await _gateway_answering(address, b'{"data": []}')
        try:
            threads_before = {t.name for t in _threading.enumerate()}
            relay = Relay.start(address, lazy=True)
            await asyncio.sleep(0.3)
            idle = not relay._started.is_set() and "sandbox-relay" in {t.name for t in _threading.enumerate()} - threads_before

            def get() -> tuple[int, bytes]:
                with urllib.request.urlopen(f"{relay.base_url}/v1/models", timeout=10) as r:
                    return r.status, r.read()

            status, body = await asyncio.to_thread(get)
            return idle, status, body
        finally:
            door.close()

    idle, status, body = asyncio.run(main())
    assert idle, "the lazy relay set up its server before any connection"
    assert status == 200 and body == b'{"data": []}'


@pytest.mark.parametrize(
    ("lose", "says"), [(True, b"was lost"), (False, b"cannot be reached")], ids=["goes away mid-request", "none listens"]
)
def test_sync_transport_answers_502_without_a_gateway_connects_again_later_and_times_out(lose: bool, says: bytes) -> None:
    """relay.SyncZmqTransport (sync clients' requests, one connection per thread): the same
    contract as the async channel's, from a thread of its own; a read timeout is httpx's."""
    import concurrent.futures

    import httpx

    from sandbox.relay import SyncZmqTransport

    transport = SyncZmqTransport("", connect_timeout_s=0.3)
    client = httpx.Client(transport=transport, base_url="http://gateway")
    pool = concurrent.futures.ThreadPoolExecutor(1)  # one thread: its one connection, lost and made again

    async def main() -> tuple[httpx.Response, httpx.Response, str]:
        loop = asyncio.get_running_loop()
        address = transport.gateway_addr = _addr()
        if lose:
            received = asyncio.Event()
            door = await Door.bind(address, lambda conn, payload: loop.call_soon(received.set))  # never answered
            pending = loop.run_in_executor(pool, lambda: client.post("/v1/chat/completions", content=b"{}"))
            await asyncio.wait_for(received.wait(), 5)
            door.close()
            failed = await asyncio.wait_for(pending, 5)
        else:
            failed = await loop.run_in_executor(pool, lambda: client.get("/v1/models"))
        door = await _gateway_answering(address, b"up")
        try:
            later = await loop.run_in_executor(pool, lambda: client.get("/v1/models"))
        finally:
            door.close()
        silent = await Door.bind(address, lambda conn, payload: None)  # a client of its own: no race with the last close
        try:
            timed = await loop.run_in_executor(
                pool, lambda: _timeout_of(httpx.Client(transport=SyncZmqTransport(address), base_url="http://g"))
            )
        finally:
            silent.close()
        return failed, later, timed

    try:
        failed, later, timed = asyncio.run(main())
    finally:
        pool.shutdown()
        transport.close()
    assert failed.status_code == 502 and says in failed.content
    assert later.status_code == 200 and later.content == b"up"
    assert timed == "ReadTimeout"


def _timeout_of(client: Any) -> str:
    import httpx

    try:
        with client:
            client.get("/v1/models", timeout=httpx.Timeout(5.0, read=0.3))
    except httpx.ReadTimeout:
        return "ReadTimeout"
    return "answered"
