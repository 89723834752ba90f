"""ArealOpenAI: the design documents' workflow, as written, over the real embedded engine."""

from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI
from transformers import AutoTokenizer

from areal.engine.client import EngineClient
from areal.experimental.openai import ArealOpenAI


async def _agent(client: ArealOpenAI, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    first = await client.chat.completions.create(model="areal", messages=messages, max_tokens=16, temperature=0.0)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Are you sure?"}]
    stream = await client.chat.completions.create(model="areal", messages=messages, max_tokens=16, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    client.set_final_reward(2.0)
    return text


def test_workflow_as_written_in_the_design_documents(engine_url, model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    async def arun_episode(engine, data):
        clients = [ArealOpenAI(engine=engine, tokenizer=tokenizer, tool_call_parser="qwen25") for _ in range(2)]
        texts = await asyncio.gather(*[_agent(c, data["q"]) for c in clients])
        interactions_with_reward = {}
        for client in clients:
            client.apply_reward_discount(turn_discount=0.9)
            interactions_with_reward.update(client.export_interactions(style="individual"))
        return clients, texts, interactions_with_reward

    async def go():
        engine = EngineClient(engine_url)
        clients, texts, rows = await arun_episode(engine, {"q": "What is 3 + 4?"})
        assert isinstance(clients[0], AsyncOpenAI)
        assert len(rows) == 4
        for client, text in zip(clients, texts):
            first, second = client.interactions.values()
            assert text == tokenizer.decode(second.output_ids, skip_special_tokens=True)  # streamed = recorded
            assert second.parent_id == first.id  # incremental: the second prompt extends the first's tokens
            assert second.prompt_ids[: len(first.prompt_ids) + len(first.output_ids)] == first.prompt_ids + first.output_ids
            assert (first.reward, second.reward) == pytest.approx((1.8, 2.0))
            t = rows[second.id].to_tensor_dict()
            assert t["input_ids"].shape == t["loss_mask"].shape == (1, len(second.prompt_ids) + len(second.output_ids))
            assert t["loss_mask"].sum().item() == len(second.output_ids)
            concat = client.export_interactions(style="concat")
            assert list(concat) == [second.id] and sum(concat[second.id].loss_mask) == len(first.output_ids) + len(second.output_ids)
        await engine.close()

    asyncio.run(go())


def test_set_reward_by_id_and_responses_api(engine_url, model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    async def go():
        engine = EngineClient(engine_url)
        client = ArealOpenAI(engine=engine, tokenizer=tokenizer)
        out = await client.chat.completions.create(model="areal", messages=[{"role": "user", "content": "2+2?"}], max_tokens=8)
        client.set_reward(out.id, 0.25)
        assert client.get_interaction(out.id).reward == 0.25
        with pytest.raises(KeyError):
            client.set_reward("chatcmpl-unknown", 1.0)
        resp = await client.responses.create(model="areal", input="What is 1 + 1?", max_output_tokens=8)
        assert resp.status in ("completed", "incomplete") and len(client.interactions) == 2
        assert client.set_last_reward(1.0) == list(client.interactions)[-1]
        await engine.close()

    asyncio.run(go())
