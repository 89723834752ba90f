"""Constrained decoding in the embedded engine (areal/engine/grammar.py), on the embedded model's
real tokenizer and llguidance (no stand-ins).

Unit: the constraint keys are validated as SGLang does (one at most, a string); what llguidance
refuses is a RequestError naming ``sampling_params.<key>``; a structural tag's literal text uses
the added tokens it holds; the mask keeps exactly the grammar's tokens and lets a stop token
through only once the grammar is complete; a complete grammar with no stop token ends the row;
the sampled logprobs are those of the masked, renormalised distribution. Engine: an in-process
``Engine`` decodes each constrained row of a mixed batch under its own constraint (JSON schema,
regex, structural tag), and a row cut by ``max_new_tokens`` finishes "length".
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.engine.batch import Engine, GenerationRequest
from areal.engine.grammar import TOP_LOGPROB_FLOOR, Grammars, advance, mask_logits, structural_tag_lark
from areal.engine.sampling import RequestError, SamplingParams, parse_sampling_params, sample_next

pytest.importorskip("llguidance")

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(ensure_embedded_model())


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return Grammars(tokenizer, len(tokenizer) + 1)  # the model's vocabulary is one past the tokenizer's


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_constraint_params_are_validated_as_sglang_does():
    assert parse_sampling_params({}, 3, 512).constraint is None
    assert parse_sampling_params({"regex": "a+", "json_schema": None}, 3, 512).constraint == ("regex", "a+")
    with pytest.raises(RequestError, match="only one of json_schema, regex"):
        parse_sampling_params({"json_schema": "{}", "regex": "a"}, 3, 512)
    with pytest.raises(RequestError, match="sampling_params.json_schema must be a non-empty string"):
        parse_sampling_params({"json_schema": {"type": "object"}}, 3, 512)


@pytest.mark.parametrize(
    "key, text, says",
    [
        ("json_schema", "{not json", "sampling_params.json_schema"),
        ("json_schema", '{"type": "strin"}', "strin"),
        ("regex", "(?=a)b", "look-around"),
        ("ebnf", "root ::= undefined", "undefined"),
        ("structural_tag", '{"type": "structural_tag", "format": {"type": "triggered_tags"}}', "triggered_tags"),
        ("structural_tag", '{"type": "structural_tag"}', "format"),
        ("structural_tag", '{"type": "structural_tag", "structures": [], "triggers": []}', "legacy"),
        (
            "structural_tag",
            '{"type": "structural_tag", "format": {"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}}',
            "qwen_xml",
        ),
    ],
)
def test_what_llguidance_refuses_is_a_request_error_naming_the_key(grammars, key, text, says):
    with pytest.raises(RequestError, match=f"sampling_params.{key}") as e:
        grammars.matcher(key, text)
    assert says in str(e.value)


def test_structural_tag_literals_use_the_added_tokens_they_hold(tokenizer, grammars):
    added = tokenizer.get_added_vocab()
    fmt = {
        "type": "sequence",
        "elements": [{"type": "const_string", "value": "<tool_call>\n"}, {"type": "json_schema", "json_schema": SCHEMA}],
    }
    lark = structural_tag_lark({"type": "structural_tag", "format": fmt}, added)
    assert f"<[{added['<tool_call>']}]>" in lark and '"\\n"' in lark
    tag = json.dumps({"type": "structural_tag", "format": fmt})
    text = '<tool_call>\n{"name": "ab", "n": 3}'
    assert grammars.matcher("structural_tag", tag).validate_tokens(_ids(tokenizer, text)) == len(_ids(tokenizer, text))
    spelled = _ids(tokenizer, "<tool") + _ids(tokenizer, "_call>")  # the same text, not as the added token
    assert grammars.matcher("structural_tag", tag).validate_tokens(spelled) == 0
    # the JSON layout: ", " and ": " separators, nothing else
    compact = _ids(tokenizer, '<tool_call>\n{"name":"ab","n":3}')
    assert grammars.matcher("structural_tag", tag).validate_tokens(compact) < len(compact)


def test_mask_keeps_the_grammar_and_lets_stops_through_only_when_complete(tokenizer, grammars):
    vocab = grammars.vocab_size
    digits = {i for i in range(vocab) if i < len(tokenizer) and tokenizer.decode([i]).isdigit()}
    stops = frozenset({0, 2})  # <|endoftext|> and <|im_end|> (the matcher's own EOS)
    m = grammars.matcher("regex", "[0-9]{2}")
    free = grammars.matcher("regex", "[0-9]{2}")
    eos = set(grammars.eos_ids)
    logits = torch.zeros(3, vocab)
    mask_logits(logits, [m, None, free], [stops, stops, frozenset()], grammars.eos_ids)
    allowed = {int(i) for i in torch.nonzero(logits[0] > float("-inf"))}
    assert allowed and allowed <= digits and not allowed & stops  # incomplete: no stop yet
    assert torch.all(logits[1] == 0)  # an unconstrained row is left whole
    assert eos and not eos & {int(i) for i in torch.nonzero(logits[2] > float("-inf"))}  # EOS only as a stop token
    two = _ids(tokenizer, "42")
    for tok in two:
        assert advance(m, tok, stops) is None
    logits = torch.zeros(1, vocab)
    mask_logits(logits, [m], [stops], grammars.eos_ids)
    assert {int(i) for i in torch.nonzero(logits[0] > float("-inf"))} == set(stops)  # complete: only a stop token
    # complete, and nothing to end the row with (ignore_eos, no stop ids): it ends there
    for tok in two[:-1]:
        assert advance(free, tok, frozenset()) is None
    assert advance(free, two[-1], frozenset()) == {"type": "stop", "matched": None}


def test_the_sampled_logprobs_are_the_masked_renormalised_distribution(tokenizer, grammars):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, grammars.vocab_size, generator=g) * 3
    raw = logits.clone()
    matchers = [grammars.matcher("json_schema", json.dumps(SCHEMA)), grammars.matcher("regex", "(yes|no)")]
    for tok in _ids(tokenizer, '{"name": "'):  # mid-string: many tokens allowed
        assert advance(matchers[0], tok, frozenset({2})) is None
    mask_logits(logits, matchers, [frozenset({2})] * 2, grammars.eos_ids)
    params = [SamplingParams(max_new_tokens=4, temperature=0.7)] * 2
    out = sample_next(logits, params, [0.3, 0.9], top_n=5)
    for row in range(2):
        allowed = logits[row] > float("-inf")
        expected = torch.log_softmax(raw[row][allowed] / 0.7, -1)
        assert bool(allowed[out.tokens[row]])
        lp = torch.log_softmax(logits[row] / 0.7, -1)
        assert out.logprobs[row] == pytest.approx(float(lp[out.tokens[row]]), abs=1e-6)
        assert math.fsum(expected.exp().tolist()) == pytest.approx(1.0, abs=1e-6)
        assert out.logprobs[row] > float(torch.log_softmax(raw[row] / 0.7, -1)[out.tokens[row]])  # renormalised: above the unmasked
    assert min(out.top_logprobs[1]) == float("-inf") and TOP_LOGPROB_FLOOR > float("-inf")  # few allowed: the engine floors these


@pytest.fixture(scope="module")
def engine():
    torch.set_num_threads(1)
    eng = Engine(str(ensure_embedded_model()), max_batch=8, weight_version="0")
    yield eng
    eng.shutdown()


def _request(engine, rid: str, prompt: list[int], **sp) -> GenerationRequest:
    params = parse_sampling_params({"max_new_tokens": 48, "stop_token_ids": [2], **sp}, len(prompt), engine.context_len)
    return GenerationRequest(rid=rid, input_ids=prompt, params=params, return_logprob=True, top_logprobs_num=2)


def test_an_engine_decodes_each_row_under_its_own_constraint(engine, tokenizer):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Describe a cat."}], add_generation_prompt=True, tokenize=False)
    prompt = _ids(tokenizer, prompt)
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": "<tool_call>\n",
            "content": {"type": "json_schema", "json_schema": SCHEMA},
            "end": "\n</tool_call>",
        },
    }
    rows = [_request(engine, f"json{i}", prompt, json_schema=json.dumps(SCHEMA), sampling_seed=i) for i in range(4)]
    rows += [_request(engine, "regex", prompt, regex="(yes|no), [0-9]{3}", sampling_seed=7)]
    rows += [_request(engine, "tag", prompt, structural_tag=json.dumps(tag), sampling_seed=8)]
    rows += [_request(engine, "free", prompt, sampling_seed=9)]
    rows += [_request(engine, "short", prompt, json_schema=json.dumps(SCHEMA), max_new_tokens=2)]
    engine.grammars.attach(rows)
    for r in [engine.submit(r).result(timeout=120) for r in rows]:
        text = tokenizer.decode(r.output_ids, skip_special_tokens=True)
        if r.rid == "short":
            assert r.finish_reason == {"type": "length", "length": 2} and len(r.output_ids) == 2
            continue
        if r.rid == "free":
            continue
        assert r.finish_reason == {"type": "stop", "matched": 2}, (r.rid, text)
        assert r.logprobs[-1] == 0.0 and all(lp >= TOP_LOGPROB_FLOOR for pos in r.top_logprobs for lp, _ in pos)
        if r.rid.startswith("json"):
            value = json.loads(text)
            assert set(value) == {"name", "n"} and len(value["name"]) <= 6 and value["n"] in range(10)
        elif r.rid == "regex":
            assert re.fullmatch(r"(yes|no), [0-9]{3}", text)
        else:
            assert r.output_ids[0] == tokenizer.convert_tokens_to_ids("<tool_call>")
            assert tokenizer.decode(r.output_ids, skip_special_tokens=False).endswith("\n</tool_call><|im_end|>")
            assert set(json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))) == {"name", "n"}
