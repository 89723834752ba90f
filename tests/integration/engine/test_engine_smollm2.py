"""The embedded engine serving SmolLM2-135M-Instruct (``model.path=smollm2-135m-instruct``), and
the trainer's logprobs of what it sampled.

The engine is a real subprocess over HTTP on the materialized directory (areal/embedded/pretrained.py;
a cache hit after the first materialization); the trainer side is what a trainer rank runs: the
model loaded as ``areal/trainer/rank.py`` loads it, the sampled rows packed by ``pack_rows`` and
scored by ``PolicyScorer`` (backbone, then the chunked lm head). Mechanics, not learning: the
engine's logprob of each sampled token must equal the trainer's, to float noise in fp32, and
within bf16's rounding when the trainer computes in bf16 (the engine always serves fp32).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from http_json import post
from transformers import AutoModelForCausalLM, AutoTokenizer

from areal.embedded.pretrained import ensure_pretrained_model
from areal.engine.launch import launch_embedded_engine
from areal.protocol import TokenRow, Trajectory
from areal.trainer.packing import PolicyScorer, pack_rows

TEMPERATURE = 1.0  # rollout.temperature's default: the engine samples, the trainer scores, at this
CONVERSATIONS = [
    [{"role": "user", "content": "What is 17 + 25? End with 'Answer: <n>'."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime number above 50."}],
]
# (max, mean) |trainer - engine| over the sampled tokens. fp32: float noise, the lean forward against
# HF's over 30 layers (seen: max 2e-5); bf16: a bf16 trainer against the fp32 engine, bf16 keeping 8
# bits of mantissa through 30 layers (seen: max 0.11, mean 0.018).
FP32_TOL = (1e-3, 1e-4)
BF16_TOL = (0.5, 0.05)


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return ensure_pretrained_model()


@pytest.fixture(scope="module")
def engine(smollm2_dir: Path) -> Iterator:
    proc = launch_embedded_engine(str(smollm2_dir), threads=1, timeout_s=300)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def sampled(engine, smollm2_dir: Path) -> list[TokenRow]:
    """Each conversation's prompt and the engine's sampled reply as one trajectory row, the
    engine's logprobs on the sampled tokens (loss mask 1), both conversations in one batch."""
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    prompts = [tok.apply_chat_template(c, add_generation_prompt=True, return_dict=False) for c in CONVERSATIONS]
    sp = {"temperature": TEMPERATURE, "max_new_tokens": 24, "ignore_eos": True, "sampling_seed": 7}
    status, outs = post(f"{engine.url}/generate", {"input_ids": prompts, "sampling_params": sp, "return_logprob": True})
    assert status == 200, outs
    rows = []
    for prompt, out in zip(prompts, outs):
        entries = out["meta_info"]["output_token_logprobs"]
        assert len(out["output_ids"]) == 24 and [e[1] for e in entries] == out["output_ids"]
        ids = np.array(prompt + out["output_ids"], np.int32)
        mask = np.r_[np.zeros(len(prompt)), np.ones(len(entries))].astype(np.uint8)
        logprobs = np.r_[np.zeros(len(prompt)), [e[0] for e in entries]].astype(np.float32)
        rows.append(TokenRow(ids, mask, logprobs, np.where(mask == 1, 0, -1).astype(np.int32), 0.0))
    return rows


def _trainer_logprobs(smollm2_dir: Path, rows: list[TokenRow], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(trainer logprobs, engine logprobs) of every sampled token: the trainer's load, packing and
    scorer; bf16 casts the parameters as FSDP's MixedPrecisionPolicy(param_dtype=bf16) does."""
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval().to(dtype)
    trajs = [
        Trajectory.from_rows(episode_id=str(i), group_id="g", group_size=len(rows), reward=0.0, status="ok", rows=[row])
        for i, row in enumerate(rows)
    ]
    (mb,) = pack_rows(trajs, torch.zeros(len(trajs)), micro_batch_tokens=4096)
    with torch.no_grad():
        logprobs, _ = PolicyScorer(model, TEMPERATURE)(mb)
    return logprobs, mb.behaviour


def test_engine_serves_smollm2_on_the_lean_forward(engine, sampled: list[TokenRow]) -> None:
    assert "(forward: lean, cpu, float32)" in Path(engine.log_path).read_text()
    for row in sampled:
        lp = row.logprobs[row.loss_mask == 1]
        assert np.isfinite(lp).all() and (lp <= 0).all() and (lp < -1e-3).any()  # sampled, not all-certain


@pytest.mark.parametrize("dtype, tol", [(torch.float32, FP32_TOL), (torch.bfloat16, BF16_TOL)], ids=["fp32", "bf16"])
def test_trainer_logprobs_agree_with_the_engines(
    smollm2_dir: Path, sampled: list[TokenRow], dtype: torch.dtype, tol: tuple[float, float]
) -> None:
    trainer, engine = _trainer_logprobs(smollm2_dir, sampled, dtype)
    assert trainer.shape == engine.shape == (sum(int(r.loss_mask.sum()) for r in sampled),)
    diff = (trainer - engine).abs()
    print(f"{dtype}: trainer vs engine logprobs over {diff.numel()} tokens: max |diff| {diff.max():.3g}, mean {diff.mean():.3g}")
    assert diff.max().item() < tol[0] and diff.mean().item() < tol[1]
