"""A session's engine work ends with its episode and is bounded over its life (issue: requests
that outlive the episode). One test per way an episode tried.

An episode queued 63 requests x n=16 x 1,024 tokens and exited: the engine generated for
nobody for minutes while other episodes waited. Here the gateway is real (HTTP + ZeroMQ, on
uvloop), over the embedded engine in its own process; clients are real sockets. The engine is
paused in place while an abuser's requests reach it, so that every row stays in the engine's
queue whatever the model would sample: each test asserts on the engine's own counters
(``/get_server_info``: rows received, aborted, served, tokens generated), never on timings or
on what the model writes.

Covered: a session closed with 320 engine calls in flight (256 at the engine, 64 still queued
in the gateway's engine client), a client that hangs up on either door, and the lifetime
budgets (sampled tokens, calls) in both APIs' error shapes.
Not covered: an agent whose HTTP connection to the sandbox relay drops while the relay stays
up (the relay forwards no cancel; the session's close at the episode's end aborts its work).
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import zmq
from gateway_harness import GatewayThread, wait_for

from areal.protocol import GatewayMessage, GatewayReply, GatewayRequest

QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"
_decode = msgspec.msgpack.Decoder(GatewayMessage).decode


# ---- the engine's own state -------------------------------------------------------------------------


def _engine(url: str, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=60) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else {}


def _state(url: str) -> dict:
    """The engine's counters; ``held``: rows it took in and has not finished (waiting or running)."""
    info = _engine(url, "/get_server_info")
    keys = ("requests_received", "aborted", "requests_served", "tokens_generated")
    return {**{k: info[k] for k in keys}, "held": info["requests_received"] - info["requests_served"]}


def _since(url: str, before: dict) -> dict:
    now = _state(url)
    return {k: now[k] - before[k] for k in now}


class _Paused:
    """The engine paused in place (rows stay where they are, new ones wait), continued on exit."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> None:
        _engine(self.url, "/pause_generation", {"mode": "in_place"})

    def __exit__(self, *exc: object) -> None:
        _engine(self.url, "/continue_generation", {})


# ---- clients ----------------------------------------------------------------------------------------


def _chat(content: str = QUESTION, max_tokens: int = 8, n: int = 1, **extra: Any) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "n": n, **extra}


def _post(url: str, key: str, body: dict, path: str = "/v1/chat/completions") -> tuple[int, dict]:
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), method="POST", headers={"content-type": "application/json", "x-api-key": key}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _dealer(address: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 60_000)
    sock.connect(address)
    return sock


def _request(request_id: int, key: str, body: dict) -> bytes:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return msgspec.msgpack.encode(GatewayRequest(request_id, "POST", "/v1/chat/completions", headers, json.dumps(body).encode()))


def _relay_call(gw: GatewayThread, request_id: int, key: str, body: dict) -> Any:
    """One request over the relay's door (a DEALER socket of its own): the decoded reply."""
    sock = _dealer(gw.zmq)
    try:
        sock.send(_request(request_id, key, body))
        return _decode(sock.recv())
    finally:
        sock.close(0)


def _healthy_call(gw: GatewayThread, key: str) -> dict:
    """A 1-token call over the relay's door, answered 200 with exactly one token."""
    reply = _relay_call(gw, 1, key, _chat(max_tokens=1))
    assert isinstance(reply, GatewayReply) and reply.status == 200, reply
    body = json.loads(reply.body)
    assert body["usage"]["completion_tokens"] == 1
    return body


# ---- (a) the session closes with its work in flight ---------------------------------------------------


def test_closing_a_session_aborts_its_work_at_the_engine_and_drops_what_was_queued(
    gateway: Callable[..., GatewayThread], engine_url: str
) -> None:
    """40 requests of n=8 x 1,024 tokens (320 engine calls) from one session: 256 reach the
    engine (the engine client's connections), 64 wait in the gateway. The controller closes the
    session: every request is answered 401, the engine aborts the 256 rows (its counters) and
    never sees the other 64, nothing is recorded, and another session's 1-token call is then
    served with the engine otherwise idle: one row served, one token generated since."""
    gw = gateway()
    abuser, healthy = gw.open_session("abuser"), gw.open_session("healthy")
    requests, n = 40, 8
    at_engine = min(requests * n, gw.gateway.engine.max_connections)
    assert at_engine < requests * n  # some calls wait in the gateway: the test covers both places
    before = _state(engine_url)
    sock = _dealer(gw.zmq)
    try:
        with _Paused(engine_url):
            for i in range(requests):
                sock.send(_request(i, abuser, _chat("Count from one to a thousand.", max_tokens=1024, n=n, temperature=1.0)))
            # stable once both hold: the engine is paused, and the engine client sends no more
            wait_for(
                lambda: (
                    _since(engine_url, before)["requests_received"] == at_engine
                    and gw.call(lambda: len(gw.gateway.sessions[abuser].engine_tasks)) == requests
                ),
                f"all {requests} requests admitted, awaiting the engine, and {at_engine} rows received by the engine",
            )
            assert _since(engine_url, before)["held"] == at_engine

            closed = gw.call(lambda: gw.gateway.close_session(abuser))
            replies = [_decode(sock.recv()) for _ in range(requests)]
            assert sorted(r.request_id for r in replies) == list(range(requests))
            for reply in replies:
                assert reply.status == 401 and not reply.more, reply
                assert "session closed" in json.loads(reply.body)["error"]["message"]
            wait_for(lambda: _since(engine_url, before)["held"] == 0, "the engine holds no row of the closed session")
            aborted = _since(engine_url, before)
            assert aborted["aborted"] == at_engine and aborted["requests_served"] == at_engine and aborted["tokens_generated"] == 0
        assert closed.interactions == {} and gw.call(lambda: gw.gateway.metrics()["awaiting_engine"]) == 0

        _healthy_call(gw, healthy)
        after = _since(engine_url, before)
        assert after["requests_received"] == at_engine + 1, "a call of the closed session reached the engine after its close"
        assert after["tokens_generated"] == 1 and after["held"] == 0
    finally:
        sock.close(0)


# ---- (b) the client hangs up -------------------------------------------------------------------------


def _hang_up_over_zmq(gw: GatewayThread, key: str, body: dict) -> Callable[[], None]:
    sock = _dealer(gw.zmq)
    sock.send(_request(7, key, body))
    return lambda: sock.close(0)


def _hang_up_over_http(gw: GatewayThread, key: str, body: dict) -> Callable[[], None]:
    host, port = gw.http.removeprefix("http://").split(":")
    raw = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    return sock.close


@pytest.mark.parametrize("door", ["zmq", "http"])
def test_a_client_that_hangs_up_has_its_engine_requests_aborted(gateway: Callable[..., GatewayThread], engine_url: str, door: str) -> None:
    """A request of n=2 x 1,024 tokens reaches the engine, and its client hangs up (the agent
    died): the engine aborts both rows (its counters), the session records nothing and stays
    open, and its next 1-token call is served with nothing else generated."""
    gw = gateway()
    key = gw.open_session("hangs-up")
    before = _state(engine_url)
    send = _hang_up_over_zmq if door == "zmq" else _hang_up_over_http
    with _Paused(engine_url):
        hang_up = send(gw, key, _chat(max_tokens=1024, n=2, temperature=1.0))
        wait_for(lambda: _since(engine_url, before)["held"] == 2, "both rows held by the engine")
        hang_up()
        wait_for(lambda: _since(engine_url, before)["aborted"] == 2, "the engine aborts the rows of the gone client")
        assert _since(engine_url, before)["held"] == 0
    assert gw.interactions(key) == []
    _healthy_call(gw, key)
    after = _since(engine_url, before)
    assert after["requests_received"] == 3 and after["tokens_generated"] == 1 and after["held"] == 0


# ---- (c) budgets over a session's life -----------------------------------------------------------------


def test_sampled_tokens_over_a_sessions_life_are_bounded(gateway: Callable[..., GatewayThread]) -> None:
    """A budget of 6 sampled tokens: six sequential 1-token calls of one session are answered,
    never more than one at a time, then the next is a 429 naming the field, in OpenAI's shape
    and in Anthropic's, streamed or not; another session's call of n=6 is answered meanwhile.
    What a call does not generate of its max_tokens is refunded: the charge is the tokens
    generated."""
    gw = gateway(max_sampled_tokens_per_session=6)
    greedy, other = gw.open_session("greedy"), gw.open_session("other")
    for _ in range(6):
        status, body = _post(gw.http, greedy, _chat(max_tokens=1))
        assert status == 200 and body["usage"]["completion_tokens"] == 1, body
    status, body = _post(gw.http, greedy, _chat(max_tokens=1))
    assert status == 429, body
    assert body["error"]["type"] == "rate_limit_error" and body["error"]["param"] == "max_tokens"
    assert "session 'greedy'" in body["error"]["message"] and "gateway.max_sampled_tokens_per_session=6" in body["error"]["message"]
    status, body = _post(gw.http, greedy, _chat(max_tokens=1, stream=True))
    assert status == 429 and "gateway.max_sampled_tokens_per_session=6" in body["error"]["message"]
    anthropic = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": QUESTION}]}
    status, body = _post(gw.http, greedy, anthropic, "/v1/messages")
    assert status == 429 and body["type"] == "error" and body["error"]["type"] == "rate_limit_error", body
    assert "gateway.max_sampled_tokens_per_session=6" in body["error"]["message"]
    assert len(gw.interactions(greedy)) == 6

    status, body = _post(gw.http, other, _chat(max_tokens=1, n=6))
    assert status == 200 and len(body["choices"]) == 6, body
    refunded = gw.open_session("refunded")
    status, body = _post(gw.http, refunded, _chat(max_tokens=6))
    assert status == 200, body
    assert gw.call(lambda: gw.gateway.sessions[refunded].tokens_charged) == body["usage"]["completion_tokens"]


def test_calls_over_a_sessions_life_are_bounded(gateway: Callable[..., GatewayThread]) -> None:
    """A budget of 3 calls: the 4th of a session is a 429 naming the field, over the relay's
    door too; another session is answered."""
    gw = gateway(max_calls_per_session=3)
    greedy, other = gw.open_session("greedy"), gw.open_session("other")
    for _ in range(3):
        status, body = _post(gw.http, greedy, _chat(max_tokens=1))
        assert status == 200, body
    reply = _relay_call(gw, 4, greedy, _chat(max_tokens=1))
    assert reply.status == 429, reply
    error = json.loads(reply.body)["error"]
    assert error["type"] == "rate_limit_error" and "gateway.max_calls_per_session=3" in error["message"]
    assert "session 'greedy' has made 3 completion calls" in error["message"]
    _healthy_call(gw, other)


def test_lifetime_budgets_are_validated_by_name() -> None:
    from areal.gateway import GatewayConfig

    for name in ("max_calls_per_session", "max_sampled_tokens_per_session"):
        with pytest.raises(ValueError, match=f"gateway.{name} must be >= 0"):
            GatewayConfig(**{name: -1})
        assert getattr(GatewayConfig(**{name: 0}), name) == 0  # no limit
