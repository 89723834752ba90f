"""Property-based bad input against a real Gateway over HTTP and ZeroMQ (hypothesis).

Over 1,000 generated requests across the three APIs: malformed JSON, wrong types, missing and
unknown fields, huge values, bad roles and content blocks, unknown routes and methods, missing,
wrong and foreign keys, and garbage ZeroMQ frames. For every one:
- no 5xx (the engine is up; 503 is checked separately with the engine down),
- an error is in the API's own shape (Anthropic's on /v1/messages, OpenAI's elsewhere),
- a refused request records nothing, and no session appears or disappears,
- the gateway keeps serving: a valid request succeeds after the run, and no task is left behind.

The engine is the instant stand-in speaking SGLang's /generate (benchmarks/gateway.py), so the
run is fast; the real engine is exercised by the SDK tests.
"""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import msgspec
import pytest
import zmq
from gateway_harness import GatewayThread
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from instant_engine import launch_instant_engine

from areal.protocol import GatewayMessage, GatewayReply, GatewayRequest

ROUTES = ["/v1/chat/completions", "/v1/responses", "/v1/messages"]
TEMPLATES = {
    "/v1/chat/completions": {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "tools": [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}],
    },
    "/v1/responses": {
        "model": "m",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "instructions": "Be brief.",
        "max_output_tokens": 8,
        "tools": [{"type": "function", "name": "calculator", "parameters": {"type": "object"}}],
    },
    "/v1/messages": {
        "model": "m",
        "max_tokens": 8,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "tools": [{"name": "calculator", "input_schema": {"type": "object"}}],
    },
}
KEYS = [
    "messages",
    "input",
    "max_tokens",
    "max_output_tokens",
    "max_completion_tokens",
    "model",
    "stream",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "stop",
    "stop_sequences",
    "seed",
    "logprobs",
    "top_logprobs",
    "system",
    "instructions",
    "previous_response_id",
    "stream_options",
    "include",
    "text",
    "reasoning",
    "store",
    "parallel_tool_calls",
    "metadata",
    "thinking",
    "response_format",
    "x-unknown",
]
# derandomize: the same 1,000+ cases every run, so a failure reproduces and CI never flakes
SETTINGS = settings(
    max_examples=360,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(
        [
            "user",
            "assistant",
            "system",
            "tool",
            "text",
            "tool_use",
            "function",
            "tool_result",
            "input_text",
            "function_call",
            "auto",
            "required",
        ]
    )
)
json_values = st.recursive(
    scalars,
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS + ["role", "content", "type", "text", "name"]) | st.text(max_size=6), c, max_size=3)
    ),
    max_leaves=8,
)
huge = st.sampled_from([10**18, -1, 0, 2**63, 1e308, -1e308, "9" * 400, "x" * 20000, [{"role": "user", "content": "x"}] * 600])


@st.composite
def mutated_body(draw, route: str) -> dict:
    body = json.loads(json.dumps(TEMPLATES[route]))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["drop", "set", "huge", "nested"]))
        if op == "drop" and body:
            body.pop(draw(st.sampled_from(sorted(body))))
        elif op in ("set", "huge"):
            body[draw(st.sampled_from(KEYS))] = draw(json_values if op == "set" else huge)
        else:  # poke inside the first message / input item / tool
            container = body.get("messages") or body.get("input") or body.get("tools")
            if isinstance(container, list) and container and isinstance(container[0], dict):
                container[0][
                    draw(
                        st.sampled_from(
                            ["role", "content", "type", "text", "name", "tool_calls", "call_id", "input_schema", "function", "output"]
                        )
                    )
                ] = draw(json_values)
            elif isinstance(container, list) and container:
                container[0] = draw(json_values)
    return body


def raw_body(route: str) -> st.SearchStrategy[bytes]:
    return st.one_of(
        mutated_body(route).map(lambda b: json.dumps(b).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=64),
        mutated_body(route).map(lambda b: json.dumps(b).encode()[: len(json.dumps(b)) // 2]),  # truncated JSON
    )


@pytest.fixture(scope="module")
def served():
    from transformers import AutoTokenizer

    from areal.embedded import ensure_embedded_model

    model_dir = ensure_embedded_model()
    tok = AutoTokenizer.from_pretrained(model_dir)
    reply = tok.encode("The answer is \\boxed{7}.", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    with launch_instant_engine(reply) as engine:
        gw = GatewayThread(engine.url, model_dir, max_tokens_cap=64, default_max_tokens=16)
        keys = [gw.open_session("fuzz-a"), gw.open_session("fuzz-b")]
        tasks_before = gw.call(lambda: len(asyncio.all_tasks(gw.loop)))
        with httpx.Client(base_url=gw.http, timeout=30) as http:
            yield gw, keys, http
            # still serving, nothing left behind, no session appeared or vanished
            ok = http.post(
                "/v1/chat/completions",
                headers={"authorization": f"Bearer {keys[0]}"},
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            )
            assert ok.status_code == 200, ok.text
        assert gw.call(lambda: sorted(gw.gateway.sessions)) == sorted(keys)
        assert gw.call(lambda: len(gw.gateway.expired)) == 0
        assert gw.call(lambda: len(asyncio.all_tasks(gw.loop))) == tasks_before
        gw.stop()


def _auth(draw_kind: str, keys: list[str]) -> dict[str, str]:
    return {
        "bearer": {"authorization": f"Bearer {keys[0]}"},
        "x-api-key": {"x-api-key": keys[0]},
        "foreign": {"authorization": f"Bearer {keys[1]}"},
        "none": {},
        "garbage": {"authorization": "Bearer sk-areal-not-a-session"},
    }[draw_kind]


def _check_answer(route: str, status: int, body: bytes, content_type: str) -> None:
    assert status < 500, (status, body[:500])
    if status == 200:
        if content_type.startswith("text/event-stream"):
            assert body.startswith(b"event: ") or body.startswith(b"data: "), body[:200]
            assert b"event: error" not in body, body[-500:]
        else:
            assert isinstance(json.loads(body), dict)
        return
    err = json.loads(body)
    if route == "/v1/messages":
        assert err["type"] == "error" and isinstance(err["error"]["type"], str) and isinstance(err["error"]["message"], str), err
    else:
        assert isinstance(err["error"]["message"], str) and isinstance(err["error"]["type"], str), err


def _count(gw: GatewayThread, keys: list[str]) -> int:
    return gw.call(lambda: sum(len(gw.gateway.sessions[k].interactions) for k in keys))


def _fuzz_route(route: str):
    @SETTINGS
    @given(data=st.data())
    def test(served, data):
        gw, keys, http = served
        body = data.draw(raw_body(route))
        headers = {
            "content-type": "application/json",
            **_auth(data.draw(st.sampled_from(["bearer", "bearer", "x-api-key", "foreign", "none", "garbage"])), keys),
        }
        method = data.draw(st.sampled_from(["POST"] * 8 + ["GET", "PUT", "DELETE"]))
        before = _count(gw, keys)
        resp = http.request(method, route, content=body, headers=headers)
        event(f"status {resp.status_code}")  # --hypothesis-show-statistics shows the mix
        _check_answer(route, resp.status_code, resp.content, resp.headers.get("content-type", ""))
        if resp.status_code != 200:
            assert _count(gw, keys) == before, "a refused request recorded an interaction"

    return test


test_fuzz_chat_completions = _fuzz_route("/v1/chat/completions")
test_fuzz_responses = _fuzz_route("/v1/responses")
test_fuzz_messages = _fuzz_route("/v1/messages")


@settings(max_examples=120, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.text(alphabet="abcdefghijklmnopqrstuvwxyz/_-.%0123456789", max_size=30), method=st.sampled_from(["GET", "POST", "PATCH"]))
def test_fuzz_unknown_routes(served, path, method):
    gw, keys, http = served
    path = "/" + path.lstrip("/")
    if path.rstrip("/") in ROUTES + ["/health", "/v1/models", "/v1/rewards"] or path.startswith("/admin"):
        path = "/v9" + path
    resp = http.request(method, path, headers={"authorization": f"Bearer {keys[0]}"}, content=b"{}")
    assert 400 <= resp.status_code < 500, (path, resp.status_code)
    _check_answer(path.split("?")[0].rstrip("/"), resp.status_code, resp.content, resp.headers.get("content-type", ""))


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzz_over_zeromq(served, data):
    gw, keys, http = served
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30000)
    sock.connect(gw.zmq)
    decoder = msgspec.msgpack.Decoder(GatewayMessage)
    try:
        route = data.draw(st.sampled_from(ROUTES))
        if data.draw(st.booleans()):
            sock.send(data.draw(st.binary(max_size=48)))  # a garbage frame: answered 400, or ignored
        body = data.draw(raw_body(route))
        kind = data.draw(st.sampled_from(["bearer", "x-api-key", "none", "garbage"]))
        headers = {"content-type": "application/json", **_auth(kind, keys)}
        before = _count(gw, keys)
        sock.send(msgspec.msgpack.encode(GatewayRequest(request_id=7, method="POST", path=route, headers=headers, body=body)))
        chunks, status, ctype = [], None, ""
        while True:
            reply = decoder.decode(sock.recv())
            assert isinstance(reply, GatewayReply)
            if reply.request_id != 7:  # the answer to the garbage frame
                assert reply.status == 400
                continue
            status = reply.status if status is None else status
            ctype = ctype or reply.headers.get("content-type", "")
            chunks.append(reply.body)
            if not reply.more:
                break
        _check_answer(route, status, b"".join(chunks), ctype)
        if status != 200:
            assert _count(gw, keys) == before
    finally:
        sock.close(0)


def test_chat_content_parts_are_joined_or_refused(served):
    gw, keys, http = served
    headers = {"authorization": f"Bearer {keys[0]}"}
    ok = http.post(
        "/v1/chat/completions",
        headers=headers,
        json={"messages": [{"role": "user", "content": [{"type": "text", "text": "What is 2 plus 3?"}]}], "max_tokens": 4},
    )
    assert ok.status_code == 200, ok.text
    for bad in ([None], [{"type": "image_url", "image_url": {"url": "x"}}]):
        resp = http.post("/v1/chat/completions", headers=headers, json={"messages": [{"role": "user", "content": bad}], "max_tokens": 4})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "messages[0].content[0]"


def test_invalid_utf8_body_is_a_400(served):
    gw, keys, http = served
    for route in ROUTES:
        resp = http.post(
            route,
            headers={"authorization": f"Bearer {keys[0]}", "x-api-key": keys[0], "content-type": "application/json"},
            content=b'{"messages": "\xff\xfe"}',
        )
        assert resp.status_code == 400, (route, resp.text)


def test_engine_down_is_503_in_each_apis_shape(served):
    from areal.embedded import ensure_embedded_model

    gw_live, _, _ = served
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    gw = GatewayThread(dead, ensure_embedded_model())
    try:
        key = gw.open_session()
        with httpx.Client(base_url=gw.http, timeout=30, headers={"authorization": f"Bearer {key}"}) as http:
            for route in ROUTES:
                for stream in (False, True):
                    resp = http.post(route, json={**TEMPLATES[route], "stream": stream})
                    assert resp.status_code == 503, (route, stream, resp.text)
                    _check_answer(route, 400, resp.content, "")  # an error body in the API's own shape
            assert http.get("/health").status_code == 200
        assert gw.interactions(key) == []
    finally:
        gw.stop()
