"""Every reply, stream event and error of the three APIs, across a matrix of request features,
validated against the published definitions: OpenAI's OpenAPI document and Anthropic's (a pinned
copy fetched at set-up, tests/support/openapi_specs.py), and the installed SDKs' own types in
strict mode (``openai`` for Chat Completions and Responses, ``anthropic`` for Messages).

Each case (the matrix: tests/support/api_cases.py) is one request over real HTTP (``serve_http`` on a port from ``bind(0)``) to a gateway on
the embedded tokenizer and the scripted engine stand-in, which samples the canonical ids of the
case's scripted replies (plain text, or a call in the model's ``<tool_call>`` format): the
gateway's own rendering, parsing, streaming and error paths produce what is validated.

    reply 200, whole       chat: CreateChatCompletionResponse  responses: Response  anthropic: Message
    reply 200, streamed    each data: CreateChatCompletionStreamResponse · ResponseStreamEvent ·
                           MessageStreamEvent (and the SSE ``event:`` equals the payload's type)
    reply 4xx              OpenAI's ErrorResponse · Anthropic's ErrorResponse; a feature the gateway
                           cannot honour is such a 400, naming it, and samples nothing

What is not covered here: the newest SDK releases (tests/integration/agents/test_sdk_releases.py has
their types check the same matrix's replies, and runs their clients against a gateway).
"""

from __future__ import annotations

import asyncio

import httpx
import openapi_specs
import pytest
from anthropic.types import ErrorResponse as AnthropicError
from anthropic.types import MessageTokensCount
from api_cases import ANTHROPIC_TOOLS, CASES, CHAT_TOOLS, PATHS, USER, body_of, exchange, sse_events
from scripted_engine import ScriptedEngine
from sdk_types_check import sdk_types
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.gateway import Gateway, GatewayConfig, serve_http

# the published component, and the SDK's type, of each kind of payload
OPENAI_COMPONENTS = {
    ("chat", False): "CreateChatCompletionResponse",
    ("chat", True): "CreateChatCompletionStreamResponse",
    ("responses", False): "Response",
    ("responses", True): "ResponseStreamEvent",
}
SDK_TYPES = sdk_types()  # the lock's SDKs (the newest releases: test_sdk_releases.py)
ANTHROPIC_COMPONENTS = {False: "Message", True: "MessageStreamEvent"}


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_embedded_model())


def _conforms(api: str, stream: bool, payload: dict) -> list[str]:
    """What the published definitions and the SDK's strict types find wrong in one payload."""
    problems = []
    if api == "anthropic":
        problems += openapi_specs.violations("anthropic", ANTHROPIC_COMPONENTS[stream], payload)
    else:
        problems += openapi_specs.violations("openai", OPENAI_COMPONENTS[api, stream], payload)
    try:
        SDK_TYPES[api, stream].validate_python(payload, strict=True)
    except ValueError as e:  # pydantic's ValidationError
        problems.append(f"SDK type: {e}"[:600])
    return problems


@pytest.mark.parametrize("name, api, request_body, replies, status", CASES, ids=[f"{c[1]}-{c[0]}" for c in CASES])
def test_every_reply_conforms_to_the_published_schema(tok, name, api, request_body, replies, status):
    body = body_of(api, request_body)
    (reply,) = asyncio.run(exchange(tok, [("POST", PATHS[api], body)], replies))
    assert reply.status_code == status, reply.text
    if status != 200:
        vendor = "anthropic" if api == "anthropic" else "openai"
        assert openapi_specs.violations(vendor, "ErrorResponse", reply.json()) == []
        if api == "anthropic":
            AnthropicError.model_validate(reply.json(), strict=True)
        return
    if not body.get("stream"):
        assert _conforms(api, False, reply.json()) == []
        return
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = sse_events(reply.text)
    assert len(events) >= 3, reply.text
    for event, payload in events:
        assert _conforms(api, True, payload) == [], payload
        if api != "chat":  # Responses and Messages name each event twice: SSE and payload agree
            assert event == payload["type"], (event, payload)
    if api == "chat":
        assert reply.text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize(
    "api, method, path, body, status, config",
    [
        (
            "chat",
            "POST",
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "hello " * 60}]},
            400,
            {"context_length": 64},
        ),
        ("responses", "POST", "/v1/responses", {"model": "m", "input": "hello " * 60}, 400, {"context_length": 64}),
        ("chat", "POST", "/v1/chat/completions", {"model": "m", "messages": USER, "max_tokens": 10**6}, 400, {}),
        ("chat", "GET", "/v1/chat/completions", None, 405, {}),
        ("chat", "POST", "/v1/nothing", {}, 404, {}),
        ("anthropic", "POST", "/v1/messages", {"model": "m", "messages": USER, "max_tokens": 10**6}, 400, {}),
        ("anthropic", "POST", "/v1/messages/batches", {}, 404, {}),
    ],
    ids=[
        "chat-context",
        "responses-context",
        "chat-max-tokens",
        "chat-method",
        "unknown-path",
        "anthropic-max-tokens",
        "anthropic-unknown-path",
    ],
)
def test_every_error_conforms(tok, api, method, path, body, status, config):
    (reply,) = asyncio.run(exchange(tok, [(method, path, body)], [], **config))
    assert reply.status_code == status, reply.text
    vendor = "anthropic" if api == "anthropic" else "openai"
    assert openapi_specs.violations(vendor, "ErrorResponse", reply.json()) == []


def test_a_bad_key_is_a_401_in_each_apis_shape(tok):
    async def run() -> list[httpx.Response]:
        engine = ScriptedEngine(tok, [])
        gw = Gateway(engine, tok, GatewayConfig())
        runner, url = await serve_http(gw)
        try:
            async with httpx.AsyncClient(base_url=url, headers={"authorization": "Bearer nope"}, timeout=60) as http:
                return [await http.post(PATHS[api], json={"model": "m"}) for api in ("chat", "responses", "anthropic")]
        finally:
            await runner.cleanup()

    chat, responses, anthropic = asyncio.run(run())
    assert chat.status_code == responses.status_code == anthropic.status_code == 401
    assert openapi_specs.violations("openai", "ErrorResponse", chat.json()) == []
    assert openapi_specs.violations("openai", "ErrorResponse", responses.json()) == []
    assert openapi_specs.violations("anthropic", "ErrorResponse", anthropic.json()) == []


def test_count_tokens_conforms(tok):
    body = {"model": "m", "system": "Be brief.", "messages": USER, "tools": ANTHROPIC_TOOLS}
    (reply,) = asyncio.run(exchange(tok, [("POST", "/v1/messages/count_tokens", body)], []))
    assert reply.status_code == 200, reply.text
    assert openapi_specs.violations("anthropic", "CountMessageTokensResponse", reply.json()) == []
    assert MessageTokensCount.model_validate(reply.json(), strict=True).input_tokens > 0


def test_the_validator_refuses_what_the_document_does_not_allow():
    # the checks above can fail: a null where the document allows none, and a required key missing
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "system_fingerprint": None, "choices": []}
    assert openapi_specs.violations("openai", "CreateChatCompletionStreamResponse", chunk) != []
    assert openapi_specs.violations("openai", "CreateChatCompletionStreamResponse", {**chunk, "system_fingerprint": "fp"}) == []
    error = {"error": {"message": "m", "type": "invalid_request_error", "param": None}}
    assert any("'code' is a required property" in v for v in openapi_specs.violations("openai", "ErrorResponse", error))


# (api, request body, what the error must name): features the gateway cannot honour, each refused
REFUSED = [
    ("chat", {"messages": USER, "audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"]}, "audio"),
    ("chat", {"messages": USER, "web_search_options": {}}, "web_search_options"),
    ("chat", {"messages": USER, "prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("chat", {"messages": USER, "tools": CHAT_TOOLS, "parallel_tool_calls": False}, "parallel_tool_calls"),
    ("responses", {"input": "hi", "background": True}, "background"),
    ("responses", {"input": "hi", "tools": [{"type": "web_search"}]}, "web_search"),
    (
        "anthropic",
        {"messages": USER, "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
        "disable_parallel_tool_use",
    ),
    ("anthropic", {"messages": USER, "mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
    (
        "anthropic",
        {
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}
            ]
        },
        "image",
    ),
]


@pytest.mark.parametrize("api, request_body, named", REFUSED, ids=[f"{api}-{named}" for api, _, named in REFUSED])
def test_a_feature_the_gateway_cannot_honour_is_a_400_naming_it(tok, api, request_body, named):
    cap = "max_output_tokens" if api == "responses" else "max_tokens"
    (reply,) = asyncio.run(exchange(tok, [("POST", PATHS[api], {"model": "m", cap: 16, **request_body})], []))
    assert reply.status_code == 400, reply.text  # never silently dropped: nothing was sampled (no reply is scripted)
    vendor = "anthropic" if api == "anthropic" else "openai"
    assert openapi_specs.violations(vendor, "ErrorResponse", reply.json()) == []
    error = reply.json()["error"]
    assert named in error["message"] or named == error.get("param"), error
