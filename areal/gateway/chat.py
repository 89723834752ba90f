"""OpenAI Chat Completions front-end: request body -> Turn, Choices -> body, deltas -> SSE chunks.

Honoured: messages, model (echoed), max_tokens / max_completion_tokens, temperature, top_p,
seed (engine ``sampling_seed``; choice i gets seed + i), stop, n, logprobs, tools, tool_choice
("auto" | "none" | "required" | {"type": "function", "function": {"name": N}}: the last two by a
forced tool-call opening after the prompt, see ``core``; a name not in tools is a 400),
parallel_tool_calls (true: every parsed call is returned), stream, stream_options.include_usage,
response_format ("text", "json_object", "json_schema" strict or not: the reply is decoded under
the schema, ``structured``; with tools under "auto" it is that JSON or one tool call),
reasoning_effort (on the chat template's thinking switch: "none" / "minimal" off, others on; a
model without one takes only "none", anything else is a 400 with code ``unsupported_parameter``;
the model's reasoning comes back as ``reasoning_content``), and vLLM's / SGLang's extension
``continue_final_message`` (true: the reply continues the last message, an assistant one; its
content is only the continuation), both ``assistant_turn``.
Accepted and deliberately ignored, because they change no token: user, metadata, store,
service_tier, and penalties at their no-op value (0).
Anything else, or a value that cannot be honoured (top_logprobs without logprobs, tool_choice
"allowed_tools", parallel_tool_calls false), is a 400 naming the parameter.

Replies carry what OpenAI's spec requires: each message a ``refusal`` (null) and each logprobs
object a ``refusal`` (null) beside ``content``; no ``system_fingerprint`` (the spec's is a string,
so none is sent rather than a null). A ``developer`` message reaches the template as a system one
when the template has no developer branch (``generation.validate_turn``), and ``tool_choice``
"none" keeps the tools out of the prompt (``core``).

Streaming sends OpenAI's exact chunk shape: a first chunk with the role, content / reasoning
deltas as the engine produces them, tool calls and finish_reason in each choice's last chunk,
a usage-only chunk when ``stream_options.include_usage``, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from areal.gateway.contract import (
    EXTENSION_FIELDS,
    Choice,
    ChoiceDelta,
    Reply,
    RequestError,
    Sampling,
    Turn,
    check_parameters,
    given,
    new_id,
    reasoning_effort,
    sampling_extensions,
)
from areal.gateway.structured import chat_response_schema

if TYPE_CHECKING:
    from areal.gateway.core import Gateway, Session

_HONOURED = {
    "messages",
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "n",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "stream",
    "stream_options",
    "response_format",
    "reasoning_effort",
    "continue_final_message",
} | EXTENSION_FIELDS
_NEUTRAL = {"user", "metadata", "store", "service_tier"}
_NOOP_VALUES: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0, None),
    "presence_penalty": (0, 0.0, None),
}
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}


def request_to_turn(body: dict, default_max_tokens: int) -> Turn:
    """Validate the parameters this front-end owns; numbers and messages are checked by the core."""
    check_parameters(body, _HONOURED, _NEUTRAL, _NOOP_VALUES, "this gateway")
    for key in ("stream", "logprobs", "parallel_tool_calls", "continue_final_message"):
        if not isinstance(body.get(key, False), bool):
            raise RequestError(400, f"{key} must be a boolean", param=key)
    if body.get("parallel_tool_calls") is False:
        raise RequestError(400, "parallel_tool_calls=false cannot be enforced; every parsed call is returned", param="parallel_tool_calls")
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool)):
        raise RequestError(400, "stream_options must be {include_usage: bool}", param="stream_options")
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    sampling = Sampling(
        max_tokens=default_max_tokens if max_tokens is None else max_tokens,
        temperature=given(body, "temperature", 1.0),
        top_p=given(body, "top_p", 1.0),
        seed=body.get("seed"),
        stop=stops,
        n=given(body, "n", 1),
        logprobs=body.get("logprobs") or False,
        top_logprobs=given(body, "top_logprobs", 0),
        **sampling_extensions(body),
    )
    return Turn(
        messages=body.get("messages"),
        sampling=sampling,
        tools=body.get("tools"),
        tool_choice=body.get("tool_choice"),
        chat_template_kwargs=body.get("chat_template_kwargs"),
        response_schema=chat_response_schema(body.get("response_format")),
        continue_final=bool(body.get("continue_final_message")),
        reasoning_effort=reasoning_effort(body.get("reasoning_effort"), "reasoning_effort"),
    )


async def handle(gateway: Gateway, session: Session, body: dict) -> Reply:
    turn = request_to_turn(body, gateway.config.default_max_tokens)
    response_id = new_id("chatcmpl-")
    model = body.get("model") or gateway.config.model_name
    if body.get("stream"):
        deltas = gateway.complete_stream(session, turn, response_id=response_id).__aiter__()
        first = await deltas.__anext__()  # engine errors become a status, not a broken stream
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return Reply(status=200, stream=_chunks(response_id, model, turn.sampling.n, first, deltas, usage), headers=SSE_HEADERS)
    choices = await gateway.complete(session, turn, response_id=response_id)
    return Reply(status=200, body=completion_body(response_id, model, choices))


def _message(choice: Choice) -> dict:
    parsed = choice.parsed
    content = parsed.content if parsed.content or not parsed.tool_calls else None
    msg: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}  # the spec requires refusal (null: none)
    if parsed.reasoning is not None:
        msg["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        msg["tool_calls"] = [_tool_call(c) for c in parsed.tool_calls]
    return msg


def _tool_call(call: Any, index: int | None = None) -> dict:
    out = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    return out if index is None else {"index": index, **out}


def _logprobs(choice: Choice) -> dict | None:
    if choice.logprobs is None:
        return None
    return {
        "content": [
            {
                "token": t.token,
                "logprob": t.logprob,
                "bytes": t.bytes,
                "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(s.encode())} for s, lp in t.top],
            }
            for t in choice.logprobs
        ],
        "refusal": None,  # the spec requires it beside content: the logprobs of a refusal (this gateway writes none)
    }


def usage(choices: list[Choice]) -> dict:
    prompt = choices[0].prompt_tokens if choices else 0  # one prompt serves every choice
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def body_head(response_id: str, kind: str, model: str) -> dict:
    """The fields every OpenAI completion object starts with (chat's and the Completions API's)."""
    return {"id": response_id, "object": kind, "created": int(time.time()), "model": model}


def completion_body(response_id: str, model: str, choices: list[Choice]) -> dict:
    return {
        **body_head(response_id, "chat.completion", model),
        "choices": [
            {"index": c.index, "message": _message(c), "finish_reason": c.finish_reason, "logprobs": _logprobs(c)} for c in choices
        ],
        "usage": usage(choices),
    }


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _chunks(
    response_id: str, model: str, n: int, first: ChoiceDelta, rest: AsyncIterator[ChoiceDelta], include_usage: bool
) -> AsyncIterator[bytes]:
    created = int(time.time())

    def chunk(choices: list[dict], **extra: Any) -> bytes:
        body = {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,  # no system_fingerprint: the spec's is a string, and non-streamed replies carry none either
            "choices": choices,
            **extra,
        }
        if include_usage and "usage" not in extra:
            body["usage"] = None
        return _sse(body)

    for i in range(n):
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
    done: list[Choice] = []

    async def all_deltas() -> AsyncIterator[ChoiceDelta]:
        yield first
        async for d in rest:
            yield d

    async for d in all_deltas():
        if d.kind == "done":
            c = d.choice
            assert c is not None
            done.append(c)
            if c.parsed.tool_calls:
                calls = [_tool_call(call, k) for k, call in enumerate(c.parsed.tool_calls)]
                yield chunk([{"index": c.index, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}])
            yield chunk([{"index": c.index, "delta": {}, "logprobs": _logprobs(c), "finish_reason": c.finish_reason}])
        else:
            key = "reasoning_content" if d.kind == "reasoning" else "content"
            yield chunk([{"index": d.index, "delta": {key: d.text}, "logprobs": None, "finish_reason": None}])
    if include_usage:
        yield chunk([], usage=usage(sorted(done, key=lambda c: c.index)))
    yield b"data: [DONE]\n\n"
