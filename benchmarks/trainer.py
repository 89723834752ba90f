"""Trainer throughput: trained tokens/s of the real train_step (packed rows, chunked lm head,
GRPO) against a plain padded HF loop (right-padded (B, T) batches with an attention mask, full
log_softmax over the vocabulary), same model, same trajectories, same run.

Tokens counted are the tokens of the rows (prompt + sampled), not padding; both loops do one
optimizer step per batch: forwards and backwards over the batch's micro-batches, the token-mean
GRPO loss (clip 0.2 against the behaviour logprobs, group-normalised advantages), grad-norm clip
1.0, AdamW. Rows have uneven lengths, as agent turns do.

Two models:

- ``embedded`` (the default, ``main(quick)``): the embedded tiny model, both loops in this
  process, 32 rows of 48-384 tokens per step, the padded loop in one (32, T) batch.
- ``smollm2`` (``python -m benchmarks.trainer --model smollm2 [--quick] [--jobs N]``):
  SmolLM2-135M-Instruct (fp32, ``areal.embedded.pretrained``), full fine-tuning and LoRA
  (``trainer.lora``: rank 8, alpha 16, every linear layer of the decoder, ``areal/trainer/lora.py``;
  the padded loop gets the same peft adapters). Rows as an agent's turns: a prompt of 100-300
  tokens, then 20-200 sampled ones, in groups of 8; a step is 8 turns (one group), 1 timed step in
  quick mode and 2 in full mode, after a warm-up step of 2 turns. Ours packs
  ``micro_batch_tokens`` = 2048 tokens per forward; the padded loop runs micro-batches of 4 rows
  padded to their longest, accumulating gradients (HF Trainer's ``per_device_train_batch_size`` 4
  with gradient accumulation). For full fine-tuning ours also runs with
  ``trainer.varlen_attention=false`` (one block-diagonally masked SDPA per micro-batch, the trainer
  before row-by-row attention), and the padded loop runs again on oneDNN's linears
  (``areal.kernels.use_onednn_linears``, which ours uses on the CPU), so that the packing's share
  of the ratio is apart from the kernels'. Each (variant, loop) runs in a subprocess of its own, so that its
  peak RSS (``ru_maxrss``: weights, gradients, AdamW state, activations, logits) is its own;
  ``--jobs`` of them at a time. Figures: trained tokens per wall second and per CPU second of the
  child (the CPU figure holds on a shared machine, the wall figure does not), peak RSS, with the
  load average before and after.

One torch thread everywhere. Not covered: GPUs (the packed path's varlen attention there is
flash-attention's), bf16, gradient checkpointing, the reference model of a KL term.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from areal.protocol import TokenRow, Trajectory
from areal.trainer.loss import group_advantages

ROOT = Path(__file__).resolve().parents[1]
LORA_RANK, LORA_ALPHA = 8, 16.0
SMOL_ROWS_PER_MICRO = 4  # the padded loop's rows per forward
SMOL_MICRO_BATCH_TOKENS = 2048  # ours: tokens packed per forward


def synthetic_trajectories(vocab: int, rows: int, rng: np.random.Generator, lo: int = 48, hi: int = 384) -> list[Trajectory]:
    """``rows`` single-row episodes in groups of 8, of lengths in [lo, hi): a prompt, then sampled
    tokens (behaviour logprob -2, version 0); rewards differ within each group."""
    out = []
    for i in range(rows):
        n = int(rng.integers(lo, hi))
        prompt = int(rng.integers(min(16, n // 4), n // 2))
        out.append(_episode(i, rng.integers(0, vocab, n), prompt))
    return out


def turn_trajectories(vocab: int, rows: int, rng: np.random.Generator) -> list[Trajectory]:
    """``rows`` single-row episodes in groups of 8: a 100-300-token prompt, 20-200 sampled tokens."""
    out = []
    for i in range(rows):
        prompt, sampled = int(rng.integers(100, 301)), int(rng.integers(20, 201))
        out.append(_episode(i, rng.integers(0, vocab, prompt + sampled), prompt))
    return out


def _episode(i: int, ids: np.ndarray, prompt: int) -> Trajectory:
    n = len(ids)
    mask = np.r_[np.zeros(prompt), np.ones(n - prompt)].astype(np.uint8)
    row = TokenRow(ids.astype(np.int32), mask, (-2.0 * mask).astype(np.float32), np.where(mask == 1, 0, -1).astype(np.int32), 0.0)
    return Trajectory.from_rows(episode_id=str(i), group_id=f"g{i // 8}", group_size=8, reward=float(i % 3 == 0), status="ok", rows=[row])


def _padded_step(model: torch.nn.Module, opt: torch.optim.Optimizer, trajs: list[Trajectory], rows_per_micro: int = 0) -> None:
    """One HF-style step: micro-batches of ``rows_per_micro`` rows (0: all at once) right-padded to
    their longest row, full logits and log_softmax, gradients accumulated, then clip and AdamW."""
    adv = group_advantages(torch.tensor([t.reward for t in trajs]), [t.group_id for t in trajs])
    rows = [t.rows()[0] for t in trajs]
    total = float(sum(int(r.loss_mask[1:].sum()) for r in rows))  # token mean over the whole batch
    per = rows_per_micro or len(rows)
    opt.zero_grad(set_to_none=True)
    for s in range(0, len(rows), per):
        part = rows[s : s + per]
        T = max(len(r.input_ids) for r in part)
        ids = torch.zeros(len(part), T, dtype=torch.long)
        att = torch.zeros(len(part), T, dtype=torch.long)
        mask = torch.zeros(len(part), T)
        beh = torch.zeros(len(part), T)
        for i, r in enumerate(part):
            n = len(r.input_ids)
            ids[i, :n] = torch.from_numpy(r.input_ids.astype(np.int64))
            att[i, :n] = 1
            mask[i, :n] = torch.from_numpy(r.loss_mask.astype(np.float32))
            beh[i, :n] = torch.from_numpy(r.logprobs.copy())
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits[:, :-1].float(), -1)  # (B, T-1, V)
        lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
        ratio = torch.exp(lp - beh[:, 1:])
        a = adv[s : s + per, None]
        per_token = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)
        ((per_token * mask[:, 1:]).sum() / total).backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()


def main(quick: bool, model: str = "embedded", jobs: int = 1) -> list[dict]:
    if model == "smollm2":
        return smollm2_rows(quick, jobs)
    if model != "embedded":
        raise ValueError(f"model: must be 'embedded' or 'smollm2', got {model!r}")
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
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    vocab = base.config.vocab_size
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
    base_opt = torch.optim.AdamW(base.parameters(), lr=1e-5)
    padded = timed(lambda b: _padded_step(base, base_opt, b))
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


def load_variant(model_path: str, variant: str) -> torch.nn.Module:
    """The model of a training child on one torch thread, seeded: ``full`` as loaded, ``lora``
    with rank-``LORA_RANK`` adapters on every linear layer (the base frozen)."""
    from transformers import AutoModelForCausalLM

    from areal.trainer.config import LoraConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    if variant == "lora":
        from areal.trainer.lora import attach_adapters

        attach_adapters(model, LoraConfig(rank=LORA_RANK, alpha=LORA_ALPHA))
    elif variant != "full":
        raise ValueError(f"variant must be lora or full, got {variant!r}")
    return model


def _measure(model_path: str, loop: str, variant: str, rows: int, steps: int) -> dict[str, float]:
    """In the child: ``steps`` timed steps of ``rows`` turns each, after a warm-up step of 2 turns
    (it creates AdamW's state and the allocator's pools; its length does not matter)."""

    from areal.trainer.config import TrainerConfig
    from areal.trainer.packing import PolicyScorer
    from areal.trainer.step import train_step

    model = load_variant(model_path, variant)
    rng = np.random.default_rng(0)  # the same trajectories in every child
    batches = [turn_trajectories(model.config.vocab_size, 2, rng)] + [
        turn_trajectories(model.config.vocab_size, rows, rng) for _ in range(steps)
    ]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    if loop in ("ours", "ours-masked"):
        varlen = loop == "ours"
        scorer = PolicyScorer(model, 1.0, varlen=varlen)
        config = TrainerConfig(steps=steps + 1, micro_batch_tokens=SMOL_MICRO_BATCH_TOKENS, varlen_attention=varlen)

        def step(b: list[Trajectory]) -> None:
            train_step(scorer, opt, b, config, version=0)
    elif loop in ("padded", "padded-onednn"):
        if loop == "padded-onednn":  # the same loop on the linears ours runs (areal/kernels.py)
            from areal.kernels import use_onednn_linears

            use_onednn_linears(model)

        def step(b: list[Trajectory]) -> None:
            _padded_step(model, opt, b, SMOL_ROWS_PER_MICRO)
    else:
        raise ValueError(f"loop must be ours, ours-masked, padded or padded-onednn, got {loop!r}")
    walls, cpus = [], []
    for i, batch in enumerate(batches):
        w0, c0 = time.perf_counter(), time.process_time()
        step(batch)
        if i:  # the first step is warm-up (and creates AdamW's state)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
    tokens = sum(t.num_tokens for b in batches[1:] for t in b)
    return {
        "tokens": float(tokens),
        "tok_per_s": tokens / sum(walls),
        "tok_per_cpu_s": tokens / sum(cpus),
        "step_s_median": statistics.median(walls),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _child(model_path: str, loop: str, variant: str, rows: int, steps: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "benchmarks.trainer", "--child", "--model-path", model_path, "--loop", loop, "--variant", variant]
    out = subprocess.run(cmd + ["--rows", str(rows), "--steps", str(steps)], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if out.returncode:
        raise RuntimeError(f"{loop}/{variant} on {model_path} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def smollm2_rows(quick: bool, jobs: int = 1) -> list[dict]:
    """Ours against the padded loop on SmolLM2-135M-Instruct, full fine-tuning and LoRA; for full
    fine-tuning also ours with one masked SDPA per micro-batch (``trainer.varlen_attention=false``).
    ``jobs`` children run at a time (their wall-clock figures then share the cores; CPU figures not)."""
    from concurrent.futures import ThreadPoolExecutor

    from areal.embedded.pretrained import ensure_pretrained_model

    path = str(ensure_pretrained_model())
    rows, steps = (8, 1) if quick else (8, 2)
    runs = [("full", "ours"), ("full", "padded"), ("full", "ours-masked"), ("full", "padded-onednn"), ("lora", "padded"), ("lora", "ours")]
    load0 = os.getloadavg()
    with ThreadPoolExecutor(jobs) as pool:
        futures = {run: pool.submit(_child, path, run[1], run[0], rows, steps) for run in runs}
        got = {run: f.result() for run, f in futures.items()}
    load1 = os.getloadavg()
    tokens = got[("full", "ours")]["tokens"]
    note = (
        f"load average (1, 5 min) {load0[0]:.1f}, {load0[1]:.1f} -> {load1[0]:.1f}, {load1[1]:.1f}; "
        f"{jobs} at a time; {steps} x {rows} turns, {tokens:.0f} tokens"
    )
    out = []
    for variant, base, label in (
        ("full", "padded", "padded HF loop, 4 rows per forward"),
        ("full", "ours-masked", "ours, one masked SDPA per micro-batch"),
        ("full", "padded-onednn", "padded HF loop on oneDNN's linears (areal.kernels), 4 rows per forward"),
        ("lora", "padded", "padded HF loop, 4 rows per forward"),
    ):
        for metric, key, unit in (
            ("train tokens/s", "tok_per_s", "tok/s"),
            ("train tokens per CPU second", "tok_per_cpu_s", "tok/CPU-s"),
            ("peak RSS", "peak_rss_mib", "MiB"),
        ):
            out.append(
                {
                    "benchmark": f"trainer_smollm2_{variant}",
                    "metric": metric,
                    "value": got[(variant, "ours")][key],
                    "unit": unit,
                    "baseline": label,
                    "baseline_value": got[(variant, base)][key],
                    "note": note,
                }
            )
    return out


def _clip(t: Trajectory, vocab: int) -> Trajectory:
    r = t.rows()[0]
    row = TokenRow((r.input_ids % vocab).astype(np.int32), r.loss_mask.copy(), r.logprobs.copy(), r.versions.copy(), 0.0)
    return Trajectory.from_rows(
        episode_id=t.episode_id, group_id=t.group_id, group_size=t.group_size, reward=t.reward, status="ok", rows=[row]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="trainer tokens/s against a padded HF loop (or one child measurement)")
    parser.add_argument("--model", default="embedded", choices=("embedded", "smollm2"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--jobs", type=int, default=1, help="smollm2: children run at a time")
    parser.add_argument("--child", action="store_true", help="one (loop, variant) measurement, printed as JSON")
    parser.add_argument("--model-path")
    parser.add_argument("--loop", choices=("ours", "ours-masked", "padded", "padded-onednn"))
    parser.add_argument("--variant", choices=("full", "lora"))
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_measure(args.model_path, args.loop, args.variant, args.rows, args.steps)))
    else:
        for r in main(args.quick, args.model, args.jobs):
            print(json.dumps(r))
