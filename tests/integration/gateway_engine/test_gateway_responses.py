"""Responses API front-end: request translation, response and event shapes the openai SDK parses,
and end to end through a real Gateway (HTTP) with the openai SDK and the OpenAI Agents SDK."""

from __future__ import annotations

import asyncio
import json

import pytest
from gateway_harness import calculator_stream, front_choice
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from areal.gateway import responses
from areal.gateway.contract import Choice, ChoiceDelta, RequestError, TokenLogprob
from areal.gateway.parsers import ToolCall

_events = TypeAdapter(ResponseStreamEvent)

WEATHER = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate arithmetic.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    "strict": True,
}


def _choice(content: str = "", calls: list[ToolCall] | None = None, reasoning: str | None = None, finish: str = "stop") -> Choice:
    return front_choice(content, calls, reasoning, finish, "resp_abc", 11, 7)


# ---- request -> Turn -------------------------------------------------------------------------


def test_string_input_with_instructions_and_sampling():
    turn = responses.request_to_turn(
        {"model": "m", "input": "What is 2+2?", "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0.0, "top_p": 0.5},
        default_max_tokens=64,
    )
    assert turn.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    assert (turn.sampling.max_tokens, turn.sampling.temperature, turn.sampling.top_p) == (9, 0.0, 0.5)
    assert turn.tools is None and turn.tool_choice is None
    assert responses.request_to_turn({"input": "x"}, default_max_tokens=64).sampling.max_tokens == 64


def test_items_fold_into_one_assistant_message_with_its_tool_calls():
    items = [
        {"role": "developer", "content": "Use tools."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "What is "}, {"type": "input_text", "text": "6*7?"}],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "multiply"}]},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Let me compute.", "annotations": []}],
        },
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "calculator", "arguments": '{"expression": "6*7"}'},
        {"type": "function_call", "call_id": "call_2", "name": "calculator", "arguments": '{"expression": "7*6"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "42"}]},
    ]
    turn = responses.request_to_turn({"input": items, "tools": [WEATHER], "tool_choice": "auto"}, default_max_tokens=64)
    assert turn.messages == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "What is 6*7?"},
        {
            "role": "assistant",
            "content": "Let me compute.",
            "reasoning_content": "multiply",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}},
                {"id": "call_2", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "7*6"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "tool", "tool_call_id": "call_2", "content": "42"},
    ]
    assert turn.tools == [
        {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.", "parameters": WEATHER["parameters"]}}
    ]
    assert turn.tool_choice == "auto"


def test_function_call_without_text_opens_an_assistant_message_with_no_content():
    items = [{"role": "user", "content": "hi"}, {"type": "function_call", "call_id": "c", "name": "calculator", "arguments": "{}"}]
    msgs = responses.input_to_messages(items)
    assert msgs[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}],
    }


def test_named_tool_choice_translates_and_must_exist():
    turn = responses.request_to_turn({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "calculator"}}, 8)
    assert turn.tool_choice == {"type": "function", "function": {"name": "calculator"}}
    with pytest.raises(RequestError, match="not in tools"):
        responses.request_to_turn({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, 8)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": "x", "frequency_penalty": 1}, "frequency_penalty"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"input": "x", "text": {"format": {"type": "grammar"}}}, "text.format"),
        ({"input": "x", "text": {"verbosity": "low"}}, "text"),
        ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"input": "x", "reasoning": {"effort": "high", "summary": "auto"}}, "reasoning.summary"),
        ({"input": "x", "parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"input": "x", "truncation": "auto"}, "truncation"),
        ({"input": 5}, "input"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0]"),
        ({"input": [{"type": "function_call", "call_id": 1, "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": "hot"}, "temperature"),
        ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
        ({"input": []}, "input"),
    ],
)
def test_unsupported_or_bad_parameters_are_400_naming_them(body, param):
    with pytest.raises(RequestError) as e:
        responses.request_to_turn(body, default_max_tokens=8)
    assert e.value.status == 400 and e.value.param == param


# ---- Choice -> response body and events ------------------------------------------------------


def _final_body(choice: Choice) -> dict:
    turn = responses.request_to_turn({"input": "x", "tools": [WEATHER]}, 8)
    status, reason = responses._status(choice)
    ids = {"reasoning": "rs_x", "message": "msg_x"}
    return responses.response_body(
        {"input": "x", "tools": [WEATHER]},
        turn,
        choice.interaction_id,
        1.0,
        status,
        responses.output_items(choice, ids),
        responses.usage_of(choice),
        reason,
    )


def test_text_and_tool_calls_together_in_one_response_the_sdk_parses():
    choice = _choice("Let me compute.", [ToolCall(id="call_1", name="calculator", arguments='{"expression": "6*7"}')], reasoning="think")
    resp = Response.model_validate(_final_body(choice))
    assert [o.type for o in resp.output] == ["reasoning", "message", "function_call"]
    assert resp.output_text == "Let me compute."
    assert resp.output[2].call_id == "call_1" and json.loads(resp.output[2].arguments) == {"expression": "6*7"}
    assert resp.id == "resp_abc" and resp.status == "completed"
    assert (resp.usage.input_tokens, resp.usage.output_tokens, resp.usage.total_tokens) == (11, 7, 18)


def test_length_finish_is_incomplete_with_reason():
    resp = Response.model_validate(_final_body(_choice("partial", finish="length")))
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"


def test_output_items_resent_as_input_rebuild_the_recorded_assistant_message():
    choice = _choice("Let me compute.", [ToolCall(id="call_1", name="calculator", arguments='{"expression": "6*7"}')], reasoning="r")
    items = responses.output_items(choice, {"reasoning": "rs", "message": "msg"})
    assert responses.input_to_messages(items) == [responses._assistant_message(choice)]
    only_call = _choice("", [ToolCall(id="c", name="calculator", arguments="{}")])
    assert responses.input_to_messages(responses.output_items(only_call, {"message": "m"})) == [responses._assistant_message(only_call)]


def test_logprobs_reach_the_output_text():
    choice = _choice("hi")
    choice.logprobs = [TokenLogprob(token="hi", logprob=-0.5, bytes=[104, 105], top=[("hi", -0.5), ("ho", -1.5)])]
    resp = Response.model_validate(_final_body(choice))
    lp = resp.output[0].content[0].logprobs
    assert lp[0].logprob == -0.5 and [t.token for t in lp[0].top_logprobs] == ["hi", "ho"]


def _run_stream(deltas: list[ChoiceDelta]) -> list:
    body = {"model": "m", "input": "x", "stream": True}
    turn = responses.request_to_turn(body, 8)

    async def rest():
        for d in deltas[1:]:
            yield d

    async def collect() -> list[bytes]:
        return [f async for f in responses._stream(body, turn, "resp_abc", deltas[0], rest(), lambda c: None)]

    frames = asyncio.run(collect())
    events = []
    for frame in frames:
        head, data = frame.decode().rstrip("\n").split("\n")
        event = _events.validate_python(json.loads(data.removeprefix("data: ")))
        assert head == f"event: {event.type}"
        events.append(event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def test_stream_events_parse_and_end_with_the_same_response_a_call_returns():
    calls, choice, deltas = calculator_stream(_choice, "call_1", "Let me compute.", 7)
    events = _run_stream(deltas)
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Let me compute."
    assert [e.delta for e in events if e.type == "response.reasoning_text.delta"] == ["mu", "lt"]
    (args_done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args_done.name == "calculator" and args_done.arguments == calls[0].arguments
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "Let me compute." and final.id == choice.interaction_id == events[0].response.id
    done_items = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.model_dump() for i in done_items] == [o.model_dump() for o in final.output]
    # every added item is later done, at the same output index
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert added == [e.output_index for e in events if e.type == "response.output_item.done"] == [0, 1, 2]


def test_stream_of_an_empty_answer_still_has_a_message_item():
    events = _run_stream([ChoiceDelta(0, "done", choice=_choice("", finish="length"))])
    assert events[-1].type == "response.incomplete"
    assert [o.type for o in events[-1].response.output] == ["message"]


# ---- end to end: real Gateway over HTTP, embedded engine, openai SDK and OpenAI Agents SDK -----


@pytest.fixture(scope="module")
def served(served_scripted):
    """This module's gateway serves the scripted model: greedy replies fixed by contract, any build."""
    return served_scripted


def _client(gw, key):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=gw.http + "/v1", api_key=key, max_retries=0)


def _calc_tool() -> dict:
    from areal.embedded.corpus import CALCULATOR_TOOL

    return {"type": "function", **CALCULATOR_TOOL["function"]}


def test_sdk_plain_call_records_the_engines_tokens(served):
    key = served.open_session()
    resp = asyncio.run(
        _client(served, key).responses.create(
            model="m", input="Tom has 3 apples and buys 4 more. How many apples does he have?", max_output_tokens=32, temperature=0
        )
    )
    (inter,) = served.interactions(key)
    assert resp.id == inter.id and resp.status in ("completed", "incomplete")
    direct = served.generate_direct(inter.prompt_ids, 32)
    assert inter.output_ids == direct.output_ids
    assert resp.usage.output_tokens == len(inter.output_ids) and resp.usage.input_tokens == len(inter.prompt_ids)
    assert resp.output_text and resp.output_text in served.gateway.tokenizer.decode(direct.output_ids, skip_special_tokens=True)


def test_sdk_tool_call_then_previous_response_id_extends_the_recorded_tokens(served):
    from areal.embedded.corpus import TOOL_SYSTEM_PROMPT

    key = served.open_session()
    client = _client(served, key)

    async def go():
        first = await client.responses.create(
            model="m", instructions=TOOL_SYSTEM_PROMPT, input="What is 23*7?", tools=[_calc_tool()], max_output_tokens=60, temperature=0
        )
        calls = [o for o in first.output if o.type == "function_call"]
        assert calls and calls[0].name == "calculator", first.output
        result = str(eval(json.loads(calls[0].arguments)["expression"], {"__builtins__": {}}))
        second = await client.responses.create(
            model="m",
            instructions=TOOL_SYSTEM_PROMPT,
            previous_response_id=first.id,
            tools=[_calc_tool()],
            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": result}],
            max_output_tokens=40,
            temperature=0,
        )
        return first, second

    first, second = asyncio.run(go())
    a, b = served.interactions(key)
    assert (a.id, b.id) == (first.id, second.id)
    assert b.parent_id == a.id and b.prompt_ids[: len(a.prompt_ids) + len(a.output_ids)] == a.prompt_ids + a.output_ids
    assert served.call(lambda: served.gateway.sessions[key].drift) == 0


def test_previous_response_id_is_scoped_to_its_session(served):
    import openai

    key, other = served.open_session(), served.open_session()
    first = asyncio.run(_client(served, key).responses.create(model="m", input="What is 2+2?", max_output_tokens=8, temperature=0))
    with pytest.raises(openai.BadRequestError) as e:
        asyncio.run(_client(served, other).responses.create(model="m", input="again", previous_response_id=first.id, max_output_tokens=8))
    assert e.value.body["param"] == "previous_response_id"
    assert served.interactions(other) == []


def test_sdk_stream_deltas_add_up_to_the_completed_response(served):
    key = served.open_session()

    async def go():
        stream = await _client(served, key).responses.create(
            model="m", input="What is 5 + 1?", max_output_tokens=24, temperature=0, stream=True
        )
        return [ev async for ev in stream]

    events = asyncio.run(go())
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    (inter,) = served.interactions(key)
    assert final.id == inter.id == events[0].response.id and final.output_text.strip() == text.strip()
    assert inter.output_ids == served.generate_direct(inter.prompt_ids, 24).output_ids


def test_agents_sdk_runs_a_function_tool_with_its_default_responses_api(served):
    from agents import Agent, FunctionTool, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
    from areal.embedded.corpus import TOOL_SYSTEM_PROMPT

    set_tracing_disabled(True)
    key = served.open_session()
    seen: list[str] = []

    async def invoke(ctx, args: str) -> str:
        expression = json.loads(args)["expression"]
        seen.append(expression)
        return str(eval(expression, {"__builtins__": {}}))

    fn = _calc_tool()
    # The model was trained on this exact schema; the SDK's generated one (strict, titles) is off its distribution.
    calculator = FunctionTool(
        name=fn["name"], description=fn["description"], params_json_schema=fn["parameters"], on_invoke_tool=invoke, strict_json_schema=False
    )
    agent = Agent(
        name="calc",
        instructions=TOOL_SYSTEM_PROMPT,
        tools=[calculator],
        model=OpenAIResponsesModel(model="m", openai_client=_client(served, key)),
        model_settings=ModelSettings(temperature=0, max_tokens=60),
    )
    result = asyncio.run(Runner.run(agent, "What is 23*7?", max_turns=4))
    assert seen, "the agent never called the tool"
    inters = served.interactions(key)
    assert len(inters) == len(result.raw_responses) >= 2
    assert [r.response_id for r in result.raw_responses] == [i.id for i in inters]
    assert inters[1].parent_id == inters[0].id  # the tool turn extended the recorded tokens
    assert isinstance(result.final_output, str) and result.final_output
