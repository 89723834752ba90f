"""The gateway's replies against the APIs' published shapes: OpenAI's OpenAPI spec (the keys it
requires, and the openai SDK's pydantic types, strict where they validate) and the anthropic SDK's
types; and the requests those APIs define that the gateway must honour or refuse as they do. (The
whole published documents over a matrix of request features: test_openapi_conformance.py.)

Covered, one test (or a parametrised few) each, over real HTTP (``serve_http`` on a port from
``bind(0)``) with the embedded tokenizer and the scripted engine stand-in (it samples the canonical
ids of scripted replies): ``refusal`` (null) in chat messages and logprobs; no null
``system_fingerprint`` in chat chunks; Responses ``usage`` details (``cache_write_tokens`` too: the
newest SDKs require it) and no null ``usage`` in the stream's opening events;
``context_length_exceeded``; Anthropic ``message_start`` usage; ``/v1/messages/count_tokens`` and
Anthropic-shaped errors under ``/v1/messages``; a JSON 413 for a body over ``max_body_bytes``;
``developer`` messages reaching the prompt; a tool message without ``tool_call_id``;
``tool_choice`` "none" keeping the tools out of the prompt.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from anthropic import AsyncAnthropic
from anthropic.types import ErrorResponse, MessageTokensCount
from api_cases import served
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent, ResponseUsage
from pydantic import TypeAdapter
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model

CALC = {
    "name": "calc",
    "description": "Evaluate arithmetic.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
}
# the same tool in each API's shape
TOOLS = {
    "chat": [{"type": "function", "function": CALC}],
    "responses": [{"type": "function", **CALC}],
    "anthropic": [{"name": CALC["name"], "description": CALC["description"], "input_schema": CALC["parameters"]}],
}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}
# what OpenAI's spec requires of a chat choice's message and of its logprobs (null allowed, never absent)
MESSAGE_KEYS = {"role", "content", "refusal"}
LOGPROBS_KEYS = {"content", "refusal"}
_stream_events = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_embedded_model())


def _body(api: str, text: str, **extra) -> dict:
    """A request of ``api`` asking ``text`` as its user turn (max 16 tokens)."""
    if api == "chat":
        return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 16, **extra}
    if api == "responses":
        return {"model": "m", "input": text, "max_output_tokens": 16, **extra}
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 16, **extra}


def _sse_data(text: str) -> list[dict]:
    """The JSON payloads of an SSE body (``data: [DONE]`` left out)."""
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


# ---- OpenAI Chat Completions ------------------------------------------------------------------


def test_chat_messages_and_logprobs_carry_a_null_refusal(tok):
    async def run() -> dict:
        async with served(tok, ["Hi there.", "Hello."]) as (_, _, http, _):
            body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16, "n": 2, "logprobs": True}
            reply = await http.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            return reply.json()

    body = asyncio.run(run())
    ChatCompletion.model_validate(body, strict=True)
    assert len(body["choices"]) == 2
    for choice in body["choices"]:
        assert MESSAGE_KEYS <= set(choice["message"]) and choice["message"]["refusal"] is None
        assert LOGPROBS_KEYS <= set(choice["logprobs"]) and choice["logprobs"]["refusal"] is None
        assert choice["logprobs"]["content"]  # the sampled tokens' logprobs are there too


def test_chat_stream_chunks_send_no_null_system_fingerprint(tok):
    async def run() -> str:
        async with served(tok, ["Hi there."]) as (_, _, http, _):
            body = _body("chat", "Hi", stream=True, logprobs=True, stream_options={"include_usage": True})
            reply = await http.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            return reply.text

    text = asyncio.run(run())
    chunks = _sse_data(text)
    assert len(chunks) >= 3 and text.rstrip().endswith("data: [DONE]")
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk, strict=True)
        assert isinstance(chunk.get("system_fingerprint", ""), str), chunk  # the spec's is a string: absent, never null
    finished = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finished) == 1 and finished[0]["choices"][0]["logprobs"]["refusal"] is None


# ---- OpenAI Responses -------------------------------------------------------------------------


def test_responses_usage_has_its_details_and_the_opening_events_no_null_usage(tok):
    async def run() -> tuple[dict, str]:
        async with served(tok, ["Hi there.", "Hello."]) as (gw, _, http, _):
            whole = await http.post("/v1/responses", json=_body("responses", "Hi"))
            streamed = await http.post("/v1/responses", json=_body("responses", "Hi", stream=True))
            assert whole.status_code == streamed.status_code == 200, (whole.text, streamed.text)
            return whole.json(), streamed.text

    body, text = asyncio.run(run())
    for usage in (body["usage"], *(e["response"]["usage"] for e in _sse_data(text) if e["type"] == "response.completed")):
        ResponseUsage.model_validate(usage, strict=True)
        assert usage["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}
        assert set(usage["output_tokens_details"]) == {"reasoning_tokens"}
    Response.model_validate(body)
    events = _sse_data(text)
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"] and events[-1]["type"] == "response.completed"
    for event in events:
        _stream_events.validate_python(event)
    for event in events[:2]:  # usage is not known yet: left out (the spec's is optional, not nullable)
        assert "usage" not in event["response"], event


# ---- context length ---------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("text", ["x" * 20000, "hello " * 60], ids=["refused-by-its-characters", "refused-by-its-tokens"])
def test_a_prompt_over_the_context_is_context_length_exceeded(tok, api, text):
    async def run() -> httpx.Response:
        async with served(tok, [], context_length=64, default_max_tokens=16, max_tokens_cap=32) as (_, engine, http, _):
            reply = await http.post(PATHS[api], json=_body(api, text))
            assert engine.prompts == []
            return reply

    reply = asyncio.run(run())
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "context length of 64" in error["message"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "messages", "context_length_exceeded")


# ---- Anthropic Messages -----------------------------------------------------------------------


def test_anthropic_message_start_reports_the_prompt_tokens(tok):
    async def run() -> tuple[list, int]:
        async with served(tok, ["Hello there."]) as (gw, _, http, url):
            key = http.headers["authorization"][7:]
            client = AsyncAnthropic(api_key=key, base_url=url, max_retries=0)
            async with client.messages.stream(**_body("anthropic", "Hi", system="Be brief.")) as stream:
                events = [e async for e in stream]
            (inter,) = gw.sessions[key].interactions.values()
            return events, len(inter.prompt_ids)

    events, prompt = asyncio.run(run())
    start = events[0]
    assert start.type == "message_start" and start.message.usage.input_tokens == prompt > 0
    assert start.message.usage.output_tokens == 0


@pytest.mark.parametrize(
    "extra",
    [{}, {"tools": TOOLS["anthropic"]}, {"tools": TOOLS["anthropic"], "tool_choice": {"type": "any"}}],
    ids=["plain", "tools", "forced-call"],
)
def test_count_tokens_counts_the_prompt_messages_would_send(tok, extra):
    request = {"model": "m", "system": "Be brief.", "messages": [{"role": "user", "content": "What is 3+4?"}], **extra}

    async def run() -> tuple[dict, int, int, int]:
        reply = '{"name": "calc", "arguments": {"expr": "3+4"}}\n</tool_call>' if "tool_choice" in extra else "Seven."
        async with served(tok, [reply]) as (gw, engine, http, _):
            counted = await http.post("/v1/messages/count_tokens", json=request)
            assert counted.status_code == 200, counted.text
            session = gw.sessions[http.headers["authorization"][7:]]
            touched = len(engine.prompts) + len(session.interactions) + session.index.full + session.index.incremental
            message = await http.post("/v1/messages", json={**request, "max_tokens": 16})
            assert message.status_code == 200, message.text
            (inter,) = session.interactions.values()
            return counted.json(), touched, message.json()["usage"]["input_tokens"], len(inter.prompt_ids)

    counted, touched, used, recorded = asyncio.run(run())
    MessageTokensCount.model_validate(counted, strict=True)
    assert counted == {"input_tokens": used} and used == recorded
    assert touched == 0  # counting sampled, recorded and matched nothing


def test_count_tokens_with_tool_choice_none_counts_no_tools(tok):
    request = {"model": "m", "messages": [{"role": "user", "content": "What is 3+4?"}]}

    async def run() -> tuple[int, int]:
        async with served(tok, []) as (_, _, http, _):
            plain = await http.post("/v1/messages/count_tokens", json=request)
            none = await http.post(
                "/v1/messages/count_tokens", json={**request, "tools": TOOLS["anthropic"], "tool_choice": {"type": "none"}}
            )
            return plain.json()["input_tokens"], none.json()["input_tokens"]

    plain, none = asyncio.run(run())
    assert plain == none > 0


@pytest.mark.parametrize(
    "method, path, body, status, kind",
    [
        ("POST", "/v1/messages/count_tokens", {"model": "m"}, 400, "invalid_request_error"),
        (
            "POST",
            "/v1/messages/count_tokens",
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "top_k": 5},
            400,
            "invalid_request_error",
        ),
        ("GET", "/v1/messages/count_tokens", None, 405, "invalid_request_error"),
        ("POST", "/v1/messages/batches", {}, 404, "not_found_error"),
        ("GET", "/v1/messages/abc/nothing", None, 404, "not_found_error"),
        ("POST", "/v1/messages/count_tokens", "bad-key", 401, "authentication_error"),
    ],
)
def test_errors_under_v1_messages_are_in_anthropics_shape(tok, method, path, body, status, kind):
    async def run() -> httpx.Response:
        async with served(tok, []) as (_, _, http, _):
            if body == "bad-key":
                return await http.post(path, json={"model": "m", "messages": []}, headers={"authorization": "Bearer nope"})
            return await http.request(method, path, json=body)

    reply = asyncio.run(run())
    assert reply.status_code == status, reply.text
    error = reply.json()
    ErrorResponse.model_validate(error)
    assert set(error) == {"type", "error"} and error["error"]["type"] == kind and error["error"]["message"]


# ---- request size -----------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_a_body_over_the_limit_gets_the_apis_json_413(tok, api):
    async def run() -> httpx.Response:
        async with served(tok, [], max_body_bytes=1 << 16) as (_, engine, http, _):
            reply = await http.post(PATHS[api], content=b'{"x": "' + b"y" * (1 << 18) + b'"}', headers={"content-type": "application/json"})
            assert engine.prompts == []
            return reply

    reply = asyncio.run(run())
    assert reply.status_code == 413 and reply.headers["content-type"].startswith("application/json"), reply.text
    body = reply.json()
    if api == "anthropic":  # Anthropic's documented type for a 413 (anthropic 2.11's ErrorResponse union lacks it)
        assert set(body) == {"type", "error"} and body["type"] == "error" and set(body["error"]) == {"type", "message"}
        assert body["error"]["type"] == "request_too_large" and "65536" in body["error"]["message"]
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"} and "65536" in body["error"]["message"]


# ---- messages the template must see -----------------------------------------------------------


def test_a_developer_message_reaches_the_prompt_as_the_system_turn(tok):
    async def run() -> list[int]:
        async with served(tok, ["Bonjour."]) as (_, engine, http, _):  # the embedded template has no developer branch
            messages = [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
            reply = await http.post("/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 16})
            assert reply.status_code == 200, reply.text
            return engine.prompts[0]

    prompt = tok.decode(asyncio.run(run()))
    assert prompt == "<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_with_a_developer_branch_keeps_the_role(tok, tmp_path: Path):
    template = tmp_path / "developer.jinja"
    template.write_text(
        "{%- if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
        "{%- for m in messages %}"
        "{%- if m.role == 'developer' %}<|im_start|>developer\n{{ m.content }}<|im_end|>\n"
        "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
        "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )

    async def run() -> list[int]:
        async with served(tok, ["Bonjour."], tool_template=str(template)) as (gw, engine, http, _):
            assert gw.prompts.template.renders_developer == {False: False, True: True}
            messages = [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
            body = {"model": "m", "messages": messages, "tools": TOOLS["chat"], "max_tokens": 16}
            reply = await http.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            return engine.prompts[0]

    prompt = tok.decode(asyncio.run(run()))
    assert "<|im_start|>developer\nAnswer in French.<|im_end|>" in prompt and prompt.count("Answer in French.") == 1


def test_a_tool_message_without_tool_call_id_is_a_400_naming_it(tok):
    messages = [
        {"role": "user", "content": "3+4?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "7"},
    ]

    async def run() -> tuple[httpx.Response, list]:
        async with served(tok, ["Seven."]) as (_, engine, http, _):
            body = {"model": "m", "messages": messages, "tools": TOOLS["chat"], "max_tokens": 16}
            return await http.post("/v1/chat/completions", json=body), engine.prompts

    reply, prompts = asyncio.run(run())
    assert reply.status_code == 400 and prompts == []
    error = reply.json()["error"]
    assert error["param"] == "messages[2].tool_call_id" and "tool_call_id" in error["message"]


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_tool_choice_none_keeps_the_tools_out_of_the_prompt(tok, api):
    choice = {"type": "none"} if api == "anthropic" else "none"

    async def run() -> list[list[int]]:
        async with served(tok, ["Seven.", "Seven."]) as (_, engine, http, _):
            for body in (_body(api, "What is 3+4?", tools=TOOLS[api], tool_choice=choice), _body(api, "What is 3+4?")):
                reply = await http.post(PATHS[api], json=body)
                assert reply.status_code == 200, reply.text
            return engine.prompts

    offered, plain = asyncio.run(run())
    assert offered == plain and "calc" not in tok.decode(offered)
