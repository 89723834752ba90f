"""The memory-flat lm head: CPU time and peak memory of logprobs + backward over a 151,936-token
vocabulary, chunked (areal.trainer.loss.head_logprobs: logits recomputed chunk by chunk, never whole)
against the plain way (full (tokens, vocab) logits, log_softmax, gather, autograd), same run.

Each variant runs in a subprocess of its own so that its peak RSS (ru_maxrss) is its own; CPU
time is the child's process time of the forward + backward alone (setup excluded). The hidden
size is small because the head's cost is set by tokens x vocabulary.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

VOCAB = 151936
HIDDEN = 64
ROOT = Path(__file__).resolve().parents[1]


def _measure(variant: str, tokens: int) -> dict[str, float]:
    """Run one variant here (in the child); returns CPU seconds and peak RSS growth in MiB."""
    from areal.trainer.loss import head_logprobs

    torch.set_num_threads(1)
    torch.manual_seed(0)
    hidden = torch.randn(tokens, HIDDEN, requires_grad=True)
    weight = (torch.randn(VOCAB, HIDDEN) * 0.05).requires_grad_(True)
    targets = torch.randint(0, VOCAB, (tokens,))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.process_time()
    if variant == "chunked":
        lp, _ = head_logprobs(hidden, weight, targets, 0.8)
    elif variant == "full_logits":
        lp = torch.log_softmax((hidden @ weight.T) / 0.8, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    else:
        raise ValueError(f"variant must be chunked or full_logits, got {variant!r}")
    lp.mean().backward()
    cpu = time.process_time() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"cpu_s": cpu, "peak_mib": (peak - base) / 1024}


def _child(variant: str, tokens: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.lm_head", "--variant", variant, "--tokens", str(tokens)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(quick: bool) -> list[dict]:
    tokens = 512 if quick else 2048  # full logits of 2048 tokens: 1.2 GB, plus their gradient
    chunked, full = _child("chunked", tokens), _child("full_logits", tokens)
    name = f"lm_head_{tokens}x{VOCAB}"
    return [
        {
            "benchmark": name,
            "metric": "peak_memory_growth",
            "value": chunked["peak_mib"],
            "unit": "MiB",
            "baseline": "full (tokens, vocab) logits + autograd",
            "baseline_value": full["peak_mib"],
        },
        {
            "benchmark": name,
            "metric": "cpu_time_fwd_bwd",
            "value": chunked["cpu_s"],
            "unit": "s",
            "baseline": "full (tokens, vocab) logits + autograd",
            "baseline_value": full["cpu_s"],
        },
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one lm-head variant (child of main) or the whole benchmark")
    parser.add_argument("--variant")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(_measure(args.variant, args.tokens)))
    else:
        for row in main(args.quick):
            print(json.dumps(row))
