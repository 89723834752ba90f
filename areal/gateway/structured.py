"""Structured output and forced tool calls, as the constraint the engine decodes under.

    response_format (chat) / text.format (Responses) ─► Turn.response_schema: a JSON schema
        ("json_object": {"type": "object"}), checked by the grammar library when it is installed
    tool_choice "required" / a named function ─► the rest of the call the gateway forced open,
        in the model's tool-call format, its arguments under the tool's parameter schema
    ─► engine_constraint ─► sampling_params: {"json_schema": ...} (a schema alone) or
        {"structural_tag": ...} (anything else): SGLang's own keys, which the embedded engine
        takes as they are (areal/engine/grammar.py) and the vLLM client maps to its structured outputs

What the engine is asked for:
- A response schema alone: the whole reply is one JSON value under it (then the stop token).
- With tools offered and ``tool_choice`` "auto": the reply is either that JSON or one complete
  tool call (a reply with tools may still call one; its final answer is the JSON).
- ``tool_choice`` "required" or a named function: the gateway appends the call's opening to the
  prompt (``parsers.forced_tool_prefix``), and the continuation is constrained to finish exactly
  one call of the offered (or named) function, arguments valid under its parameter schema, then
  the call's closing marker, then the stop token: the call parses, every time. A function that
  takes no arguments is written whole by the gateway and needs no constraint.
- A prompt that ends inside a reasoning block (``reasoning_open``): any text up to the block's
  ``</think>``, then the above (thinking stays free, the answer does not).

Invariants:
- A schema or tool the grammar library (llguidance) rejects is a 400 naming the field
  (``response_format.json_schema.schema``, ``text.format.schema``, ``tools[i]``) before anything
  is sent; without llguidance here the engine checks it, and its refusal is the 400.
- The constraint is a property of the request, never of the engine: SGLang, vLLM and the embedded
  engine get the same structural tag (xgrammar's format, checked against xgrammar 0.2.7 / 0.2.8),
  JSON in it with at most one whitespace character in a row. A response schema alone is sent as
  ``json_schema``, whose whitespace the engine's grammar backend decides: the embedded engine
  writes ", " and ": " separators and nothing else; SGLang and vLLM allow any whitespace unless
  started without it (``--constrained-json-disable-any-whitespace``; vLLM's
  ``--structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'``).

Not covered: a constrained continuation for the ``qwen3_coder`` and ``gpt-oss`` formats (their
calls are XML and harmony channels: ``tool_choice`` forces their opening only, as before), a
response format under ``gpt-oss`` (a 400), several calls in one constrained reply, and a model
that opens its own reasoning block in its output (constrained from its first token, it writes no
reasoning).
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from areal.gateway.contract import RequestError, Turn
from areal.gateway.parsers import takes_no_arguments
from areal.gateway.toolcalls import DS_CALL_CLOSE, DS_CALL_OPEN, DS_CALLS_CLOSE, DS_CALLS_OPEN, DS_SEP, MISTRAL_OPEN

if TYPE_CHECKING:
    from areal.gateway.core import GatewayConfig

ANY_OBJECT = {"type": "object"}
REASONING_END = {"think": "</think>"}


def _schema_object(value: Any, param: str) -> dict:
    if value is True:
        return {}
    if not isinstance(value, dict):
        raise RequestError(400, f"{param} must be a JSON schema object", param=param)
    return value


@functools.lru_cache(maxsize=256)
def _library_verdict(schema_json: str) -> str:
    """llguidance's complaint about a schema ("" when it compiles, or when llguidance is absent)."""
    try:
        from llguidance import LLMatcher
    except ImportError:
        return ""
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema_json)
    except ValueError as e:
        return str(e)
    return LLMatcher.validate_grammar(grammar).strip()


def check_schema(schema: dict, param: str) -> None:
    """A 400 naming ``param`` when the grammar library cannot compile ``schema``."""
    verdict = _library_verdict(json.dumps(schema, sort_keys=True))
    if verdict:
        raise RequestError(400, f"{param} cannot be honoured: the grammar library rejects the schema: {verdict}", param=param)


def chat_response_schema(value: Any) -> dict | None:
    """Chat Completions' ``response_format`` -> the reply's JSON schema (None: free text)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind != "json_schema":
        raise RequestError(
            400, f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}", param="response_format"
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise RequestError(400, "response_format.json_schema must be an object", param="response_format.json_schema")
    return _named_schema(spec, "response_format.json_schema")


def responses_text_schema(text: Any) -> dict | None:
    """The Responses API's ``text`` -> the reply's JSON schema (None: free text)."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format"}:
        raise RequestError(400, "text may only hold format", param="text")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None if fmt is None else "?"
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind != "json_schema":
        raise RequestError(400, f"text.format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}", param="text.format")
    return _named_schema(fmt, "text.format")


def _named_schema(spec: dict, where: str) -> dict:
    """The schema of a ``{name, schema, strict, description}`` object (``strict`` either way: a
    constrained reply always follows the schema)."""
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise RequestError(400, f"{where}.name must be a non-empty string", param=f"{where}.name")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise RequestError(400, f"{where}.strict must be a boolean", param=f"{where}.strict")
    if spec.get("description") is not None and not isinstance(spec["description"], str):
        raise RequestError(400, f"{where}.description must be a string", param=f"{where}.description")
    schema = ANY_OBJECT if spec.get("schema") is None else _schema_object(spec["schema"], f"{where}.schema")
    check_schema(schema, f"{where}.schema")
    return schema


# ---- tool calls, one format each --------------------------------------------------------------


def call_frame(tool_parser: str, name: str) -> tuple[str, str] | None:
    """The text around one call's arguments object in ``tool_parser``'s format (as the chat
    templates write it, and as ``parsers.forced_tool_prefix`` opens it), or None for a format
    whose arguments are not one JSON object."""
    quoted = json.dumps(name, ensure_ascii=False)
    match tool_parser:
        case "qwen25" | "hermes":
            return f'<tool_call>\n{{"name": {quoted}, "arguments": ', "}\n</tool_call>"
        case "llama3":
            return f'{{"name": {quoted}, "parameters": ', "}"
        case "mistral":
            return f'{MISTRAL_OPEN}[{{"name": {quoted}, "arguments": ', "}]"
        case "deepseekv3":
            return f"{DS_CALLS_OPEN}{DS_CALL_OPEN}function{DS_SEP}{name}\n```json\n", f"\n```{DS_CALL_CLOSE}{DS_CALLS_CLOSE}"
        case "deepseekv31":
            return f"{DS_CALLS_OPEN}{DS_CALL_OPEN}{name}{DS_SEP}", f"{DS_CALL_CLOSE}{DS_CALLS_CLOSE}"
    return None


def _arguments_schema(tool: dict, where: str) -> dict:
    """A function's parameter schema as the schema of its arguments object."""
    params = tool.get("parameters")
    schema = ANY_OBJECT if params is None else _schema_object(params, f"{where}.parameters")
    schema = schema if "type" in schema else {**schema, "type": "object"}  # arguments are an object, always
    check_schema(schema, where)
    return schema


def _call(tool_parser: str, index: int, tool: dict, forced: str) -> dict | None:
    """One complete call of ``tool`` after the ``forced`` text, as a structural-tag element."""
    name = tool["name"]
    frame = call_frame(tool_parser, name)
    if frame is None:
        return None
    head, tail = frame
    if not head.startswith(forced):  # the forced opening is this format's: a bug, not a request error
        raise AssertionError(f"forced text {forced!r} does not open {tool_parser}'s call {head!r}")
    elements = [{"type": "const_string", "value": head[len(forced) :]}] if len(head) > len(forced) else []
    elements += [
        _json(_arguments_schema(tool, f"tools[{index}]")),
        {"type": "const_string", "value": tail},
    ]
    return {"type": "sequence", "elements": elements}


def _json(schema: dict) -> dict:
    """A structural tag's JSON element. At most one whitespace character in a row: xgrammar's JSON
    (SGLang's, vLLM's) allows any whitespace otherwise, which a small model can spend its whole
    budget on (and, without the bound, xgrammar 0.2's tags let raw control characters into
    strings); the embedded engine writes none anyway."""
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1}


def _one_of(elements: list[dict]) -> dict:
    return elements[0] if len(elements) == 1 else {"type": "or", "elements": elements}


def engine_constraint(turn: Turn, config: GatewayConfig, forced: str, reasoning_open: bool) -> dict[str, str]:
    """The sampling params that constrain ``turn``'s reply ({} for none); ``forced``: the text
    the gateway appended to the prompt (``generation.forced_text``)."""
    tools = [t["function"] for t in turn.tools or ()]
    choice, parser = turn.tool_choice, config.tool_parser
    if forced:  # required, or a named function: finish the call the gateway opened
        named = choice["function"]["name"] if isinstance(choice, dict) else None
        offered = [(i, t) for i, t in enumerate(tools) if named in (None, t["name"])]
        if named is not None and takes_no_arguments(offered[0][1].get("parameters")):
            return {}  # written whole by the gateway (parsers.forced_tool_prefix)
        calls = [_call(parser, i, t, forced) for i, t in offered]  # type: ignore[arg-type]  (forced: a parser is set)
        if any(c is None for c in calls):
            return {}  # a format whose calls are not JSON objects: its opening alone is forced
        return _structural_tag(_one_of(calls))  # type: ignore[arg-type]
    schema = turn.response_schema
    if schema is None:
        return {}
    if parser == "gpt-oss" or config.reasoning_parser == "gpt-oss":
        raise RequestError(
            400, f"{turn.response_schema_param} cannot be honoured for the gpt-oss (harmony) format", param=turn.response_schema_param
        )
    answer: dict = _json(schema)
    if tools and choice != "none" and parser is not None:
        calls = [_call(parser, i, t, "") for i, t in enumerate(tools)]
        if any(c is None for c in calls):
            raise RequestError(
                400,
                f"{turn.response_schema_param} with tools cannot be honoured for the {parser} tool-call format "
                "(tool_choice 'none' leaves the tools out)",
                param=turn.response_schema_param,
            )
        answer = _one_of([answer, *calls])  # type: ignore[list-item]
    end = REASONING_END.get(config.reasoning_parser or "") if reasoning_open else None
    if end is not None:
        thought = {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": end}
        return _structural_tag({"type": "sequence", "elements": [thought, answer]})
    if answer["type"] == "json_schema":
        return {"json_schema": json.dumps(schema, ensure_ascii=False)}
    return _structural_tag(answer)


def _structural_tag(fmt: dict) -> dict[str, str]:
    return {"structural_tag": json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)}
