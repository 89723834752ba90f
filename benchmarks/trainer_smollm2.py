"""The trainer on a real model: benchmarks/trainer.py's SmolLM2-135M-Instruct comparison (its
docstring says how both loops are fed and measured): trained tokens per wall and per CPU second
and peak RSS of the real training step, full fine-tuning and LoRA, against a padded HF loop over
the same trajectories, each (variant, loop) in a fresh process.

    python -m benchmarks.run trainer_smollm2 [--quick]
    python -m benchmarks.trainer --model smollm2 [--quick] [--jobs N]   # the same, its table printed
"""

from __future__ import annotations

from benchmarks.trainer import main as trainer_main


def main(quick: bool) -> list[dict]:
    return trainer_main(quick, model="smollm2")
