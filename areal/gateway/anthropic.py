"""Anthropic Messages API front-end (``POST /v1/messages``): translation to and from the core.

    body ──request_to_turn──► Turn ──Gateway.complete / complete_stream──► Choice | ChoiceDelta*
                                         message_body(Choice) ◄──┘             │
                                         MessageEvents (SSE events) ◄──────────┘

``system`` (a string or text blocks) becomes the system message; user content blocks become a
user message, with each ``tool_result`` block a ``tool`` message placed before the user's text
(Anthropic puts results first in the turn that answers the calls); assistant ``text``,
``thinking`` and ``tool_use`` blocks fold into one assistant chat message. A final assistant
message is a prefill: the reply continues its text and returns only the continuation
(``assistant_turn``; trailing whitespace is a 400, as Anthropic answers; an empty one is dropped).
``thinking`` turns the chat template's thinking switch on (enabled, adaptive) or off (disabled);
a model without a switch takes only disabled, else a 400 naming ``thinking``; the model's
reasoning comes back as ``thinking`` blocks (signature ""). ``budget_tokens`` is checked as
Anthropic checks it (>= 1024, < max_tokens) but does not cap the thinking: ``max_tokens`` bounds it. ``tools``
(``name``/``description``/``input_schema``) become chat function tools and parsed tool calls come
back as ``tool_use`` blocks whose ``input`` is the model's JSON arguments.

Invariants:
- The message id is the interaction id, so ``set_reward(message.id, r)`` rewards this call.
- ``max_tokens`` is required, as in Anthropic's API. ``top_k`` is honoured, and so are SGLang's
  ``min_p`` / ``repetition_penalty`` (sent with ``extra_body``); anything else the gateway cannot
  honour is a 400 naming it; ``metadata``, ``service_tier``, ``cache_control``,
  ``inference_geo`` and ``speed`` are accepted without effect. (anthropic 2.11's ``create`` has no
  ``temperature``/``top_p``/``top_k`` arguments; clients send them with ``extra_body``.)
- ``tool_choice`` ``{"type": "any"}`` / ``{"type": "tool", "name": N}`` force a call by appending
  the opening of one to the prompt (see ``core``); a name not in ``tools`` is a 400.
- ``stop_reason``: tool calls → ``tool_use``; the length limit → ``max_tokens``; a stop sequence
  → ``stop_sequence`` with the sequence; otherwise ``end_turn``.
- Errors on this route use Anthropic's shape, built by ``error_body`` (the core calls it).
- ``POST /v1/messages/count_tokens`` (``count_tokens``) renders the body as ``/v1/messages``
  would (system, messages, tools, tool_choice) and answers ``{"input_tokens": N}``: the
  ``usage.input_tokens`` that call would report; nothing is sampled or recorded.
- Streaming sends the events the anthropic 2.11 SDK accumulates: message_start (its usage has
  the prompt's real ``input_tokens``), then per block
  content_block_start / content_block_delta (text_delta, thinking_delta, input_json_delta) /
  content_block_stop, then message_delta (stop reason, usage) and message_stop.

Not covered: images, documents, citations, server tools (bash, web search, code execution),
prompt caching (``cache_control`` is accepted on blocks and has no effect), a thinking budget as
a cap (``budget_tokens`` is validated, not enforced), thinking signatures (always ""), a prefill
on a chat template whose assistant turn does not follow its generation prompt (a 400).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from areal.engine.client import EngineError
from areal.gateway import contract
from areal.gateway.contract import Choice, ChoiceDelta, Reply, RequestError, Sampling, Turn
from areal.gateway.sse import relay_events, sse_event

if TYPE_CHECKING:  # the core imports this module to route to it
    from areal.gateway.core import Gateway, Session

_HONOURED = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "stream",
    "tools",
    "tool_choice",
    "thinking",
} | contract.EXTENSION_FIELDS
# Accepted without effect on what is sampled.
_NEUTRAL = {"metadata", "service_tier", "cache_control", "inference_geo", "speed"}
# What /v1/messages/count_tokens reads (it renders the prompt only) and accepts without effect.
_COUNTED = {"model", "messages", "system", "tools", "tool_choice", "chat_template_kwargs", "thinking", "cache_control", "speed"}
_ERROR_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str, kind: str) -> dict:
    """Anthropic's error shape; ``kind`` outside Anthropic's vocabulary is mapped by status."""
    if kind not in _ERROR_KINDS.values() and kind != "api_error":
        kind = _ERROR_KINDS.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


# ---- request -> Turn -------------------------------------------------------------------------


def _check_fields(body: dict, allowed: set[str]) -> None:
    """A 400 naming the first field of ``body`` not in ``allowed``."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(400, f"unsupported parameter(s): {', '.join(unknown)}", param=unknown[0])


def _thinking_effort(thinking: Any, max_tokens: int | None) -> str | None:
    """``thinking`` in OpenAI's effort words (``assistant_turn`` maps them on the template's
    switch): disabled is "none", enabled (its ``budget_tokens`` checked as Anthropic checks it, at
    least 1,024 and below ``max_tokens``, but not enforced) and adaptive are "medium"."""
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled" and set(thinking) == {"type"}:
        return "none"
    if kind == "adaptive" and set(thinking) == {"type"}:
        return "medium"
    if kind == "enabled" and set(thinking) == {"type", "budget_tokens"}:
        contract.check_number("thinking.budget_tokens", thinking["budget_tokens"], 1024, 1 << 31, integer=True)
        if max_tokens is not None and thinking["budget_tokens"] >= max_tokens:
            raise RequestError(400, "thinking.budget_tokens must be less than max_tokens", param="thinking.budget_tokens")
        return "medium"
    raise RequestError(400, "thinking must be {type: disabled}, {type: adaptive} or {type: enabled, budget_tokens: N}", param="thinking")


def request_to_turn(body: dict) -> Turn:
    """Validate a Messages request body and normalise it to a chat ``Turn``."""
    _check_fields(body, _HONOURED | _NEUTRAL)
    if "max_tokens" not in body:
        raise RequestError(400, "max_tokens: field required", param="max_tokens")
    contract.check_number("max_tokens", body["max_tokens"], 1, 1 << 31, integer=True)
    temperature = 1.0 if body.get("temperature") is None else body["temperature"]
    top_p = 1.0 if body.get("top_p") is None else body["top_p"]
    contract.check_number("temperature", temperature, 0.0, 1.0)
    contract.check_number("top_p", top_p, 1e-9, 1.0)
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 32:
        raise RequestError(400, "stop_sequences must be a list of at most 32 non-empty strings", param="stop_sequences")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise RequestError(400, "stream must be a boolean", param="stream")

    sampling = Sampling(
        max_tokens=body["max_tokens"], temperature=temperature, top_p=top_p, stop=list(stops), **contract.sampling_extensions(body)
    )
    return _prompt_turn(body, sampling, body["max_tokens"])


def count_tokens_turn(body: dict) -> Turn:
    """A ``/v1/messages/count_tokens`` body as the Turn ``/v1/messages`` would render: its system,
    messages, tools and tool_choice; it names no sampling (max_tokens 1 passes the core's checks)."""
    _check_fields(body, _COUNTED)
    return _prompt_turn(body, Sampling(max_tokens=1))


def _prompt_turn(body: dict, sampling: Sampling, max_tokens: int | None = None) -> Turn:
    """The Turn of what a body puts in the prompt (system, messages, tools, tool_choice, thinking,
    template kwargs, a prefill)."""
    messages = _system_messages(body.get("system")) + _chat_messages(body.get("messages"))
    tools = _convert_tools(body.get("tools"))
    tool_choice = _convert_tool_choice(body.get("tool_choice"), tools)
    return Turn(
        messages,
        sampling,
        tools,
        tool_choice,
        chat_template_kwargs=body.get("chat_template_kwargs"),
        continue_final=_prefill(messages, len(body["messages"]) - 1),
        reasoning_effort=_thinking_effort(body.get("thinking"), max_tokens),
        reasoning_param="thinking",
    )


def _prefill(messages: list[dict], last: int) -> bool:
    """Whether the conversation ends in an assistant message the reply continues (Anthropic's
    prefill; an empty one is dropped, in place: the reply starts the turn). Its text may not end
    in whitespace (Anthropic's rule: a token boundary there would be the prompt's, not the model's)."""
    final = messages[-1]
    if final["role"] != "assistant":
        return False
    if not final["content"] and not final.get("tool_calls") and "reasoning_content" not in final:
        messages.pop()
        return False
    if final["content"] and final["content"] != final["content"].rstrip():
        at = f"messages[{last}].content"
        raise RequestError(400, f"{at}: final assistant content cannot end with trailing whitespace", param=at)
    return True


def _system_messages(system: Any) -> list[dict]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    return [{"role": "system", "content": _block_text(system, "system", allowed=("text",))}]


def _chat_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages: a non-empty list is required", param="messages")
    out: list[dict] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            raise RequestError(400, f"{where}.role must be 'user' or 'assistant'", param=f"{where}.role")
        content = msg.get("content")
        if isinstance(content, str):
            out.append({"role": msg["role"], "content": content})
        elif isinstance(content, list):
            out += _user_blocks(content, where) if msg["role"] == "user" else [_assistant_blocks(content, where)]
        else:
            raise RequestError(400, f"{where}.content must be a string or a list of content blocks", param=f"{where}.content")
    return out


def _typed_blocks(blocks: list, where: str) -> Iterator[tuple[str, str | None, Any]]:
    """Each content block of message ``where``: where it stands, its type (None: not an object), the block."""
    for j, block in enumerate(blocks):
        yield f"{where}.content[{j}]", (block.get("type") if isinstance(block, dict) else None), block


def _user_blocks(blocks: list, where: str) -> list[dict]:
    tool_results, texts = [], []
    for at, kind, block in _typed_blocks(blocks, where):
        if kind == "text":
            texts.append(contract.string_field(block, "text", at))
        elif kind == "tool_result":
            tool_use_id = contract.string_field(block, "tool_use_id", at)
            content = block.get("content", "")
            text = content if isinstance(content, str) else _block_text(content, f"{at}.content", allowed=("text",))
            tool_results.append({"role": "tool", "tool_call_id": tool_use_id, "content": text})
        else:
            raise RequestError(400, f"{at}: block type {kind!r} is not supported in a user message", param=at)
    return tool_results + ([{"role": "user", "content": "".join(texts)}] if texts or not tool_results else [])


def _assistant_blocks(blocks: list, where: str) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": None}
    texts: list[str] = []
    for at, kind, block in _typed_blocks(blocks, where):
        if kind == "text":
            texts.append(contract.string_field(block, "text", at))
        elif kind == "thinking":
            msg["reasoning_content"] = contract.string_field(block, "thinking", at)
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) or not isinstance(block.get("input"), dict):
                raise RequestError(400, f"{at}: tool_use needs string id and name and an object input", param=at)
            arguments = json.dumps(block["input"], ensure_ascii=False)
            msg.setdefault("tool_calls", []).append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        else:
            raise RequestError(400, f"{at}: block type {kind!r} is not supported in an assistant message", param=at)
    if texts or "tool_calls" not in msg:
        msg["content"] = "".join(texts)
    return msg


def _block_text(blocks: Any, where: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(blocks, list):
        raise RequestError(400, f"{where} must be a string or a list of text blocks", param=where)
    texts = []
    for j, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") not in allowed:
            raise RequestError(400, f"{where}[{j}] must be a text block", param=f"{where}[{j}]")
        texts.append(contract.string_field(block, "text", f"{where}[{j}]"))
    return "".join(texts)


def _convert_tools(tools: Any) -> list[dict] | None:
    out = []
    for at, tool in contract.named_tools(tools, "custom", "client", default_type="custom"):
        if not isinstance(tool.get("input_schema"), dict):
            raise RequestError(400, f"{at}.input_schema: an object is required", param=f"{at}.input_schema")
        if tool.get("description") is not None and not isinstance(tool["description"], str):
            raise RequestError(400, f"{at}.description must be a string", param=f"{at}.description")
        function = {"name": tool["name"], "description": tool.get("description") or "", "parameters": tool["input_schema"]}
        out.append({"type": "function", "function": function})
    return out or None


def _convert_tool_choice(choice: Any, tools: list[dict] | None) -> str | dict | None:
    if choice is None:
        return None
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise RequestError(400, "tool_choice.type must be auto, any, tool or none", param="tool_choice")
    if choice.get("disable_parallel_tool_use"):
        raise RequestError(400, "disable_parallel_tool_use is not supported: the model may emit several calls", param="tool_choice")
    match choice["type"]:
        case "auto":
            return "auto"
        case "any":
            return "required"
        case "none":
            return "none"
    name = choice.get("name")
    if not isinstance(name, str) or not any(t["function"]["name"] == name for t in tools or []):
        raise RequestError(400, f"tool_choice.name {name!r} is not one of tools", param="tool_choice.name")
    return {"type": "function", "function": {"name": name}}


# ---- Choice -> message body ------------------------------------------------------------------


def stop_reason(choice: Choice, matched_stop: str | None) -> str:
    if choice.parsed.tool_calls:
        return "tool_use"
    if choice.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if matched_stop is not None else "end_turn"


def content_blocks(choice: Choice) -> list[dict]:
    parsed = choice.parsed
    blocks: list[dict] = []
    if parsed.reasoning:
        blocks.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
    if parsed.content or not parsed.tool_calls:
        blocks.append({"type": "text", "text": parsed.content})
    for tc in parsed.tool_calls:
        blocks.append({"type": "tool_use", "id": tc.id, "name": tc.name, "input": _tool_input(tc.arguments), "caller": {"type": "direct"}})
    return blocks


def _tool_input(arguments: str) -> dict:
    # The parser only emits calls whose arguments are JSON; an object is what the API promises.
    value = json.loads(arguments) if arguments else {}
    return value if isinstance(value, dict) else {"value": value}


def message_body(body: dict, choice: Choice, matched_stop: str | None) -> dict:
    reason = stop_reason(choice, matched_stop)
    return {
        "id": choice.interaction_id,
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or "areal",
        "content": content_blocks(choice),
        "stop_reason": reason,
        "stop_sequence": matched_stop if reason == "stop_sequence" else None,
        "usage": {"input_tokens": choice.prompt_tokens, "output_tokens": choice.completion_tokens},
    }


def matched_stop_sequence(gateway: Gateway, session: Session, choice: Choice, stops: list[str]) -> str | None:
    """Which stop sequence ended the generation, if any.

    The engine trims a matched stop string from its text but keeps its tokens, so the full
    decode of the recorded output shows which sequence matched (earliest occurrence wins).
    """
    if not stops or choice.finish_reason != "stop":
        return None
    interaction = session.interactions.get(choice.interaction_id)
    if interaction is None:
        return None
    text = gateway.tokenizer.decode(interaction.output_ids, skip_special_tokens=False)
    hits = [(text.find(s), s) for s in stops if s in text]
    return min(hits)[1] if hits else None


# ---- handler -------------------------------------------------------------------------------


async def handle(gateway: Gateway, session: Session, body: dict) -> Reply:
    """``POST /v1/messages``: one message, streamed as SSE events when ``stream`` is true."""
    turn = request_to_turn(body)
    message_id = "msg_" + secrets.token_hex(12)  # the interaction id too (so message_start carries it)
    if body.get("stream"):
        deltas = gateway.complete_stream(session, turn, response_id=message_id).__aiter__()
        first = await deltas.__anext__()  # bad input raises here, before any byte is sent
        stream = _stream(body, message_id, first, deltas, lambda c: matched_stop_sequence(gateway, session, c, turn.sampling.stop))
        return Reply(status=200, stream=stream, headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
    (choice,) = await gateway.complete(session, turn, response_id=message_id)
    return Reply(status=200, body=message_body(body, choice, matched_stop_sequence(gateway, session, choice, turn.sampling.stop)))


async def count_tokens(gateway: Gateway, session: Session, body: dict) -> Reply:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, the prompt ids ``/v1/messages``
    would send for the same system, messages, tools and tool_choice (``Gateway.count_prompt_tokens``:
    nothing sampled, nothing recorded)."""
    return Reply(status=200, body={"input_tokens": await gateway.count_prompt_tokens(session, count_tokens_turn(body))})


def _stream(
    body: dict, message_id: str, first: ChoiceDelta, rest: AsyncIterator[ChoiceDelta], matched: Callable[[Choice], str | None]
) -> AsyncIterator[bytes]:
    """Turn the core's deltas into Messages stream events, in the order Anthropic sends them."""
    return relay_events(MessageEvents(body, message_id, matched, first.prompt_tokens), first, rest)


class MessageEvents:
    """The event sequence of one streamed message (``sse.ChoiceEvents``); ``matched`` names
    the stop sequence that ended a choice, if one did."""

    def __init__(self, body: dict, message_id: str, matched: Callable[[Choice], str | None], prompt_tokens: int = 0) -> None:
        self.body, self.message_id = body, message_id  # = the interaction id the core records
        self.matched = matched
        self.prompt_tokens = prompt_tokens  # message_start's input_tokens: the prompt is known before any token
        self.index = -1  # index of the open content block
        self.open: str | None = None  # "text" | "thinking" | None
        self.text = ""
        self.saw_text = False  # a text block was opened (so the message needs no empty one)

    def start(self) -> list[bytes]:
        message = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.body.get("model") or "areal",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        }
        return [sse_event({"type": "message_start", "message": message})]

    def delta(self, kind: str, text: str) -> list[bytes]:
        if not text:
            return []
        block = "thinking" if kind == "reasoning" else "text"
        frames: list[bytes] = []
        if self.open != block:
            frames += self._close()
            frames.append(self._open(block))
        self.text += text
        payload = {"type": "thinking_delta", "thinking": text} if block == "thinking" else {"type": "text_delta", "text": text}
        frames.append(sse_event({"type": "content_block_delta", "index": self.index, "delta": payload}))
        return frames

    def _open(self, block: str) -> bytes:
        self.index += 1
        self.open, self.text = block, ""
        self.saw_text |= block == "text"
        start = {"type": "thinking", "thinking": "", "signature": ""} if block == "thinking" else {"type": "text", "text": ""}
        return sse_event({"type": "content_block_start", "index": self.index, "content_block": start})

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        frames = []
        if self.open == "thinking":  # the SDK expects a signature before a thinking block ends
            frames.append(
                sse_event({"type": "content_block_delta", "index": self.index, "delta": {"type": "signature_delta", "signature": ""}})
            )
        frames.append(sse_event({"type": "content_block_stop", "index": self.index}))
        self.open = None
        return frames

    def error(self, error: EngineError) -> bytes:
        return sse_event(error_body(503 if error.status is None else 502, str(error), "api_error"))

    def finish(self, choice: Choice) -> list[bytes]:
        matched_stop = self.matched(choice)
        parsed, frames = choice.parsed, []
        if self.open == "thinking":
            frames += self._close()
        if not self.saw_text and (parsed.content or not parsed.tool_calls):
            frames.append(self._open("text"))  # a message always has a text block or a tool_use
            if parsed.content:
                frames.append(
                    sse_event({"type": "content_block_delta", "index": self.index, "delta": {"type": "text_delta", "text": parsed.content}})
                )
        frames += self._close()
        for tc in parsed.tool_calls:
            self.index += 1
            start = {"type": "tool_use", "id": tc.id, "name": tc.name, "input": {}, "caller": {"type": "direct"}}
            frames.append(sse_event({"type": "content_block_start", "index": self.index, "content_block": start}))
            frames.append(
                sse_event(
                    {
                        "type": "content_block_delta",
                        "index": self.index,
                        "delta": {"type": "input_json_delta", "partial_json": tc.arguments},
                    }
                )
            )
            frames.append(sse_event({"type": "content_block_stop", "index": self.index}))
        reason = stop_reason(choice, matched_stop)
        frames.append(
            sse_event(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": matched_stop if reason == "stop_sequence" else None},
                    "usage": {"input_tokens": choice.prompt_tokens, "output_tokens": choice.completion_tokens},
                }
            )
        )
        frames.append(sse_event({"type": "message_stop"}))
        return frames
