"""Tool-call and reasoning parsers: model text -> content, reasoning and tool calls.

One incremental scanner (``StreamParser``) serves both paths; ``parse_output`` is that scanner fed
the whole text at once. The streaming path is therefore the non-streaming path by construction,
and the property test checks what is left to check: the result does not depend on how the text
was cut into deltas.

    text ──► CONTENT ──<think>──► REASONING ──</think>──► CONTENT
                │  opener of a span (<tool_call>, <｜tool▁calls▁begin｜>) ──► SPAN ──closer──► CONTENT
                │  opener of a tail ([TOOL_CALLS], <|python_tag|>, llama3 "{" first) ──► TAIL (to the end)

Formats (``tool_parser``; the grammar of each call body is in ``toolcalls``):
- ``qwen25`` / ``hermes`` (same grammar; Qwen2.5, Qwen3): ``<tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>``,
  any number of spans (parallel calls), text allowed around them.
- ``qwen3_coder`` (Qwen3-Coder, Qwen3.5): ``<tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>\n...``
  ``</function>\n</tool_call>``, spans as above; values typed by the request's tool schemas.
- ``llama3``: ``{"name": N, "parameters": {...}}`` as the whole message (first non-blank char ``{``),
  or after ``<|python_tag|>``; several separated by ``;``.
- ``mistral``: ``[TOOL_CALLS][{"name": N, "arguments": {...}}, ...]`` or the newer
  ``[TOOL_CALLS]N[ARGS]{...}`` (repeated for parallel calls); everything after the marker is calls.
- ``deepseekv3``: ``<｜tool▁calls▁begin｜>`` then per call ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>N``
  ``\n```json\n{...}\n```<｜tool▁call▁end｜>``, then ``<｜tool▁calls▁end｜>``.
- ``deepseekv31`` (DeepSeek-V3.1): the same span, per call ``<｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``.
- ``gpt-oss`` (GPT-OSS harmony): channels, not spans; ``harmony.HarmonyParser`` scans it. Its
  reasoning is the analysis channel, so its reasoning parser is ``gpt-oss`` too (``GatewayConfig``
  pairs them), and a harmony text is scanned as harmony even when a request offers no tools.
- Reasoning (``reasoning_parser="think"``): the first ``<think>...</think>`` block (anywhere outside
  a tool span) is reasoning; an unclosed block runs to the end of the text. Tags inside reasoning
  are reasoning text (no tool calls are parsed there). ``reasoning_open``: the prompt ended inside
  a block (Qwen3.5's, DeepSeek-V3.1's generation prompt ends with ``<think>``), so the text starts
  as reasoning and ``</think>`` ends it.

Invariants:
- Never raises on model text. A span or tail that does not parse (bad JSON, not an object, no
  string ``name``, arguments not an object, NaN/Infinity, lone surrogates) stays in ``content``
  verbatim, tags and surrounding whitespace included. An unclosed span is content too. Each
  such span or tail counts in ``ParsedOutput.malformed`` (a call the model tried to make).
- Whitespace touching a tag belongs to the tag: trailing whitespace before an opener and leading
  whitespace after a closer are dropped, and reasoning is stripped. (Inline "a <tool_call>..
  </tool_call> b" therefore gives content "ab": models put calls on their own lines.)
- Streaming: ``feed`` returns only text that no later delta can turn into a tag; it holds back a
  suffix that could begin a marker, trailing whitespace, and everything inside a span or tail.
  Concatenated events of ``feed`` + ``finish`` equal ``finish``'s ``ParsedOutput`` (content and
  reasoning), and that equals ``parse_output`` of the whole text up to the random ``ToolCall.id``.
- ``ToolCall.arguments`` is the compact JSON (``separators=(",", ":")``, non-ASCII kept) of the
  parsed object, so equal arguments compare equal as text.

Not covered: Llama-3.2 pythonic calls (``[f(a=1)]``), DeepSeek-V3.2's DSML calls, harmony's
built-in tools (``browser.*``, ``python``: their messages stay content), and checking names
against the request's ``tools`` (the caller's job).
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from areal.gateway import harmony
from areal.gateway.toolcalls import (
    DS_CALL_CLOSE,
    DS_CALL_OPEN,
    DS_CALLS_CLOSE,
    DS_CALLS_OPEN,
    DS_MARKERS,
    DS_SEP,
    MISTRAL_ARGS,
    MISTRAL_CALL_ID,
    MISTRAL_MARKERS,
    MISTRAL_OPEN,
    ParsedOutput,
    StreamEvent,
    ToolCall,
    new_call_id,
    parse_deepseek_v3,
    parse_deepseek_v31,
    parse_json_call,
    parse_llama,
    parse_mistral,
    parse_qwen3_coder,
)

__all__ = [  # the parsed types live in toolcalls; this module is where callers import them from
    "DS_CALL_CLOSE",
    "DS_CALL_OPEN",
    "DS_CALLS_CLOSE",
    "DS_CALLS_OPEN",
    "DS_MARKERS",
    "DS_SEP",
    "MISTRAL_ARGS",
    "MISTRAL_CALL_ID",
    "MISTRAL_MARKERS",
    "MISTRAL_OPEN",
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "ParsedOutput",
    "StreamEvent",
    "StreamParser",
    "ToolCall",
    "forced_tool_prefix",
    "new_call_id",
    "parse_output",
    "reasoning_parser_name",
    "takes_no_arguments",
    "tool_parser_name",
]

TOOL_PARSERS: tuple[str, ...] = ("qwen25", "hermes", "llama3", "mistral", "deepseekv3", "qwen3_coder", "deepseekv31", "gpt-oss")
REASONING_PARSERS: tuple[str, ...] = ("think", "gpt-oss")  # <think>...</think> (Qwen3/DeepSeek-R1 style); harmony's analysis
AUTO = "auto"  # tool_parser: chosen from the tokenizer by the gateway (``formats.detect_tool_parser``)
# The names SGLang's and vLLM's servers use for the same formats (--tool-call-parser,
# --reasoning-parser), so that a config written for either works here unchanged.
TOOL_PARSER_ALIASES: dict[str, str] = {
    "qwen": "qwen25",
    "qwen2_5": "qwen25",
    "qwen3": "hermes",
    "qwen3_xml": "qwen3_coder",
    "qwen3-coder": "qwen3_coder",
    "llama3_json": "llama3",
    "llama4_json": "llama3",
    "deepseek_v3": "deepseekv3",
    "deepseek-v3": "deepseekv3",
    "deepseek_v31": "deepseekv31",
    "deepseek-v31": "deepseekv31",
    "deepseek-v3.1": "deepseekv31",
    "gpt_oss": "gpt-oss",
    "openai": "gpt-oss",
    "harmony": "gpt-oss",
}
REASONING_PARSER_ALIASES: dict[str, str] = {
    "qwen3": "think",
    "qwen3-thinking": "think",
    "qwen3_thinking": "think",
    "deepseek-r1": "think",
    "deepseek_r1": "think",
    "deepseek-v3": "think",
    "deepseek_v3": "think",
    "deepseek_v31": "think",
    "deepseek-v31": "think",
    "gpt_oss": "gpt-oss",
    "openai_gptoss": "gpt-oss",
    "openai": "gpt-oss",
    "harmony": "gpt-oss",
}
# Formats those servers know and this gateway does not parse yet: named, so the error says so.
_NOT_YET = {
    "pythonic": "pythonic tool calls",
    "llama4_pythonic": "pythonic tool calls",
    "kimi_k2": "Kimi K2 tool calls",
    "deepseekv32": "DeepSeek-V3.2's DSML tool calls",
    "deepseek_v32": "DeepSeek-V3.2's DSML tool calls",
    "glm45": "GLM-4.5 tool calls",
}


def tool_parser_name(name: str | None) -> str | None:
    """This gateway's name for a tool-call parser given by SGLang's, vLLM's or its own name, or
    ``"auto"`` (the gateway then reads the format off its tokenizer)."""
    if name == AUTO:
        return name
    return _parser_name(name, TOOL_PARSERS, TOOL_PARSER_ALIASES, "tool_parser")


def reasoning_parser_name(name: str | None) -> str | None:
    """This gateway's name for a reasoning parser given by SGLang's, vLLM's or its own name."""
    return _parser_name(name, REASONING_PARSERS, REASONING_PARSER_ALIASES, "reasoning_parser")


def _parser_name(name: str | None, known: tuple[str, ...], aliases: dict[str, str], field: str) -> str | None:
    if name is None or name in known:
        return name
    if name in aliases:
        return aliases[name]
    if name in _NOT_YET:
        raise ValueError(f"gateway.{field}={name!r}: {_NOT_YET[name]} are not parsed by this gateway yet")
    auto = ", 'auto'" if field == "tool_parser" else ""
    raise ValueError(
        f"gateway.{field} must be one of {', '.join(known)}{auto} (or SGLang's / vLLM's names: "
        f"{', '.join(sorted(aliases))}) or None, got {name!r}"
    )


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
QWEN_OPEN, QWEN_CLOSE = "<tool_call>", "</tool_call>"
LLAMA_OPEN = "<|python_tag|>"


def forced_tool_prefix(tool_parser: str, name: str | None, no_arguments: bool = False) -> str:
    """The opening of a tool call in ``tool_parser``'s format, for ``tool_choice`` "required"
    (``name`` None: any function) or a named function (through the key of its arguments).

    The gateway appends its ids to the prompt and lets the model continue, so whatever the model
    samples next completes a call; the parser is fed this text first, so the call it sees is whole.
    It ends where a token ends in the canonical tokenisation: after ``"arguments":``, not after the
    space that follows, because BPE vocabularies (Qwen2.5's, the embedded model's) merge that space
    into the next token (`` {"``); a lone space token would be text the model never saw there.

    ``no_arguments`` (a named function whose schema declares no parameters, e.g. an OpenAI Agents
    handoff): ``{}`` is then the only canonical arguments object, so the call is written whole,
    through its closing marker, and the model samples only what follows it.
    """
    _check_names(tool_parser, None)
    quoted = None if name is None else json.dumps(name, ensure_ascii=False)
    whole = no_arguments and quoted is not None
    match tool_parser:
        case "qwen25" | "hermes":
            if whole:
                return f'{QWEN_OPEN}\n{{"name": {quoted}, "arguments": {{}}}}\n{QWEN_CLOSE}'
            return QWEN_OPEN + "\n" + ("" if quoted is None else '{"name": ' + quoted + ', "arguments":')
        case "llama3":
            if whole:
                return f'{{"name": {quoted}, "parameters": {{}}}}'
            return '{"name":' + ("" if quoted is None else " " + quoted + ', "parameters":')
        case "mistral":
            if whole:
                return f'{MISTRAL_OPEN}[{{"name": {quoted}, "arguments": {{}}}}'
            return MISTRAL_OPEN + "[" + ("" if quoted is None else '{"name": ' + quoted + ', "arguments":')
        case "deepseekv3":
            head = DS_CALLS_OPEN + DS_CALL_OPEN + "function" + DS_SEP
            if whole:
                return f"{head}{name}\n```json\n{{}}\n```{DS_CALL_CLOSE}"
            return head + ("" if name is None else name + "\n```json\n")
        case "deepseekv31":
            head = DS_CALLS_OPEN + DS_CALL_OPEN
            if whole:
                return f"{head}{name}{DS_SEP}{{}}{DS_CALL_CLOSE}"
            return head + ("" if name is None else name + DS_SEP)
        case "qwen3_coder":
            # "<function" then "=name": the pre-tokenizer joins "=" to the name, so the prefix of
            # "required" stops before it; a named call ends after ">\n", a token of its own.
            if whole:
                return f"{QWEN_OPEN}\n<function={name}>\n</function>\n{QWEN_CLOSE}"
            return QWEN_OPEN + "\n<function" + ("" if name is None else f"={name}>\n")
        case _:  # gpt-oss
            return harmony.forced_prefix(name, whole)


def takes_no_arguments(parameters: Any) -> bool:
    """True when a function's JSON schema declares no parameters (absent, or an object schema with
    no properties, nothing required and no minimum count): ``{}`` is then valid arguments."""
    if parameters is None:
        return True
    return (
        isinstance(parameters, dict)
        and not parameters.get("properties")
        and not parameters.get("required")
        and not parameters.get("minProperties")
    )


def parse_output(
    text: str,
    tool_parser: str | None = "qwen25",
    reasoning_parser: str | None = "think",
    *,
    tools: list[dict] | None = None,
    reasoning_open: bool = False,
) -> ParsedOutput:
    """Split a finished model output into content, reasoning and tool calls (never raises on text).
    ``tools``: the request's, for formats that type arguments by their schema (qwen3_coder);
    ``reasoning_open``: the prompt ended inside a ``<think>`` block."""
    if (
        not reasoning_open
        and (tool_parser is None or (tool_parser in _TOOL_OPENERS and tool_parser != "llama3"))
        and reasoning_parser in (None, "think")
    ):
        # No marker anywhere: the scanner would pass every character through as content, so the
        # common plain answer skips it. (llama3 is excluded: a leading "{" opens a call there.)
        markers = (_TOOL_OPENERS[tool_parser] if tool_parser else ()) + ((THINK_OPEN,) if reasoning_parser else ())
        if not any(m in text for m in markers):
            return ParsedOutput(text)
    parser = StreamParser(tool_parser, reasoning_parser, tools=tools, reasoning_open=reasoning_open)
    parser.feed(text)
    return parser.finish()[1]


# ---- the scanner ----------------------------------------------------------------------------------

_CONTENT, _REASONING, _SPAN, _TAIL = "content", "reasoning", "span", "tail"
_SPAN_CLOSER = {QWEN_OPEN: QWEN_CLOSE, DS_CALLS_OPEN: DS_CALLS_CLOSE}
_TOOL_OPENERS = {  # gpt-oss has none: harmony.HarmonyParser scans it
    "qwen25": (QWEN_OPEN,),
    "hermes": (QWEN_OPEN,),
    "qwen3_coder": (QWEN_OPEN,),
    "llama3": (LLAMA_OPEN,),
    "mistral": (MISTRAL_OPEN,),
    "deepseekv3": (DS_CALLS_OPEN,),
    "deepseekv31": (DS_CALLS_OPEN,),
}


def _check_names(tool_parser: str | None, reasoning_parser: str | None) -> None:
    if tool_parser is not None and tool_parser not in TOOL_PARSERS:
        raise ValueError(f"unknown tool_parser {tool_parser!r}; choose one of {', '.join(TOOL_PARSERS)} or None")
    if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning_parser {reasoning_parser!r}; choose one of {', '.join(REASONING_PARSERS)} or None")


@cache
def _prefix_pattern(markers: tuple[str, ...]) -> tuple[re.Pattern[str], int]:
    """A regex matching, at the end of a text, any proper prefix of a marker; and the longest one."""
    prefixes = sorted({m[:k] for m in markers for k in range(1, len(m))}, key=len, reverse=True)
    if not prefixes:
        return re.compile(r"(?!)"), 0
    return re.compile("(?:" + "|".join(map(re.escape, prefixes)) + r")\Z"), max(map(len, prefixes))


def _held_suffix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some marker."""
    pattern, longest = _prefix_pattern(markers)
    m = pattern.search(text, max(0, len(text) - longest))  # leftmost match = longest suffix
    return len(text) - m.start() if m else 0


class StreamParser:
    """Incremental parser: ``feed`` deltas as they are sampled, then ``finish`` once."""

    def __init__(
        self,
        tool_parser: str | None = "qwen25",
        reasoning_parser: str | None = "think",
        *,
        tools: list[dict] | None = None,
        reasoning_open: bool = False,
    ) -> None:
        """``tools``: the request's tools (typing qwen3_coder's argument values); ``reasoning_open``:
        the prompt ended inside a ``<think>`` block, so the text starts as reasoning."""
        _check_names(tool_parser, reasoning_parser)
        # GPT-OSS: a text of channels, scanned by harmony's own parser when either names it (calls
        # only with a tool parser: None when the request offered no tools)
        self._harmony = harmony.HarmonyParser(tool_parser is not None) if "gpt-oss" in (tool_parser, reasoning_parser) else None
        self._tool = tool_parser
        self._tools = tools
        self._think = reasoning_parser is not None
        self._buf = ""  # text not yet consumed: held back, or inside a span/tail
        self._state = _CONTENT
        self._skip_ws = False  # drop leading whitespace (after a closer, inside reasoning)
        self._think_done = False  # only the first <think> block is reasoning
        self._at_start = True  # llama3: no content yet, so a leading "{" opens a tail
        self._raw = ""  # whitespace + opener of the current span/tail, restored if it is malformed
        self._closer = ""  # closer of the current span
        self._scan_from = 0  # where the span's closer search resumes
        self._content: list[str] = []
        self._reasoning: list[str] | None = None
        self._calls: list[ToolCall] = []
        self._malformed = 0  # spans and tails that did not parse (kept as content)
        self._events: list[StreamEvent] = []
        self._finished = False
        if reasoning_open and self._think:
            self._state, self._skip_ws, self._reasoning = _REASONING, True, []

    def feed(self, delta: str) -> list[StreamEvent]:
        """Consume ``delta``; return the content/reasoning text that is safe to emit now."""
        if self._harmony is not None:
            return self._harmony.feed(delta)
        if self._finished:
            raise RuntimeError("StreamParser.feed after finish")
        self._buf += delta
        while self._step(final=False):
            pass
        return self._take_events()

    def finish(self) -> tuple[list[StreamEvent], ParsedOutput]:
        """Flush held-back text, parse any open span/tail; the result equals ``parse_output``."""
        if self._harmony is not None:
            return self._harmony.finish()
        if not self._finished:
            while self._step(final=True):
                pass
            self._finished = True
        reasoning = None if self._reasoning is None else "".join(self._reasoning)
        return self._take_events(), ParsedOutput("".join(self._content), reasoning, list(self._calls), self._malformed)

    # ---- internals ----

    def _take_events(self) -> list[StreamEvent]:
        events, self._events = self._events, []
        return events

    def _emit(self, kind: str, text: str) -> None:
        if not text:
            return
        (self._content if kind == _CONTENT else self._reasoning).append(text)  # type: ignore[union-attr]
        if self._events and self._events[-1].kind == kind:
            self._events[-1].text += text
        else:
            self._events.append(StreamEvent(kind, text))

    def _markers(self) -> tuple[str, ...]:
        if self._state == _REASONING:
            return (THINK_CLOSE,)
        markers = _TOOL_OPENERS[self._tool] if self._tool else ()
        if self._think and not self._think_done:
            markers += (THINK_OPEN,)
        return markers

    def _step(self, final: bool) -> bool:
        """Advance once; True when a transition happened and the loop should run again."""
        if self._skip_ws:
            stripped = self._buf.lstrip()
            if not stripped and not final:
                self._buf = ""
                return False  # still inside the whitespace run: keep skipping next time
            self._buf, self._skip_ws = stripped, False
        if self._state == _SPAN:
            return self._step_span(final)
        if self._state == _TAIL:
            if final:
                self._close_tail()
            return False
        if self._state == _CONTENT and self._tool == "llama3" and self._at_start:
            head = self._buf.lstrip()
            if not head and not final:
                return False  # only whitespace so far: cannot tell yet
            self._at_start = False
            if head.startswith("{"):
                self._raw, self._buf, self._state = "", self._buf, _TAIL
                return True
        return self._step_text(final)

    def _step_text(self, final: bool) -> bool:
        kind = self._state
        markers = self._markers()
        found = [(i, m) for m in markers if (i := self._buf.find(m)) >= 0]
        if found:
            i, marker = min(found)
            before = self._buf[:i]
            kept = before.rstrip()
            self._emit(kind, kept)
            self._buf = self._buf[i + len(marker) :]
            if marker == THINK_CLOSE:
                self._state, self._think_done, self._skip_ws = _CONTENT, True, True
                self._at_start = not self._content
            elif marker == THINK_OPEN:
                self._state, self._skip_ws, self._reasoning = _REASONING, True, []
            else:
                self._raw = before[len(kept) :] + marker
                self._state = _SPAN if marker in _SPAN_CLOSER else _TAIL
                self._closer = _SPAN_CLOSER.get(marker, "")
                self._scan_from = 0
            return True
        if final:
            self._emit(kind, self._buf)
            self._buf = ""
            return False
        head = self._buf[: len(self._buf) - _held_suffix(self._buf, markers)]
        kept = head.rstrip()  # trailing whitespace may still turn out to touch a tag
        self._emit(kind, kept)
        self._buf = self._buf[len(kept) :]
        return False

    def _step_span(self, final: bool) -> bool:
        closer = self._closer
        i = self._buf.find(closer, self._scan_from)
        if i < 0:
            if final:
                self._emit(_CONTENT, self._raw + self._buf)  # unclosed: plain text
                self._buf, self._state = "", _CONTENT
                self._malformed += 1
            else:
                self._scan_from = max(0, len(self._buf) - len(closer) + 1)
            return False
        inner, self._buf = self._buf[:i], self._buf[i + len(closer) :]
        calls = self._parse_span(inner)
        if calls is None:
            self._emit(_CONTENT, self._raw + inner + closer)
            self._malformed += 1
        else:
            self._calls.extend(calls)
            self._skip_ws = True
        self._state = _CONTENT
        return True

    def _parse_span(self, inner: str) -> list[ToolCall] | None:
        match self._tool:
            case "qwen3_coder":
                return parse_qwen3_coder(inner, self._tools)
            case "deepseekv3":
                return parse_deepseek_v3(inner)
            case "deepseekv31":
                return parse_deepseek_v31(inner)
            case _:  # qwen25, hermes
                return parse_json_call(inner)

    def _close_tail(self) -> None:
        body, self._buf = self._buf, ""
        calls = parse_mistral(body) if self._tool == "mistral" else parse_llama(body)
        if calls is None:
            self._emit(_CONTENT, self._raw + body)
            self._malformed += 1
        else:
            self._calls.extend(calls)
        self._state = _CONTENT
