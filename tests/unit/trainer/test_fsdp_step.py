"""FSDP2 with one rank (gloo) steps exactly as the unsharded scorer does, also right after a
no-grad scoring pass, which leaves FSDP2's root unsharded: the step's clipping and grad norm must
still cover the embeddings and the lm head (they once left them out)."""

from __future__ import annotations

import subprocess
import sys

from paths import ROOT

CHILD = r"""
import copy, sys, torch, torch.distributed as dist
sys.path.insert(0, "tests/support")
from tiny_models import tiny_qwen2
from areal.engine.launch import free_port
from areal.trainer.config import TrainerConfig
from areal.trainer.fsdp import shard_policy
from areal.trainer.packing import PolicyScorer, pack_rows
from areal.trainer.step import train_step
from areal.protocol import TokenRow, Trajectory

base = tiny_qwen2(tie_word_embeddings=True)
g = torch.Generator().manual_seed(1)
trajs = []
for i in range(8):  # one group of 8 single-row episodes: 10 prompt tokens, 30 sampled
    mask = torch.tensor([0] * 10 + [1] * 30, dtype=torch.uint8).numpy()
    ids = torch.randint(0, base.config.vocab_size, (40,), generator=g, dtype=torch.int32).numpy()
    row = TokenRow(ids, mask, (-2.0 * mask).astype("float32"), (mask.astype("int32") - 1) * (1 - mask), 0.0)
    trajs.append(Trajectory.from_rows(episode_id=str(i), group_id="g", group_size=8, reward=float(i % 3 == 0), status="ok", rows=[row]))
config = TrainerConfig(lr=1e-3, parallel="fsdp2", max_grad_norm=1e-3)  # clipping on: the norm scales every gradient

def step(scorer, score_first):
    opt = torch.optim.AdamW([p for p in scorer.parameters() if p.requires_grad], lr=config.lr)
    if score_first:
        with torch.no_grad():
            for mb in pack_rows(trajs, torch.zeros(len(trajs)), config.micro_batch_tokens):
                scorer(mb)
    m = train_step(scorer, opt, trajs, config, version=0)
    return m["grad_norm"], {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in scorer.named_parameters()}

plain_norm, plain = step(PolicyScorer(copy.deepcopy(base), 1.0), False)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
for score_first in (False, True):
    norm, weights = step(shard_policy(PolicyScorer(copy.deepcopy(base), 1.0), "cpu"), score_first)
    gap = max(float((weights[n] - plain[n]).abs().max()) for n in plain)
    print(f"score_first={score_first} grad_norm {norm!r} vs {plain_norm!r}, weights differ by {gap:.3g}")
    assert abs(norm - plain_norm) <= 1e-6 * plain_norm and gap < 1e-6, (score_first, norm, plain_norm, gap)
print("ok")
"""


def test_fsdp2_one_rank_steps_as_the_unsharded_scorer_even_after_a_no_grad_pass() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("ok"), proc.stdout[-2000:] + proc.stderr[-3000:]
