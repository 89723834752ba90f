"""Pictures of a run: the reward curve people look at instead of reading metrics.jsonl."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on training machines
import matplotlib.pyplot as plt


def plot_reward_curve(
    steps: list[dict[str, Any]],
    path: Path,
    eval_before: dict | None = None,
    eval_after: dict | None = None,
    periodic: list[dict[str, Any]] | None = None,
    title: str = "",
) -> None:
    """Per-step batch reward, its moving average and fitted trend (with the trend's p-value), and
    held-out accuracy before, during (``periodic``: rows with ``step``, data.eval_every) and
    after, with what the evaluations before and after cost (``wall_s``). The y-axis zooms on the
    data: the rises RL makes on the tiny embedded model are a few points, invisible on a 0..1 axis."""
    from areal.controller.evaluation import reward_trend  # numpy only; kept local so plots stays importable alone

    xs = [m["step"] for m in steps]
    ys = [m["reward_mean"] for m in steps]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(xs, ys, "o-", ms=3, lw=1, alpha=0.35, label="batch reward (mean)")
    w = max(1, len(ys) // 8)
    if len(ys) >= w:  # trailing average, drawn only where its window is full
        smooth = [sum(ys[i - w + 1 : i + 1]) / w for i in range(w - 1, len(ys))]
        ax.plot(xs[w - 1 :], smooth, lw=2.5, label=f"moving average ({w} steps)")
    trend = reward_trend(ys)
    if trend["steps"] >= 4:
        ax.plot(
            [xs[0], xs[-1]],
            [trend["fit_start"], trend["fit_end"]],
            lw=2,
            color="tab:red",
            label=f"linear trend {trend['fit_start']:.3f} → {trend['fit_end']:.3f} (permutation p={trend['p_value']:.3g})",
        )
    lo, hi = min(ys, default=0.0), max(ys, default=1.0)
    if eval_before and eval_after and xs:
        during = sorted(periodic or [], key=lambda e: e["step"])
        accs = [eval_before["sampled_acc"], *(e["sampled_acc"] for e in during), eval_after["sampled_acc"]]
        took = [e["wall_s"] for e in (eval_before, eval_after) if "wall_s" in e]  # what the evaluations cost
        cost = f"; evaluated in {' and '.join(f'{t:.0f} s' for t in took)}" if took else ""
        ax.plot(
            [0, *(e["step"] for e in during), xs[-1]],
            accs,
            "s--",
            color="black",
            label=f"held-out accuracy ({eval_before['n']} problems{cost}): {eval_before['sampled_acc']:.3f} → {eval_after['sampled_acc']:.3f}",
        )
        lo, hi = min(lo, *accs), max(hi, *accs)
    ax.set_xlabel("training step (policy version)")
    ax.set_ylabel("reward")
    pad = max(0.02, (hi - lo) * 0.1)
    ax.set_ylim(max(-0.02, lo - pad), min(1.02, hi + 3 * pad))  # room at the top for the legend
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=7)
    ax.set_title(title or "batch reward and held-out accuracy")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.rename(path)
