"""Against TRL on a real model: benchmarks/trl_grpo.py's comparison (its docstring says what is the
same on both sides and how each figure is derived) on SmolLM2-135M-Instruct and reasoning-gym's
chain_sum, as ``make demo-smollm2`` trains it (conf/smollm2.yaml): held-out accuracy after the same
number of episodes, and wall-clock per step, ours next to TRL's GRPOTrainer.

    python -m benchmarks.run --with-trl trl_grpo_smollm2 [--quick]   # quick: 4 steps, 20 held-out problems
    python -m benchmarks.trl_grpo --model smollm2 [--quick]          # the same, its table printed

Opt-in with the other TRL comparison (``--with-trl``, ``AREAL_BENCH_TRL=1``): besides the TRL venv,
a full call trains a 135M model twice for 40 steps of 32 episodes on the machine's CPUs.
"""

from __future__ import annotations

from benchmarks.trl_grpo import SMOLLM2, compare


def main(quick: bool) -> list[dict]:
    return compare(SMOLLM2, quick)
