"""The types the gateway's front-ends and its core exchange (the gateway contract).

A front-end (chat.py, responses.py, anthropic.py) turns its API's request body into a ``Turn``,
calls ``Gateway.complete`` (-> list[Choice]) or ``Gateway.complete_stream`` (-> ChoiceDelta
stream), and answers with a ``Reply``. Bad input raises ``RequestError``; the core turns it into
the API's own error shape. What every front-end checks alike: ``check_number`` (a parameter's
range; the core's too), ``string_field``, ``named_tools`` (the request's tools, each named) and
``EXTENSION_FIELDS`` (the sampling extensions a body may carry, ``sampling_extensions``),
``as_system`` (a ``developer`` message as a system one), ``reasoning_effort`` (OpenAI's effort
vocabulary, which the Anthropic front-end maps its ``thinking`` onto) and ``context_exceeded`` (the 400 of a
prompt that does not fit, with OpenAI's ``context_length_exceeded`` code).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator
from typing import Any

import msgspec

_ID_PREFIX = os.urandom(6).hex()  # per process; ids are keys within a session, never credentials
_id_counter = itertools.count()


def new_id(prefix: str) -> str:
    """``prefix`` + 24 hex digits, unique in this process: a random per-process half and a counter
    (``secrets.token_hex`` cost a getrandom system call per id, several per request)."""
    return "%s%s%012x" % (prefix, _ID_PREFIX, next(_id_counter))


class RequestError(Exception):
    """A request the gateway refuses; becomes an error reply in the API's own shape."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.code = code  # OpenAI's machine-readable ``error.code`` (e.g. "context_length_exceeded"), or None


def context_exceeded(message: str) -> RequestError:
    """The 400 of a prompt that does not fit the context, with OpenAI's code for it."""
    return RequestError(400, message, param="messages", code="context_length_exceeded")


# OpenAI's reasoning efforts (chat's reasoning_effort, Responses' reasoning.effort), least first
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def reasoning_effort(value: Any, param: str) -> str | None:
    """A request's reasoning effort: None (unset) or one of ``REASONING_EFFORTS``, else a 400 naming ``param``."""
    if value is not None and value not in REASONING_EFFORTS:
        raise RequestError(400, f"{param} must be one of {', '.join(REASONING_EFFORTS)}, got {value!r}", param=param, code="invalid_value")
    return value


def as_system(message: dict) -> dict:
    """A ``developer`` message as the ``system`` message it stands for (OpenAI's newer name for
    the role), for a chat template with no branch of its own for it; other messages unchanged."""
    return {**message, "role": "system"} if message.get("role") == "developer" else message


class Sampling(msgspec.Struct):
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = []
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    top_k: int = -1  # -1: the whole vocabulary
    min_p: float = 0.0
    repetition_penalty: float = 1.0


# SGLang's and vLLM's extensions of each API (the SDKs send them with ``extra_body``).
EXTENSION_FIELDS = frozenset({"top_k", "min_p", "repetition_penalty", "chat_template_kwargs"})


def sampling_extensions(body: dict) -> dict:
    """``top_k`` / ``min_p`` / ``repetition_penalty`` of a request body, as SGLang's and vLLM's
    OpenAI servers accept them (top level; the SDKs send them with ``extra_body``); a null is unset.
    Validated with the rest of the turn (``generation.validate_turn``)."""
    defaults = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
    return {k: (d if body.get(k) is None else body[k]) for k, d in defaults.items()}


def check_parameters(body: dict, honoured: set[str], neutral: set[str], noop: dict[str, tuple[Any, ...]], where: str) -> None:
    """A 400 naming the first parameter of ``body`` a front-end neither honours nor ignores
    (``neutral``: changes no token), or that it takes only at a value of ``noop`` (a penalty at 0)."""
    for key, value in body.items():
        if key in noop:
            if value not in noop[key]:
                raise RequestError(400, f"{key}={value!r} is not supported by {where}", param=key)
        elif key not in honoured and key not in neutral:
            raise RequestError(400, f"unsupported parameter: {key}", param=key)


def given(body: dict, key: str, default: Any) -> Any:
    """``body[key]``, or ``default`` when it is absent or null (the SDKs send null for "unset")."""
    return default if body.get(key) is None else body[key]


def check_number(name: str, value: Any, lo: float, hi: float, integer: bool = False) -> None:
    """A 400 naming ``name`` unless ``value`` is a number (``integer``: an int) in [lo, hi]; a bool is neither."""
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise RequestError(400, f"{name} must be {kind} in [{lo}, {hi}], got {value!r}", param=name)


def string_field(item: dict, key: str, where: str) -> str:
    """``item[key]``, a string (else a 400 naming ``where.key``)."""
    value = item.get(key)
    if not isinstance(value, str):
        raise RequestError(400, f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


def named_tools(tools: Any, tool_type: str, what: str, default_type: str | None = None) -> list[tuple[str, dict]]:
    """The request's ``tools`` as (where, tool) pairs ([] for none): each an object of type
    ``tool_type`` (``default_type`` when it names none; ``what`` calls such tools in the 400 that
    refuses another) with a non-empty string ``name``."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError(400, "tools must be a list", param="tools")
    out = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", default_type) != tool_type:
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise RequestError(400, f"{at}: only {what} tools are supported, got type {kind!r}", param=at)
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise RequestError(400, f"{at}.name must be a non-empty string", param=f"{at}.name")
        out.append((at, tool))
    return out


class Turn(msgspec.Struct):
    """One request, normalised to Chat Completions form (see the contract in the package doc)."""

    messages: list[dict]
    sampling: Sampling
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    # SGLang's and vLLM's extension (extra_body): keyword arguments of the chat template, e.g.
    # Qwen3's {"enable_thinking": false}; checked by ``render.check_template_kwargs``
    chat_template_kwargs: dict | None = None
    # the JSON schema the reply must follow (chat's response_format, Responses' text.format; None:
    # free text), and the request field that named it (for the errors): ``structured``
    response_schema: dict | None = None
    response_schema_param: str = "response_format"
    # the last message is an assistant turn the reply continues (Anthropic's prefill, chat's
    # continue_final_message): ``assistant_turn``
    continue_final: bool = False
    # how much the model should reason, in OpenAI's words (``REASONING_EFFORTS``; None: not asked),
    # and the request field that asked: mapped to the chat template's thinking switch (``assistant_turn``)
    reasoning_effort: str | None = None
    reasoning_param: str = "reasoning_effort"


class TokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top: list[tuple[str, float]] = []


class Choice(msgspec.Struct):
    index: int
    interaction_id: str
    parsed: Any  # parsers.ParsedOutput
    finish_reason: str  # "stop" | "length" | "tool_calls" | "abort"
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[TokenLogprob] | None = None
    token_ids: list[int] = []  # the ids sampled, where a front-end returns them (completions.py)


class ChoiceDelta(msgspec.Struct):
    index: int
    kind: str  # "content" | "reasoning" | "done"
    text: str = ""
    choice: Choice | None = None  # set when kind == "done"
    prompt_tokens: int = 0  # the prompt's ids (the same for every delta of a request), known before the first token


class Reply(msgspec.Struct):
    """What a front-end handler returns: a JSON body, or SSE bytes already framed."""

    status: int
    body: dict | None = None
    stream: AsyncIterator[bytes] | None = None
    headers: dict[str, str] = {}
