"""What a parse of model text gives (``ToolCall``, ``ParsedOutput``, ``StreamEvent``), and the
tool-call bodies: the text of one span or tail of a format -> ``ToolCall``s, or None.

The scanner in ``parsers`` finds where a format's calls are (between ``<tool_call>`` and
``</tool_call>``, after ``<|python_tag|>``, ...); the functions here read what is inside. Each one
never raises on model text: text that does not parse gives None, and the scanner keeps it in the
content verbatim.

Grammars (one function each):
- ``parse_json_call`` (qwen25 / hermes): ``{"name": N, "arguments": {...}}``.
- ``parse_qwen3_coder`` (Qwen3-Coder, Qwen3.5): ``<function=N>`` then per argument
  ``<parameter=K>\\nvalue\\n</parameter>``, then ``</function>``. Values are text; each is typed by
  the request's JSON schema for it when one is given (string, integer, number, boolean, object,
  array), else read as JSON when it parses as a non-string, else kept as text (SGLang's and vLLM's
  rule for these models).
- ``parse_llama`` (llama3): ``{"name": N, "parameters": {...}}``, several separated by ``;``.
- ``parse_mistral``: ``[{"name": N, "arguments": {...}}, ...]`` or ``N[ARGS]{...}`` per ``[TOOL_CALLS]``.
- ``parse_deepseek_v3``: per call ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>N\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``.
- ``parse_deepseek_v31``: per call ``<｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``.

``ToolCall.arguments`` is always the compact JSON (``separators=(",", ":")``, non-ASCII kept) of
an object, so equal arguments compare equal as text; NaN/Infinity and lone surrogates never parse,
and a raw control character in a string is read as that character (escaped in ``arguments``).
"""

from __future__ import annotations

import json
import math
import re
import secrets
from typing import Any

import msgspec

MISTRAL_OPEN, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
# DeepSeek's markers use FULLWIDTH VERTICAL LINE (U+FF5C) and LOWER ONE EIGHTH BLOCK (U+2581).
DS_CALLS_OPEN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
DS_CALLS_CLOSE = "<\uff5ctool\u2581calls\u2581end\uff5c>"
DS_CALL_OPEN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
DS_CALL_CLOSE = "<\uff5ctool\u2581call\u2581end\uff5c>"
DS_SEP = "<\uff5ctool\u2581sep\uff5c>"
MISTRAL_MARKERS = (MISTRAL_OPEN, MISTRAL_ARGS, MISTRAL_CALL_ID)
DS_MARKERS = (DS_CALLS_OPEN, DS_CALLS_CLOSE, DS_CALL_OPEN, DS_CALL_CLOSE, DS_SEP)


class ToolCall(msgspec.Struct, frozen=True):
    id: str  # "call_" + 24 random hex chars
    name: str
    arguments: str  # JSON object text (compact json.dumps of the parsed object)


class ParsedOutput(msgspec.Struct):
    content: str  # text outside tool calls and reasoning, tags removed
    reasoning: str | None = None  # text inside <think>...</think> (or harmony's analysis channel); None when absent
    tool_calls: list[ToolCall] = []
    # call spans or tails the parser could not read (bad JSON, not an object, never closed): the
    # model tried to call a tool, and its markup stays in ``content`` verbatim
    malformed: int = 0


class StreamEvent(msgspec.Struct):
    kind: str  # "content" | "reasoning"
    text: str


def new_call_id() -> str:
    """A fresh tool-call id in OpenAI's shape: ``call_`` + 24 hex chars."""
    return "call_" + secrets.token_hex(12)


# ---- JSON helpers: strict enough that whatever they accept re-serialises as valid JSON -----------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite JSON constant {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf, which json.dumps writes as "Infinity"
        raise ValueError(f"non-finite number {text}")
    return value


# strict=False: a raw control character inside a string (a tab, or what xgrammar's structural tags
# let an engine write) is read as itself; the arguments are re-serialised with it escaped
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float, strict=False)
_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone "\\ud800" escape cannot be encoded as UTF-8
_WS = re.compile(r"\s*")


def _decode_at(text: str, pos: int) -> tuple[Any, int] | None:
    """One JSON value starting at ``text[pos]`` (whitespace skipped) and the index after it."""
    pos = _WS.match(text, pos).end()
    try:
        return _DECODER.raw_decode(text, pos)
    except (ValueError, RecursionError):  # deliberate: bad model JSON is plain text, not an error
        return None


def decode_json(text: str) -> Any | None:
    """A JSON value that is the whole of ``text`` (surrounding whitespace allowed), else None."""
    got = _decode_at(text, 0)
    if got is None or text[got[1] :].strip():
        return None
    return got[0]


def make_call(name: Any, args: Any) -> ToolCall | None:
    """A call with compact JSON arguments, or None when the name or arguments cannot be one."""
    if not isinstance(name, str) or not name.strip() or not isinstance(args, dict):
        return None
    arguments = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    if _SURROGATE.search(arguments) or _SURROGATE.search(name):
        return None
    return ToolCall(id=new_call_id(), name=name.strip(), arguments=arguments)


def _call_from_object(obj: Any, args_keys: tuple[str, ...]) -> ToolCall | None:
    """``{"name": N, <args key>: {...}}`` -> ToolCall; a missing arguments key means ``{}``."""
    if not isinstance(obj, dict):
        return None
    args = next((obj[k] for k in args_keys if k in obj), {})
    return make_call(obj.get("name"), args)


def _all_or_none(calls: list[ToolCall | None]) -> list[ToolCall] | None:
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


# ---- one function per grammar ---------------------------------------------------------------------


def parse_json_call(inner: str) -> list[ToolCall] | None:
    return _all_or_none([_call_from_object(decode_json(inner), ("arguments",))])


_QC_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.DOTALL)
_QC_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def parse_qwen3_coder(inner: str, tools: list[dict] | None = None) -> list[ToolCall] | None:
    """The inside of one ``<tool_call>`` span in Qwen3-Coder's XML (one or more functions)."""
    calls: list[ToolCall | None] = []
    pos = 0
    while pos < len(inner) and inner[pos:].strip():
        m = _QC_FUNCTION.match(inner, pos)
        if m is None:
            return None
        name, body = m.group(1).strip(), m.group(2)
        schema = _parameter_schemas(tools, name)
        args: dict[str, Any] = {}
        at = 0
        while body[at:].strip():
            p = _QC_PARAMETER.match(body, at)
            if p is None:
                return None
            value = p.group(2)
            value = value[1:] if value.startswith("\n") else value  # the template writes "\n" around each value
            value = value[:-1] if value.endswith("\n") else value
            args[p.group(1).strip()] = _typed_value(value, schema.get(p.group(1).strip()))
            at = p.end()
        calls.append(make_call(name, args))
        pos = m.end()
    return _all_or_none(calls)


def _parameter_schemas(tools: list[dict] | None, name: str) -> dict[str, Any]:
    """The JSON schema of each parameter of function ``name`` in a request's ``tools``."""
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            return props if isinstance(props, dict) else {}
    return {}


def _typed_value(text: str, schema: Any) -> Any:
    """A parameter's text as the type its schema declares; without one, JSON if it is a non-string."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):  # ["string", "null"]: the first non-null type decides
        kind = next((k for k in kind if k != "null"), None)
    if kind == "string":
        return text
    if kind == "boolean":
        lowered = text.strip().lower()
        return {"true": True, "false": False}.get(lowered, text)
    value = decode_json(text)
    if kind in ("integer", "number"):
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else text
    if kind in ("object", "array"):
        return value if isinstance(value, (dict, list)) else text
    return text if value is None or isinstance(value, str) else value


_DS_CALL = re.compile(
    rf"\s*{re.escape(DS_CALL_OPEN)}(?P<kind>[^\n]*?){re.escape(DS_SEP)}(?P<name>[^\n]*?)"
    rf"\s*```(?:json)?\s*(?P<args>.*?)\s*```\s*{re.escape(DS_CALL_CLOSE)}",
    re.DOTALL,
)
_DS31_CALL = re.compile(
    rf"\s*{re.escape(DS_CALL_OPEN)}(?P<name>[^\n]*?){re.escape(DS_SEP)}(?P<args>.*?){re.escape(DS_CALL_CLOSE)}",
    re.DOTALL,
)


def parse_deepseek_v3(inner: str) -> list[ToolCall] | None:
    return _parse_deepseek(inner, _DS_CALL)


def parse_deepseek_v31(inner: str) -> list[ToolCall] | None:
    return _parse_deepseek(inner, _DS31_CALL)


def _parse_deepseek(inner: str, call: re.Pattern[str]) -> list[ToolCall] | None:
    """The calls between DeepSeek's calls markers, each matching ``call`` (V3's names its kind,
    which must be ``function``; V3.1's has none), back to back; None if any does not parse."""
    calls: list[ToolCall | None] = []
    pos = 0
    while inner[pos:].strip():
        m = call.match(inner, pos)
        if m is None or m.groupdict().get("kind", "function").strip() != "function":
            return None
        calls.append(make_call(m.group("name"), decode_json(m.group("args"))))
        pos = m.end()
    return _all_or_none(calls)


def parse_llama(body: str) -> list[ToolCall] | None:
    calls: list[ToolCall | None] = []
    pos = 0
    while True:
        got = _decode_at(body, pos)
        if got is None:
            return None
        calls.append(_call_from_object(got[0], ("parameters", "arguments")))
        pos = _WS.match(body, got[1]).end()
        if pos < len(body):
            if body[pos] != ";":  # two calls must be separated by ';'
                return None
            pos = _WS.match(body, pos + 1).end()
        if pos == len(body):  # a trailing ';' is allowed
            return _all_or_none(calls)


def parse_mistral(body: str) -> list[ToolCall] | None:
    if body.lstrip().startswith("["):
        items = decode_json(body)
        if not isinstance(items, list):
            return None
        return _all_or_none([_call_from_object(item, ("arguments",)) for item in items])
    calls: list[ToolCall | None] = []
    for segment in body.split(MISTRAL_OPEN):  # newer form: N[ARGS]{...} per marker
        name, sep, args = segment.partition(MISTRAL_ARGS)
        if not sep:
            return None
        calls.append(make_call(name.partition(MISTRAL_CALL_ID)[0], decode_json(args)))
    return _all_or_none(calls)
