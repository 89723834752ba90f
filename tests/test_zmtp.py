"""areal.zmtp: ZeroMQ's wire protocol spoken on asyncio sockets, against real libzmq peers.

Covered: a pyzmq (libzmq) DEALER talking to our ROUTER and our DEALERs (asyncio and blocking)
talking to a pyzmq ROUTER, byte for byte; replies routed to the right one of several peers;
frames split at every byte; long frames; PING/PONG; the blocking DEALER sleeping once per reply
(no spurious wake-up) and timing out on a silent peer; the relay's channel failing its waiting
requests at once when the gateway goes away; and hostile peers (bad greeting, oversized frame,
traffic before the handshake, a wrong socket type, endless MORE frames): each is dropped while
the ROUTER goes on serving everyone else.
Not covered: CURVE/PLAIN security and socket patterns other than DEALER/ROUTER (not implemented).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from typing import Any

import msgspec
import pytest
import zmq

from areal import zmtp
from areal.protocol import GatewayReply, GatewayRequest


def _addr() -> str:
    return f"ipc://{tempfile.mkdtemp(prefix='zmtp-test-')}/r.sock"


async def _echo_router(address: str, max_frame: int = 1 << 20) -> zmtp.Router:
    """Our ROUTER answering every one-frame message with b"echo:" + the message."""
    return await zmtp.Router.bind(address, lambda peer, frames: peer.send(b"echo:" + b"".join(frames)), max_frame=max_frame)


def test_libzmq_dealer_talks_to_our_router_and_replies_reach_the_right_peer() -> None:
    async def main() -> None:
        address = _addr()
        router = await _echo_router(address)
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
        assert len(router.peers) == 3 and router.refused == 0
        for d in dealers:
            d.close(0)
        ctx.term()
        router.close()

    import zmq.asyncio  # noqa: F401

    asyncio.run(main())


def test_our_dealers_talk_to_a_libzmq_router() -> None:
    address = _addr()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(address)
    stop = threading.Event()

    def serve() -> None:
        router.setsockopt(zmq.RCVTIMEO, 100)
        while not stop.is_set():
            try:
                identity, payload = router.recv_multipart()
            except zmq.Again:
                continue
            router.send_multipart([identity, payload[::-1]])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        blocking = zmtp.Dealer(address)
        blocking.send(b"abc")
        assert blocking.recv() == [b"cba"]
        blocking.send(b"x" * 70000)
        assert blocking.recv() == [b"x" * 70000]
        blocking.close()

        async def main() -> list[list[bytes]]:
            got: list[list[bytes]] = []
            arrived = asyncio.Event()

            def on_message(frames: list[bytes]) -> None:
                got.append(frames)
                if len(got) == 2:
                    arrived.set()

            conn = await zmtp.connect_dealer(address, on_message, lambda exc: None)
            conn.send(b"hello")
            conn.send(b"world")
            await asyncio.wait_for(arrived.wait(), 5)
            assert conn.transport is not None
            conn.transport.close()
            return got

        assert asyncio.run(main()) == [[b"olleh"], [b"dlrow"]]
    finally:
        stop.set()
        thread.join()
        router.close(0)
        ctx.term()


def test_parser_gives_the_same_messages_whatever_the_split() -> None:
    stream = (zmtp.greeting(False) + zmtp.ready(b"DEALER") + zmtp.frame_header(3) + b"one"
              + zmtp.frame_header(300, more=True) + b"a" * 300 + zmtp.frame_header(1) + b"b"
              + zmtp.command(b"PING", b"\x00\x0actx"))
    whole = zmtp.Parser(b"ROUTER", frozenset((b"DEALER",)), 1 << 20)
    assert whole.feed(stream) == [[b"one"], [b"a" * 300, b"b"]]
    assert whole.replies == [zmtp.ready(b"ROUTER"), zmtp.command(b"PONG", b"ctx")]
    split = zmtp.Parser(b"ROUTER", frozenset((b"DEALER",)), 1 << 20)
    got = []
    for i in range(len(stream)):
        got += split.feed(stream[i : i + 1])
    assert got == [[b"one"], [b"a" * 300, b"b"]] and split.replies == whole.replies


@pytest.mark.parametrize("case", ["bad greeting", "oversized frame", "message before READY", "wrong socket type",
                                  "endless MORE", "bad mechanism"])
def test_hostile_peer_is_dropped_and_others_are_still_served(case: str) -> None:
    ready = zmtp.greeting(False) + zmtp.ready(b"DEALER")
    attacks = {
        "bad greeting": b"GET / HTTP/1.1\r\n\r\n" + bytes(64),
        "oversized frame": ready + b"\x02" + (1 << 40).to_bytes(8, "big"),
        "message before READY": zmtp.greeting(False) + zmtp.frame_header(2) + b"hi",
        "wrong socket type": zmtp.greeting(False) + zmtp.ready(b"PUSH"),
        "endless MORE": ready + (zmtp.frame_header(1, more=True) + b"x") * (zmtp.MAX_PARTS + 2),
        "bad mechanism": b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"CURVE".ljust(20, b"\x00") + bytes(32),
    }

    async def main() -> None:
        address = _addr()
        router = await _echo_router(address, max_frame=1 << 20)
        path = address[len("ipc://"):]
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(attacks[case])
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) is not None  # read() returns b"..." at EOF: dropped
        assert reader.at_eof() and router.refused == 1
        writer.close()
        good = await asyncio.get_running_loop().run_in_executor(None, _blocking_round_trip, address)
        assert good == [b"echo:still here"]
        router.close()

    asyncio.run(main())


def _blocking_round_trip(address: str) -> list[bytes]:
    dealer = zmtp.Dealer(address)
    try:
        dealer.send(b"still here")
        return dealer.recv()
    finally:
        dealer.close()


async def _gateway_answering(address: str, body: bytes) -> zmtp.Router:
    """A stand-in gateway answering every GatewayRequest with status 200 and ``body``."""
    def answer(peer: zmtp.RouterPeer, frames: list[bytes]) -> None:
        request_id = msgspec.msgpack.decode(frames[0], type=GatewayRequest).request_id
        peer.send(msgspec.msgpack.encode(GatewayReply(request_id=request_id, status=200, headers={}, body=body)))

    return await zmtp.Router.bind(address, answer)


async def _next_request_once_a_gateway_listens(channel: Any, address: str, body: bytes) -> GatewayReply:
    """Start ``_gateway_answering(address, body)``, send one request on ``channel`` (the relay's
    GatewayChannel, which must connect again), return its reply, then close both."""
    router = await _gateway_answering(address, body)
    try:
        return await asyncio.wait_for(anext(channel.request("GET", "/v1/models", {}, b"")), 5)
    finally:
        channel.close()
        router.close()


async def _lost_mid_request(channel: Any, address: str) -> GatewayReply:
    """The gateway takes the request and goes away before answering it."""
    received = asyncio.Event()

    def on_message(peer: zmtp.RouterPeer, frames: list[bytes]) -> None:
        received.set()  # never answered: the gateway "dies" with the request in flight

    router = await zmtp.Router.bind(address, on_message)
    replies = channel.request("POST", "/v1/chat/completions", {}, b"{}")
    pending = asyncio.ensure_future(anext(replies))
    await asyncio.wait_for(received.wait(), 5)
    router.close()
    lost = await asyncio.wait_for(pending, 5)
    await replies.aclose()
    return lost


async def _nothing_listening(channel: Any, address: str) -> GatewayReply:
    """No gateway has bound the address: the connect times out."""
    replies = channel.request("GET", "/v1/models", {}, b"")
    refused = await asyncio.wait_for(anext(replies), 5)
    await replies.aclose()
    return refused


@pytest.mark.parametrize(("first", "says"), [(_lost_mid_request, b"was lost"), (_nothing_listening, b"cannot be reached")],
                         ids=["gateway goes away mid-request", "no gateway listens"])
def test_relay_channel_answers_502_without_a_gateway_and_connects_again_later(first: Any, says: bytes) -> None:
    """A waiting request gets its 502 at once (not a hang until the deadline), and the next
    request connects again, to a new gateway on the same path."""
    from sandbox.relay import GatewayChannel

    async def main() -> tuple[GatewayReply, GatewayReply]:
        address = _addr()
        channel = GatewayChannel(address, connect_timeout_s=0.2)
        failed = await first(channel, address)
        return failed, await _next_request_once_a_gateway_listens(channel, address, b"up")

    failed, later = asyncio.run(main())
    assert failed.status == 502 and says in failed.body and not failed.more
    assert later.status == 200 and later.body == b"up"


def test_addresses_other_than_ipc_and_tcp_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="inproc://x"):
        zmtp._endpoint("inproc://x")
    assert zmtp._endpoint("tcp://127.0.0.1:5555") == ("tcp", ("127.0.0.1", 5555))
    assert zmtp._endpoint("ipc://@abstract") == ("unix", "\0abstract")


def _slow_echo_in_thread(address: str, delay_s: float) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """Our ROUTER on a loop in a thread, answering each message ``delay_s`` after reading it."""
    loop = asyncio.new_event_loop()
    bound = threading.Event()

    def on_message(peer: zmtp.RouterPeer, frames: list[bytes]) -> None:
        loop.call_later(delay_s, peer.send, b"echo:" + b"".join(frames))

    async def start() -> None:
        await zmtp.Router.bind(address, on_message)
        bound.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert bound.wait(10)
    return loop, thread


def test_blocking_dealer_sleeps_once_per_reply_and_times_out_on_a_silent_peer() -> None:
    """The blocking Dealer waits for input in poll(): a reader blocked in recv() on a Unix socket
    is also woken when the peer reads the request (the kernel wakes the socket's wait queue for
    the freed send space), so it slept twice per call. And a peer that never finishes the
    handshake is a TimeoutError after ``timeout_s``, not a hang."""
    import resource
    import socket

    address = _addr()
    loop, thread = _slow_echo_in_thread(address, 0.02)
    try:
        dealer = zmtp.Dealer(address)
        dealer.send(b"warm")
        assert dealer.recv() == [b"echo:warm"]
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        for i in range(10):
            dealer.send(b"%d" % i)
            assert dealer.recv() == [b"echo:%d" % i]
        sleeps = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before
        dealer.close()
        assert sleeps <= 13, f"{sleeps} sleeps for 10 replies: woken by something other than the reply"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)

    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # accepts, never greets
    path = tempfile.mkdtemp(prefix="zmtp-test-") + "/silent.sock"
    silent.bind(path)
    silent.listen(1)
    try:
        with pytest.raises(TimeoutError, match="within 0.3 s"):
            zmtp.Dealer(f"ipc://{path}", timeout_s=0.3)
    finally:
        silent.close()
