"""The gateway's constraints (areal/gateway/structured.py), checked against the engine's own
compiler (areal/engine/grammar.py: llguidance on the embedded tokenizer) and the gateway's own
parsers, so that what the constraint allows is what the parsers read.

Unit: response formats (chat, Responses) become a schema or a 400 naming the field; for every
format whose calls are JSON objects, the continuation of a forced call ("required" and named)
accepts exactly the calls of the offered functions with valid arguments, and forced text +
that continuation parses to the call; with tools under "auto" a reply is the JSON or a call; a
prompt left inside a reasoning block keeps its reasoning free; what cannot be honoured is a 400.
"""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.engine.grammar import Grammars
from areal.gateway.contract import RequestError, Sampling, Turn
from areal.gateway.core import GatewayConfig
from areal.gateway.generation import forced_text
from areal.gateway.parsers import parse_output
from areal.gateway.structured import call_frame, chat_response_schema, engine_constraint, responses_text_schema

pytest.importorskip("llguidance")

DEFINE = {
    "type": "function",
    "function": {
        "name": "define",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "maxLength": 12}, "lang": {"enum": ["en", "fr"]}},
            "required": ["word", "lang"],
            "additionalProperties": False,
        },
    },
}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
HANDOFF = {"type": "function", "function": {"name": "handoff", "parameters": {"type": "object", "properties": {}}}}
JSON_FORMATS = ("qwen25", "hermes", "llama3", "mistral", "deepseekv3", "deepseekv31")
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(ensure_embedded_model())


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return Grammars(tokenizer, len(tokenizer) + 1)


def _turn(tools=None, tool_choice=None, schema=None) -> Turn:
    return Turn([{"role": "user", "content": "hi"}], Sampling(max_tokens=8), tools, tool_choice, response_schema=schema)


def _accepts(grammars, tokenizer, params: dict, text: str) -> bool:
    """Does the engine, under ``params``' constraint, allow ``text`` whole and end after it?"""
    ((key, value),) = params.items()
    matcher = grammars.matcher(key, value)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()


def test_response_formats_become_a_schema():
    assert chat_response_schema(None) is None and chat_response_schema({"type": "text"}) is None
    assert chat_response_schema({"type": "json_object"}) == {"type": "object"}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}}
    assert chat_response_schema(fmt) == SCHEMA
    assert responses_text_schema(None) is None and responses_text_schema({"format": {"type": "text"}}) is None
    assert responses_text_schema({"format": {"type": "json_object"}}) == {"type": "object"}
    assert responses_text_schema({"format": {"type": "json_schema", "name": "s", "schema": SCHEMA, "strict": False}}) == SCHEMA


@pytest.mark.parametrize(
    "value, param",
    [
        ({"type": "json"}, "response_format"),
        ("json_object", "response_format"),
        ({"type": "json_schema", "json_schema": {"name": "s", "schema": []}}, "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}, "strict": "yes"}}, "response_format.json_schema.strict"),
        ({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "minProperties": "x"}}}, "response_format.json_schema.schema"),
    ],
)  # fmt: skip
def test_a_format_that_cannot_be_honoured_is_a_400_naming_it(value, param):
    with pytest.raises(RequestError) as e:
        chat_response_schema(value)
    assert e.value.status == 400 and e.value.param == param


@pytest.mark.parametrize("fmt", JSON_FORMATS)
@pytest.mark.parametrize("named", [None, "define", "add"])
def test_a_forced_call_is_finished_to_one_that_parses(grammars, tokenizer, fmt, named):
    config = GatewayConfig(tool_parser=fmt)
    choice = "required" if named is None else {"type": "function", "function": {"name": named}}
    turn = _turn([DEFINE, ADD], choice)
    forced = forced_text(turn, config)
    params = engine_constraint(turn, config, forced, reasoning_open=False)
    assert set(params) == {"structural_tag"}
    calls = {"define": {"word": "cat", "lang": "fr"}, "add": {"a": 3}}
    for name, args in calls.items():
        head, tail = call_frame(fmt, name)
        continuation = head[len(forced) :] + json.dumps(args) + tail if head.startswith(forced) else None
        if named not in (None, name):
            assert continuation is None or not _accepts(grammars, tokenizer, params, continuation)
            continue
        assert _accepts(grammars, tokenizer, params, continuation), (fmt, name, forced + continuation)
        parsed = parse_output(forced + continuation, fmt, None, tools=turn.tools)
        assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [(name, args)] and parsed.malformed == 0
    # arguments outside the schema are never allowed
    head, tail = call_frame(fmt, "define")
    if head.startswith(forced):
        assert not _accepts(grammars, tokenizer, params, head[len(forced) :] + json.dumps({"word": "cat", "lang": "de"}) + tail)
        assert not _accepts(grammars, tokenizer, params, head[len(forced) :] + json.dumps({"word": "cat"}) + tail)


def test_other_formats_force_the_opening_only_and_a_function_without_arguments_is_written_whole():
    turn = _turn([DEFINE, HANDOFF], "required")
    for fmt in ("qwen3_coder", "gpt-oss"):
        config = GatewayConfig(tool_parser=fmt, reasoning_parser="gpt-oss" if fmt == "gpt-oss" else "think")
        assert engine_constraint(turn, config, forced_text(turn, config), reasoning_open=False) == {}
    named = _turn([DEFINE, HANDOFF], {"type": "function", "function": {"name": "handoff"}})
    config = GatewayConfig(tool_parser="qwen25")
    assert forced_text(named, config).endswith("</tool_call>")
    assert engine_constraint(named, config, forced_text(named, config), reasoning_open=False) == {}


def test_a_response_schema_alone_with_tools_and_after_reasoning(grammars, tokenizer):
    config = GatewayConfig(tool_parser="qwen25")
    alone = engine_constraint(_turn(schema=SCHEMA), config, "", reasoning_open=False)
    assert alone == {"json_schema": json.dumps(SCHEMA)}
    assert _accepts(grammars, tokenizer, alone, '{"ok": true}') and not _accepts(grammars, tokenizer, alone, "ok")
    none = engine_constraint(_turn([DEFINE], "none", SCHEMA), config, "", reasoning_open=False)
    assert none == alone  # tools the prompt does not show cannot be called
    auto = engine_constraint(_turn([DEFINE], None, SCHEMA), config, "", reasoning_open=False)
    call = '<tool_call>\n{"name": "define", "arguments": {"word": "cat", "lang": "en"}}\n</tool_call>'
    assert _accepts(grammars, tokenizer, auto, '{"ok": false}') and _accepts(grammars, tokenizer, auto, call)
    assert not _accepts(grammars, tokenizer, auto, "I think so")
    thinking = engine_constraint(_turn(schema=SCHEMA), config, "", reasoning_open=True)
    assert _accepts(grammars, tokenizer, thinking, "Any thought at all, {even braces}.</think>" + '{"ok": true}')
    assert not _accepts(grammars, tokenizer, thinking, "Any thought</think>no json")


def test_what_the_format_cannot_carry_is_a_400():
    with pytest.raises(RequestError) as e:
        engine_constraint(_turn(schema=SCHEMA), GatewayConfig(tool_parser="gpt-oss", reasoning_parser="gpt-oss"), "", False)
    assert e.value.param == "response_format"
    turn = _turn([DEFINE], None, SCHEMA)
    turn.response_schema_param = "text.format"
    with pytest.raises(RequestError) as e:
        engine_constraint(turn, GatewayConfig(tool_parser="qwen3_coder"), "", False)
    assert e.value.param == "text.format" and "qwen3_coder" in e.value.message
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"pattern": "(?<=a)"}}}}}
    with pytest.raises(RequestError) as e:
        engine_constraint(_turn([DEFINE, bad], "required"), GatewayConfig(), "<tool_call>\n", False)
    assert e.value.param == "tools[1]"
