"""Model families users train today, through the real gateway with their real chat templates.

Families: Qwen3 (thinking on and off; its template strips earlier reasoning from history),
Qwen3-Coder and Qwen3.5 (XML tool calls; Qwen3.5's prompt opens ``<think>``), Llama 3.1 (JSON
tool calls, ``<|python_tag|>``), GPT-OSS (harmony channels), DeepSeek-V3 (the R1 template's
fenced-JSON calls) and DeepSeek-V3.1. For each:

(a) an episode with tool calls and tool results through ``Gateway`` (the stand-in engine samples
    the canonical tokens of scripted replies): each prompt extends its parent's prompt + sampled
    ids, and equals a full render of the same history where the template is prefix-preserving;
    where the template rewrites history (Qwen3 and Qwen3.5 drop earlier reasoning after a new user
    query, Qwen3 without thinking drops its empty think block, GPT-OSS drops analysis after a final
    answer, DeepSeek-R1 drops ``<think>``) the call is a new root and the drift is counted;
(b) the family's own output format parses (parallel calls included), the same whole and streamed
    with a cut at every character boundary, and streamed through the gateway;
(c) SGLang's and vLLM's parser names, and ``tool_parser=auto`` reading the format off the tokenizer.

Templates: the real ones, fetched by ``tests/support/chat_templates.py`` (never copied here). Tokenizers:
Qwen3's exact one (Qwen2.5's vocabulary + its four added tokens); for Llama 3, GPT-OSS and
DeepSeek (vocabularies that cannot be built offline) the Qwen2.5 vocabulary with the family's
special tokens added (``qwen.derived_tokenizer``), which is what template text -> ids and parsing
need. The stand-in engine is the only stand-in: nothing on this machine samples these formats.
"""

from __future__ import annotations

import json

import pytest
from chat_templates import template
from gateway_harness import handled, post_chat
from qwen_tokenizers import build_qwen3_tokenizer, derived_tokenizer
from scripted_engine import ScriptedEngine

from areal.gateway import Gateway, GatewayConfig
from areal.gateway import parsers as P
from areal.gateway.families import detect_tool_parser, stop_token_ids
from areal.gateway.parsers import StreamParser, parse_output, reasoning_parser_name, tool_parser_name
from areal.gateway.template import with_argument_objects

DS = {k: f"<\uff5c{k.replace('_', chr(0x2581))}\uff5c>" for k in ("tool_calls_begin", "tool_calls_end", "tool_call_begin", "tool_call_end")}
DS_SEP = "<\uff5ctool\u2581sep\uff5c>"
DS_EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
DS_ADDED = tuple(
    (f"<\uff5c{name.replace('_', chr(0x2581))}\uff5c>", special)
    for name, special in [
        ("begin_of_sentence", True),
        ("end_of_sentence", True),
        ("User", False),
        ("Assistant", False),
        ("tool_calls_begin", False),
        ("tool_calls_end", False),
        ("tool_call_begin", False),
        ("tool_call_end", False),
        ("tool_outputs_begin", False),
        ("tool_outputs_end", False),
        ("tool_output_begin", False),
        ("tool_output_end", False),
        ("tool_sep", False),
    ]
) + (("<think>", False), ("</think>", False))
LLAMA_ADDED = tuple(
    (t, True) for t in ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>")
)
HARMONY_ADDED = tuple((t, True) for t in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"))


def _tokenizer(family: str):
    match family:
        case "qwen3":
            return build_qwen3_tokenizer(template("Qwen-Qwen3-0.6B"))
        case "qwen3_coder":
            return build_qwen3_tokenizer(template("Qwen3-Coder"))
        case "qwen35":
            return build_qwen3_tokenizer(template("Qwen3.5-4B"))
        case "llama31":
            return derived_tokenizer(template("meta-llama-Llama-3.1-8B-Instruct"), LLAMA_ADDED, "<|eot_id|>", "<|begin_of_text|>")
        case "gpt_oss":
            return derived_tokenizer(template("openai-gpt-oss-120b"), HARMONY_ADDED, "<|return|>")
        case "deepseek_r1":
            return derived_tokenizer(template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"), DS_ADDED, DS_EOS, DS_ADDED[0][0])
        case "deepseek_v31":
            return derived_tokenizer(template("deepseek-ai-DeepSeek-V3.1"), DS_ADDED, DS_EOS, DS_ADDED[0][0])
    raise AssertionError(family)


_TOKENIZERS: dict = {}


def tokenizer_of(family: str):
    if family not in _TOKENIZERS:  # one build per family and test process (seconds each)
        _TOKENIZERS[family] = _tokenizer(family)
    return _TOKENIZERS[family]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate arithmetic.",
            "parameters": {
                "type": "object",
                "properties": {"expr": {"type": "string", "description": "an expression"}},
                "required": ["expr"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]},
        },
    },
]


def _post_stream(gw: Gateway, key: str, body: dict) -> tuple[dict, list[dict]]:
    """A streamed request: (the message the deltas add up to, the chunks)."""
    reply = handled(gw, key, {**body, "stream": True})  # the server-sent events, collected
    assert reply.status == 200, reply.body
    chunks = [json.loads(line[6:]) for line in reply.body.decode().splitlines() if line.startswith("data: {")]
    msg: dict = {"content": "", "reasoning_content": "", "tool_calls": []}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            msg["content"] += delta.get("content") or ""
            msg["reasoning_content"] += delta.get("reasoning_content") or ""
            msg["tool_calls"] += delta.get("tool_calls") or []
    return msg, chunks


def _reference(gw: Gateway, messages: list[dict], tools, kwargs: dict | None = None) -> list[int]:
    """A full render through transformers' public API, of the history as the gateway hands it to
    the template: None-valued keys dropped (a null content as ""), reasoning also as ``thinking``, arguments as objects
    where the template takes them (the probe's answer, pinned per family below)."""
    tok = gw.tokenizer
    clean = []
    for m in messages:
        m = {k: ("" if k == "content" and v is None else v) for k, v in m.items() if v is not None or k == "content"}
        if "reasoning_content" in m:
            m["thinking"] = m["reasoning_content"]
        clean.append(with_argument_objects(m) if gw.prompts.template.argument_objects else m)
    text = tok.apply_chat_template(clean, tools=tools, tokenize=False, add_generation_prompt=True, **(kwargs or {}))
    return tok.encode(text, add_special_tokens=False)


def _episode(family: str, script: list[tuple[str, str, str]], system: bool = True, kwargs: dict | None = None, **config):
    """Run ``script`` (reply text, stop token, what follows: "tools" | "user" | "end") as one agent
    would: send the history, append the reply as returned (+ an SDK's extra key), then a tool
    result per call or a new user message. Returns (gateway, session, messages sent per call, replies)."""
    tok = tokenizer_of(family)
    engine = ScriptedEngine(tok, [(text, stop) for text, stop, _ in script])
    gw = Gateway(engine, tok, GatewayConfig(context_length=16384, **config))
    key = gw.open_session("ep")
    messages = [{"role": "system", "content": "You are a careful assistant."}] if system else []
    messages.append({"role": "user", "content": "What is (3+4)*2, and the weather in Paris?"})
    sent, replies = [], []
    for _, _, follow in script:
        body = {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 256}
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        sent.append(list(messages))
        msg = post_chat(gw, key, body)["choices"][0]["message"]
        replies.append(msg)
        messages = messages + [{**msg, "refusal": None}]
        if follow == "tools":
            for call in msg["tool_calls"]:
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": "14" if call["function"]["name"] == "calc" else "sunny"}
                )
        elif follow == "user":
            messages.append({"role": "user", "content": "Thanks. And 2+2?"})
    session = gw.sessions[key]
    assert engine.prompts == [i.prompt_ids for i in session.interactions.values()]  # what was sent is what was recorded
    return gw, session, sent, replies


def _calls(msg: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]


def _check_chain(session, equal_upto: int, gw, sent, kwargs=None) -> None:
    """Calls 1..equal_upto-1 extend their parent exactly and equal a full render of their history."""
    inters = list(session.interactions.values())
    for i in range(1, equal_upto):
        parent, child = inters[i - 1], inters[i]
        assert child.parent_id == parent.id
        assert child.prompt_ids[: len(parent.prompt_ids) + len(parent.output_ids)] == parent.prompt_ids + parent.output_ids
        assert child.prompt_ids == _reference(gw, sent[i], TOOLS, kwargs), f"call {i}"


# ---- (a) episodes ------------------------------------------------------------------------------------

QWEN_CALC = '<tool_call>\n{"name": "calc", "arguments": {"expr":"%s"}}\n</tool_call>'
QWEN_WEATHER = '<tool_call>\n{"name": "weather", "arguments": {"city":"Paris","days":2}}\n</tool_call>'


def test_qwen3_thinking_tool_episode_is_exact_and_a_new_query_drifts():
    script = [
        ("<think>\nAdd first.\n</think>\n\n" + QWEN_CALC % "3+4", "<|im_end|>", "tools"),
        ("<think>\nNow both.\n</think>\n\n" + QWEN_CALC % "7*2" + "\n" + QWEN_WEATHER, "<|im_end|>", "tools"),
        ("<think>\nDone.\n</think>\n\nIt is 14, and sunny.", "<|im_end|>", "user"),
        ("<think>\nEasy.\n</think>\n\n4.", "<|im_end|>", "end"),
    ]
    gw, session, sent, replies = _episode("qwen3", script, tool_parser="qwen3", reasoning_parser="qwen3")
    assert gw.prompts.template.argument_objects is False  # Qwen3's template writes text arguments verbatim
    assert (replies[0]["reasoning_content"], replies[0]["content"], _calls(replies[0])) == ("Add first.", None, [("calc", {"expr": "3+4"})])
    assert _calls(replies[1]) == [("calc", {"expr": "7*2"}), ("weather", {"city": "Paris", "days": 2})]  # parallel
    assert (replies[2]["content"], replies[2]["reasoning_content"]) == ("It is 14, and sunny.", "Done.")
    _check_chain(session, 3, gw, sent)
    # the new user query: Qwen3's template no longer writes the earlier turns' reasoning
    last = list(session.interactions.values())[3]
    assert (session.index.incremental, session.drift) == (2, 1) and gw.metrics()["drift"] == 1
    assert last.parent_id is None
    assert last.prompt_ids == _reference(gw, sent[3], TOOLS)


def test_qwen3_without_thinking_renders_the_kwarg_and_its_template_drifts():
    off = {"enable_thinking": False}
    script = [(QWEN_CALC % "3+4", "<|im_end|>", "tools"), ("It is 7.", "<|im_end|>", "end")]
    gw, session, sent, replies = _episode("qwen3", script, kwargs=off, tool_parser="qwen3")
    first, second = session.interactions.values()
    tok = gw.tokenizer
    assert first.prompt_ids[-6:] == tok.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False)[-6:]
    assert first.prompt_ids == _reference(gw, sent[0], TOOLS, off)
    assert "reasoning_content" not in replies[0] and _calls(replies[0]) == [("calc", {"expr": "3+4"})]
    # the template drops the empty think block of an earlier reply without reasoning: not prefix-preserving
    assert second.parent_id is None and session.drift == 1
    assert second.prompt_ids == _reference(gw, sent[1], TOOLS, off)


def _xml_call(name: str, **args) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def test_qwen3_coder_xml_tool_episode_is_exact():
    script = [
        (_xml_call("calc", expr="3+4"), "<|im_end|>", "tools"),
        (_xml_call("calc", expr="7*2") + "\n" + _xml_call("weather", city="Paris", days=2), "<|im_end|>", "tools"),
        ("It is 14, and sunny.", "<|im_end|>", "user"),
        ("4.", "<|im_end|>", "end"),
    ]
    gw, session, sent, replies = _episode("qwen3_coder", script, tool_parser="qwen3_coder")
    assert gw.prompts.template.argument_objects is True  # arguments|items: objects
    # typed by the request's schemas: days is an integer, expr a string even where it looks like JSON
    assert _calls(replies[1]) == [("calc", {"expr": "7*2"}), ("weather", {"city": "Paris", "days": 2})]
    _check_chain(session, 4, gw, sent)
    assert (session.index.incremental, session.drift) == (3, 0)


def test_qwen35_prompt_opens_reasoning_and_xml_calls_are_exact():
    script = [
        ("Add first.\n</think>\n\n" + _xml_call("calc", expr="3+4"), "<|im_end|>", "tools"),
        ("Now both.\n</think>\n\n" + _xml_call("calc", expr="7*2") + "\n" + _xml_call("weather", city="Paris"), "<|im_end|>", "tools"),
        ("Done.\n</think>\n\nIt is 14, and sunny.", "<|im_end|>", "user"),
        ("Easy.\n</think>\n\n4.", "<|im_end|>", "end"),
    ]
    gw, session, sent, replies = _episode("qwen35", script, tool_parser="qwen3_coder", reasoning_parser="qwen3")
    assert gw.decode_text(session.interactions[next(iter(session.interactions))].prompt_ids[-2:]) == "<think>\n"
    assert (replies[0]["reasoning_content"], replies[0]["content"], _calls(replies[0])) == ("Add first.", None, [("calc", {"expr": "3+4"})])
    assert _calls(replies[1]) == [("calc", {"expr": "7*2"}), ("weather", {"city": "Paris"})]
    assert (replies[2]["reasoning_content"], replies[2]["content"]) == ("Done.", "It is 14, and sunny.")
    _check_chain(session, 3, gw, sent)
    assert session.index.incremental == 2
    last = list(session.interactions.values())[3]  # a new query: earlier reasoning dropped by the template
    assert last.parent_id is None and session.drift == 1 and last.prompt_ids == _reference(gw, sent[3], TOOLS)
    # without thinking the prompt closes the block and nothing is reasoning
    gw2, s2, _, replies2 = _episode(
        "qwen35", [("It is 14.", "<|im_end|>", "end")], kwargs={"enable_thinking": False}, tool_parser="qwen3_coder"
    )
    assert replies2[0]["content"] == "It is 14." and "reasoning_content" not in replies2[0]


def _llama_call(name: str, args: dict) -> str:
    return '{"name": "%s", "parameters": %s}' % (name, json.dumps(args))


def test_llama31_json_tool_episode_is_exact():
    script = [
        (_llama_call("calc", {"expr": "3+4"}), "<|eot_id|>", "tools"),
        (_llama_call("calc", {"expr": "7*2"}), "<|eot_id|>", "tools"),
        ("It is 14.", "<|eot_id|>", "user"),
        ("4.", "<|eot_id|>", "end"),
    ]
    gw, session, sent, replies = _episode("llama31", script, tool_parser="llama3_json")
    assert gw.prompts.template.argument_objects is True  # arguments|tojson: objects
    assert _calls(replies[0]) == [("calc", {"expr": "3+4"})] and replies[2]["content"] == "It is 14."
    _check_chain(session, 4, gw, sent)  # tools in the first user message: the lead keeps it
    assert (session.index.incremental, session.drift) == (3, 0)


def test_llama31_python_tag_call_parses_and_the_next_call_extends_it():
    tok = tokenizer_of("llama31")
    assert {tok.convert_tokens_to_ids(t) for t in ("<|eot_id|>", "<|eom_id|>")} <= set(stop_token_ids(tok))
    script = [("<|python_tag|>" + _llama_call("calc", {"expr": "3+4"}), "<|eom_id|>", "tools"), ("It is 7.", "<|eot_id|>", "end")]
    gw, session, sent, replies = _episode("llama31", script, tool_parser="llama3")
    # <|python_tag|> is a special token: decoded for the parser all the same
    assert _calls(replies[0]) == [("calc", {"expr": "3+4"})] and replies[0]["content"] is None
    first, second = session.interactions.values()
    # the template writes the call without the tag: the sampled tokens stay, the tool result follows
    assert second.parent_id == first.id and session.drift == 0
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.output_ids)] == first.prompt_ids + first.output_ids


def test_llama31_template_refusing_parallel_calls_is_a_400():
    tok = tokenizer_of("llama31")
    gw = Gateway(ScriptedEngine(tok, []), tok, GatewayConfig(tool_parser="llama3"))
    key = gw.open_session("ep")
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "1"}'}} for i in range(2)]
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c0", "content": "1"},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
    ]
    body = {"model": "m", "messages": messages, "tools": TOOLS}
    reply = handled(gw, key, body)
    assert reply.status == 400 and "only supports single tool-calls" in json.loads(reply.body)["error"]["message"]


def _harmony_call(name: str, args: dict, analysis: str | None = None) -> str:
    head = f"<|channel|>analysis<|message|>{analysis}<|end|><|start|>assistant" if analysis is not None else ""
    return f"{head} to=functions.{name}<|channel|>commentary json<|message|>{json.dumps(args)}"


def test_gpt_oss_harmony_tool_episode_is_exact_and_a_final_answer_drifts():
    script = [
        (_harmony_call("calc", {"expr": "3+4"}, "Add first."), "<|call|>", "tools"),
        (_harmony_call("weather", {"city": "Paris"}, "Now the weather."), "<|call|>", "tools"),
        (
            "<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>final<|message|>It is 14, and sunny.",
            "<|return|>",
            "user",
        ),
        ("<|channel|>final<|message|>4.", "<|return|>", "end"),
    ]
    gw, session, sent, replies = _episode("gpt_oss", script, tool_parser="openai")
    assert (gw.config.tool_parser, gw.config.reasoning_parser) == ("gpt-oss", "gpt-oss")  # harmony is the whole format
    tok = gw.tokenizer
    stops = set(stop_token_ids(tok))
    assert {tok.convert_tokens_to_ids(t) for t in ("<|call|>", "<|return|>")} <= stops
    assert tok.convert_tokens_to_ids("<|end|>") not in stops  # it ends a message inside one output
    assert (replies[0]["reasoning_content"], replies[0]["content"], _calls(replies[0])) == ("Add first.", None, [("calc", {"expr": "3+4"})])
    assert (replies[2]["reasoning_content"], replies[2]["content"]) == ("Done.", "It is 14, and sunny.")
    _check_chain(session, 3, gw, sent)
    assert session.index.incremental == 2
    # after a final answer the template drops the analysis of earlier turns (and ends it with <|end|>)
    last = list(session.interactions.values())[3]
    assert last.parent_id is None and session.drift == 1 and last.prompt_ids == _reference(gw, sent[3], TOOLS)


def test_gpt_oss_call_in_the_models_spelling_keeps_its_tokens_and_the_tool_result_follows():
    """The model writes the recipient after the channel; the template before it. The sampled tokens
    stay, and what follows them is what the template writes after the call's <|call|>."""
    reply = '<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{"expr":"3+4"}'
    gw, session, sent, replies = _episode(
        "gpt_oss", [(reply, "<|call|>", "tools"), ("<|channel|>final<|message|>7.", "<|return|>", "end")], tool_parser="gpt-oss"
    )
    assert gw.config.tool_parser == "gpt-oss" and _calls(replies[0]) == [("calc", {"expr": "3+4"})]
    first, second = session.interactions.values()
    assert second.parent_id == first.id and session.drift == 0
    head = len(first.prompt_ids) + len(first.output_ids)
    assert second.prompt_ids[:head] == first.prompt_ids + first.output_ids
    tail = '<|start|>functions.calc to=assistant<|channel|>commentary<|message|>"14"<|end|><|start|>assistant'
    assert second.prompt_ids[head:] == gw.tokenizer.encode(tail, add_special_tokens=False)


def _ds31_calls(*calls: tuple[str, dict]) -> str:
    body = "".join(DS["tool_call_begin"] + n + DS_SEP + json.dumps(a) + DS["tool_call_end"] for n, a in calls)
    return DS["tool_calls_begin"] + body + DS["tool_calls_end"]


def test_deepseek_v31_tool_episode_is_exact():
    script = [
        (_ds31_calls(("calc", {"expr": "3+4"})), DS_EOS, "tools"),
        (_ds31_calls(("calc", {"expr": "7*2"}), ("weather", {"city": "Paris"})), DS_EOS, "tools"),
        ("It is 14, and sunny.", DS_EOS, "user"),
        ("4.", DS_EOS, "end"),
    ]
    gw, session, sent, replies = _episode("deepseek_v31", script, tool_parser="deepseek_v31", reasoning_parser="deepseek-r1")
    assert gw.prompts.template.argument_objects is True
    assert _calls(replies[1]) == [("calc", {"expr": "7*2"}), ("weather", {"city": "Paris"})]
    _check_chain(session, 4, gw, sent)
    assert (session.index.incremental, session.drift) == (3, 0)


def _ds3_calls(*calls: tuple[str, dict]) -> str:
    body = "\n".join(f"{DS['tool_call_begin']}function{DS_SEP}{n}\n```json\n{json.dumps(a)}\n```{DS['tool_call_end']}" for n, a in calls)
    return DS["tool_calls_begin"] + body + DS["tool_calls_end"]


def test_deepseek_v3_format_parses_and_the_r1_template_drift_is_counted():
    script = [
        (_ds3_calls(("calc", {"expr": "3+4"}), ("weather", {"city": "Paris"})), DS_EOS, "tools"),
        ("It is 7, and sunny.", DS_EOS, "end"),
    ]
    gw, session, sent, replies = _episode("deepseek_r1", script, tool_parser="deepseekv3")
    assert _calls(replies[0]) == [("calc", {"expr": "3+4"}), ("weather", {"city": "Paris"})]
    first, second = session.interactions.values()
    # the prompt ended "<think>\n</think>", which the template does not write back before a call
    assert second.parent_id is None and session.drift == 1 and second.prompt_ids == _reference(gw, sent[1], TOOLS)


# ---- (b) each family's output, whole and streamed ---------------------------------------------------

OUTPUTS = [  # (tool parser, reasoning parser, reasoning_open, text, content, reasoning, calls)
    (
        "hermes",
        "think",
        False,
        '<think>\nplan\n</think>\n\nBoth.\n<tool_call>\n{"name": "calc", "arguments": {"expr": "1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "Both.",
        "plan",
        [("calc", {"expr": "1"}), ("weather", {"city": "Paris"})],
    ),
    (
        "qwen3_coder",
        "think",
        True,
        "plan\n</think>\n\nBoth.\n\n" + _xml_call("calc", expr="1+1") + "\n" + _xml_call("weather", city="Paris", days=3),
        "Both.",
        "plan",
        [("calc", {"expr": "1+1"}), ("weather", {"city": "Paris", "days": 3})],
    ),
    (
        "qwen3_coder",
        None,
        False,
        _xml_call("weather", city="multi\nline <b>", days="x"),  # an integer that is not one stays text
        "",
        None,
        [("weather", {"city": "multi\nline <b>", "days": "x"})],
    ),
    (
        "llama3",
        None,
        False,
        _llama_call("calc", {"expr": "1"}) + "; " + _llama_call("weather", {"city": "Paris"}),
        "",
        None,
        [("calc", {"expr": "1"}), ("weather", {"city": "Paris"})],
    ),
    (
        "llama3",
        None,
        False,
        "Let me see.<|python_tag|>" + _llama_call("calc", {"expr": "1"}),
        "Let me see.",
        None,
        [("calc", {"expr": "1"})],
    ),
    (
        "gpt-oss",
        "gpt-oss",
        False,
        "<|channel|>analysis<|message|>Two calls.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking both.<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{"expr": "1"}<|call|>'
        '<|start|>assistant to=functions.weather<|channel|>commentary json<|message|>{"city": "Paris"}',
        "Checking both.",
        "Two calls.",
        [("calc", {"expr": "1"}), ("weather", {"city": "Paris"})],
    ),
    (
        "gpt-oss",
        "gpt-oss",
        False,
        '<|channel|>commentary to=browser.search<|message|>{"q": 1}<|end|><|start|>assistant<|channel|>final<|message|>Hi',
        '<|channel|>commentary to=browser.search<|message|>{"q": 1}<|end|>\nHi',  # a built-in tool's call stays text
        None,
        [],
    ),
    (
        "deepseekv3",
        "think",
        False,
        "<think>\nplan\n</think>\n\n" + _ds3_calls(("calc", {"expr": "1"}), ("weather", {"city": "Paris"})),
        "",
        "plan",
        [("calc", {"expr": "1"}), ("weather", {"city": "Paris"})],
    ),
    (
        "deepseekv31",
        "think",
        True,
        "plan</think>Sure." + _ds31_calls(("calc", {"expr": "1"}), ("weather", {"city": "Paris"})),
        "Sure.",
        "plan",
        [("calc", {"expr": "1"}), ("weather", {"city": "Paris"})],
    ),
]


@pytest.mark.parametrize("tool,reasoning,opened,text,content,thought,calls", OUTPUTS)
def test_family_output_parses_whole_and_at_every_cut(tool, reasoning, opened, text, content, thought, calls):
    def shape(out):
        return out.content, out.reasoning, [(c.name, json.loads(c.arguments)) for c in out.tool_calls]

    whole = parse_output(text, tool, reasoning, tools=TOOLS, reasoning_open=opened)
    assert shape(whole) == (content, thought, calls)
    for cuts in [[i] for i in range(len(text) + 1)] + [list(range(len(text)))]:  # every boundary; and char by char
        parser = StreamParser(tool, reasoning, tools=TOOLS, reasoning_open=opened)
        events, prev = [], 0
        for cut in cuts + [len(text)]:
            events += parser.feed(text[prev:cut])
            prev = cut
        tail, out = parser.finish()
        events += tail
        assert shape(out) == shape(whole), cuts
        assert "".join(e.text for e in events if e.kind == "content") == content
        assert "".join(e.text for e in events if e.kind == "reasoning") == (thought or "")


def test_malformed_calls_of_the_new_formats_stay_text():
    for tool, text in [
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>"),  # unclosed parameter
        ("qwen3_coder", "<tool_call>\n{not xml}\n</tool_call>"),
        (
            "deepseekv31",
            DS["tool_calls_begin"] + DS["tool_call_begin"] + "f" + DS_SEP + "{oops}" + DS["tool_call_end"] + DS["tool_calls_end"],
        ),
    ]:
        out = parse_output(text, tool, None)
        assert (out.content, out.tool_calls) == (text, []), tool
    bad = "<|channel|>commentary to=functions.f json<|message|>[1, 2]"
    out = parse_output(bad, "gpt-oss", "gpt-oss")
    assert (out.content, out.tool_calls) == (bad, [])


@pytest.mark.parametrize(
    "family,tool,reply,stop",
    [
        ("gpt_oss", "gpt-oss", _harmony_call("calc", {"expr": "3+4"}, "Add first."), "<|call|>"),
        ("qwen35", "qwen3_coder", "Add first.\n</think>\n\n" + _xml_call("calc", expr="3+4"), "<|im_end|>"),
        ("llama31", "llama3", "<|python_tag|>" + _llama_call("calc", {"expr": "3+4"}), "<|eom_id|>"),
    ],
)
def test_streamed_through_the_gateway_equals_the_whole_answer(family, tool, reply, stop):
    tok = tokenizer_of(family)
    gw = Gateway(ScriptedEngine(tok, [(reply, stop), (reply, stop)]), tok, GatewayConfig(context_length=16384, tool_parser=tool))
    body = {"model": "m", "messages": [{"role": "user", "content": "3+4?"}], "tools": TOOLS, "max_tokens": 64}
    whole = post_chat(gw, gw.open_session("a"), body)["choices"][0]["message"]
    streamed, chunks = _post_stream(gw, gw.open_session("b"), body)
    assert streamed["content"] == (whole["content"] or "")
    assert streamed["reasoning_content"] == (whole.get("reasoning_content") or "") == ("" if family == "llama31" else "Add first.")
    assert (
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed["tool_calls"]]
        == _calls(whole)
        == [("calc", {"expr": "3+4"})]
    )
    assert not any(m in json.dumps(chunks) for m in ("<|channel|>", "<|python_tag|>", "</think>"))  # markers never reach the client


# ---- (c) names and auto ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given,ours",
    [
        ("qwen25", "qwen25"),
        ("qwen3", "hermes"),
        ("hermes", "hermes"),
        ("qwen3_coder", "qwen3_coder"),
        ("qwen3_xml", "qwen3_coder"),
        ("llama3", "llama3"),
        ("llama3_json", "llama3"),
        ("deepseekv3", "deepseekv3"),
        ("deepseek_v3", "deepseekv3"),
        ("deepseekv31", "deepseekv31"),
        ("deepseek_v31", "deepseekv31"),
        ("gpt-oss", "gpt-oss"),
        ("openai", "gpt-oss"),
        ("auto", "auto"),
    ],
)
def test_tool_parser_names_of_sglang_and_vllm(given, ours):
    assert tool_parser_name(given) == ours


@pytest.mark.parametrize(
    "given,ours",
    [("qwen3", "think"), ("deepseek-r1", "think"), ("deepseek_v31", "think"), ("gpt-oss", "gpt-oss"), ("openai_gptoss", "gpt-oss")],
)
def test_reasoning_parser_names_of_sglang_and_vllm(given, ours):
    assert reasoning_parser_name(given) == ours


@pytest.mark.parametrize(
    "family,expected",
    [
        ("qwen3", "qwen25"),
        ("qwen3_coder", "qwen3_coder"),
        ("qwen35", "qwen3_coder"),
        ("llama31", "llama3"),
        ("gpt_oss", "gpt-oss"),
        ("deepseek_r1", "deepseekv3"),
        ("deepseek_v31", "deepseekv31"),
    ],
)
def test_auto_reads_the_format_off_the_tokenizer(family, expected):
    tok = tokenizer_of(family)
    assert detect_tool_parser(tok) == expected
    gw = Gateway(ScriptedEngine(tok, []), tok, GatewayConfig(tool_parser="auto"))
    assert gw.config.tool_parser == expected


@pytest.mark.parametrize(
    "name,expected",
    [
        ("meta-llama-Llama-3.2-3B-Instruct", "llama3"),
        ("meta-llama-Llama-3.3-70B-Instruct", "llama3"),
        ("Qwen-Qwen2.5-7B-Instruct", "qwen25"),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "qwen25"),
        ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
    ],
)
def test_auto_on_more_real_templates(name, expected):
    tok = tokenizer_of("qwen3")  # the template decides; the vocabulary only for Llama's tag
    tok.chat_template, saved = template(name), tok.chat_template
    try:
        assert detect_tool_parser(tok) == expected
    finally:
        tok.chat_template = saved


def test_auto_says_when_it_cannot_tell():
    tok = tokenizer_of("qwen3")
    tok.chat_template, saved = template("google-gemma-2-2b-it"), tok.chat_template
    try:
        with pytest.raises(ValueError, match="tool_parser=auto: .* writes tool calls in none of the formats .* set gateway.tool_parser"):
            Gateway(ScriptedEngine(tok, []), tok, GatewayConfig(tool_parser="auto"))
        tok.chat_template = None
        with pytest.raises(ValueError, match="has no chat template"):
            detect_tool_parser(tok)
    finally:
        tok.chat_template = saved


def test_chat_template_kwargs_are_checked_and_key_the_render_cache():
    tok = tokenizer_of("qwen3")
    gw = Gateway(ScriptedEngine(tok, [("A.", "<|im_end|>"), ("B.", "<|im_end|>")]), tok, GatewayConfig())
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for bad in (["x"], {"messages": []}, {"not an identifier": 1}):
        reply = handled(gw, gw.open_session("e"), {**body, "chat_template_kwargs": bad})
        assert reply.status == 400 and json.loads(reply.body)["error"]["param"] == "chat_template_kwargs", bad
    post_chat(gw, gw.open_session("on"), body)
    post_chat(gw, gw.open_session("off"), {**body, "chat_template_kwargs": {"enable_thinking": False}})
    on, off = (next(iter(s.interactions.values())).prompt_ids for s in list(gw.sessions.values())[-2:])
    assert off[: len(on)] == on and tok.decode(off[len(on) :]) == "<think>\n\n</think>\n\n"  # not the cached render of the other


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
        ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 8}),
        ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
    ],
)
def test_chat_template_kwargs_reach_the_render_from_every_api(path, body):
    tok = tokenizer_of("qwen3")
    gw = Gateway(ScriptedEngine(tok, [("A.", "<|im_end|>")]), tok, GatewayConfig(tool_parser="qwen3"))
    key = gw.open_session("e")
    reply = handled(gw, key, {**body, "chat_template_kwargs": {"enable_thinking": False}}, path, headers={"x-api-key": key})
    assert reply.status == 200, reply.body
    (inter,) = gw.sessions[key].interactions.values()
    assert tok.decode(inter.prompt_ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_harmony_markers_are_kept_for_the_parser_and_dropped_elsewhere():
    from areal.gateway.families import text_decoder

    tok = tokenizer_of("gpt_oss")
    ids = tok.encode("<|channel|>final<|message|>Hi<|return|>", add_special_tokens=False)
    assert text_decoder(tok, "gpt-oss", "gpt-oss")(ids) == "<|channel|>final<|message|>Hi"
    assert text_decoder(tok, None, None)(ids) == "finalHi"  # no harmony parser: every special token dropped
    assert P.parse_output(text_decoder(tok, "gpt-oss", "gpt-oss")(ids), None, "gpt-oss").content == "Hi"
