"""Tree rollouts against independent episodes on the agentic demo, same sample budget, same run.

Two arms of ``make demo``'s run (``--config-name agentic``: the calculator agent, sandboxed, up to
4 calls, on the embedded model's agentic variant), each trained with several seeds (``seed=``),
the arms alternating seed by seed (drift on the machine falls on both):

  * ``independent``: 8 episodes a group (``rollout.n_samples=8``), the baseline;
  * ``tree``: 4 episodes a group, each branched in 2 at the first call that follows a tool's
    result (``rollout.n_samples=4 rollout.branch.n=2 rollout.branch.at_tool_result=true``,
    docs/branching.md): the two branches share the episode up to that call (the question, the
    model's tool call, the tool's result) and differ from it on; the turn credit compares each
    branch with its sibling after the fork. At most 8 leaves a group, as the baseline's 8
    episodes; an episode that never reaches a tool result is not branched and gives 1 leaf, so
    the tree arm uses at most the baseline's sample budget (the figures count what each used).

Figures (tree, with independent as the baseline; each the mean over the seeds, the per-seed
values in the note):

  * held-out agent accuracy after training and its change from before (the run's own sampled
    evaluation, ``data.eval_mode=agent``, summary.json);
  * the episodes used (leaves, one reward each: episodes.jsonl lines of the trained episodes),
    the LLM calls generated (a tree's shared calls once) and the wall time of a run;
  * curves: held-out accuracy against the episodes used and against wall time, from the periodic
    evaluations (``data.eval_every``, evals.jsonl), the seeds' mean per evaluation.

Full mode: 3 seeds per arm, 30 steps x 8 groups, evaluated every 10 steps on the config's 100
held-out problems x 2 sampled episodes. Quick mode (a smoke run): 1 seed, 2 steps x 2 groups,
evaluated every step on 4 problems x 1.

Not covered: a multi-turn environment other than the calculator agent; branch points other than
the first tool result; trees deeper than one fork (a branch session never branches again).

    python -m benchmarks.run [--quick] branching
"""

from __future__ import annotations

import functools
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.e2e import train_run
from benchmarks.report import figure

ARMS: dict[str, list[str]] = {
    "independent": ["rollout.n_samples=8"],
    "tree": ["rollout.n_samples=4", "rollout.branch.n=2", "rollout.branch.at_tool_result=true"],
}
BASE = "independent episodes (8 a group), same run"
_row = functools.partial(figure, "branching")


def overrides(quick: bool, arm: str, seed: int) -> list[str]:
    """One run of ``arm`` with ``seed``: only the arm's settings and the seed differ between runs."""
    size = (
        ["trainer.steps=2", "rollout.groups_per_step=2", "data.eval_size=4", "data.eval_samples=1", "data.eval_every=1"]
        if quick
        else ["trainer.steps=30", "data.eval_every=10"]
    )
    return [
        "--config-name",
        "agentic",
        *ARMS[arm],
        *size,
        f"seed={seed}",
        "trainer.checkpoint_every=0",
        f"experiment_name=bench-branching-{arm}-{seed}",
    ]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def episodes_used(run_dir: Path) -> dict[int, tuple[int, int]]:
    """Per step, the (leaves, LLM calls generated) of the episodes it trained: a trained tree is
    one id whose branches are the episodes.jsonl lines ``<id>/b<i>``, each a leaf; its calls are
    the shared ones once plus each branch's own."""
    lines: dict[str, list[dict]] = {}
    for row in _jsonl(run_dir / "episodes.jsonl"):
        lines.setdefault(row["episode_id"].split("/b")[0], []).append(row)
    used: dict[int, tuple[int, int]] = {}
    for row in _jsonl(run_dir / "trained_episodes-r0.jsonl"):
        leaves = calls = 0
        for episode in row["episodes"]:
            rows = lines.get(episode, [])
            shared = max((r.get("shared_interactions", 0) for r in rows), default=0)
            leaves += len(rows)
            calls += shared + sum(r["interactions"] - r.get("shared_interactions", 0) for r in rows)
        was = used.get(row["step"], (0, 0))
        used[row["step"]] = (was[0] + leaves, was[1] + calls)
    return used


def run_points(run_dir: Path, launched: float) -> list[tuple[float, float, float]]:
    """(episodes used, seconds since launch, held-out sampled accuracy) at each evaluation: before
    training (0 used) and after each step that was evaluated."""
    used = episodes_used(run_dir)
    ended = {r["step"]: r["step_started"] + r["step_s"] - launched for r in _jsonl(run_dir / "metrics.jsonl")}
    points = []
    for ev in _jsonl(run_dir / "evals.jsonl"):
        step = ev["step"]
        leaves = sum(n for s, (n, _) in used.items() if s <= step)
        points.append((float(leaves), ended.get(step, 0.0), float(ev["sampled_acc"])))
    return points


def _mean_curve(runs: list[list[tuple[float, float, float]]], x: int) -> tuple[list[float], list[float]]:
    """The seeds' mean of coordinate ``x`` and of the accuracy at each evaluation they share."""
    n = min(len(r) for r in runs)
    return [statistics.mean(r[i][x] for r in runs) for i in range(n)], [statistics.mean(r[i][2] for r in runs) for i in range(n)]


def main(quick: bool) -> list[dict]:
    seeds = [1] if quick else [1, 2, 3]
    per: dict[str, dict[str, list[float]]] = {arm: {"before": [], "after": [], "leaves": [], "calls": [], "wall": []} for arm in ARMS}
    points: dict[str, list[list[tuple[float, float, float]]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="areal-bench-branching-") as tmp:
        for seed in seeds:
            for arm in ARMS:
                run_dir = Path(tmp) / f"{arm}-{seed}"
                launched = time.time()
                wall = train_run(overrides(quick, arm, seed), run_dir, timeout_s=900.0 if quick else 2400.0)
                summary = json.loads((run_dir / "summary.json").read_text())
                used = episodes_used(run_dir)
                p = per[arm]
                p["before"].append(summary["eval_before"]["sampled_acc"])
                p["after"].append(summary["eval_after"]["sampled_acc"])
                p["leaves"].append(float(sum(n for n, _ in used.values())))
                p["calls"].append(float(sum(c for _, c in used.values())))
                p["wall"].append(wall)
                points[arm].append(run_points(run_dir, launched))
    mean = {arm: {k: statistics.mean(v) for k, v in p.items()} for arm, p in per.items()}
    seeds_note = f"seeds {seeds}; per seed, tree {{}} against independent {{}}"

    def per_seed(key: str, digits: int = 3) -> str:
        return seeds_note.format(*([round(v, digits) for v in per[arm][key]] for arm in ("tree", "independent")))

    t, i = mean["tree"], mean["independent"]
    after_eval = "the run's own held-out agent evaluation (data.eval_mode=agent, sampled episodes, summary.json)"
    curves_leaves = {arm: _mean_curve(points[arm], 0) for arm in ARMS}
    curves_wall = {arm: _mean_curve(points[arm], 1) for arm in ARMS}
    return [
        _row(
            "held-out agent accuracy after training, tree rollouts",
            t["after"],
            "acc",
            BASE,
            i["after"],
            note=f"{after_eval}; {per_seed('after')}",
            curves={arm: ys for arm, (_, ys) in curves_leaves.items()},
            curve_x={arm: xs for arm, (xs, _) in curves_leaves.items()},
            xlabel="episodes used (leaves)",
            plot="accuracy_vs_episodes",
        ),
        _row(
            "held-out agent accuracy change over training, tree rollouts",
            t["after"] - t["before"],
            "acc points",
            BASE,
            i["after"] - i["before"],
            note=f"before: {per_seed('before')}",
            curves={arm: ys for arm, (_, ys) in curves_wall.items()},
            curve_x={arm: xs for arm, (xs, _) in curves_wall.items()},
            xlabel="seconds since the run's launch",
            plot="accuracy_vs_wall",
        ),
        _row(
            "episodes used by a run (leaves, one reward each), tree rollouts",
            t["leaves"],
            "episodes",
            BASE,
            i["leaves"],
            note=f"{per_seed('leaves', 0)}; an episode with no tool result is not branched (1 leaf)",
        ),
        _row(
            "LLM calls generated by a run, tree rollouts",
            t["calls"],
            "calls",
            BASE,
            i["calls"],
            note=f"a tree's shared calls counted once; {per_seed('calls', 0)}",
        ),
        _row(
            "wall time of a run, tree rollouts",
            t["wall"],
            "s",
            BASE,
            i["wall"],
            note=f"start-up and evaluations included; {per_seed('wall', 1)}",
        ),
    ]


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    for out in main(parser.parse_args().quick):
        print(json.dumps(out))
