"""OpenAI Responses API front-end (``POST /v1/responses``): translation to and from the core.

    body ──request_to_turn──► Turn ──Gateway.complete / complete_stream──► Choice | ChoiceDelta*
                                          response_body(Choice) ◄──┘            │
                                          ResponseStream (SSE events) ◄─────────┘

The core speaks Chat Completions messages; this module only translates. ``input`` (a string or
a list of items: messages with text parts, ``function_call``, ``function_call_output``,
``reasoning``) becomes chat messages, ``instructions`` the system message, Responses-shaped
function tools the chat tool shape. One choice comes back as one response whose ``output`` holds
a reasoning item (when the model thought), a message item, and one ``function_call`` item per
parsed tool call, in that order.

Invariants:
- The response id is the interaction id, so ``set_reward(response.id, r)`` rewards this call.
- ``previous_response_id`` resolves only inside the caller's session (``session.store``), so one
  session can never continue another's conversation. The stored conversation excludes the
  system message: as in OpenAI's API, ``instructions`` do not carry over between responses.
- Consecutive assistant output items (reasoning, message, function calls) of one response are
  folded back into the single assistant chat message they came from, so a client that resends
  the output items reproduces the exact message the core recorded.
- A parameter this gateway cannot honour is a 400 naming it, never a silent ignore. Accepted
  without effect (they change nothing the gateway computes): ``model``, ``user``, ``metadata``,
  ``service_tier``, ``prompt_cache_key``, ``safety_identifier``, ``background=false``,
  ``truncation="disabled"``, ``include`` of an empty list.
- ``reasoning.effort`` is mapped to the chat template's thinking switch (``assistant_turn``:
  "none" / "minimal" off, others on; a model without one takes only "none", anything else is a
  400 with code ``unsupported_parameter``); the model's reasoning comes back as a ``reasoning``
  item. ``reasoning.summary`` other than null is a 400: no summary is written. A function
  tool's ``strict`` flag is accepted; its arguments are constrained to its schema only when
  ``tool_choice`` forces a call (``structured``).
- ``text.format`` ("text", "json_object", "json_schema" strict or not) is honoured by decoding
  the reply under the schema (``structured``), and echoed in the response.
- ``tool_choice`` "required" / ``{"type": "function", "name": N}`` force a call by appending the
  opening of one to the prompt (see ``core``); a name not in ``tools`` is a 400.
- The streamed events are the ones the openai 2.44 SDK parses (``ResponseStreamEvent``) and the
  final ``response.completed`` carries the same body a non-streamed call returns. The opening
  ``response.created`` / ``response.in_progress`` carry no ``usage`` (not known yet; the spec's
  is optional, not nullable); every ``usage`` has its ``input_tokens_details`` /
  ``output_tokens_details``.

Past 600 lines because one API's request translation, reply body and stream events belong
together: each changes with the others when the API does.

Not covered: built-in tools (web search, file search, computer use), images and files,
``conversation`` objects, ``text.verbosity``, retrieving or deleting stored responses by id,
reasoning summaries, a prefill (a last ``input`` item of the assistant starts a new turn).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from areal.engine.client import EngineError
from areal.gateway import contract
from areal.gateway.contract import Choice, ChoiceDelta, Reply, RequestError, Sampling, Turn
from areal.gateway.sse import relay_events, sse_event
from areal.gateway.structured import responses_text_schema

if TYPE_CHECKING:  # the core imports this module to route to it
    from areal.gateway.core import Gateway, Session

_HONOURED = {
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "max_output_tokens",
    "temperature",
    "top_p",
    "previous_response_id",
    "stream",
    "store",
    "parallel_tool_calls",
    "top_logprobs",
    "reasoning",
} | contract.EXTENSION_FIELDS
_NEUTRAL = {
    "model",
    "user",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "background",
    "truncation",
    "text",
    "include",
    "stream_options",
}
_STORE_KEY = "responses"  # session.store[_STORE_KEY][response_id] = conversation after that response


# ---- request -> Turn -------------------------------------------------------------------------


def request_to_turn(body: dict, default_max_tokens: int, history: list[dict] | None = None) -> Turn:
    """Validate a Responses request body and normalise it to a chat ``Turn``.

    ``history`` is the stored conversation of ``previous_response_id`` (no system message).
    """
    _check_parameters(body)
    messages: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RequestError(400, "instructions must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    messages += history or []
    messages += input_to_messages(body.get("input"))
    if not messages:
        raise RequestError(400, "input must not be empty", param="input")

    max_tokens = body.get("max_output_tokens")
    max_tokens = default_max_tokens if max_tokens is None else max_tokens
    contract.check_number("max_output_tokens", max_tokens, 1, 1 << 31, integer=True)
    temperature = 1.0 if body.get("temperature") is None else body["temperature"]
    top_p = 1.0 if body.get("top_p") is None else body["top_p"]
    contract.check_number("temperature", temperature, 0.0, 2.0)
    contract.check_number("top_p", top_p, 1e-9, 1.0)
    top_logprobs = body.get("top_logprobs") or 0
    contract.check_number("top_logprobs", top_logprobs, 0, 20, integer=True)
    include = body.get("include") or []
    logprobs = "message.output_text.logprobs" in include or top_logprobs > 0
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        **contract.sampling_extensions(body),
    )
    tools = _convert_tools(body.get("tools"))
    tool_choice = _convert_tool_choice(body.get("tool_choice"), tools)
    return Turn(
        messages,
        sampling,
        tools,
        tool_choice,
        chat_template_kwargs=body.get("chat_template_kwargs"),
        response_schema=responses_text_schema(body.get("text")),
        response_schema_param="text.format",
        reasoning_effort=contract.reasoning_effort((body.get("reasoning") or {}).get("effort"), "reasoning.effort"),
        reasoning_param="reasoning.effort",
    )


def _check_parameters(body: dict) -> None:
    unknown = sorted(set(body) - _HONOURED - _NEUTRAL)
    if unknown:
        raise RequestError(400, f"unsupported parameter(s): {', '.join(unknown)}", param=unknown[0])
    if body.get("parallel_tool_calls") is False:
        raise RequestError(400, "parallel_tool_calls=false is not supported: the model may emit several calls", param="parallel_tool_calls")
    if body.get("background"):
        raise RequestError(400, "background responses are not supported", param="background")
    if body.get("truncation") not in (None, "disabled"):
        raise RequestError(400, "only truncation='disabled' is supported", param="truncation")
    reasoning = body.get("reasoning")
    if reasoning is not None and (not isinstance(reasoning, dict) or set(reasoning) - {"effort", "summary", "generate_summary"}):
        raise RequestError(400, "reasoning must be an object of effort (and a null summary)", param="reasoning")
    for key in ("summary", "generate_summary"):
        if (reasoning or {}).get(key) is not None:
            raise RequestError(400, f"reasoning.{key}: no summary is written; the reasoning comes back whole", param=f"reasoning.{key}")
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or set(include) - {"message.output_text.logprobs"}):
        raise RequestError(400, "include may only hold 'message.output_text.logprobs'", param="include")
    for name in ("stream", "store"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise RequestError(400, f"{name} must be a boolean", param=name)
    if body.get("previous_response_id") is not None and not isinstance(body["previous_response_id"], str):
        raise RequestError(400, "previous_response_id must be a string", param="previous_response_id")


def input_to_messages(items: Any) -> list[dict]:
    """Translate ``input`` (a string or a list of items) into chat messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise RequestError(400, "input must be a string or a list of items", param="input")
    messages: list[dict] = []
    reasoning: str | None = None  # a reasoning item belongs to the assistant message that follows
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(400, f"{where} must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(400, f"{where}.role must be user, system, developer or assistant", param=f"{where}.role")
            text = _content_text(item.get("content"), f"{where}.content")
            if role == "assistant":
                _assistant(messages, reasoning, fresh=True)["content"] = text
                reasoning = None
            else:
                messages.append(contract.as_system({"role": role, "content": text}))
        elif kind == "function_call":
            call_id, name, arguments = (contract.string_field(item, k, where) for k in ("call_id", "name", "arguments"))
            msg = _assistant(messages, reasoning, fresh=False)
            reasoning = None
            msg.setdefault("tool_calls", []).append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        elif kind == "function_call_output":
            call_id = contract.string_field(item, "call_id", where)
            output = item.get("output")
            content = output if isinstance(output, str) else _content_text(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in parts):
                raise RequestError(400, f"{where}.content must be a list of text parts", param=f"{where}.content")
            reasoning = "".join(p["text"] for p in parts)
        else:
            raise RequestError(400, f"{where}.type {kind!r} is not supported", param=f"{where}.type")
    return messages


def _assistant(messages: list[dict], reasoning: str | None, fresh: bool) -> dict:
    """The assistant message an output item belongs to: the open one, or a new one.

    A message item opens a new assistant message unless the open one holds only reasoning;
    a function_call item joins the assistant message right before it (text and calls of one
    response are one chat message).
    """
    last = messages[-1] if messages else None
    reusable = last is not None and last["role"] == "assistant" and reasoning is None
    if reusable and fresh:
        reusable = last.get("content") is None and not last.get("tool_calls")
    if not reusable:
        last = {"role": "assistant", "content": None}
        if reasoning is not None:
            last["reasoning_content"] = reasoning
        messages.append(last)
    return last


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(400, f"{where} must be a string or a list of parts", param=where)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text", "refusal"):
            raise RequestError(400, f"{where}[{j}] must be an input_text or output_text part", param=f"{where}[{j}]")
        text = part.get("refusal") if part.get("type") == "refusal" else part.get("text")
        if not isinstance(text, str):
            raise RequestError(400, f"{where}[{j}].text must be a string", param=f"{where}[{j}].text")
        texts.append(text)
    return "".join(texts)


def _convert_tools(tools: Any) -> list[dict] | None:
    out = []
    for at, tool in contract.named_tools(tools, "function", "function"):
        params = tool.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise RequestError(400, f"{at}.parameters must be an object", param=f"{at}.parameters")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise RequestError(400, f"{at}.description must be a string", param=f"{at}.description")
        function: dict[str, Any] = {"name": tool["name"]}
        if description is not None:
            function["description"] = description
        function["parameters"] = params if params is not None else {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out or None


def _convert_tool_choice(choice: Any, tools: list[dict] | None) -> str | dict | None:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        if not any(t["function"]["name"] == choice["name"] for t in tools or []):
            raise RequestError(400, f"tool_choice names {choice['name']!r}, which is not in tools", param="tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise RequestError(400, "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}", param="tool_choice")


# ---- Choice -> response body -----------------------------------------------------------------


def output_items(choice: Choice, ids: dict[str, str]) -> list[dict]:
    """The ``output`` items of one choice; ``ids`` fixes item ids so streamed and final agree."""
    status = "incomplete" if choice.finish_reason == "length" else "completed"
    items: list[dict] = []
    parsed = choice.parsed
    if parsed.reasoning:
        items.append(_reasoning_item(ids["reasoning"], parsed.reasoning, status))
    if parsed.content or not parsed.tool_calls:
        items.append(_message_item(ids["message"], parsed.content, status, _logprobs(choice)))
    for tc in parsed.tool_calls:
        items.append(_function_call_item(ids.get(tc.id, "fc_" + tc.id), tc.id, tc.name, tc.arguments, "completed"))
    return items


def _reasoning_item(item_id: str, text: str, status: str) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}], "status": status}


def _message_item(item_id: str, text: str | None, status: str, logprobs: list[dict] | None = None) -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def _function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments, "status": status}


def _logprobs(choice: Choice) -> list[dict]:
    return [
        {
            "token": t.token,
            "bytes": t.bytes,
            "logprob": t.logprob,
            "top_logprobs": [{"token": s, "bytes": list(s.encode()), "logprob": lp} for s, lp in t.top],
        }
        for t in choice.logprobs or []
    ]


def response_body(
    body: dict,
    turn: Turn,
    response_id: str,
    created: float,
    status: str,
    output: list[dict],
    usage: dict | None,
    incomplete_reason: str | None = None,
) -> dict:
    """A full ``Response`` object (also the payload of response.created / completed events).
    ``usage`` None: not known yet (response.created / in_progress), and the key is left out: the
    spec's ``usage`` is an optional ResponseUsage, not a nullable one."""
    out = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": incomplete_reason} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": turn.sampling.max_tokens,
        "model": body.get("model") or "areal",
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": body.get("previous_response_id"),
        "temperature": turn.sampling.temperature,
        "top_p": turn.sampling.top_p,
        "tool_choice": _response_tool_choice(body.get("tool_choice")),
        "tools": [dict(t, strict=t.get("strict", False)) for t in body.get("tools") or []],
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},  # as asked (request_to_turn checked it)
        "truncation": "disabled",
        "store": body.get("store", True),
        "metadata": body.get("metadata") or {},
    }
    if usage is not None:
        out["usage"] = usage
    return out


def _response_tool_choice(choice: Any) -> Any:
    return "auto" if choice is None else choice


def usage_of(choice: Choice) -> dict:
    return {
        "input_tokens": choice.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": choice.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": choice.prompt_tokens + choice.completion_tokens,
    }


def _status(choice: Choice) -> tuple[str, str | None]:
    if choice.finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if choice.finish_reason == "abort":
        return "incomplete", None
    return "completed", None


def _assistant_message(choice: Choice) -> dict:
    """The chat message this choice adds to the conversation (what the core recorded)."""
    parsed = choice.parsed
    has_message = bool(parsed.content) or not parsed.tool_calls  # mirrors output_items
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content if has_message else None}
    if parsed.reasoning:
        msg["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        msg["tool_calls"] = [
            {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}} for tc in parsed.tool_calls
        ]
    return msg


# ---- handler -------------------------------------------------------------------------------


async def handle(gateway: Gateway, session: Session, body: dict) -> Reply:
    """``POST /v1/responses``: one response, streamed as SSE events when ``stream`` is true."""
    stored: dict[str, list[dict]] = session.store.setdefault(_STORE_KEY, {})
    prev = body.get("previous_response_id")
    history = None
    if prev is not None:
        if not isinstance(prev, str) or prev not in stored:
            raise RequestError(400, f"previous response {prev!r} not found in this session", param="previous_response_id")
        history = stored[prev]
    turn = request_to_turn(body, gateway.config.default_max_tokens, history)
    # instructions do not carry over to a follow-up response: store the conversation without them
    conversation = turn.messages[1:] if body.get("instructions") is not None else turn.messages

    def remember(choice: Choice) -> None:
        if body.get("store", True):
            stored[choice.interaction_id] = conversation + [_assistant_message(choice)]

    response_id = "resp_" + secrets.token_hex(12)  # the interaction id too (so it is known before streaming)
    if body.get("stream"):
        deltas = gateway.complete_stream(session, turn, response_id=response_id).__aiter__()
        first = await deltas.__anext__()  # bad input raises here, before any byte is sent
        return Reply(
            status=200,
            stream=_stream(body, turn, response_id, first, deltas, remember),
            headers={"content-type": "text/event-stream", "cache-control": "no-cache"},
        )
    (choice,) = await gateway.complete(session, turn, response_id=response_id)
    remember(choice)
    status, reason = _status(choice)
    ids = {"reasoning": "rs_" + choice.interaction_id, "message": "msg_" + choice.interaction_id}
    out = response_body(body, turn, choice.interaction_id, time.time(), status, output_items(choice, ids), usage_of(choice), reason)
    return Reply(status=200, body=out)


def _stream(
    body: dict, turn: Turn, response_id: str, first: ChoiceDelta, rest: AsyncIterator[ChoiceDelta], remember: Callable[[Choice], None]
) -> AsyncIterator[bytes]:
    """Turn the core's deltas into Responses stream events, in the order OpenAI sends them."""
    return relay_events(ResponseEvents(body, turn, response_id, remember), first, rest)


class ResponseEvents:
    """The event sequence of one streamed response (``sse.ChoiceEvents``); ``frame`` numbers
    events in order; ``remember`` stores the finished choice for a follow-up response."""

    def __init__(self, body: dict, turn: Turn, response_id: str, remember: Callable[[Choice], None]) -> None:
        self.body, self.turn = body, turn
        self.remember = remember
        self.response_id = response_id  # = the interaction id the core records
        self.created = time.time()
        self.seq = 0
        self.output: list[dict] = []
        self.open: dict | None = None  # the item being streamed (reasoning or message)
        self.text = ""

    def frame(self, event: dict) -> bytes:
        event["sequence_number"] = self.seq
        self.seq += 1
        return sse_event(event)

    def start(self) -> list[bytes]:
        shell = response_body(self.body, self.turn, self.response_id, self.created, "in_progress", [], None)
        return [
            self.frame({"type": "response.created", "response": shell}),
            self.frame({"type": "response.in_progress", "response": shell}),
        ]

    def delta(self, kind: str, text: str) -> list[bytes]:
        if not text:
            return []
        frames: list[bytes] = []
        item_type = "reasoning" if kind == "reasoning" else "message"
        if self.open is None or self.open["type"] != item_type:
            frames += self._close()
            frames += self._open(item_type)
        self.text += text
        if item_type == "reasoning":
            frames.append(
                self.frame(
                    {
                        "type": "response.reasoning_text.delta",
                        "item_id": self.open["id"],
                        "output_index": len(self.output),
                        "content_index": 0,
                        "delta": text,
                    }
                )
            )
        else:
            frames.append(
                self.frame(
                    {
                        "type": "response.output_text.delta",
                        "item_id": self.open["id"],
                        "output_index": len(self.output),
                        "content_index": 0,
                        "delta": text,
                        "logprobs": [],
                    }
                )
            )
        return frames

    def _open(self, item_type: str) -> list[bytes]:
        prefix = "rs_" if item_type == "reasoning" else "msg_"
        item_id = prefix + secrets.token_hex(12)
        if item_type == "reasoning":
            self.open = _reasoning_item(item_id, "", "in_progress")
            self.open["content"] = []
        else:
            self.open = _message_item(item_id, None, "in_progress")
        self.text = ""
        idx = len(self.output)
        frames = [self.frame({"type": "response.output_item.added", "output_index": idx, "item": dict(self.open)})]
        part = (
            {"type": "reasoning_text", "text": ""}
            if item_type == "reasoning"
            else {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        )
        frames.append(
            self.frame({"type": "response.content_part.added", "item_id": item_id, "output_index": idx, "content_index": 0, "part": part})
        )
        return frames

    def _close(self, final_text: str | None = None, status: str = "completed", logprobs: list[dict] | None = None) -> list[bytes]:
        if self.open is None:
            return []
        item, idx = self.open, len(self.output)
        text = self.text if final_text is None else final_text
        if item["type"] == "reasoning":
            done_item = _reasoning_item(item["id"], text, status)
            part = {"type": "reasoning_text", "text": text}
            frames = [
                self.frame(
                    {"type": "response.reasoning_text.done", "item_id": item["id"], "output_index": idx, "content_index": 0, "text": text}
                )
            ]
        else:
            done_item = _message_item(item["id"], text, status, logprobs)
            part = done_item["content"][0]
            frames = [
                self.frame(
                    {
                        "type": "response.output_text.done",
                        "item_id": item["id"],
                        "output_index": idx,
                        "content_index": 0,
                        "text": text,
                        "logprobs": [],
                    }
                )
            ]
        frames.append(
            self.frame({"type": "response.content_part.done", "item_id": item["id"], "output_index": idx, "content_index": 0, "part": part})
        )
        frames.append(self.frame({"type": "response.output_item.done", "output_index": idx, "item": done_item}))
        self.output.append(done_item)
        self.open = None
        return frames

    def error(self, error: EngineError) -> bytes:
        return self.frame({"type": "error", "code": "engine_error", "message": str(error), "param": None})

    def finish(self, choice: Choice) -> list[bytes]:
        """Close what is open with the parsed text, add tool calls, then the final response."""
        self.remember(choice)
        status, reason = _status(choice)
        item_status = "incomplete" if status == "incomplete" else "completed"
        parsed, frames = choice.parsed, []
        if self.open is not None and self.open["type"] == "reasoning":
            frames += self._close(parsed.reasoning or self.text, item_status)
        if self.open is None and (parsed.content or not parsed.tool_calls) and not any(i["type"] == "message" for i in self.output):
            frames += self._open("message")  # a response always has a message or a call
        if self.open is not None:
            frames += self._close(parsed.content, item_status, _logprobs(choice))
        for tc in parsed.tool_calls:
            idx, item_id = len(self.output), "fc_" + tc.id
            frames.append(
                self.frame(
                    {
                        "type": "response.output_item.added",
                        "output_index": idx,
                        "item": _function_call_item(item_id, tc.id, tc.name, "", "in_progress"),
                    }
                )
            )
            frames.append(
                self.frame(
                    {"type": "response.function_call_arguments.delta", "item_id": item_id, "output_index": idx, "delta": tc.arguments}
                )
            )
            frames.append(
                self.frame(
                    {
                        "type": "response.function_call_arguments.done",
                        "item_id": item_id,
                        "output_index": idx,
                        "name": tc.name,
                        "arguments": tc.arguments,
                    }
                )
            )
            item = _function_call_item(item_id, tc.id, tc.name, tc.arguments, "completed")
            frames.append(self.frame({"type": "response.output_item.done", "output_index": idx, "item": item}))
            self.output.append(item)
        final = response_body(self.body, self.turn, choice.interaction_id, self.created, status, self.output, usage_of(choice), reason)
        frames.append(self.frame({"type": "response.completed" if status == "completed" else "response.incomplete", "response": final}))
        return frames
