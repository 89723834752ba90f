"""A request's say over the assistant turn it opens (``areal.gateway.assistant_turn``): a prefill
the reply continues (Anthropic's final assistant message, chat's ``continue_final_message``), and
reasoning on or off (chat's ``reasoning_effort``, Responses' ``reasoning.effort``, Anthropic's
``thinking``) on the chat template's thinking switch.

Real parts: the real chat templates of the families (``chat_templates``), Qwen3's tokenizer built
offline, the embedded model's tokenizer and template (no thinking switch), real HTTP with the
official ``openai`` and ``anthropic`` clients, and the scripted engine stand-in (it samples the
canonical ids of scripted replies, and records every prompt it was sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import anthropic
import openai
import pytest
from anthropic import AsyncAnthropic
from anthropic.types import ErrorResponse, Message
from chat_templates import template
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from qwen_tokenizers import build_qwen3_tokenizer, derived_tokenizer
from scripted_engine import ScriptedEngine
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.embedded.pretrained import ensure_pretrained_model
from areal.gateway import Gateway, GatewayConfig, serve_http
from areal.gateway.server import handle
from areal.gateway.template import thinking_switch
from areal.protocol import GatewayRequest

SDK_TYPES = {"chat": ChatCompletion, "responses": Response, "anthropic": Message}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}
THINK_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # Qwen3's generation prompt with thinking off
HARMONY_ADDED = tuple((t, True) for t in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"))
QWEN3_GEN = "<|im_end|>\n<|im_start|>assistant\n"  # ... and with thinking on (the model opens <think> itself)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_embedded_model())


@pytest.fixture(scope="module")
def qwen3():
    return build_qwen3_tokenizer(template("Qwen-Qwen3-0.6B"))


@contextlib.asynccontextmanager
async def served(tok, replies: list[str], **config) -> AsyncIterator[tuple[Gateway, ScriptedEngine, str, str]]:
    """A gateway over real HTTP on the scripted engine: (gateway, engine, base URL, a session's key)."""
    engine = ScriptedEngine(tok, [(r, "<|im_end|>") for r in replies])
    gw = Gateway(engine, tok, GatewayConfig(**config))
    runner, url = await serve_http(gw)
    try:
        yield gw, engine, url, gw.open_session("ep")
    finally:
        await runner.cleanup()


def _post(gw: Gateway, path: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    """One request through the gateway's handler, in this thread: (status, JSON body)."""
    key = key or gw.open_session("e")
    req = GatewayRequest(
        request_id=1, method="POST", path=path, headers={"authorization": f"Bearer {key}", "x-api-key": key}, body=json.dumps(body).encode()
    )
    reply = asyncio.run(handle(gw, req))
    return reply.status, json.loads(reply.body)


def _ask(api: str, **extra) -> dict:
    if api == "responses":
        return {"model": "m", "input": "What is 6*7?", "max_output_tokens": 64, **extra}
    return {"model": "m", "messages": [{"role": "user", "content": "What is 6*7?"}], "max_tokens": 64, **extra}


# ---- the thinking switch ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,switch",
    [
        ("Qwen-Qwen3-0.6B", "enable_thinking"),
        ("Qwen3.5-4B", "enable_thinking"),
        ("deepseek-ai-DeepSeek-V3.1", "enable_thinking"),  # its template reads it as an alias of `thinking`
        ("ibm-granite-granite-3.3-2B-Instruct", "thinking"),
        ("openai-gpt-oss-120b", "reasoning_effort"),
        ("Qwen-Qwen2.5-7B-Instruct", None),
        ("meta-llama-Llama-3.1-8B-Instruct", None),
    ],
)
def test_the_thinking_switch_is_read_off_the_real_templates(name, switch):
    assert thinking_switch(template(name)) == switch


def test_the_embedded_and_smollm2_templates_have_no_switch(tok):
    smollm2 = AutoTokenizer.from_pretrained(ensure_pretrained_model(progress=False))
    assert thinking_switch(tok.chat_template) is None and thinking_switch(smollm2.chat_template) is None


# (API, the request's reasoning field, whether it asks for reasoning)
SWITCHED = [
    ("chat", {"reasoning_effort": "high"}, True),
    ("chat", {"reasoning_effort": "minimal"}, False),
    ("chat", {"reasoning_effort": "none"}, False),
    ("responses", {"reasoning": {"effort": "medium"}}, True),
    ("responses", {"reasoning": {"effort": "none", "summary": None}}, False),
    ("anthropic", {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 1500}, True),
    ("anthropic", {"thinking": {"type": "adaptive"}}, True),
    ("anthropic", {"thinking": {"type": "disabled"}}, False),
]


@pytest.mark.parametrize("api,field,on", SWITCHED)
def test_reasoning_turns_the_qwen3_switch_and_comes_back_as_the_api_defines(qwen3, api, field, on):
    reply = "<think>\n6 times 7 is 42.\n</think>\n\n42." if on else "42."
    gw = Gateway(ScriptedEngine(qwen3, [(reply, "<|im_end|>")]), qwen3, GatewayConfig(max_tokens_cap=2048))
    key = gw.open_session("e")
    status, body = _post(gw, PATHS[api], _ask(api, **field), key)
    assert status == 200, body
    (inter,) = gw.sessions[key].interactions.values()
    prompt = qwen3.decode(inter.prompt_ids)
    if on:  # the template's own render with enable_thinking=True: the generation prompt alone
        assert prompt.endswith(QWEN3_GEN) and not prompt.endswith(THINK_OFF)
    else:
        assert prompt.endswith(THINK_OFF)
    thought = "6 times 7 is 42." if on else None
    SDK_TYPES[api].model_validate(body, strict=True)  # the official SDKs' own types accept the reply
    if api == "chat":
        msg = body["choices"][0]["message"]
        assert msg["content"] == "42." and msg.get("reasoning_content") == thought
    elif api == "responses":
        items = {item["type"]: item for item in body["output"]}
        assert items["message"]["content"][0]["text"] == "42."
        assert (items["reasoning"]["content"][0]["text"] if "reasoning" in items else None) == thought
    else:
        blocks = {b["type"]: b for b in body["content"]}
        assert blocks["text"]["text"] == "42."
        assert (blocks["thinking"]["thinking"] if "thinking" in blocks else None) == thought


def test_an_effort_that_contradicts_chat_template_kwargs_is_a_400(qwen3):
    gw = Gateway(ScriptedEngine(qwen3, []), qwen3, GatewayConfig())
    body = _ask("chat", reasoning_effort="high", chat_template_kwargs={"enable_thinking": False})
    status, reply = _post(gw, PATHS["chat"], body)
    assert status == 400 and reply["error"]["param"] == "reasoning_effort"
    status, reply = _post(gw, PATHS["chat"], _ask("chat", reasoning_effort="extreme"))
    assert status == 400 and reply["error"]["param"] == "reasoning_effort" and reply["error"]["code"] == "invalid_value"


def test_gpt_oss_takes_the_effort_itself():
    tok = derived_tokenizer(template("openai-gpt-oss-120b"), HARMONY_ADDED, "<|return|>")
    gw = Gateway(ScriptedEngine(tok, [("<|channel|>final<|message|>42.", "<|return|>")]), tok, GatewayConfig(tool_parser="gpt-oss"))
    key = gw.open_session("e")
    status, body = _post(gw, PATHS["chat"], _ask("chat", reasoning_effort="high"), key)
    assert status == 200, body
    (inter,) = gw.sessions[key].interactions.values()
    assert "Reasoning: high" in tok.decode(inter.prompt_ids)
    status, body = _post(gw, PATHS["chat"], _ask("chat", reasoning_effort="none"))
    assert status == 400 and body["error"]["param"] == "reasoning_effort" and body["error"]["code"] == "unsupported_value"


def test_a_model_without_a_switch_refuses_reasoning_in_each_apis_error_shape(tok):
    async def run() -> dict:
        async with served(tok, ["Hi.", "Hi.", "Hi."], max_tokens_cap=2048) as (gw, engine, url, key):
            oa = AsyncOpenAI(api_key=key, base_url=url + "/v1", max_retries=0)
            an = AsyncAnthropic(api_key=key, base_url=url, max_retries=0)
            out = {}
            with pytest.raises(openai.BadRequestError) as chat:
                await oa.chat.completions.create(**_ask("chat", reasoning_effort="low"))
            with pytest.raises(openai.BadRequestError) as resp:
                await oa.responses.create(**_ask("responses", reasoning={"effort": "minimal"}))
            with pytest.raises(anthropic.BadRequestError) as msg:
                await an.messages.create(**_ask("anthropic", thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=2000))
            out["errors"] = [chat.value.body, resp.value.body, msg.value.body]
            # asking for no reasoning is honoured as it is: nothing changes in the prompt
            await oa.chat.completions.create(**_ask("chat", reasoning_effort="none"))
            await oa.responses.create(**_ask("responses", reasoning={"effort": "none"}))
            await an.messages.create(**_ask("anthropic", thinking={"type": "disabled"}))
            out["prompts"] = engine.prompts
            out["calls"] = len(gw.sessions[key].interactions)
            return out

    out = asyncio.run(run())
    chat, resp, msg = out["errors"]
    for error, param in ((chat, "reasoning_effort"), (resp, "reasoning.effort")):
        assert error["param"] == param and error["code"] == "unsupported_parameter" and error["type"] == "invalid_request_error"
    ErrorResponse.model_validate(msg, strict=True)
    assert msg["error"]["type"] == "invalid_request_error" and msg["error"]["message"].startswith("thinking is not supported")
    assert out["calls"] == 3 and len({tuple(p) for p in out["prompts"]}) == 1  # the same prompt as without the field


# ---- prefill ------------------------------------------------------------------------------------


def test_an_anthropic_prefill_is_continued_and_the_reply_is_the_continuation(tok):
    question = {"role": "user", "content": "What is 6*7?"}

    async def run() -> dict:
        async with served(tok, [" 42.", " 42.", "Forty-three."]) as (gw, engine, url, key):
            client = AsyncAnthropic(api_key=key, base_url=url, max_retries=0)
            body = {"model": "m", "max_tokens": 32, "messages": [question, {"role": "assistant", "content": "The answer is"}]}
            message = await client.messages.create(**body)
            counted = await client.messages.count_tokens(model="m", messages=body["messages"])
            async with client.messages.stream(**body) as stream:
                streamed = "".join([e.delta.text async for e in stream if e.type == "content_block_delta"])
                final = await stream.get_final_message()
            # the agent joins prefill and reply, then asks on: that call extends the first's tokens
            follow = [question, {"role": "assistant", "content": "The answer is 42."}, {"role": "user", "content": "And 6*7+1?"}]
            await client.messages.create(model="m", max_tokens=32, messages=follow)
            return {
                "message": message,
                "counted": counted.input_tokens,
                "streamed": streamed,
                "final": final,
                "inters": list(gw.sessions[key].interactions.values()),
                "drift": gw.sessions[key].drift,
                "history": tok.apply_chat_template([question], tokenize=False, add_generation_prompt=True),
                "follow": tok.apply_chat_template(follow, tokenize=False, add_generation_prompt=True),
            }

    out = asyncio.run(run())
    first, second, third = out["inters"]
    assert [b.text for b in out["message"].content] == [" 42."] and out["message"].stop_reason == "end_turn"
    assert out["streamed"] == " 42." and [b.text for b in out["final"].content] == [" 42."]
    # the prompt: the history's render with its generation prompt, then the prefill's tokens, no end of turn
    prefill = tok.encode("The answer is", add_special_tokens=False)
    assert first.prompt_ids == tok.encode(out["history"], add_special_tokens=False) + prefill
    assert tok.decode(first.prompt_ids).endswith("<|im_start|>assistant\nThe answer is")
    assert second.prompt_ids == first.prompt_ids and out["message"].usage.input_tokens == out["counted"] == len(first.prompt_ids)
    assert tok.decode(first.output_ids, skip_special_tokens=True) == " 42."
    # the follow-up found the first call as its parent (the joined text is its reply): no drift
    assert third.parent_id in (first.id, second.id) and out["drift"] == 0  # the two have the same tokens
    assert third.prompt_ids[: len(first.prompt_ids) + len(first.output_ids)] == first.prompt_ids + first.output_ids
    assert third.prompt_ids == tok.encode(out["follow"], add_special_tokens=False)  # == a full render: nothing drifted


def test_a_prefill_on_qwen3_is_the_templates_partial_assistant_turn(qwen3):
    gw = Gateway(ScriptedEngine(qwen3, [(" 42.", "<|im_end|>"), (" 42.", "<|im_end|>")]), qwen3, GatewayConfig())
    messages = [{"role": "user", "content": "What is 6*7?"}, {"role": "assistant", "content": "The answer is"}]
    for kwargs, opening in ((None, "<think>\n\n</think>\n\n"), ({"enable_thinking": False}, "")):
        key = gw.open_session("e")
        body = {"model": "m", "max_tokens": 32, "messages": messages, **({"chat_template_kwargs": kwargs} if kwargs else {})}
        status, reply = _post(gw, PATHS["anthropic"], body, key)
        assert status == 200 and reply["content"] == [{"type": "text", "text": " 42."}], reply
        (inter,) = gw.sessions[key].interactions.values()
        head = qwen3.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True, **(kwargs or {}))
        # with thinking on, the template writes a final assistant turn with an empty think block
        assert qwen3.decode(inter.prompt_ids) == head + opening + "The answer is"
        assert inter.prompt_ids[-len(qwen3.encode("The answer is")) :] == qwen3.encode("The answer is")


def test_chat_continue_final_message_continues_and_without_it_a_new_turn_starts(tok):
    messages = [{"role": "user", "content": "What is 6*7?"}, {"role": "assistant", "content": "The answer is"}]

    async def run() -> tuple[list, list[str]]:
        async with served(tok, [" 42.", " 42.", "42."]) as (gw, engine, url, key):
            client = AsyncOpenAI(api_key=key, base_url=url + "/v1", max_retries=0)
            body = {"model": "m", "max_tokens": 32, "messages": messages}
            replies = [await client.chat.completions.create(**body, extra_body={"continue_final_message": True})]
            stream = await client.chat.completions.create(**body, stream=True, extra_body={"continue_final_message": True})
            streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            replies.append(await client.chat.completions.create(**body))
            return replies, streamed, [tok.decode(p) for p in engine.prompts]

    (cont, plain), streamed, prompts = asyncio.run(run())
    assert cont.choices[0].message.content == " 42." and streamed == " 42."
    assert prompts[0] == prompts[1] and prompts[0].endswith("<|im_start|>assistant\nThe answer is")
    assert plain.choices[0].message.content == "42." and prompts[2].endswith("The answer is<|im_end|>\n<|im_start|>assistant\n")


QUESTION = {"role": "user", "content": "What is 6*7?"}
CALC = {"name": "calc", "input_schema": {"type": "object"}}


@pytest.mark.parametrize(
    "body,named",
    [
        ({"messages": [QUESTION, {"role": "assistant", "content": "The answer is "}]}, "messages[1].content: final assistant content"),
        ({"tools": [CALC], "tool_choice": {"type": "any"}}, "forced tool call"),
    ],
)
def test_an_anthropic_prefill_that_cannot_be_continued_is_a_400_in_its_shape(tok, body, named):
    gw = Gateway(ScriptedEngine(tok, []), tok, GatewayConfig())
    messages = [QUESTION, {"role": "assistant", "content": "The answer is"}]
    status, reply = _post(gw, PATHS["anthropic"], {"model": "m", "max_tokens": 16, "messages": messages, **body})
    assert status == 400, reply
    ErrorResponse.model_validate(reply, strict=True)
    assert named in reply["error"]["message"]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"messages": [QUESTION]}, "messages[0]"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"continue_final_message": "yes"}, "continue_final_message"),
    ],
)
def test_a_chat_continuation_that_cannot_be_honoured_is_a_400_naming_it(tok, body, param):
    gw = Gateway(ScriptedEngine(tok, []), tok, GatewayConfig())
    messages = [QUESTION, {"role": "assistant", "content": "The answer is"}]
    status, reply = _post(gw, PATHS["chat"], {"model": "m", "max_tokens": 16, "messages": messages, "continue_final_message": True, **body})
    assert status == 400 and reply["error"]["param"] == param, reply


def test_a_prefill_that_opens_reasoning_makes_the_continuation_reasoning_until_it_closes(tok):
    gw = Gateway(ScriptedEngine(tok, [(" 6*7 is 42.\n</think>\n\nIt is 42.", "<|im_end|>")]), tok, GatewayConfig())
    messages = [QUESTION, {"role": "assistant", "content": "<think>\nLet me see:"}]
    status, reply = _post(gw, PATHS["anthropic"], {"model": "m", "max_tokens": 32, "messages": messages})
    assert status == 200, reply
    Message.model_validate(reply, strict=True)
    assert [(b["type"], b.get("thinking", b.get("text")).strip()) for b in reply["content"]] == [
        ("thinking", "6*7 is 42."),
        ("text", "It is 42."),
    ]
