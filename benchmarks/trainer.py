"""Trainer throughput: trained tokens/s of the real train_step (packed rows, chunked lm head,
GRPO) against a plain padded HF loop (right-padded (B, T) batch with an attention mask, full
log_softmax over the vocabulary), same model (the embedded one), same trajectories, same run.

Tokens counted are the tokens of the rows (prompt + sampled), not padding; both loops do one
forward, one backward and one AdamW step per batch. Rows have uneven lengths, as agent turns do.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from areal.protocol import TokenRow, Trajectory
from areal.trainer.loss import group_advantages


def synthetic_trajectories(vocab: int, rows: int, rng: np.random.Generator, lo: int = 48, hi: int = 384) -> list[Trajectory]:
    """``rows`` single-row episodes in groups of 8, of lengths in [lo, hi): a prompt, then sampled
    tokens (behaviour logprob -2, version 0); rewards differ within each group."""
    out = []
    for i in range(rows):
        n = int(rng.integers(lo, hi))
        prompt = int(rng.integers(min(16, n // 4), n // 2))
        mask = np.r_[np.zeros(prompt), np.ones(n - prompt)].astype(np.uint8)
        row = TokenRow(
            rng.integers(0, vocab, n).astype(np.int32),
            mask,
            (-2.0 * mask).astype(np.float32),
            np.where(mask == 1, 0, -1).astype(np.int32),
            0.0,
        )
        out.append(
            Trajectory.from_rows(episode_id=str(i), group_id=f"g{i // 8}", group_size=8, reward=float(i % 3 == 0), status="ok", rows=[row])
        )
    return out


def _padded_step(model: torch.nn.Module, opt: torch.optim.Optimizer, trajs: list[Trajectory]) -> None:
    adv = group_advantages(torch.tensor([t.reward for t in trajs]), [t.group_id for t in trajs])
    rows = [t.rows()[0] for t in trajs]
    T = max(len(r.input_ids) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    att = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T)
    beh = torch.zeros(len(rows), T)
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        ids[i, :n] = torch.from_numpy(r.input_ids.astype(np.int64))
        att[i, :n] = 1
        mask[i, :n] = torch.from_numpy(r.loss_mask.astype(np.float32))
        beh[i, :n] = torch.from_numpy(r.logprobs.copy())
    opt.zero_grad(set_to_none=True)
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits[:, :-1].float(), -1)  # (B, T-1, V)
    lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ratio = torch.exp(lp - beh[:, 1:])
    a = adv[:, None]
    per_token = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)
    ((per_token * mask[:, 1:]).sum() / mask[:, 1:].sum()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def main(quick: bool) -> list[dict]:
    from transformers import AutoModelForCausalLM

    from areal.embedded import ensure_embedded_model
    from areal.trainer.config import TrainerConfig
    from areal.trainer.packing import PolicyScorer
    from areal.trainer.step import train_step

    torch.set_num_threads(1)
    path = ensure_embedded_model()
    rng = np.random.default_rng(0)
    steps = 2 if quick else 6
    batches = [synthetic_trajectories(1 << 30, 32, rng) for _ in range(steps + 1)]  # vocab clipped below
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    batches = [[_clip(t, vocab) for t in b] for b in batches]  # token ids must be < vocab
    tokens = [sum(t.num_tokens for t in b) for b in batches]
    config = TrainerConfig(steps=steps, micro_batch_tokens=1024)

    def timed(fn) -> float:
        fn(batches[0])  # warm-up
        t0 = time.perf_counter()
        for b in batches[1:]:
            fn(b)
        return sum(tokens[1:]) / (time.perf_counter() - t0)

    ours_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    scorer = PolicyScorer(ours_model, 1.0)
    opt = torch.optim.AdamW(ours_model.parameters(), lr=1e-5)
    ours = timed(lambda b: train_step(scorer, opt, b, config, version=0))
    base_opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    padded = timed(lambda b: _padded_step(model, base_opt, b))
    return [
        {
            "benchmark": "trainer",
            "metric": "train tokens/s (packed, chunked head)",
            "value": ours,
            "unit": "tok/s",
            "baseline": "padded HF loop",
            "baseline_value": padded,
        }
    ]


def _clip(t: Trajectory, vocab: int) -> Trajectory:
    r = t.rows()[0]
    row = TokenRow((r.input_ids % vocab).astype(np.int32), r.loss_mask.copy(), r.logprobs.copy(), r.versions.copy(), 0.0)
    return Trajectory.from_rows(
        episode_id=t.episode_id, group_id=t.group_id, group_size=t.group_size, reward=t.reward, status="ok", rows=[row]
    )
