"""Credit across turns: episode-level against turn-level credit on a multi-turn agent, same run.

Each call trains the embedded model twice with `python -m areal.train`, identical but for
`trainer.credit` (`episode`: the baseline; `turn`: areal/trainer/credit.py), on the retrying
math agent `agents/openai_multiturn.py:MultiTurnMathAgent`: it answers, and after a wrong
answer is told so and asked again, up to 3 calls; every call is rewarded on its own (1 when its
answer is right, else 0), so an episode's reward is 1 when some call got it right. Episode credit
gives a wrong first answer that a retry fixed the same credit as a right first answer; turn
credit gives it `turn_discount` (0.5) of the retry's return, and compares each call with the
other episodes' calls at the same depth.

Figures (turn credit, with episode credit as the baseline), from the run directories:

  * held-out accuracy after training (single-call answers to held-out problems, sampled at the
    training temperature: the first call of the agent), and its change from before training;
  * over the last third of the steps: first-call accuracy of the trained episodes (share whose
    first call was right), episode success (some call right), LLM calls per episode;
  * learning curves of those three per step, both arms on the same axes (the `curves` of each
    row; benchmarks/report.py draws them as `credit_curves.png`).

Same seed, data and settings in both arms (the episode arm first); `trainer.lr` is raised to
1e-4 so that a few minutes of training move the curves. Not covered: several seeds per arm (the
harness's repeats are the only replication), tree-shaped episodes (the agent's calls form a chain).
    python -m benchmarks.run credit [--quick]
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from areal.trajectories import read_saved_trajectories
from benchmarks.e2e import train_run

AGENT = "agents/openai_multiturn.py:MultiTurnMathAgent"
ARMS = ("episode", "turn")


def overrides(quick: bool, credit: str) -> list[str]:
    """The run of one arm: only ``trainer.credit`` differs between the arms."""
    return [
        f"rollout.agent={AGENT}",
        f"trainer.credit={credit}",
        "trainer.turn_discount=0.5",
        "trainer.lr=1e-4",
        f"trainer.steps={6 if quick else 30}",
        f"rollout.groups_per_step={2 if quick else 8}",
        "rollout.n_samples=8",
        f"data.eval_size={40 if quick else 200}",
        "data.eval_samples=2",
        "data.train_size=2000",
        "trainer.checkpoint_every=0",
        "save_trajectories=true",
        f"experiment_name=bench-credit-{credit}",
    ]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_curves(run_dir: Path) -> dict[str, list[float]]:
    """Per step, over the episodes that step trained: first-call accuracy, success, calls per episode."""
    trajs = {t.episode_id: t for t in read_saved_trajectories(run_dir / "trajectories.bin")}
    trained: dict[int, list[str]] = {}
    for row in _jsonl(run_dir / "trained_episodes-r0.jsonl"):
        trained.setdefault(row["step"], []).extend(row["episodes"])
    curves: dict[str, list[float]] = {"first-call accuracy": [], "episode success": [], "calls per episode": []}
    for step in sorted(trained):
        batch = [trajs[e] for e in trained[step] if e in trajs]
        n = max(len(batch), 1)
        curves["first-call accuracy"].append(sum(float(t.array("row_rewards")[0] > 0) for t in batch) / n)
        curves["episode success"].append(sum(float(t.reward > 0) for t in batch) / n)
        curves["calls per episode"].append(sum(len(t.array("row_lens")) for t in batch) / n)
    return curves


def _last_third(xs: list[float]) -> float:
    tail = xs[len(xs) - max(len(xs) // 3, 1) :]
    return sum(tail) / len(tail)


def main(quick: bool) -> list[dict]:
    curves: dict[str, dict[str, list[float]]] = {}
    evals: dict[str, tuple[float, float]] = {}
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="areal-bench-credit-") as tmp:
        for arm in ARMS:
            run_dir = Path(tmp) / arm
            walls[arm] = train_run(overrides(quick, arm), run_dir, timeout_s=900.0)
            curves[arm] = step_curves(run_dir)
            summary = json.loads((run_dir / "summary.json").read_text())
            evals[arm] = (summary["eval_before"]["sampled_acc"], summary["eval_after"]["sampled_acc"])
    base = "episode credit (trainer.credit=episode), same run"
    rows: list[dict[str, Any]] = [
        _row("held-out accuracy after training, turn credit", evals["turn"][1], "acc", base, evals["episode"][1]),
        _row(
            "held-out accuracy change over training, turn credit",
            evals["turn"][1] - evals["turn"][0],
            "acc points",
            base,
            evals["episode"][1] - evals["episode"][0],
            note="sampled single-call answers, areal/evaluation.py; before = the same embedded model in both arms",
        ),
    ]
    for name, unit in (("first-call accuracy", "share"), ("episode success", "share"), ("calls per episode", "calls")):
        rows.append(
            _row(
                f"{name}, last third of the steps, turn credit",
                _last_third(curves["turn"][name]),
                unit,
                base,
                _last_third(curves["episode"][name]),
                curves={arm: curves[arm][name] for arm in ARMS},
                note="per step over the episodes it trained (trajectories.bin + trained_episodes-r0.jsonl)",
            )
        )
    rows.append(_row("wall time of the run, turn credit", walls["turn"], "s", base, walls["episode"]))
    return rows


def _row(metric: str, value: float, unit: str, baseline: str, baseline_value: float, **extra: Any) -> dict[str, Any]:
    return {
        "benchmark": "credit",
        "metric": metric,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_value": baseline_value,
        **extra,
    }
