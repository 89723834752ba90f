"""Training episodes are sampled at ``rollout.temperature`` whatever the agent asks: the trainer
scores every sampled token at that temperature, so an agent that asks for another one (here 0.3)
must not make the behaviour logprobs the trainer compares against those of another distribution."""

from __future__ import annotations

import pytest
from run_checks import one_step_run, read_jsonl, run_ok

AGENT = """
from openai import AsyncOpenAI

async def run(data, **kw):
    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["question"]}], max_tokens=16, temperature=0.3)
    return float(len(data["question"]) % 2)
"""


@pytest.mark.e2e
def test_an_agents_own_temperature_does_not_reach_its_training_samples(tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    run_dir = tmp_path / "run"
    run_ok(one_step_run(run_dir, f"rollout.agent={tmp_path / 'agent.py'}:run", "model.path=embedded", "rollout.temperature=1.0"))
    (step,) = read_jsonl(run_dir / "trainer_metrics.jsonl")
    # sampled at 0.3 and scored at 1.0, the two logprobs of a token would differ by ~1 nat
    assert step["logprob_max_diff"] < 1e-3, step
