"""The fast paths of ``areal.gateway.render`` give the same answers as the slow ones.

- A 200-turn episode (plain answers, tool calls, parallel tool results), each prompt built on the
  parent's recorded ids, equals ``tokenizer.encode(apply_chat_template(...))`` of the whole history
  token for token at every turn, with the embedded tokenizer and the Qwen2.5 vocabulary; a
  rewritten history mid-episode starts a new root and the turns after it are equal again.
- The incremental history hash (``HistoryHash`` checkpoints) gives the digests a fresh hash gives,
  whatever the next history does: extend, rewrite, shrink, change tools, cut before the checkpoint.
- The template overlay that answers ``message.role`` and ``loop.first`` without the sandbox's
  exception path renders what transformers' own compiled template renders, including names that
  are dict methods, keys that start with an underscore, undefined keys and loop attributes.
- ``PieceEncoder`` (cached pieces and words, the split pattern run by ``regex``) gives the
  tokenizer's own ids for any text: ASCII, control characters, Unicode, added tokens and their
  fragments; it refuses pipelines it does not reproduce, and the builder then uses the tokenizer.
- A reply whose content the template rewrites (reasoning dropped) keeps the sampled tokens: the
  child prompt is the parent's + sampled ids + what the template writes after the turn's end.

The "model" here samples the canonical tokens of each reply (what the template writes for it),
because equality with a full render is only defined for those.
"""

from __future__ import annotations

import json

import pytest
from gateway_harness import CALC_TOOLS
from hypothesis import given, settings
from hypothesis import strategies as st
from qwen_tokenizers import build_qwen25_tokenizer
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.gateway.pieces import PieceEncoder
from areal.gateway.render import PromptBuilder, PromptIndex, _hash_history, prefix_digest
from areal.gateway.template import compile_dict_first
from areal.gateway.tree import Interaction


@pytest.fixture(scope="module", params=["embedded", "qwen25"])
def tokenizer(request):
    if request.param == "embedded":
        return AutoTokenizer.from_pretrained(ensure_embedded_model())
    return build_qwen25_tokenizer()


def _reference(tok, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """The full render, through transformers' public API only."""
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def _sampled_ids(tok, first: dict, reply: dict, tools: list[dict] | None) -> list[int]:
    """The canonical tokens of ``reply`` up to and including the end of turn, as a model emits them."""
    prompt = tok.apply_chat_template([first], tools=tools, tokenize=False, add_generation_prompt=True)
    whole = tok.apply_chat_template([first, reply], tools=tools, tokenize=False)
    assert whole.startswith(prompt)
    end = "<|im_end|>"
    text = whole[len(prompt) : whole.rindex(end)]
    return tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids(end)]


def _reply(t: int) -> dict:
    """Turn ``t``'s assistant message: a tool call every third turn (two calls every ninth), else text."""
    if t % 3 == 1:
        calls = [
            {
                "id": f"c{t}-{i}",
                "type": "function",
                "function": {"name": "calc", "arguments": json.dumps({"expr": f"{t}*{i + 7}"}, separators=(",", ":"))},
            }
            for i in range(2 if t % 9 == 1 else 1)
        ]
        return {"role": "assistant", "content": None, "tool_calls": calls}
    return {"role": "assistant", "content": f"Step {t} gives {t * 7 + 3}, so the answer is \\boxed{{{t * 7 + 3}}}."}


def _after(t: int, reply: dict) -> list[dict]:
    """What the agent appends after the reply: one tool result per call, or the next question."""
    if reply.get("tool_calls"):
        return [{"role": "tool", "tool_call_id": c["id"], "content": str(t * 7)} for c in reply["tool_calls"]]
    return [{"role": "user", "content": f"Step {t + 1}: what is {t + 1} * 7 plus 3?"}]


def _record(builder: PromptBuilder, index: PromptIndex, interactions: dict, prompt, t: int, output_ids: list[int], reply: dict) -> None:
    inter = Interaction(
        id=f"i{t}",
        prompt_ids=prompt.ids,
        output_ids=output_ids,
        output_logprobs=[0.0] * len(output_ids),
        version=0,
        finish_reason="stop",
        created=0.0,
        parent_id=prompt.parent_id,
    )
    interactions[inter.id] = inter
    builder.record(index, prompt, inter, reply)


@pytest.mark.timeout(120)
def test_200_turn_episode_incremental_equals_full_render_every_turn(tokenizer):
    builder = PromptBuilder(tokenizer, [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    assert builder.template.compiled  # the fast template path is the one under test
    index, interactions = PromptIndex(), {}
    first = {"role": "system", "content": "You are a calculator."}
    messages = [first, {"role": "user", "content": "Step 0: what is 0 * 7 plus 3?"}]
    turns, rewrite_at = 200, 120
    for t in range(turns):
        if t == rewrite_at:  # the agent edits an old reply: no parent matches, a full render, a new root
            old = next(i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("content"))
            messages[old] = {**messages[old], "content": "I rewrote this answer."}
        prompt = builder.build(index, interactions, messages, CALC_TOOLS)
        assert prompt.ids == _reference(tokenizer, messages, CALC_TOOLS), f"turn {t}"
        assert prompt.prefix_digest == prefix_digest(CALC_TOOLS, messages), f"turn {t}"
        if t in (0, rewrite_at):
            assert prompt.parent_id is None
        else:
            parent = interactions[f"i{t - 1}"]
            assert prompt.parent_id == parent.id
            assert prompt.ids[: len(parent.prompt_ids) + len(parent.output_ids)] == parent.prompt_ids + parent.output_ids
        reply = _reply(t)
        _record(builder, index, interactions, prompt, t, _sampled_ids(tokenizer, first, reply, CALC_TOOLS), reply)
        messages = messages + [reply] + _after(t, reply)
    assert index.incremental == turns - 2 and index.full == 2 and index.drift == 1


def test_incremental_hash_equals_fresh_hash_whatever_the_history_does():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    msgs = [{"role": "system", "content": "s"}]
    for t in range(6):
        msgs += [{"role": "user", "content": f'q{t} ü "x"'}, {"role": "assistant", "content": f"a{t}"}]
    calls = [  # (tools, messages, k): each continues from the checkpoint the previous call left
        (None, [], None),
        (None, msgs[:1], None),
        (None, msgs[:2], None),
        (None, msgs[:4], 2),
        (None, msgs[:6], 4),
        (None, msgs[:6], 2),  # the same history again, cut before the checkpoint
        (tools, msgs[:8], 6),  # other tools
        (tools, msgs[:4] + [{"role": "assistant", "content": "edited"}] + msgs[5:10], 8),  # a rewrite
        (tools, msgs[:3], 2),  # shorter than the checkpoint
        (tools, msgs, len(msgs) - 1),
        (tools, msgs + [{"role": "user", "content": "more"}], len(msgs) - 1),
        (None, msgs + [{"role": "user", "content": "more"}], 1),
    ]
    last = None
    for n, (tl, messages, k) in enumerate(calls):
        whole, head, last = _hash_history(tl, messages, k, last)
        assert whole == prefix_digest(tl, messages), n
        assert head == (prefix_digest(tl, messages[:k]) if k else None), n


def test_dict_first_template_renders_what_the_sandbox_renders():
    from transformers.utils.chat_template_utils import _compile_jinja_template

    source = (
        "{%- for m in messages %}"
        "[{{ loop.index0 }}/{{ loop.length }} {{ loop.first }} {{ loop.last }} {{ loop.cycle('a', 'b') }}"
        " {{ m.role }} {{ m.content or '' }} {{ m.missing is defined }} {{ m.get('role') }} {{ m.keys() | list | length }}"
        " {{ m.items is defined }} {{ m._private if m._private is defined else '-' }} {{ m.tool_calls | length if m.tool_calls else 0 }}"
        " {{ loop.previtem.role if loop.previtem is defined else '^' }} {{ loop._nope is defined }}]"
        "{%- endfor %}"
        "{{ messages[0].__class__ is defined }} {{ (messages | first).role }}"
    )
    stock = _compile_jinja_template(source)
    fast = compile_dict_first(stock.environment, source)
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u", "_private": "p", "items": 1},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]},
    ]
    expected = stock.render(messages=messages)
    assert fast.render(messages=messages) == expected
    assert "1/3 False False b user u False user 4" in expected  # the template exercised what it claims to


_TEXT_PARTS = st.one_of(
    st.text(st.characters(max_codepoint=127), max_size=24),  # every ASCII character, controls included
    st.text(st.sampled_from(list(" \t\r\n'sSlLtTdDmMvVeErR09aZ.,!?{}\"*")), max_size=24),  # contractions, runs of space
    st.text(max_size=12),  # any Unicode: those pieces go to the tokenizer whole
    st.sampled_from(["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|im_end", "<tool_", "\u00e9", "e\u0301"]),
)


@pytest.mark.parametrize("which", ["embedded", "qwen25"])
def test_piece_encoder_gives_the_tokenizers_ids(which):
    tok = AutoTokenizer.from_pretrained(ensure_embedded_model()) if which == "embedded" else build_qwen25_tokenizer()
    backend = tok.backend_tokenizer
    encoder = PieceEncoder.build(backend)
    assert encoder is not None  # both vocabularies use the pipeline it reproduces

    @settings(max_examples=300, deadline=None)
    @given(parts=st.lists(_TEXT_PARTS, max_size=8))
    def check(parts: list[str]) -> None:
        text = "".join(parts)
        assert encoder.encode(text) == backend.encode(text, add_special_tokens=False).ids, repr(text)
        assert encoder.encode(text) == backend.encode(text, add_special_tokens=False).ids, repr(text)  # from the caches

    check()


def test_piece_encoder_refuses_other_pipelines_and_the_builder_falls_back():
    tok = AutoTokenizer.from_pretrained(ensure_embedded_model())
    config = json.loads(tok.backend_tokenizer.to_str())
    stripped = json.loads(json.dumps(config))
    stripped["added_tokens"][2]["rstrip"] = True  # "<|im_end|>" would swallow the "\n" after it
    other_split = json.loads(json.dumps(config))
    other_split["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
    lowercase = json.loads(json.dumps(config))
    lowercase["normalizer"] = {"type": "Lowercase"}
    for variant in (stripped, other_split, lowercase):
        assert PieceEncoder.build(Tokenizer.from_str(json.dumps(variant))) is None
    # the builder of a tokenizer without the fast encoder still builds exact prompts
    tok.backend_tokenizer.encode_special_tokens = True  # one more thing the encoder does not reproduce
    try:
        builder = PromptBuilder(tok, [tok.convert_tokens_to_ids("<|im_end|>")])
    finally:
        tok.backend_tokenizer.encode_special_tokens = False
    assert builder._pieces is None
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 3 + 4?"}]
    assert builder.build(PromptIndex(), {}, messages, CALC_TOOLS).ids == _reference(tok, messages, CALC_TOOLS)


@pytest.mark.parametrize("ended", [True, False])
def test_rewritten_reply_content_keeps_the_sampled_tokens(tokenizer, ended):
    """The model sampled reasoning that the agent's message drops; the template writes only the
    content, so the sampled text is not a prefix of the turn: the child still extends the sampled
    ids exactly, then what the template writes after the turn's end (the end itself when the model
    was cut before sampling it)."""
    builder = PromptBuilder(tokenizer, [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    index, interactions = PromptIndex(), {}
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 3 + 4?"}]
    prompt = builder.build(index, interactions, messages, None)
    sampled = tokenizer.encode("<think>3 plus 4</think>It is 7.", add_special_tokens=False)
    if ended:
        sampled.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    reply = {"role": "assistant", "content": "It is 7."}
    _record(builder, index, interactions, prompt, 0, sampled, reply)
    follow = messages + [reply, {"role": "user", "content": "And 4 + 5?"}]
    child = builder.build(index, interactions, follow, None)
    after = ("" if ended else "<|im_end|>") + "\n<|im_start|>user\nAnd 4 + 5?<|im_end|>\n<|im_start|>assistant\n"
    assert child.parent_id == "i0" and index.drift == 0
    assert child.ids == prompt.ids + sampled + tokenizer.encode(after, add_special_tokens=False)


def test_kept_tools_render_in_their_own_key_order(tokenizer):
    """Tools are kept as template data between turns; the same tools with keys in another order
    are other template data (``tojson`` writes keys in order), so each renders as the wrapper does."""
    builder = PromptBuilder(tokenizer, [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    fn = CALC_TOOLS[0]["function"]
    reordered = [{"function": {"parameters": fn["parameters"], "name": fn["name"], "description": fn["description"]}, "type": "function"}]
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    kept = len(builder.template.tools_cache)  # the construction probe's tools
    texts = [builder.render_text(chat, tools, True) for tools in (CALC_TOOLS, reordered, CALC_TOOLS, reordered)]
    assert texts == [builder.template.wrapper_text(chat, tools, True) for tools in (CALC_TOOLS, reordered, CALC_TOOLS, reordered)]
    assert texts[0] != texts[1] and len(builder.template.tools_cache) == kept + 2
