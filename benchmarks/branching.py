"""Tree rollouts against independent episodes, same sample budget, same run, on two multi-turn tasks.

Each task is trained in two arms with several seeds (``seed=``), the arms alternating seed by
seed (drift on the machine falls on both).

The agentic demo (``make demo``'s run, ``--config-name agentic``: the calculator agent,
sandboxed, up to 4 calls, on the embedded model's agentic variant; metrics "agentic demo: ..."):

  * ``independent``: 8 episodes a group (``rollout.n_samples=8``), the baseline;
  * ``tree``: 4 episodes a group, each branched in 2 at the first call that follows a tool's
    result (``rollout.n_samples=4 rollout.branch.n=2 rollout.branch.at_tool_result=true``,
    docs/branching.md): the two branches share the episode up to that call (the question, the
    model's tool call, the tool's result) and differ from it on; the turn credit compares each
    branch with its sibling after the fork. At most 8 leaves a group, as the baseline's 8
    episodes; an episode that never reaches a tool result is not branched and gives 1 leaf, so
    the tree arm uses at most the baseline's sample budget (the figures count what each used).

The retrying math agent (``agents/openai_multiturn.py:MultiTurnMathAgent`` on the embedded model,
as in benchmarks/credit.py: it answers, and after a wrong answer is told so and asked again, up
to 3 calls; each call rewarded on its own; metrics "retrying math agent: ..."): ``independent``
8 episodes a group; ``tree`` 4, each branched in 2 at its second call
(``rollout.branch.at_call=2``): the siblings share the question and the wrong first answer and
retry apart. An episode right at its first call makes no second call and gives 1 leaf.
``trainer.lr=1e-4`` as in credit.py; its held-out evaluation is single-call answers.

Figures per task (tree, with independent as the baseline; each the mean over the seeds, the
per-seed values in the note):

  * held-out accuracy after training and its change from before (the run's own sampled
    evaluation, summary.json: the agent itself for the agentic demo, ``data.eval_mode=agent``;
    single-call answers for the math agent);
  * the episodes used (leaves, one reward each: episodes.jsonl lines of the trained episodes),
    the LLM calls generated (a tree's shared calls once) and the wall time of a run;
  * curves: held-out accuracy against the episodes used and against wall time, from the periodic
    evaluations (``data.eval_every``, evals.jsonl), the seeds' mean per evaluation.

Full mode: 3 seeds per arm; the agentic demo 30 steps x 8 groups, evaluated every 10 steps on its
config's 100 held-out problems x 2 sampled episodes; the math agent 20 steps x 8 groups, evaluated
every 10 steps on 100 x 2. Quick mode
(a smoke run): the agentic demo only, 1 seed, 2 steps x 2 groups, evaluated every step on 4
problems x 1.

Not covered: environment libraries (TextArena, verifiers) as the task; other branch points;
trees deeper than one fork (a branch session never branches again).

    python -m benchmarks.run [--quick] branching
    python -m benchmarks.branching [--quick] [--task agentic|math]   # rows as JSON lines
"""

from __future__ import annotations

import functools
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.e2e import _jsonl, train_run
from benchmarks.report import figure

ARMS = ("independent", "tree")
BASE = "independent episodes (8 a group), same run"
_row = functools.partial(figure, "branching")


@dataclass(frozen=True)
class Task:
    label: str  # the metrics' prefix
    arms: dict[str, list[str]]  # arm -> its settings: all that differs between the arms
    run: list[str]  # the task's own settings
    full: list[str]  # full mode's size and evaluation
    branch_point: str  # in the notes


TASKS = {
    "agentic": Task(
        "agentic demo",
        {
            "independent": ["rollout.n_samples=8"],
            "tree": ["rollout.n_samples=4", "rollout.branch.n=2", "rollout.branch.at_tool_result=true"],
        },
        ["--config-name", "agentic"],
        ["trainer.steps=30", "data.eval_every=10"],
        "an episode with no tool result is not branched (1 leaf)",
    ),
    "math": Task(
        "retrying math agent",
        {
            "independent": ["rollout.n_samples=8"],
            "tree": ["rollout.n_samples=4", "rollout.branch.n=2", "rollout.branch.at_call=2"],
        },
        ["rollout.agent=agents/openai_multiturn.py:MultiTurnMathAgent", "trainer.lr=1e-4", "data.train_size=2000"],
        ["trainer.steps=20", "rollout.groups_per_step=8", "data.eval_size=100", "data.eval_samples=2", "data.eval_every=10"],
        "an episode right at its first call is not branched (1 leaf)",
    ),
}


def overrides(quick: bool, task: str, arm: str, seed: int) -> list[str]:
    """One run of ``task``'s ``arm`` with ``seed``: only the arm's settings and the seed differ between runs."""
    t = TASKS[task]
    size = (
        ["trainer.steps=2", "rollout.groups_per_step=2", "data.eval_size=4", "data.eval_samples=1", "data.eval_every=1"]
        if quick
        else t.full
    )
    return [
        *t.run,
        *t.arms[arm],
        *size,
        f"seed={seed}",
        "trainer.checkpoint_every=0",
        f"experiment_name=bench-branching-{task}-{arm}-{seed}",
    ]


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


def main(quick: bool, tasks: list[str] | None = None) -> list[dict]:
    """Every task in full mode (``tasks`` picks some), the agentic demo alone in quick mode."""
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="areal-bench-branching-") as tmp:
        for task in tasks or (("agentic",) if quick else tuple(TASKS)):
            rows += task_rows(quick, task, Path(tmp))
    return rows


def task_rows(quick: bool, task: str, runs: Path) -> list[dict]:
    """Both arms of ``task`` over the seeds, run into ``runs``, the arms alternating."""
    seeds = [1] if quick else [1, 2, 3]
    per: dict[str, dict[str, list[float]]] = {arm: {"before": [], "after": [], "leaves": [], "calls": [], "wall": []} for arm in ARMS}
    points: dict[str, list[list[tuple[float, float, float]]]] = {arm: [] for arm in ARMS}
    for seed in seeds:
        for arm in ARMS:
            run_dir = runs / f"{task}-{arm}-{seed}"
            launched = time.time()
            wall = train_run(overrides(quick, task, arm, seed), run_dir, timeout_s=900.0 if quick else 2400.0)
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

    def per_seed(key: str, digits: int = 3) -> str:
        tree, indep = ([round(v, digits) for v in per[arm][key]] for arm in ("tree", "independent"))
        return f"seeds {seeds}; per seed, tree {tree} against independent {indep}"

    t, i = mean["tree"], mean["independent"]
    label = TASKS[task].label
    after_eval = "the run's own held-out evaluation (sampled, summary.json)"

    def curve(axis: int, against: str, xlabel: str) -> dict:
        """The seeds' mean accuracy against coordinate ``axis`` of the points, per arm: a row's plot."""
        means = {arm: _mean_curve(points[arm], axis) for arm in ARMS}
        return {
            "curves": {arm: ys for arm, (_, ys) in means.items()},
            "curve_x": {arm: xs for arm, (xs, _) in means.items()},
            "xlabel": xlabel,
            "title": f"{label}: held-out accuracy against {against}",
            "plot": f"{task}_accuracy_vs_{against.split()[0]}",
        }

    return [
        _row(
            f"{label}: held-out accuracy after training, tree rollouts",
            t["after"],
            "acc",
            BASE,
            i["after"],
            note=f"{after_eval}; {per_seed('after')}",
            **curve(0, "episodes used", "episodes used (leaves)"),
        ),
        _row(
            f"{label}: held-out accuracy change over training, tree rollouts",
            t["after"] - t["before"],
            "acc points",
            BASE,
            i["after"] - i["before"],
            note=f"before: {per_seed('before')}",
            **curve(1, "wall time", "seconds since the run's launch"),
        ),
        _row(
            f"{label}: episodes used by a run (leaves, one reward each), tree rollouts",
            t["leaves"],
            "episodes",
            BASE,
            i["leaves"],
            note=f"{per_seed('leaves', 0)}; {TASKS[task].branch_point}",
        ),
        _row(
            f"{label}: LLM calls generated by a run, tree rollouts",
            t["calls"],
            "calls",
            BASE,
            i["calls"],
            note=f"a tree's shared calls counted once; {per_seed('calls', 0)}",
        ),
        _row(
            f"{label}: wall time of a run, tree rollouts",
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
    parser.add_argument("--task", choices=sorted(TASKS), action="append", default=[], help="only this task (repeatable)")
    args = parser.parse_args()
    for out in main(args.quick, args.task):
        print(json.dumps(out), flush=True)
