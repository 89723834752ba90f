"""The Completions front-end (areal/gateway/completions.py): a prompt the client wrote, no template.

Requests go through the real openai SDK (``AsyncOpenAI.completions.create``) to the gateway core in
process (``ArealOpenAI``'s transport), on the embedded tokenizer and the scripted engine stand-in,
which samples the canonical ids of scripted replies. Checked: what is recorded (the prompt's ids,
the sampled ids, the parent of a prompt that extends an earlier call), what is answered (text cut
at a stop string, ``token_ids``, logprobs, usage; OpenAI's ``CreateCompletionResponse`` and the
SDK's ``Completion`` type), and each refusal naming its parameter.
"""

from __future__ import annotations

import asyncio

import openai
import openapi_specs
import pytest
from scripted_engine import ScriptedEngine
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.experimental.openai import ArealOpenAI
from areal.gateway.core import GatewayConfig

PROMPT = "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_embedded_model())


def _run(tok, replies, go, **config):
    engine = ScriptedEngine(tok, replies)
    client = ArealOpenAI(engine=engine, tokenizer=tok, gateway_config=GatewayConfig(context_length=512, **config))
    return asyncio.run(go(client)), client, engine


def test_a_text_prompt_is_recorded_as_its_ids_and_the_reply_holds_the_sampled_ids(tok):
    async def go(client):
        return await client.completions.create(model="m", prompt=PROMPT, max_tokens=16)

    reply, client, engine = _run(tok, [("42 it is.", "<|im_end|>")], go)
    (inter,) = client.interactions.values()
    assert engine.prompts == [tok.encode(PROMPT)] and inter.prompt_ids == tok.encode(PROMPT)  # no template around it
    (choice,) = reply.choices
    assert choice.text == "42 it is." and choice.finish_reason == "stop"
    assert (
        choice.token_ids
        == inter.output_ids
        == tok.encode("42 it is.", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    )
    assert reply.id == inter.id and reply.object == "text_completion" and reply.model == "m"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(inter.prompt_ids), len(inter.output_ids))
    assert inter.output_logprobs == [-0.5] * len(inter.output_ids) and inter.max_tokens == 16
    assert engine.params[0]["max_new_tokens"] == 16


def test_a_prompt_extending_a_call_is_its_child_and_the_chain_exports_as_one_row(tok):
    async def go(client):
        first = await client.completions.create(model="m", prompt=PROMPT, max_tokens=8)
        follow = tok.encode(PROMPT) + first.choices[0].token_ids + tok.encode("\n<|im_start|>user\nAgain?<|im_end|>\n")
        second = await client.completions.create(model="m", prompt=follow, max_tokens=8)  # ids, as OpenAI's API allows
        return first, second, follow

    (first, second, follow), client, _ = _run(tok, [("42", "<|im_end|>"), ("Still 42", "<|im_end|>")], go)
    a, b = client.interactions.values()
    assert b.parent_id == a.id and b.prompt_ids == follow
    (row,) = client.export_interactions("concat").values()
    assert row.input_ids == b.prompt_ids + b.output_ids
    assert sum(row.loss_mask) == len(a.output_ids) + len(b.output_ids)  # both replies trained, the user's turn not


def test_stop_strings_cut_the_text_and_the_recorded_ids_and_logprobs_list_each_token(tok):
    async def go(client):
        return await client.completions.create(model="m", prompt=PROMPT, max_tokens=16, stop=["STOP"], n=2, logprobs=2)

    reply, client, engine = _run(tok, [("6 * 7 = 42 STOP more", "<|im_end|>"), ("42", "<|im_end|>")], go)
    cut, whole = reply.choices
    assert (cut.text, cut.finish_reason) == ("6 * 7 = 42 ", "stop") and whole.text == "42"
    first = client.interactions[reply.id]
    assert tok.decode(first.output_ids, skip_special_tokens=True).startswith("6 * 7 = 42 STOP")  # kept through the stop
    assert "more" not in tok.decode(first.output_ids) and cut.token_ids == first.output_ids
    assert cut.logprobs.tokens and len(cut.logprobs.tokens) == len(cut.logprobs.token_logprobs) == len(cut.logprobs.text_offset)
    assert engine.params[0]["stop"] == ["STOP"]


def test_the_reply_conforms_to_openais_schema_and_the_sdks_type(tok):
    async def go(client):
        return await client.completions.with_raw_response.create(model="m", prompt=PROMPT, max_tokens=8, logprobs=0)

    raw, client, _ = _run(tok, [("42", "<|im_end|>")], go)
    body = raw.http_response.json()
    errors = [e.message for e in openapi_specs.validator("openai", "CreateCompletionResponse").iter_errors(body)]
    assert errors == []
    completion = openai.types.Completion.model_validate(body, strict=True)
    (inter,) = client.interactions.values()
    assert completion.choices[0].text == "42" and body["choices"][0]["token_ids"] == inter.output_ids
    assert completion.choices[0].logprobs.top_logprobs == [{}] * len(completion.choices[0].logprobs.tokens)  # logprobs=0: none


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"stream": True}, "stream"),
        ({"echo": True}, "echo"),
        ({"suffix": "x"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"logprobs": 9}, "logprobs"),
        ({"extra_body": {"tools": []}}, "tools"),
        ({"prompt": [PROMPT, PROMPT]}, "prompt"),
        ({"prompt": [1, 2, 10**9]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it_and_samples_nothing(tok, kwargs, param):
    async def go(client):
        with pytest.raises(openai.BadRequestError) as e:
            await client.completions.create(**{"model": "m", "prompt": PROMPT, "max_tokens": 8, **kwargs})
        return e.value

    error, client, engine = _run(tok, [], go)
    assert error.body["param"] == param and not engine.prompts and not client.interactions


def test_a_prompt_beyond_the_context_is_refused_as_context_length_exceeded(tok):
    async def go(client):
        with pytest.raises(openai.BadRequestError) as e:
            await client.completions.create(model="m", prompt=list(range(10, 500)), max_tokens=100)
        return e.value

    error, _, engine = _run(tok, [], go)
    assert error.body["code"] == "context_length_exceeded" and not engine.prompts
