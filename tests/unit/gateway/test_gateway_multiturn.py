"""Exact multi-turn tokens: incremental prompts on the parent's sampled ids, == a full render when
nothing drifted (embedded tokenizer and the Qwen2.5 vocabulary), drift starts a new branch.

The engine here is a scripted stand-in with EngineClient's ``generate`` signature: it answers
with the canonical tokens of a chosen reply, because the equivalence needs known replies (tool
calls in the Qwen2.5 vocabulary) that no model on this machine can be made to sample.
"""

from __future__ import annotations

import pytest
from gateway_harness import CALC_TOOLS, assistant_call, post_chat
from qwen_tokenizers import build_qwen25_tokenizer
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.engine.client import GenerateResult
from areal.gateway import Gateway, GatewayConfig


class ScriptedEngine:
    """Answers each call with the next scripted reply text, tokenised canonically + <|im_end|>."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.prompts = tokenizer, list(replies), []
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, input_ids, sampling_params, return_logprob=True, rid=None, **kw) -> GenerateResult:
        self.prompts.append(list(input_ids))
        ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False) + [self.eot]
        return GenerateResult(
            output_ids=ids,
            output_logprobs=[-0.5] * len(ids),
            finish_reason="stop",
            weight_version="3",
            prompt_tokens=len(input_ids),
            completion_tokens=len(ids),
        )


@pytest.fixture(scope="module", params=["embedded", "qwen25"])
def tokenizer(request):
    if request.param == "embedded":
        return AutoTokenizer.from_pretrained(ensure_embedded_model())
    return build_qwen25_tokenizer()


def _full_render(tok, messages, tools) -> list[int]:
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def test_incremental_prompt_equals_full_render_over_a_tool_episode(tokenizer):
    # Arguments sampled in the parser's compact JSON: a full render writes them back that way, so
    # the two can be equal (with other spacing only the incremental ids keep the sampled tokens).
    replies = [
        'Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"expr":"3+4"}}\n</tool_call>',
        '<tool_call>\n{"name": "calc", "arguments": {"expr":"7*2"}}\n</tool_call>\n<tool_call>\n{"name": "calc", "arguments": {"expr":"1+1"}}\n</tool_call>',
        "The answer is \\boxed{14}.",
    ]
    engine = ScriptedEngine(tokenizer, replies)
    gw = Gateway(engine, tokenizer, GatewayConfig(context_length=8192))
    key = gw.open_session("ep")
    messages = [{"role": "system", "content": "You are a calculator."}, {"role": "user", "content": "What is (3+4)*2?"}]
    for turn in range(3):
        out = post_chat(gw, key, {"model": "m", "messages": messages, "tools": CALC_TOOLS, "max_tokens": 64})
        msg = out["choices"][0]["message"]
        # the SDK way of sending the reply back: the message as returned, plus the SDK's extras
        messages = messages + [{**msg, "refusal": None}]
        if turn == 0:
            assert out["choices"][0]["finish_reason"] == "tool_calls" and msg["content"] == "Let me compute."
        if turn == 1:
            assert [c["function"]["name"] for c in msg["tool_calls"]] == ["calc", "calc"]  # parallel calls
        for call in msg.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "14"})
        if not msg.get("tool_calls"):
            messages.append({"role": "user", "content": "Thanks. And 2+2?"})
    session = gw.sessions[key]
    inters = list(session.interactions.values())
    assert len(engine.prompts) == 3 and session.drift == 0 and session.index.incremental == 2
    for parent, child in zip(inters, inters[1:]):
        assert child.parent_id == parent.id
        assert child.prompt_ids[: len(parent.prompt_ids) + len(parent.output_ids)] == parent.prompt_ids + parent.output_ids
    # the third prompt, built incrementally, equals a full render of the same history
    history = [m for m in messages[:-1]]
    upto = max(i for i, m in enumerate(history) if m["role"] == "assistant")
    clean = [{k: v for k, v in m.items() if k != "refusal"} for m in history[:upto]]
    assert inters[2].prompt_ids == _full_render(tokenizer, clean, CALC_TOOLS)
    assert engine.prompts[2] == inters[2].prompt_ids  # what the engine was sent is what was recorded


def _follow_up(tokenizer, **second: object) -> tuple[ScriptedEngine, Gateway, str, list[dict]]:
    """A plain answer to "3+4?", then a follow-up question sent with ``second`` in its body:
    (engine, gateway, session key, the follow-up's messages)."""
    engine = ScriptedEngine(tokenizer, ["It is 7.", "It is 9."])
    gw = Gateway(engine, tokenizer, GatewayConfig())
    key = gw.open_session("ep")
    messages = [{"role": "user", "content": "3+4?"}]
    out = post_chat(gw, key, {"model": "m", "messages": messages})
    messages += [out["choices"][0]["message"], {"role": "user", "content": "and 4+5?"}]
    post_chat(gw, key, {"model": "m", "messages": messages, **second})
    return engine, gw, key, messages


def test_follow_up_after_plain_answer_equals_full_render(tokenizer):
    engine, gw, key, messages = _follow_up(tokenizer)
    first, second = gw.sessions[key].interactions.values()
    assert second.parent_id == first.id
    assert second.prompt_ids == _full_render(tokenizer, messages, None)
    assert engine.prompts[1] == second.prompt_ids


def test_rewritten_history_starts_a_new_branch_and_counts_drift(tokenizer):
    engine = ScriptedEngine(tokenizer, ["It is 7.", "It is 9.", "It is 10."])
    gw = Gateway(engine, tokenizer, GatewayConfig())
    key = gw.open_session("ep")
    base = [{"role": "user", "content": "3+4?"}]
    out = post_chat(gw, key, {"model": "m", "messages": base})
    reply = out["choices"][0]["message"]
    edited = {"role": "assistant", "content": "It is seven."}  # the agent rewrote the reply
    messages = base + [edited, {"role": "user", "content": "and 4+5?"}]
    post_chat(gw, key, {"model": "m", "messages": messages})
    session = gw.sessions[key]
    first, second = session.interactions.values()
    assert second.parent_id is None and session.drift == 1
    assert second.prompt_ids == _full_render(tokenizer, messages, None)
    assert gw.metrics()["drift"] == 1
    # a branch from the unedited reply still finds its parent: two children of one root
    post_chat(gw, key, {"model": "m", "messages": base + [reply, {"role": "user", "content": "and 5+5?"}]})
    third = list(session.interactions.values())[2]
    assert third.parent_id == first.id and session.drift == 1


def test_changed_tools_are_not_a_parent(tokenizer):
    _, gw, key, messages = _follow_up(tokenizer, tools=CALC_TOOLS)
    second = list(gw.sessions[key].interactions.values())[1]
    assert second.parent_id is None
    assert second.prompt_ids == _full_render(tokenizer, messages, CALC_TOOLS)


def test_one_pass_digests_equal_separate_digests():
    """The parent lookup hashes the history once; its digest of messages[:k] must be the one a
    separate encoding gives (else every follow-up would miss its parent and count as drift)."""
    from areal.gateway.render import _digests, prefix_digest

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = [{"role": "system", "content": "s"}]
    for t in range(12):
        messages += [
            {"role": "user", "content": f'q{t} ü \u2028 "x"'},
            {
                "role": "assistant",
                "content": None if t % 3 else f"a{t}",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}] if t % 3 else None,
            },
        ]
    for n in range(2, len(messages) + 1):
        for k in range(1, n):
            for tl in (None, tools):
                whole, head = _digests(tl, messages[:n], k)
                assert whole == prefix_digest(tl, messages[:n])
                assert head == prefix_digest(tl, messages[:k])


def test_direct_template_render_equals_apply_chat_template(tokenizer):
    """PromptBuilder renders with the compiled template directly; the text must be the wrapper's."""
    from areal.gateway.render import PromptBuilder

    builder = PromptBuilder(tokenizer, [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    assert builder.template.compiled  # the probe passed: the fast path is in use
    tools = [
        {
            "type": "function",
            "function": {"name": "calc", "description": "d", "parameters": {"type": "object", "properties": {"e": {"type": "string"}}}},
        }
    ]
    chat = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "2+2?", "name": None},
        assistant_call("", "think", "c1", "calc", '{"e": "2+2"}'),
        {"role": "tool", "content": "4", "tool_call_id": "c1"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "thanks"},
    ]
    for tl in (None, tools):
        for n in range(1, len(chat) + 1):
            for gen in (False, True):
                assert builder.render_text(chat[:n], tl, gen) == builder.template.wrapper_text(chat[:n], tl, gen)
