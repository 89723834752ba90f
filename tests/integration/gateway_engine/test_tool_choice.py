"""tool_choice "required" / a named function, by a forced prefix: the three APIs end to end through
a real Gateway (HTTP) on the embedded engine, with the openai and anthropic SDKs.

What is checked: the answer carries a parsed call of the right function; the recorded prompt ends
with the forced ids (the opening of a call) and the loss mask covers only sampled ids; the engine
sampled exactly what a direct /generate from that prompt gives; a follow-up extends the parent's
tokens exactly; streaming parses the forced call too; a name not in tools is a 400 naming
tool_choice and records nothing. Per format, the forced prefix + a model's continuation parses.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from areal.gateway.parsers import TOOL_PARSERS, forced_tool_prefix, parse_output, takes_no_arguments


@pytest.fixture(scope="module")
def served(served_scripted):
    """This module's gateway serves the scripted model: greedy replies fixed by contract, any build."""
    return served_scripted


QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    },
}


def _calc() -> dict:
    from areal.embedded.corpus import CALCULATOR_TOOL

    return CALCULATOR_TOOL


def _openai(gw, key):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=gw.http + "/v1", api_key=key, max_retries=0)


def _anthropic(gw, key):
    from anthropic import AsyncAnthropic

    return AsyncAnthropic(base_url=gw.http, api_key=key, max_retries=0)


def _forced_ids(gw, name: str | None) -> list[int]:
    return gw.call(lambda: gw.gateway.prompts.encode(forced_tool_prefix(gw.gateway.config.tool_parser, name)))


def _check_recorded(gw, key, inter, name: str | None, max_tokens: int) -> None:
    """The prompt ends with the forced ids; only sampled ids are trained on; the engine's tokens."""
    forced = _forced_ids(gw, name)
    assert inter.prompt_ids[-len(forced) :] == forced
    row = gw.call(lambda: gw.gateway.sessions[key].export_interactions("individual"))[inter.id]
    assert row.input_ids == inter.prompt_ids + inter.output_ids
    assert row.loss_mask == [0] * len(inter.prompt_ids) + [1] * len(inter.output_ids)
    assert len(inter.output_logprobs) == len(inter.output_ids)
    assert inter.output_ids == gw.generate_direct(inter.prompt_ids, max_tokens).output_ids


def _extends(parent, child) -> bool:
    return (
        child.parent_id == parent.id
        and child.prompt_ids[: len(parent.prompt_ids) + len(parent.output_ids)] == parent.prompt_ids + parent.output_ids
    )


# ---- the prefix of each format --------------------------------------------------------------------

_CONTINUATIONS = {  # what a model writes after the forced prefix, per format: (required, named)
    "qwen25": ('{"name": "calc", "arguments": {"x": 1}}\n</tool_call>', ' {"x": 1}}\n</tool_call>'),
    "hermes": ('{"name": "calc", "arguments": {"x": 1}}\n</tool_call>', ' {"x": 1}}\n</tool_call>'),
    "llama3": (' "calc", "parameters": {"x": 1}}', ' {"x": 1}}'),
    "mistral": ('{"name": "calc", "arguments": {"x": 1}}]', ' {"x": 1}}]'),
    "deepseekv3": (
        'calc\n```json\n{"x": 1}\n```<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c>',
        '{"x": 1}\n```<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c>',
    ),
    "qwen3_coder": (
        "=calc>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
        "<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
    ),
    "deepseekv31": (
        'calc<\uff5ctool\u2581sep\uff5c>{"x": 1}<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c>',
        '{"x": 1}<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c>',
    ),
    "gpt-oss": ('calc <|constrain|>json<|message|>{"x": 1}', '{"x": 1}'),
}


@pytest.mark.parametrize("fmt", TOOL_PARSERS)
def test_forced_prefix_and_a_continuation_parse_as_one_call(fmt):
    for name, rest in zip((None, "calc"), _CONTINUATIONS[fmt]):
        prefix = forced_tool_prefix(fmt, name)
        assert not prefix.endswith(" ")  # ends on a token boundary: a space goes with the next token
        out = parse_output(prefix + rest, tool_parser=fmt, reasoning_parser="think")
        assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [("calc", {"x": 1})], (fmt, name, out)
        assert out.content == ""


_CLOSERS = {
    "qwen25": "",
    "hermes": "",
    "llama3": "",
    "mistral": "]",
    "deepseekv3": "<\uff5ctool\u2581calls\u2581end\uff5c>",
    "qwen3_coder": "",
    "deepseekv31": "<\uff5ctool\u2581calls\u2581end\uff5c>",
    "gpt-oss": "",  # the call ends where the text does: <|call|> is a stop token, cut from the decoded text
}


@pytest.mark.parametrize("fmt", TOOL_PARSERS)
def test_a_function_without_parameters_is_forced_whole(fmt):
    """Its only canonical arguments are {}: the call is written through its closing marker."""
    prefix = forced_tool_prefix(fmt, "transfer_to_math_agent", no_arguments=True)
    out = parse_output(prefix + _CLOSERS[fmt], tool_parser=fmt, reasoning_parser="think")
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("transfer_to_math_agent", "{}")], (fmt, out)
    assert forced_tool_prefix(fmt, None, no_arguments=True) == forced_tool_prefix(fmt, None)  # "required": no name


def test_which_schemas_take_no_arguments():
    handoff = {"type": "object", "properties": {}, "additionalProperties": False, "required": []}  # OpenAI Agents
    assert takes_no_arguments(None) and takes_no_arguments({"type": "object"}) and takes_no_arguments(handoff)
    assert not takes_no_arguments(LOOKUP["function"]["parameters"])
    assert not takes_no_arguments({"type": "object", "minProperties": 1})
    assert not takes_no_arguments({"type": "object", "required": ["x"]})


# ---- Chat Completions ------------------------------------------------------------------------------


@pytest.mark.parametrize("choice, name", [("required", None), ({"type": "function", "function": {"name": "calculator"}}, "calculator")])
def test_chat_forced_call_records_forced_ids_as_prompt_and_follow_up_extends(served, choice, name):
    key = served.open_session()
    client = _openai(served, key)
    question = {"role": "user", "content": QUESTION}

    async def go():
        first = await client.chat.completions.create(
            model="m", messages=[question], tools=[LOOKUP, _calc()], tool_choice=choice, max_tokens=48, temperature=0
        )
        msg = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls" and msg.tool_calls, first
        assert msg.tool_calls[0].function.name == "calculator" and msg.content is None
        second = await client.chat.completions.create(
            model="m",
            tools=[LOOKUP, _calc()],
            max_tokens=24,
            temperature=0,
            messages=[question, msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "7"}],
        )
        return first, second

    first, second = asyncio.run(go())
    a, b = served.interactions(key)
    assert (a.id, b.id) == (first.id, second.id)
    assert first.usage.prompt_tokens == len(a.prompt_ids) and first.usage.completion_tokens == len(a.output_ids)
    _check_recorded(served, key, a, name, 48)
    assert _extends(a, b)
    assert served.call(lambda: served.gateway.sessions[key].drift) == 0


def test_chat_required_after_a_tool_result_forces_a_call_or_returns_the_whole_text(served):
    """After a tool result the model answers in text under "auto". Under "required" it continues
    from "<tool_call>\n": either a call that parses, or (this small model often writes a broken
    one there) text that starts with the forced opening, since forced + sampled is what is parsed."""
    key = served.open_session()
    call = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "3+4"}'}}
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "7"},
    ]
    body = {"model": "m", "messages": messages, "tools": [_calc()], "max_tokens": 40, "temperature": 0}
    headers = {"authorization": f"Bearer {key}"}
    auto = httpx.post(served.http + "/v1/chat/completions", headers=headers, json=body, timeout=60).json()["choices"][0]
    forced = httpx.post(served.http + "/v1/chat/completions", headers=headers, json={**body, "tool_choice": "required"}, timeout=60).json()[
        "choices"
    ][0]
    assert auto["message"].get("tool_calls") is None and not auto["message"]["content"].startswith("<tool_call>"), auto
    if forced["message"].get("tool_calls"):
        assert forced["finish_reason"] == "tool_calls" and forced["message"]["tool_calls"][0]["function"]["name"] == "calculator"
    else:
        assert forced["finish_reason"] in ("stop", "length") and forced["message"]["content"].startswith("<tool_call>\n"), forced
    _, inter = served.interactions(key)
    _check_recorded(served, key, inter, None, 40)
    text = served.gateway.tokenizer.decode(inter.output_ids, skip_special_tokens=False)
    assert not text.startswith("<tool_call>")  # the forced opening is prompt, not output


def test_chat_stream_parses_the_forced_call(served):
    key = served.open_session()

    async def go():
        stream = await _openai(served, key).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": QUESTION}],
            tools=[LOOKUP, _calc()],
            max_tokens=48,
            temperature=0,
            tool_choice={"type": "function", "function": {"name": "calculator"}},
            stream=True,
        )
        return [c async for c in stream]

    chunks = asyncio.run(go())
    calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    finish = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert finish == ["tool_calls"] and [tc.function.name for tc in calls] == ["calculator"] and text == ""
    (inter,) = served.interactions(key)
    _check_recorded(served, key, inter, "calculator", 48)


# ---- Responses -------------------------------------------------------------------------------------


def _response_tools() -> list[dict]:
    return [{"type": "function", **t["function"]} for t in (LOOKUP, _calc())]


@pytest.mark.parametrize("choice, name", [("required", None), ({"type": "function", "name": "calculator"}, "calculator")])
def test_responses_forced_call_and_previous_response_id_extends(served, choice, name):
    key = served.open_session()
    client = _openai(served, key)

    async def go():
        first = await client.responses.create(
            model="m", input=QUESTION, tools=_response_tools(), tool_choice=choice, max_output_tokens=48, temperature=0
        )
        calls = [o for o in first.output if o.type == "function_call"]
        assert [c.name for c in calls] == ["calculator"], first.output
        second = await client.responses.create(
            model="m",
            previous_response_id=first.id,
            tools=_response_tools(),
            max_output_tokens=24,
            temperature=0,
            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "7"}],
        )
        return first, second

    first, second = asyncio.run(go())
    a, b = served.interactions(key)
    assert (a.id, b.id) == (first.id, second.id)
    _check_recorded(served, key, a, name, 48)
    assert _extends(a, b)


def test_responses_named_handoff_without_parameters_is_a_whole_call(served):
    """The OpenAI Agents SDK's handoff tool: named, no parameters. The call is forced whole; the
    model samples only what follows it (the end of its turn); the follow-up extends it exactly."""
    handoff = {
        "type": "function",
        "name": "transfer_to_math_agent",
        "description": "Solve an arithmetic problem",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False, "required": []},
        "strict": True,
    }
    key = served.open_session()
    client = _openai(served, key)

    async def go():
        first = await client.responses.create(
            model="m",
            input=QUESTION,
            tools=[handoff],
            max_output_tokens=16,
            tool_choice={"type": "function", "name": "transfer_to_math_agent"},
            temperature=0,
        )
        calls = [o for o in first.output if o.type == "function_call"]
        assert [(c.name, c.arguments) for c in calls] == [("transfer_to_math_agent", "{}")], first.output
        second = await client.responses.create(
            model="m",
            previous_response_id=first.id,
            tools=[handoff],
            max_output_tokens=16,
            temperature=0,
            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "{}"}],
        )
        return second

    asyncio.run(go())
    a, b = served.interactions(key)
    whole = served.call(
        lambda: served.gateway.prompts.encode(
            forced_tool_prefix(served.gateway.config.tool_parser, "transfer_to_math_agent", no_arguments=True)
        )
    )
    assert a.prompt_ids[-len(whole) :] == whole and len(a.output_ids) >= 1
    assert _extends(a, b)


def test_responses_stream_parses_the_forced_call(served):
    key = served.open_session()

    async def go():
        stream = await _openai(served, key).responses.create(
            model="m", input=QUESTION, tools=_response_tools(), tool_choice="required", max_output_tokens=48, temperature=0, stream=True
        )
        return [ev async for ev in stream]

    events = asyncio.run(go())
    final = events[-1].response
    assert events[-1].type == "response.completed"
    assert [o.name for o in final.output if o.type == "function_call"] == ["calculator"]
    assert not any(e.type == "response.output_text.delta" for e in events)  # the forced call is no text
    (inter,) = served.interactions(key)
    _check_recorded(served, key, inter, None, 48)


# ---- Anthropic Messages ----------------------------------------------------------------------------


def _anthropic_tools() -> list[dict]:
    return [
        {"name": t["function"]["name"], "description": t["function"]["description"], "input_schema": t["function"]["parameters"]}
        for t in (LOOKUP, _calc())
    ]


@pytest.mark.parametrize("choice, name", [({"type": "any"}, None), ({"type": "tool", "name": "calculator"}, "calculator")])
def test_anthropic_forced_tool_use_and_tool_result_extends(served, choice, name):
    key = served.open_session()
    client = _anthropic(served, key)
    question = {"role": "user", "content": QUESTION}

    async def go():
        first = await client.messages.create(
            model="m", max_tokens=48, extra_body={"temperature": 0}, tools=_anthropic_tools(), tool_choice=choice, messages=[question]
        )
        uses = [b for b in first.content if b.type == "tool_use"]
        assert first.stop_reason == "tool_use" and [u.name for u in uses] == ["calculator"], first
        second = await client.messages.create(
            model="m",
            max_tokens=24,
            extra_body={"temperature": 0},
            tools=_anthropic_tools(),
            messages=[
                question,
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "7"}]},
            ],
        )
        return first, second

    first, second = asyncio.run(go())
    a, b = served.interactions(key)
    assert (a.id, b.id) == (first.id, second.id)
    assert first.usage.input_tokens == len(a.prompt_ids)
    _check_recorded(served, key, a, name, 48)
    assert _extends(a, b)


def test_anthropic_stream_parses_the_forced_tool_use(served):
    key = served.open_session()

    async def go():
        async with _anthropic(served, key).messages.stream(
            model="m",
            max_tokens=48,
            extra_body={"temperature": 0},
            tools=_anthropic_tools(),
            tool_choice={"type": "tool", "name": "calculator"},
            messages=[{"role": "user", "content": QUESTION}],
        ) as stream:
            return await stream.get_final_message()

    msg = asyncio.run(go())
    assert msg.stop_reason == "tool_use" and [b.name for b in msg.content if b.type == "tool_use"] == ["calculator"]
    (inter,) = served.interactions(key)
    assert msg.id == inter.id
    _check_recorded(served, key, inter, "calculator", 48)


# ---- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body, auth",
    [
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [LOOKUP],
                "tool_choice": {"type": "function", "function": {"name": "calculator"}},
            },
            "authorization",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "authorization"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "tools": [LOOKUP], "tool_choice": {"type": "allowed_tools"}},
            "authorization",
        ),
        (
            "/v1/responses",
            {
                "input": "x",
                "tools": [{"type": "function", "name": "lookup", "parameters": {}}],
                "tool_choice": {"type": "function", "name": "calculator"},
            },
            "authorization",
        ),
        ("/v1/responses", {"input": "x", "tool_choice": "required"}, "authorization"),
        (
            "/v1/messages",
            {
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "calculator"},
            },
            "x-api-key",
        ),
        ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}}, "x-api-key"),
    ],
)
def test_forcing_a_tool_that_is_not_offered_is_400_naming_tool_choice(served, path, body, auth):
    key = served.open_session()
    value = f"Bearer {key}" if auth == "authorization" else key
    r = httpx.post(served.http + path, headers={auth: value}, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "tool_choice" in (err.get("param") or err["message"])
    assert served.interactions(key) == []
