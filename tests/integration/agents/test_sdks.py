"""Every agent SDK the project supports (requirements.txt pins them), unchanged, through a real Gateway (HTTP) to
the real engine: a plain, a streaming and a tool-call request each.

The engine serves the scripted model (``areal.embedded.scripted``), whose greedy reply is fixed by
the conversation's shape on every build: with tools offered it calls ``calculator`` with
``{"expression": "6*7"}``, after a tool result and without tools it answers in text. So each SDK
must hand its caller a real tool call, whatever CPU built the model. After each SDK's requests,
every recorded interaction is replayed straight to the engine (greedy, same prompt ids, same
max_tokens) and must hold exactly the tokens the engine produces.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from areal.embedded.corpus import CALCULATOR_TOOL, TOOL_SYSTEM_PROMPT
from areal.embedded.scripted import AFTER_TOOL_TEXT, CALL_ARGUMENTS, PLAIN_TEXT

QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"
TOOL_QUESTION = "What is 23*7?"
MAX_TOKENS = 48


def _calculate(expression: str) -> str:
    return str(eval(expression, {"__builtins__": {}}))  # the model's expressions are digits and + - * ( )


def _check_recorded(gw, key: str, calls: int) -> list:
    """At least ``calls`` interactions, each holding exactly the engine's greedy tokens for its prompt."""
    inters = gw.interactions(key)
    assert len(inters) >= calls, [i.id for i in inters]
    for inter in inters:
        direct = gw.generate_direct(inter.prompt_ids, MAX_TOKENS)
        assert inter.output_ids == direct.output_ids
        assert inter.output_logprobs == pytest.approx(direct.output_logprobs, abs=1e-4)
    return inters


def test_openai_sdk(served_scripted):
    from openai import AsyncOpenAI

    key = served_scripted.open_session("openai")

    async def go():
        client = AsyncOpenAI(base_url=served_scripted.http + "/v1", api_key=key, max_retries=0)
        kw = {"model": "m", "temperature": 0, "max_tokens": MAX_TOKENS}
        plain = await client.chat.completions.create(messages=[{"role": "user", "content": QUESTION}], **kw)
        stream = await client.chat.completions.create(messages=[{"role": "user", "content": QUESTION}], stream=True, **kw)
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        tool = await client.chat.completions.create(
            messages=[{"role": "system", "content": TOOL_SYSTEM_PROMPT}, {"role": "user", "content": TOOL_QUESTION}],
            tools=[CALCULATOR_TOOL],
            **kw,
        )
        return plain, streamed, tool

    plain, streamed, tool = asyncio.run(go())
    assert plain.choices[0].message.content == PLAIN_TEXT and streamed == PLAIN_TEXT
    (call,) = tool.choices[0].message.tool_calls
    assert tool.choices[0].finish_reason == "tool_calls" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == CALL_ARGUMENTS
    inters = _check_recorded(served_scripted, key, 3)
    assert inters[0].id == plain.id and inters[2].id == tool.id


def test_openai_agents_sdk_default_responses_api(served_scripted):
    from openai import AsyncOpenAI

    from agents import Agent, FunctionTool, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    key = served_scripted.open_session("agents")
    seen: list[str] = []

    async def invoke(ctx, args: str) -> str:
        seen.append(json.loads(args)["expression"])
        return _calculate(seen[-1])

    fn = CALCULATOR_TOOL["function"]
    calculator = FunctionTool(
        name=fn["name"], description=fn["description"], params_json_schema=fn["parameters"], on_invoke_tool=invoke, strict_json_schema=False
    )
    settings = ModelSettings(temperature=0, max_tokens=MAX_TOKENS)

    async def go():
        model = OpenAIResponsesModel(
            model="m", openai_client=AsyncOpenAI(base_url=served_scripted.http + "/v1", api_key=key, max_retries=0)
        )
        plain = await Runner.run(Agent(name="plain", model=model, model_settings=settings), QUESTION)
        run = Runner.run_streamed(Agent(name="stream", model=model, model_settings=settings), QUESTION)
        deltas = [
            e.data.delta
            async for e in run.stream_events()
            if e.type == "raw_response_event" and e.data.type == "response.output_text.delta"
        ]
        tool = await Runner.run(
            Agent(name="tool", instructions=TOOL_SYSTEM_PROMPT, tools=[calculator], model=model, model_settings=settings),
            TOOL_QUESTION,
            max_turns=4,
        )
        return plain, "".join(deltas), run.final_output, tool

    plain, streamed, streamed_final, tool = asyncio.run(go())
    assert plain.final_output == PLAIN_TEXT and streamed == PLAIN_TEXT and streamed_final == PLAIN_TEXT
    assert seen == [CALL_ARGUMENTS["expression"]] and tool.final_output == AFTER_TOOL_TEXT
    _check_recorded(served_scripted, key, 4)


def test_anthropic_sdk(served_scripted):
    from anthropic import AsyncAnthropic

    key = served_scripted.open_session("anthropic")
    fn = CALCULATOR_TOOL["function"]
    tool_spec = {"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}

    async def go():
        client = AsyncAnthropic(base_url=served_scripted.http, api_key=key, max_retries=0)
        kw = {"model": "m", "max_tokens": MAX_TOKENS, "extra_body": {"temperature": 0}}  # create() has no temperature argument
        plain = await client.messages.create(messages=[{"role": "user", "content": QUESTION}], **kw)
        async with client.messages.stream(messages=[{"role": "user", "content": QUESTION}], **kw) as stream:
            streamed = "".join([t async for t in stream.text_stream])
        tool = await client.messages.create(
            system=TOOL_SYSTEM_PROMPT, tools=[tool_spec], messages=[{"role": "user", "content": TOOL_QUESTION}], **kw
        )
        return plain, streamed, tool

    plain, streamed, tool = asyncio.run(go())
    assert plain.content[0].text == PLAIN_TEXT and streamed == PLAIN_TEXT
    uses = [b for b in tool.content if b.type == "tool_use"]
    assert tool.stop_reason == "tool_use" and [(u.name, u.input) for u in uses] == [("calculator", CALL_ARGUMENTS)]
    inters = _check_recorded(served_scripted, key, 3)
    assert [inters[0].id, inters[2].id] == [plain.id, tool.id]


def test_langchain_chat_openai(served_scripted):
    from langchain_openai import ChatOpenAI

    key = served_scripted.open_session("langchain")
    llm = ChatOpenAI(base_url=served_scripted.http + "/v1", api_key=key, model="m", temperature=0, max_tokens=MAX_TOKENS, max_retries=0)

    async def go():
        plain = await llm.ainvoke(QUESTION)
        streamed = "".join([c.content async for c in llm.astream(QUESTION)])
        tool = await llm.bind_tools([CALCULATOR_TOOL]).ainvoke([("system", TOOL_SYSTEM_PROMPT), ("user", TOOL_QUESTION)])
        return plain, streamed, tool

    plain, streamed, tool = asyncio.run(go())
    assert plain.content == PLAIN_TEXT and streamed == PLAIN_TEXT
    assert [(c["name"], c["args"]) for c in tool.tool_calls] == [("calculator", CALL_ARGUMENTS)]
    _check_recorded(served_scripted, key, 3)


def test_camel_chat_agent(served_scripted):
    from camel.agents import ChatAgent
    from camel.models import ModelFactory
    from camel.toolkits import FunctionTool
    from camel.types import ModelPlatformType
    from camel.utils import BaseTokenCounter

    tok = served_scripted.gateway.tokenizer

    class HFTokenCounter(BaseTokenCounter):  # without one, CAMEL downloads a tiktoken encoding
        def count_tokens_from_messages(self, messages: list) -> int:
            return sum(len(tok.encode(str(m.get("content") or ""))) for m in messages)

        def encode(self, text: str) -> list[int]:
            return tok.encode(text)

        def decode(self, token_ids: list[int]) -> str:
            return tok.decode(token_ids)

    key = served_scripted.open_session("camel")

    def model(stream: bool):
        config = {"temperature": 0, "max_tokens": MAX_TOKENS, "stream": stream}
        return ModelFactory.create(
            model_platform=ModelPlatformType.OPENAI_COMPATIBLE_MODEL,
            model_type="m",
            url=served_scripted.http + "/v1",
            api_key=key,
            token_counter=HFTokenCounter(),
            model_config_dict=config,
        )

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * and parentheses."""
        return _calculate(expression)

    plain = ChatAgent(system_message="You are a helpful assistant.", model=model(False)).step(QUESTION)
    chunks = list(ChatAgent(system_message="You are a helpful assistant.", model=model(True)).step(QUESTION))
    streamed = "".join(c.msgs[0].content for c in chunks if c.msgs)
    tool_agent = ChatAgent(
        system_message=TOOL_SYSTEM_PROMPT, model=model(False), tools=[FunctionTool(calculator, openai_tool_schema=CALCULATOR_TOOL)]
    )
    tool = tool_agent.step(TOOL_QUESTION)
    assert plain.msgs[0].content == PLAIN_TEXT
    assert streamed == PLAIN_TEXT or chunks[-1].msgs[0].content == PLAIN_TEXT  # deltas or snapshots
    records = tool.info["tool_calls"]
    assert [(r.tool_name, r.args, r.result) for r in records] == [("calculator", CALL_ARGUMENTS, "42")]
    assert tool.msgs[0].content == AFTER_TOOL_TEXT
    _check_recorded(served_scripted, key, 4)  # plain, stream, tool call, answer after the tool result
