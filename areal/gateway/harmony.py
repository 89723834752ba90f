"""GPT-OSS's harmony format: sampled text -> content, reasoning and tool calls, incrementally.

The prompt ends with ``<|start|>assistant``; the model then writes one or more messages, each a
header, ``<|message|>``, a body and an end marker, later ones opened by ``<|start|>`` + a role:

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

    header:  [role] [" to=" recipient] "<|channel|>" channel [" to=" recipient] [" <|constrain|>" type | " " type]
    end:     <|end|> | <|call|> | <|return|> | the end of the text (the stop token was cut off)

Routing by header: ``analysis`` -> reasoning; ``final`` and ``commentary`` without a recipient
(a preamble) -> content; a recipient ``functions.NAME`` -> a tool call whose body is the JSON
arguments (only when tool calls are parsed: the request offered tools). Bodies of one kind are
joined with "\\n". Anything else (a message to a built-in tool such as ``browser.search``, a call
whose body is not a JSON object, text outside any message, an unfinished header) stays in the
content verbatim, markers included, as the other formats keep text they cannot parse.

The recipient may stand before the channel (the chat template writes it so) or after it (the
model usually does); both parse. The gateway decodes sampled ids with these markers kept (they are
special tokens in GPT-OSS's vocabulary) and the stop tokens (``<|call|>``, ``<|return|>``) dropped.

Streaming: ``feed`` returns reasoning and content as they arrive, holding back only a suffix that
could begin a marker; headers and call bodies are held until they end. As for the other formats,
the events of ``feed`` + ``finish`` concatenate to ``finish``'s ``ParsedOutput``, whatever the cuts.
"""

from __future__ import annotations

import re

from areal.gateway.toolcalls import ParsedOutput, StreamEvent, ToolCall, decode_json, make_call

START, END, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"
CALL, RETURN = "<|call|>", "<|return|>"
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)  # what the gateway's decoding keeps or drops
_BODY_ENDS = (END, CALL, RETURN, START)  # a body also ends where a new message starts without an end
_HEADER_ENDS = (MESSAGE, START, END, CALL, RETURN)
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_HEADER, _BODY, _BETWEEN = "header", "body", "between"
_FUNCTIONS = "functions."


def _held(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a marker."""
    longest = max(map(len, markers)) - 1
    for k in range(min(longest, len(text)), 0, -1):
        tail = text[-k:]
        if any(m.startswith(tail) for m in markers):
            return k
    return 0


class HarmonyParser:
    """Incremental harmony parser with ``StreamParser``'s interface (``feed`` then ``finish``)."""

    def __init__(self, tools: bool) -> None:
        self._tools = tools  # parse calls to functions.*; otherwise such messages stay content
        self._buf = ""
        self._state = _HEADER  # the text starts inside the first header (the prompt opened the message)
        self._opened = ""  # "<|start|>" when the current header began with one (restored if malformed)
        self._header = ""
        self._route = ""  # "reasoning" | "content" | "call" | "raw"
        self._content: list[str] = []
        self._reasoning: list[str] | None = None
        self._calls: list[ToolCall] = []
        self._events: list[StreamEvent] = []
        self._started = {"content": False, "reasoning": False}  # a body of the kind has emitted text
        self._body_emitted = False
        self._finished = False

    def feed(self, delta: str) -> list[StreamEvent]:
        if self._finished:
            raise RuntimeError("HarmonyParser.feed after finish")
        self._buf += delta
        while self._step(final=False):
            pass
        return self._take()

    def finish(self) -> tuple[list[StreamEvent], ParsedOutput]:
        if not self._finished:
            while self._step(final=True):
                pass
            self._finished = True
        reasoning = None if self._reasoning is None else "".join(self._reasoning)
        return self._take(), ParsedOutput("".join(self._content), reasoning, list(self._calls))

    # ---- internals ----

    def _take(self) -> list[StreamEvent]:
        events, self._events = self._events, []
        return events

    def _emit(self, kind: str, text: str, *, body: bool = False) -> None:
        """Append ``text`` to ``kind``; a body's first text after another body's gets "\\n" first."""
        if not text:
            return
        if body and not self._body_emitted and self._started[kind]:
            text = "\n" + text
        if body:
            self._body_emitted = True
        self._started[kind] = True
        (self._content if kind == "content" else self._reasoning).append(text)  # type: ignore[union-attr]
        if self._events and self._events[-1].kind == kind:
            self._events[-1].text += text
        else:
            self._events.append(StreamEvent(kind, text))

    def _step(self, final: bool) -> bool:
        if self._state == _HEADER:
            return self._step_header(final)
        if self._state == _BODY:
            return self._step_body(final)
        return self._step_between(final)

    def _step_header(self, final: bool) -> bool:
        found = [(i, m) for m in _HEADER_ENDS if (i := self._buf.find(m)) >= 0]
        if not found:
            if final:  # an unfinished header: text, as it was
                self._emit("content", self._opened + self._buf)
                self._buf = ""
            return False
        i, marker = min(found)
        header, self._buf = self._buf[:i], self._buf[i + len(marker) :]
        if marker != MESSAGE:  # a header that never reached its body: text, and look for the next message
            self._emit("content", self._opened + header + (marker if marker != START else ""))
            self._opened = START if marker == START else ""
            self._state = _HEADER if marker == START else _BETWEEN
            return True
        self._header = header
        self._route = self._route_of(header)
        if self._route == "reasoning" and self._reasoning is None:
            self._reasoning = []
        self._body_emitted = False
        self._state = _BODY
        return True

    def _route_of(self, header: str) -> str:
        recipient = _RECIPIENT.search(header)
        if recipient is not None:
            return "call" if self._tools and recipient.group(1).startswith(_FUNCTIONS) else "raw"
        channel = _CHANNEL.search(header)
        return "reasoning" if channel is not None and channel.group(1) == "analysis" else "content"

    def _step_body(self, final: bool) -> bool:
        found = [(i, m) for m in _BODY_ENDS if (i := self._buf.find(m)) >= 0]
        if found:
            i, marker = min(found)
            body, self._buf = self._buf[:i], self._buf[i + len(marker) :]
            self._end_body(body, marker)
            self._opened = START if marker == START else ""
            self._state = _HEADER if marker == START else _BETWEEN
            return True
        if final:
            body, self._buf = self._buf, ""
            self._end_body(body, "")
            self._state = _BETWEEN
            return False
        if self._route in ("reasoning", "content"):  # streamed as it comes, but for a possible marker
            keep = len(self._buf) - _held(self._buf, _BODY_ENDS)
            self._emit(self._route, self._buf[:keep], body=True)
            self._buf = self._buf[keep:]
        return False

    def _end_body(self, body: str, marker: str) -> None:
        route = self._route
        if route in ("reasoning", "content"):
            self._emit(route, body, body=True)
            return
        if route == "call":
            recipient = _RECIPIENT.search(self._header)
            assert recipient is not None
            call = make_call(recipient.group(1)[len(_FUNCTIONS) :], decode_json(body))
            if call is not None:
                self._calls.append(call)
                return
        # a message this gateway does not turn into a call: the whole of it, as it was
        end = marker if marker in (END, CALL, RETURN) else ""
        self._emit("content", self._opened + self._header + MESSAGE + body + end)

    def _step_between(self, final: bool) -> bool:
        i = self._buf.find(START)
        if i >= 0:
            self._emit("content", self._buf[:i])
            self._buf = self._buf[i + len(START) :]
            self._opened, self._state = START, _HEADER
            return True
        keep = len(self._buf) if final else len(self._buf) - _held(self._buf, (START,))
        self._emit("content", self._buf[:keep])
        self._buf = self._buf[keep:]
        return False


def forced_prefix(name: str | None, no_arguments: bool = False) -> str:
    """The opening of a call in harmony for ``tool_choice``: the commentary channel to ``functions.``
    (the model writes the name and the rest), or through ``<|message|>`` for a named function (and
    ``{}`` when it takes no arguments: the model then samples only ``<|call|>``)."""
    head = CHANNEL + "commentary to=" + _FUNCTIONS
    if name is None:
        return head
    return head + name + " " + CONSTRAIN + "json" + MESSAGE + ("{}" if no_arguments else "")
