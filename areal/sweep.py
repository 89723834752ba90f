"""Sweep summary: one table and one plot comparing the finished runs of a Hydra multirun.

    python -m areal.train -m trainer.lr=1e-5,3e-5 seed=1,2
        multirun/<experiment>/<time>/            (the sweep dir)
            0/ 1/ 2/ 3/                          each run: .hydra/overrides.yaml, summary.json, metrics.jsonl
            sweep_summary.md  sweep_summary.csv  (a row per finished run)
            sweep_rewards.png                    (batch-reward curves, one line per run)

``areal.train`` calls ``write_sweep_summary(sweep_dir)`` at the end of every run of a multirun.
It rebuilds the whole summary from what is on disk each time, so the summary is complete after
the last run whichever order the runs finish in, and a crashed run (no ``summary.json``) is
simply absent. Invariants: the rebuild holds an exclusive ``flock`` on ``<sweep_dir>/.sweep.lock``
(overlapping runs, e.g. a parallel launcher, never interleave their writes) and every file is
written to a temporary name and renamed, so a reader never sees half a table.

Covered: Hydra's default layout (``<sweep_dir>/<job num>/.hydra/overrides.yaml``) and any run
directory under the sweep dir holding ``summary.json``. Not covered: comparing runs of different
sweeps (run it on each sweep dir).
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import math
from pathlib import Path
from typing import Any

import matplotlib
import yaml

matplotlib.use("Agg")  # no display on training machines
import matplotlib.pyplot as plt

COLUMNS = ["run", "overrides", "steps", "reward_first", "reward_last", "heldout_before", "heldout_after", "wall_s"]


def collect_runs(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per finished run under ``sweep_dir`` (a run is finished when its summary.json exists)."""
    rows = []
    for summary_path in sorted(sweep_dir.rglob("summary.json"), key=lambda p: _natural(p.parent.relative_to(sweep_dir))):
        run_dir = summary_path.parent
        summary = json.loads(summary_path.read_text())
        overrides_file = run_dir / ".hydra" / "overrides.yaml"
        overrides = (yaml.safe_load(overrides_file.read_text()) or []) if overrides_file.is_file() else []
        metrics_file = run_dir / "metrics.jsonl"
        metrics = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()] if metrics_file.is_file() else []
        rewards = [m["reward_mean"] for m in metrics if "reward_mean" in m]
        window = max(1, len(rewards) // 4)  # the same quarter windows as the run's own reward_trend
        before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
        rows.append(
            {
                "run": str(run_dir.relative_to(sweep_dir)),
                "all_overrides": list(overrides),
                "steps": len(metrics),
                "reward_first": _mean(rewards[:window]),
                "reward_last": _mean(rewards[-window:]),
                "heldout_before": before.get("sampled_acc", math.nan),
                "heldout_after": after.get("sampled_acc", math.nan),
                "wall_s": summary.get("wall_s", math.nan),
                "curve": [(m["step"], m["reward_mean"]) for m in metrics if "reward_mean" in m],
            }
        )
    # Show what tells runs apart: overrides shared by every run (trainer.steps=2 ...) are noise.
    shared = set.intersection(*(set(r["all_overrides"]) for r in rows)) if len(rows) > 1 else set()
    for r in rows:
        r["overrides"] = " ".join(o for o in r["all_overrides"] if o not in shared) or "(defaults)"
    return rows


def write_sweep_summary(sweep_dir: Path) -> list[dict[str, Any]]:
    """Rebuild ``sweep_summary.{md,csv}`` and ``sweep_rewards.png`` in ``sweep_dir``; returns the rows."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / ".sweep.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        rows = collect_runs(sweep_dir)
        _write_atomic(sweep_dir / "sweep_summary.csv", _csv(rows))
        _write_atomic(sweep_dir / "sweep_summary.md", _markdown(rows, sweep_dir))
        _plot(rows, sweep_dir / "sweep_rewards.png")
    return rows


def _csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for r in rows:
        writer.writerow([_fmt(r[c]) for c in COLUMNS])
    return out.getvalue()


def _markdown(rows: list[dict[str, Any]], sweep_dir: Path) -> str:
    lines = [
        f"# Sweep summary: {sweep_dir}",
        "",
        f"{len(rows)} finished run(s). Reward first/last: mean batch reward of the first/last quarter of steps; "
        "held-out: sampled accuracy before/after training.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(_fmt(r[c]).replace("|", "\\|") for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n\n![reward curves](sweep_rewards.png)\n"


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for r in rows:
        if r["curve"]:
            xs, ys = zip(*r["curve"])
            ax.plot(xs, ys, "o-", ms=3, lw=1.5, label=r["overrides"])
    ax.set_xlabel("training step (policy version)")
    ax.set_ylabel("batch reward (mean)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if any(r["curve"] for r in rows):
        ax.legend(loc="best", fontsize=7)
    ax.set_title("sweep: reward curves")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.rename(path)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.rename(path)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3f}"
    return str(v)


def _natural(rel: Path) -> tuple:
    """Job 10 after job 9: numeric path parts compare as numbers."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in rel.parts)
