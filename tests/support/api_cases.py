"""The request-feature matrix of the API conformance tests (tests/unit/gateway/test_openapi_conformance.py
validates each reply against the published documents and the lock's SDK types;
tests/integration/agents/test_sdk_releases.py has the newest SDK releases' types check the same
replies), and the exchange that sends requests to a fresh gateway over HTTP.

``CASES``: (id, api, request body without model and max tokens, the scripted engine's replies, the
status the gateway must answer). Replies are what the stand-in engine samples (tests/support/
scripted_engine.py): plain text, a call in the model's ``<tool_call>`` format (``FORCED``: its
continuation, the gateway having sampled the opening itself), reasoning, JSON.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from scripted_engine import ScriptedEngine

from areal.gateway import Gateway, GatewayConfig, serve_http

CALC = {
    "name": "calc",
    "description": "Evaluate arithmetic.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
}
CHAT_TOOLS = [{"type": "function", "function": CALC}]
RESPONSES_TOOLS = [{"type": "function", **CALC}]
ANTHROPIC_TOOLS = [{"name": "calc", "description": CALC["description"], "input_schema": CALC["parameters"]}]
CALL = '<tool_call>\n{"name": "calc", "arguments": {"expr": "3+4"}}\n</tool_call>'
FORCED = '{"name": "calc", "arguments": {"expr": "3+4"}}\n</tool_call>'  # the call's opening is the gateway's
NAMED = ' {"expr": "3+4"}}\n</tool_call>'  # a named function's call: its name too is the gateway's
THINK = "<think>\nAdd them.\n</think>\n\nSeven."
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}
USER = [{"role": "user", "content": "What is 3+4?"}]
HISTORY = [  # a finished tool round in each API's shape, then the model answers
    *USER,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "3+4"}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "7"},
]
RESPONSES_HISTORY = [
    {"role": "user", "content": "What is 3+4?"},
    {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": '{"expr": "3+4"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "7"},
]
ANTHROPIC_HISTORY = [
    *USER,
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {"expr": "3+4"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "7"}]},
]

ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"], "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}
TEXT_FORMAT = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}
JSON = '{"answer": 7}'

# (id, api, request body without model/max tokens, scripted replies, status)
CASES = [
    ("plain", "chat", {"messages": USER}, ["Seven."], 200),
    (
        "system-developer",
        "chat",
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Terse."}, *USER]},
        ["7."],
        200,
    ),
    ("n2-logprobs", "chat", {"messages": USER, "n": 2, "logprobs": True, "top_logprobs": 2}, ["Seven.", "7."], 200),
    (
        "sampling-stop-seed",
        "chat",
        {"messages": USER, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n\n"], "user": "u1"},
        ["7."],
        200,
    ),
    ("tools-call", "chat", {"messages": USER, "tools": CHAT_TOOLS}, [CALL], 200),
    ("tool-choice-required", "chat", {"messages": USER, "tools": CHAT_TOOLS, "tool_choice": "required"}, [FORCED], 200),
    (
        "tool-choice-named",
        "chat",
        {"messages": USER, "tools": CHAT_TOOLS, "tool_choice": {"type": "function", "function": {"name": "calc"}}},
        [NAMED],
        200,
    ),
    (
        "stream-tool-choice-required",
        "chat",
        {"messages": USER, "tools": CHAT_TOOLS, "tool_choice": "required", "stream": True},
        [FORCED],
        200,
    ),
    ("tool-result-turn", "chat", {"messages": HISTORY, "tools": CHAT_TOOLS}, ["It is 7."], 200),
    ("reasoning-effort-none", "chat", {"messages": USER, "reasoning_effort": "none"}, ["7."], 200),  # honoured: nothing changes
    ("reasoning-effort-no-switch", "chat", {"messages": USER, "reasoning_effort": "low"}, [], 400),  # this template has none
    ("reasoning", "chat", {"messages": USER}, [THINK], 200),
    ("json-object", "chat", {"messages": USER, "response_format": {"type": "json_object"}}, [JSON], 200),
    ("json-schema", "chat", {"messages": USER, "response_format": JSON_SCHEMA}, [JSON], 200),
    ("stream-json-schema", "chat", {"messages": USER, "response_format": JSON_SCHEMA, "stream": True}, [JSON], 200),
    ("stream", "chat", {"messages": USER, "stream": True, "stream_options": {"include_usage": True}}, ["Seven."], 200),
    ("stream-logprobs", "chat", {"messages": USER, "stream": True, "logprobs": True, "top_logprobs": 1}, ["Seven."], 200),
    ("stream-tools-call", "chat", {"messages": USER, "tools": CHAT_TOOLS, "stream": True}, [CALL], 200),
    ("stream-reasoning", "chat", {"messages": USER, "stream": True}, [THINK], 200),
    ("no-messages", "chat", {}, [], 400),
    ("bad-role", "chat", {"messages": [{"role": "wizard", "content": "x"}]}, [], 400),
    ("n-over-cap", "chat", {"messages": USER, "n": 99}, [], 400),
    ("plain", "responses", {"input": "What is 3+4?"}, ["Seven."], 200),
    ("instructions-list", "responses", {"instructions": "Be brief.", "input": USER}, ["7."], 200),
    ("tools-call", "responses", {"input": "What is 3+4?", "tools": RESPONSES_TOOLS}, [CALL], 200),
    ("tool-choice-required", "responses", {"input": "What is 3+4?", "tools": RESPONSES_TOOLS, "tool_choice": "required"}, [FORCED], 200),
    (
        "tool-choice-named",
        "responses",
        {"input": "What is 3+4?", "tools": RESPONSES_TOOLS, "tool_choice": {"type": "function", "name": "calc"}},
        [NAMED],
        200,
    ),
    ("tool-result-turn", "responses", {"input": RESPONSES_HISTORY, "tools": RESPONSES_TOOLS}, ["It is 7."], 200),
    ("reasoning-effort-none", "responses", {"input": "What is 3+4?", "reasoning": {"effort": "none"}}, ["7."], 200),
    ("reasoning-effort-no-switch", "responses", {"input": "What is 3+4?", "reasoning": {"effort": "low"}}, [], 400),
    ("reasoning", "responses", {"input": "What is 3+4?"}, [THINK], 200),
    ("sampling", "responses", {"input": "What is 3+4?", "temperature": 0.5, "top_p": 0.9}, ["7."], 200),
    ("text-format", "responses", {"input": "What is 3+4?", "text": TEXT_FORMAT}, [JSON], 200),
    ("stream-text-format", "responses", {"input": "What is 3+4?", "text": TEXT_FORMAT, "stream": True}, [JSON], 200),
    ("stream", "responses", {"input": "What is 3+4?", "stream": True}, ["Seven."], 200),
    ("stream-tools-call", "responses", {"input": "What is 3+4?", "tools": RESPONSES_TOOLS, "stream": True}, [CALL], 200),
    ("stream-reasoning", "responses", {"input": "What is 3+4?", "stream": True}, [THINK], 200),
    ("no-input", "responses", {}, [], 400),
    ("plain", "anthropic", {"messages": USER}, ["Seven."], 200),
    ("system-stop", "anthropic", {"system": "Be brief.", "messages": USER, "stop_sequences": ["\n\n"], "temperature": 0.5}, ["7."], 200),
    ("tools-call", "anthropic", {"messages": USER, "tools": ANTHROPIC_TOOLS}, [CALL], 200),
    ("tool-choice-any", "anthropic", {"messages": USER, "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "any"}}, [FORCED], 200),
    (
        "tool-choice-named",
        "anthropic",
        {"messages": USER, "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool", "name": "calc"}},
        [NAMED],
        200,
    ),
    ("tool-result-turn", "anthropic", {"messages": ANTHROPIC_HISTORY, "tools": ANTHROPIC_TOOLS}, ["It is 7."], 200),
    ("prefill", "anthropic", {"messages": [*USER, {"role": "assistant", "content": "The answer is"}]}, [" 7."], 200),
    ("stream-prefill", "anthropic", {"messages": [*USER, {"role": "assistant", "content": "The answer is"}], "stream": True}, [" 7."], 200),
    ("thinking-disabled", "anthropic", {"messages": USER, "thinking": {"type": "disabled"}}, ["7."], 200),
    ("thinking-no-switch", "anthropic", {"messages": USER, "thinking": {"type": "enabled", "budget_tokens": 1024}}, [], 400),
    ("stream", "anthropic", {"messages": USER, "stream": True}, ["Seven."], 200),
    ("stream-tools-call", "anthropic", {"messages": USER, "tools": ANTHROPIC_TOOLS, "stream": True}, [CALL], 200),
    ("no-messages", "anthropic", {}, [], 400),
    ("bad-role", "anthropic", {"messages": [{"role": "system", "content": "x"}]}, [], 400),
]


@contextlib.asynccontextmanager
async def served(tok, replies: list[str], **config) -> AsyncIterator[tuple[Gateway, ScriptedEngine, httpx.AsyncClient, str]]:
    """A gateway over HTTP on the scripted engine; yields it, the engine, an httpx client holding a
    session's key, and the base URL."""
    engine = ScriptedEngine(tok, [(r, "<|im_end|>") for r in replies])
    gw = Gateway(engine, tok, GatewayConfig(**config))
    runner, url = await serve_http(gw)
    key = gw.open_session("ep")
    try:
        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=60) as http:
            yield gw, engine, http, url
    finally:
        await runner.cleanup()


async def exchange(tok, requests: list[tuple[str, dict, str]], replies: list[str], **config) -> list[httpx.Response]:
    """Each (method, path, body) over HTTP to a fresh gateway holding one session; bodies as given."""
    async with served(tok, replies, **config) as (_, _, http, _):
        return [await http.request(method, path, json=body) for method, path, body in requests]


def sse_events(text: str) -> list[tuple[str | None, dict]]:
    """The (``event:`` name or None, JSON payload) pairs of an SSE body; ``data: [DONE]`` left out."""
    out, name = [], None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and line != "data: [DONE]":
            out.append((name, json.loads(line[6:])))
            name = None
    return out


def body_of(api: str, request_body: dict) -> dict:
    """The case's request as sent: a model and a small max tokens added (a body left empty stays so)."""
    cap = "max_output_tokens" if api == "responses" else "max_tokens"
    return {"model": "m", **request_body, **({cap: 32} if request_body else {})}


async def replies_of_every_case(tok: Any) -> list[tuple[str, bool, dict]]:
    """(api, streamed, payload) of every reply and stream event the 200 cases get, in order."""
    out: list[tuple[str, bool, dict]] = []
    for _, api, request_body, replies, status in CASES:
        if status != 200:
            continue
        body = body_of(api, request_body)
        (reply,) = await exchange(tok, [("POST", PATHS[api], body)], replies)
        assert reply.status_code == 200, reply.text
        if body.get("stream"):
            out += [(api, True, payload) for _, payload in sse_events(reply.text)]
        else:
            out.append((api, False, reply.json()))
    return out
