"""Structured output on the stand-in for a user's own model: SmolLM2-135M-Instruct (49,152-token
vocabulary, a ChatML template without a tool branch, so ``gateway.tool_template=chatml-tools``)
served by the embedded engine, through a real Gateway with the openai SDK.

What is checked: json_schema replies (n > 1) validate; ``tool_choice`` "required" gives a call of
an offered function with valid arguments, on a vocabulary where ``<tool_call>`` is plain text (no
added token); ``responses.parse`` gives the pydantic model.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_structured_output import ADD, MAX_TOKENS, WORD, Pet, _check_pets_and_calls, _client, _pet_format


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from areal.embedded.pretrained import ensure_pretrained_model

    return ensure_pretrained_model()


@pytest.fixture(scope="module")
def smollm2(engine_url: str, model_dir: Path) -> Iterator:
    from gateway_harness import GatewayThread

    gw = GatewayThread(engine_url, model_dir, tool_template="chatml-tools")
    yield gw
    gw.stop()


def test_smollm2_replies_follow_the_schema_and_forced_calls_parse(smollm2):
    key = smollm2.open_session("smollm2")

    async def go():
        client = _client(smollm2, key)
        pets = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Describe a pet."}], response_format=_pet_format(), max_tokens=MAX_TOKENS, n=2
        )
        calls = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Define the word cat."}],
            tools=[WORD, ADD],
            tool_choice="required",
            max_tokens=MAX_TOKENS,
            n=2,
        )
        parsed = await client.responses.parse(model="m", input="Describe a dog.", text_format=Pet, max_output_tokens=MAX_TOKENS)
        await client.close()
        return pets, calls, parsed

    pets, calls, parsed = smollm2.run(go(), timeout=600)
    _check_pets_and_calls(pets, calls)
    assert isinstance(parsed.output_parsed, Pet)
