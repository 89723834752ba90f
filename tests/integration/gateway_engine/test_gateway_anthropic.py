"""Anthropic Messages front-end: request translation, message and event shapes the anthropic SDK
parses and accumulates, the error shape, and end to end through a real Gateway with the SDK."""

from __future__ import annotations

import asyncio
import json

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from gateway_harness import assistant_call, calculator_stream, front_choice
from pydantic import TypeAdapter

from areal.gateway import anthropic as front
from areal.gateway.contract import Choice, ChoiceDelta, RequestError
from areal.gateway.parsers import ToolCall

_events = TypeAdapter(RawMessageStreamEvent)
CALC = {
    "name": "calculator",
    "description": "Evaluate arithmetic.",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}


def _choice(content: str = "", calls: list[ToolCall] | None = None, reasoning: str | None = None, finish: str = "stop") -> Choice:
    return front_choice(content, calls, reasoning, finish, "msg_abc", 12, 5)


def test_system_blocks_tool_use_and_tool_result_translate_to_chat_messages():
    body = {
        "model": "m",
        "max_tokens": 20,
        "temperature": 0.0,
        "stop_sequences": ["END"],
        "system": [{"type": "text", "text": "Use the "}, {"type": "text", "text": "calculator.", "cache_control": {"type": "ephemeral"}}],
        "tools": [CALC],
        "tool_choice": {"type": "auto"},
        "messages": [
            {"role": "user", "content": "What is 6*7?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "multiply", "signature": ""},
                    {"type": "text", "text": "Computing."},
                    {"type": "tool_use", "id": "toolu_1", "name": "calculator", "input": {"expression": "6*7"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]},
                    {"type": "text", "text": "Now answer."},
                ],
            },
        ],
    }
    turn = front.request_to_turn(body)
    assert turn.messages == [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": "What is 6*7?"},
        assistant_call("Computing.", "multiply", "toolu_1", "calculator", '{"expression": "6*7"}'),
        {"role": "tool", "tool_call_id": "toolu_1", "content": "42"},
        {"role": "user", "content": "Now answer."},
    ]
    assert turn.tools == [
        {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.", "parameters": CALC["input_schema"]}}
    ]
    assert turn.tool_choice == "auto"
    assert (turn.sampling.max_tokens, turn.sampling.temperature, turn.sampling.stop) == (20, 0.0, ["END"])


def test_tool_choice_mapping():
    base = {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [CALC]}
    assert front.request_to_turn({**base, "tool_choice": {"type": "any"}}).tool_choice == "required"
    assert front.request_to_turn({**base, "tool_choice": {"type": "none"}}).tool_choice == "none"
    named = front.request_to_turn({**base, "tool_choice": {"type": "tool", "name": "calculator"}}).tool_choice
    assert named == {"type": "function", "function": {"name": "calculator"}}


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5}, "temperature"),
        ({"max_tokens": "5", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 5, "messages": []}, "messages"),
        ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "bash_20250124", "name": "bash"}]},
            "tools[0]",
        ),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}, "tools[0].input_schema"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled", "budget_tokens": 9}},
            "thinking.budget_tokens",
        ),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stop_sequences": "END"}, "stop_sequences"),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
            },
            "tool_choice",
        ),
    ],
)
def test_bad_or_unsupported_parameters_are_400_naming_them(body, param):
    with pytest.raises(RequestError) as e:
        front.request_to_turn(body)
    assert e.value.status == 400 and e.value.param == param


def test_error_body_has_anthropic_shape_and_vocabulary():
    assert front.error_body(400, "bad", "invalid_request_error") == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
    }
    assert front.error_body(503, "down", "engine_unavailable")["error"]["type"] == "overloaded_error"
    assert front.error_body(502, "x", "engine_error")["error"]["type"] == "api_error"
    assert front.error_body(401, "who", "authentication_error")["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    "choice, matched, reason",
    [
        (_choice("hi"), None, "end_turn"),
        (_choice("hi", finish="length"), None, "max_tokens"),
        (_choice("hi"), "END", "stop_sequence"),
        (_choice("", [ToolCall(id="t", name="calculator", arguments="{}")]), None, "tool_use"),
    ],
)
def test_stop_reasons(choice, matched, reason):
    msg = Message.model_validate(front.message_body({"model": "m"}, choice, matched))
    assert msg.stop_reason == reason
    assert msg.stop_sequence == (matched if reason == "stop_sequence" else None)


def test_text_thinking_and_tool_use_blocks_parse():
    calls = [ToolCall(id="toolu_1", name="calculator", arguments='{"expression": "6*7"}')]
    msg = Message.model_validate(front.message_body({"model": "m"}, _choice("Computing.", calls, reasoning="mult"), None))
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
    assert msg.content[2].input == {"expression": "6*7"} and msg.content[2].id == "toolu_1"
    assert (msg.id, msg.usage.input_tokens, msg.usage.output_tokens) == ("msg_abc", 12, 5)


def _accumulate(deltas: list[ChoiceDelta], matched: str | None = None):
    async def rest():
        for d in deltas[1:]:
            yield d

    async def collect() -> list[bytes]:
        return [f async for f in front._stream({"model": "m"}, "msg_abc", deltas[0], rest(), lambda c: matched)]

    snapshot, bufs, types = None, {}, []
    for frame in asyncio.run(collect()):
        head, data = frame.decode().rstrip("\n").split("\n")
        event = _events.validate_python(json.loads(data.removeprefix("data: ")))
        assert head == f"event: {event.type}"
        types.append(event.type)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    return snapshot, types


def test_stream_events_accumulate_into_the_message_a_call_returns():
    calls, choice, deltas = calculator_stream(_choice, "toolu_1", "Computing.", 4)
    snapshot, types = _accumulate(deltas)
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    final = front.message_body({"model": "m"}, choice, None)
    got = snapshot.to_dict()
    assert got["id"] == choice.interaction_id
    assert [b["type"] for b in got["content"]] == ["thinking", "text", "tool_use"]
    assert got["content"][1]["text"] == "Computing." and got["content"][2]["input"] == {"expression": "6*7"}
    assert got["content"][0]["thinking"] == "mult"
    assert (got["stop_reason"], got["usage"]["input_tokens"], got["usage"]["output_tokens"]) == ("tool_use", 12, 5)
    assert got["content"][2] == final["content"][2]


def test_stream_of_an_empty_answer_has_one_text_block_and_reports_the_stop_sequence():
    snapshot, types = _accumulate([ChoiceDelta(0, "done", choice=_choice(""))], matched="END")
    assert [b.type for b in snapshot.content] == ["text"] and snapshot.content[0].text == ""
    assert (snapshot.stop_reason, snapshot.stop_sequence) == ("stop_sequence", "END")


# ---- end to end: real Gateway over HTTP, embedded engine, the anthropic SDK unchanged ---------


@pytest.fixture(scope="module")
def served(served_scripted):
    """This module's gateway serves the scripted model: greedy replies fixed by contract, any build."""
    return served_scripted


GREEDY = {"temperature": 0}  # anthropic 2.11's create() has no temperature argument: it travels in the body


def _client(gw, key):
    from anthropic import AsyncAnthropic

    return AsyncAnthropic(base_url=gw.http, api_key=key, max_retries=0)  # the SDK appends /v1/messages


def _calc() -> dict:
    from areal.embedded.corpus import CALCULATOR_TOOL

    fn = CALCULATOR_TOOL["function"]
    return {"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}


def test_sdk_plain_message_records_the_engines_tokens(served):
    key = served.open_session()
    msg = asyncio.run(
        _client(served, key).messages.create(
            model="m",
            max_tokens=32,
            extra_body=GREEDY,
            messages=[{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many?"}],
        )
    )
    (inter,) = served.interactions(key)
    assert msg.id == inter.id and msg.stop_reason in ("end_turn", "max_tokens")
    assert inter.output_ids == served.generate_direct(inter.prompt_ids, 32).output_ids
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (len(inter.prompt_ids), len(inter.output_ids))
    assert msg.content[0].type == "text" and msg.content[0].text


def test_sdk_tool_use_then_tool_result_extends_the_recorded_tokens(served):
    from areal.embedded.corpus import TOOL_SYSTEM_PROMPT

    key = served.open_session()
    client = _client(served, key)
    question = {"role": "user", "content": "What is 23*7?"}

    async def go():
        first = await client.messages.create(
            model="m", max_tokens=60, extra_body=GREEDY, system=TOOL_SYSTEM_PROMPT, tools=[_calc()], messages=[question]
        )
        uses = [b for b in first.content if b.type == "tool_use"]
        assert first.stop_reason == "tool_use" and uses and uses[0].name == "calculator", first
        result = str(eval(uses[0].input["expression"], {"__builtins__": {}}))
        second = await client.messages.create(
            model="m",
            max_tokens=40,
            extra_body=GREEDY,
            system=TOOL_SYSTEM_PROMPT,
            tools=[_calc()],
            messages=[
                question,
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": result}]},
            ],
        )
        return first, second

    first, second = asyncio.run(go())
    a, b = served.interactions(key)
    assert (a.id, b.id) == (first.id, second.id)
    assert b.parent_id == a.id and b.prompt_ids[: len(a.prompt_ids) + len(a.output_ids)] == a.prompt_ids + a.output_ids


def test_sdk_stream_accumulates_the_recorded_message(served):
    key = served.open_session()

    async def go():
        async with _client(served, key).messages.stream(
            model="m", max_tokens=24, extra_body=GREEDY, messages=[{"role": "user", "content": "What is 5 + 1?"}]
        ) as stream:
            text = "".join([t async for t in stream.text_stream])
            return text, await stream.get_final_message()

    text, final = asyncio.run(go())
    (inter,) = served.interactions(key)
    assert final.content[0].text.strip() == text.strip() and text
    assert final.usage.output_tokens == len(inter.output_ids) and final.id == inter.id
    assert inter.output_ids == served.generate_direct(inter.prompt_ids, 24).output_ids


def test_stop_sequence_is_reported(served):
    key = served.open_session()
    question = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}]

    async def go():
        client = _client(served, key)
        free = (await client.messages.create(model="m", max_tokens=40, extra_body=GREEDY, messages=question)).content[0].text
        stop = free.split()[1]  # a word the greedy answer is known to contain
        msg = await client.messages.create(
            model="m", max_tokens=40, extra_body=GREEDY, stop_sequences=["never-there", stop], messages=question
        )
        return free, stop, msg

    free, stop, msg = asyncio.run(go())
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", stop)
    assert free.startswith(msg.content[0].text) and stop not in msg.content[0].text


def test_errors_reach_the_sdk_in_anthropic_shape(served):
    import anthropic
    import httpx

    key = served.open_session()
    with pytest.raises(anthropic.BadRequestError) as e:
        asyncio.run(
            _client(served, key).messages.create(
                model="m", max_tokens=8, extra_body={"top_k": 0}, messages=[{"role": "user", "content": "x"}]
            )
        )
    assert e.value.body == {"type": "error", "error": {"type": "invalid_request_error", "message": e.value.body["error"]["message"]}}
    assert "top_k" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError):
        asyncio.run(_client(served, "sk-wrong").messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}]))
    raw = httpx.post(served.http + "/v1/messages", headers={"x-api-key": key}, json={"messages": [{"role": "user", "content": "x"}]})
    assert raw.status_code == 400 and raw.json()["type"] == "error" and "max_tokens" in raw.json()["error"]["message"]
    assert served.interactions(key) == []
