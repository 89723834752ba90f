"""Pictures of a run: the reward curve people look at instead of reading metrics.jsonl."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on training machines
import matplotlib.pyplot as plt


def plot_reward_curve(steps: list[dict[str, Any]], path: Path, eval_before: dict | None = None, eval_after: dict | None = None) -> None:
    """Per-step batch reward with a moving average, and held-out accuracy before/after."""
    xs = [m["step"] for m in steps]
    ys = [m["reward_mean"] for m in steps]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(xs, ys, "o-", ms=3, lw=1, alpha=0.5, label="batch reward (mean)")
    w = max(1, len(ys) // 8)
    if len(ys) >= w:
        smooth = [sum(ys[max(0, i - w + 1) : i + 1]) / len(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))]
        ax.plot(xs, smooth, lw=2.5, label=f"moving average ({w} steps)")
    if eval_before and eval_after and xs:
        ax.plot([0, xs[-1]], [eval_before["sampled_acc"], eval_after["sampled_acc"]], "s--", color="black",
                label=f"held-out accuracy ({eval_before['n']} problems)")
    ax.set_xlabel("training step (policy version)")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.set_title("GRPO on the embedded math task")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.rename(path)
