"""Credit across turns: episode-level against turn-level credit on multi-turn agents, same run.

Each call trains four runs with `python -m areal.train`, one pair per task, the two runs of a pair
identical but for `trainer.credit` (`episode`: the baseline; `turn`: areal/trainer/credit.py).

The retrying math agent (`math_rows`, `main`'s first rows) on the embedded model,
`agents/openai_multiturn.py:MultiTurnMathAgent`: it answers, and after a wrong answer is told so
and asked again, up to 3 calls; every call is rewarded on its own (1 when its
answer is right, else 0), so an episode's reward is 1 when some call got it right. Episode credit
gives a wrong first answer that a retry fixed the same credit as a right first answer; turn
credit gives it `turn_discount` (0.5) of the retry's return, and compares each call with the
other episodes' calls at the same depth.

Full mode trains the math agent 30 steps x 8 groups and scores 200 held-out problems; quick
mode (a smoke run) 3 steps x 1 group and 4 problems x 1 sampled answer.

Figures (turn credit, with episode credit as the baseline), from the run directories:

  * held-out accuracy after training (single-call answers to held-out problems, sampled at the
    training temperature: the first call of the agent), and its change from before training;
  * over the last third of the steps: first-call accuracy of the trained episodes (share whose
    first call was right), episode success (some call right), LLM calls per episode;
  * learning curves of those three per step, both arms on the same axes (the `curves` of each
    row; benchmarks/report.py draws them as `credit_curves.png`).

Same seed, data and settings in both arms (the episode arm first); `trainer.lr` is raised to
1e-4 so that a few minutes of training move the curves.

The agentic demo (`agentic_rows`, metrics starting "agentic demo:"): `make demo`'s run
(`--config-name agentic`: the calculator agent `agents/openai_tools.py:CalculatorAgent`, up to 4
calls, sandboxed, on `model.path=embedded-agent`; full mode its 60 steps × 8 groups × 8 episodes,
quick mode 2 steps × 2 groups), checkpoints off in both arms. Its reward is one float per episode
(right answer 1, else 0), shared by every call, so both arms give every call the episode's reward
as its return: what differs is the baseline (episode: the group's mean and std; turn: the
leave-one-out mean of the other episodes' returns at the same call depth, scaled by the group's
RMS), so a call at depth 2 of a successful episode is compared with other episodes' third calls,
not with episodes that answered at once. Figures, from the run directories:

  * the run's own held-out evaluation of the agent (data.eval_mode=agent, areal/controller/agent_eval.py:
    the sandboxed agent through the gateway, the config's 100 problems × 2 sampled episodes, quick
    4 × 1; summary.json): sampled accuracy before and after, and the paired sign-flip p-value
    of the change (summary.json's eval_test);
  * tool use of the held-out episodes after training (the eval's sampled episodes): LLM calls,
    well-formed and malformed tool calls per episode, share of final answers using a tool result;
  * learning curves per step (metrics.jsonl): batch reward (reward_mean), well-formed and
    malformed tool calls per episode of the training episodes, both arms on the same axes
    (benchmarks/report.py draws them as `credit_agentic_curves.png`, the row's "plot"), with their
    mean over the last third of the steps as the rows' values;
  * the wall time of each run (start-up and both evaluations included).

Not covered: several seeds per arm (the harness's repeats are the only replication; the agent's
requests carry no seed, so two runs of one arm differ too), tree-shaped episodes (the agents'
calls form a chain), per-call rewards on the demo (its agent returns one float).
    python -m benchmarks.run credit [--quick]
    python -m benchmarks.credit [--quick] [--agentic-only] [--runs DIR]   # rows as JSON lines; DIR keeps the run dirs
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

from areal.controller.trajectories import read_saved_trajectories
from benchmarks.e2e import _jsonl, train_run
from benchmarks.report import figure

AGENT = "agents/openai_multiturn.py:MultiTurnMathAgent"
ARMS = ("episode", "turn")


def overrides(quick: bool, credit: str) -> list[str]:
    """The run of one arm: only ``trainer.credit`` differs between the arms."""
    return [
        f"rollout.agent={AGENT}",
        f"trainer.credit={credit}",
        "trainer.turn_discount=0.5",
        "trainer.lr=1e-4",
        f"trainer.steps={3 if quick else 30}",
        f"rollout.groups_per_step={1 if quick else 8}",
        "rollout.n_samples=8",
        f"data.eval_size={4 if quick else 200}",
        f"data.eval_samples={1 if quick else 2}",
        "data.train_size=2000",
        "trainer.checkpoint_every=0",
        "save_trajectories=true",
        f"experiment_name=bench-credit-{credit}",
    ]


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
    with tempfile.TemporaryDirectory(prefix="areal-bench-credit-") as tmp:
        return math_rows(quick, Path(tmp)) + agentic_rows(quick, Path(tmp))


BASE = "episode credit (trainer.credit=episode), same run"


def math_rows(quick: bool, runs: Path) -> list[dict]:
    """The retrying math agent, both arms run into ``runs``/{episode,turn}."""
    curves: dict[str, dict[str, list[float]]] = {}
    evals: dict[str, tuple[float, float]] = {}
    walls: dict[str, float] = {}
    for arm in ARMS:
        run_dir = runs / arm
        walls[arm] = train_run(overrides(quick, arm), run_dir, timeout_s=900.0)
        curves[arm] = step_curves(run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        evals[arm] = (summary["eval_before"]["sampled_acc"], summary["eval_after"]["sampled_acc"])
    rows: list[dict[str, Any]] = [
        _row("held-out accuracy after training, turn credit", evals["turn"][1], "acc", BASE, evals["episode"][1]),
        _row(
            "held-out accuracy change over training, turn credit",
            evals["turn"][1] - evals["turn"][0],
            "acc points",
            BASE,
            evals["episode"][1] - evals["episode"][0],
            note="sampled single-call answers, areal/controller/evaluation.py; before = the same embedded model in both arms",
        ),
    ]
    for name, unit in (("first-call accuracy", "share"), ("episode success", "share"), ("calls per episode", "calls")):
        rows.append(
            _row(
                f"{name}, last third of the steps, turn credit",
                _last_third(curves["turn"][name]),
                unit,
                BASE,
                _last_third(curves["episode"][name]),
                curves={arm: curves[arm][name] for arm in ARMS},
                note="per step over the episodes it trained (trajectories.bin + trained_episodes-r0.jsonl)",
            )
        )
    rows.append(_row("wall time of the run, turn credit", walls["turn"], "s", BASE, walls["episode"]))
    return rows


def agentic_demo_overrides(quick: bool, name: str, *arm: str) -> list[str]:
    """``make demo``'s run (conf/agentic.yaml) as a benchmark arm: ``arm``'s settings, checkpoints
    off; full: the config's 60 steps, groups and evaluation (100 problems x 2), quick: 2 steps of 2
    groups, 4 problems x 1."""
    # quick: a smoke; two steps are the fewest that give every curve a point and a step after the first
    quick_size = ["trainer.steps=2", "rollout.groups_per_step=2", "data.eval_size=4", "data.eval_samples=1"]
    return [
        "--config-name",
        "agentic",
        *arm,
        *(quick_size if quick else ["trainer.steps=60"]),
        "trainer.checkpoint_every=0",
        f"experiment_name={name}",
    ]


def agentic_overrides(quick: bool, credit: str) -> list[str]:
    """The agentic demo's run of one arm: only ``trainer.credit`` differs."""
    return agentic_demo_overrides(quick, f"bench-credit-agentic-{credit}", f"trainer.credit={credit}")


CURVES = {  # metrics.jsonl key -> (curve name, unit)
    "reward_mean": ("batch reward", "reward"),
    "tool_calls_per_episode": ("well-formed tool calls per episode", "calls"),
    "malformed_tool_calls_per_episode": ("malformed tool calls per episode", "calls"),
}
TOOL_USE = {  # eval result key (areal/controller/agent_eval.py:tool_use_means) -> (figure, unit)
    "calls_per_episode": ("LLM calls per episode", "calls"),
    "tool_calls_per_episode": ("well-formed tool calls per episode", "calls"),
    "malformed_tool_calls_per_episode": ("malformed tool calls per episode", "calls"),
    "used_tool_result_share": ("share of answers using a tool result", "share"),
}


def metric_curves(run_dir: Path) -> dict[str, list[float]]:
    """Per step (metrics.jsonl), the ``CURVES`` keys. A step that logged no episode since the
    previous one has no tool-call figures: at the end of the run (the rollouts stopped before the
    last step's report) the curve stops there; before, it repeats the previous step's (0 before any)."""
    rows = _jsonl(run_dir / "metrics.jsonl")
    out: dict[str, list[float]] = {}
    for key in CURVES:
        last = max((i for i, row in enumerate(rows) if key in row), default=-1)
        ys: list[float] = []
        for row in rows[: last + 1]:
            ys.append(float(row.get(key, ys[-1] if ys else 0.0)))
        out[key] = ys
    return out


def agentic_rows(quick: bool, runs: Path) -> list[dict]:
    """The agentic demo, both arms run into ``runs``/agentic-{episode,turn}, the episode arm first."""
    summaries: dict[str, dict[str, Any]] = {}
    curves: dict[str, dict[str, list[float]]] = {}
    walls: dict[str, float] = {}
    for arm in ARMS:
        run_dir = runs / f"agentic-{arm}"
        walls[arm] = train_run(agentic_overrides(quick, arm), run_dir, timeout_s=1500.0)
        summaries[arm] = json.loads((run_dir / "summary.json").read_text())
        curves[arm] = metric_curves(run_dir)
    before = {arm: s["eval_before"] for arm, s in summaries.items()}
    after = {arm: s["eval_after"] for arm, s in summaries.items()}
    test = {arm: s["eval_test"] for arm, s in summaries.items()}
    n, k = after["turn"]["n"], after["turn"]["samples"]
    held_out = f"the run's own agent evaluation (data.eval_mode=agent, summary.json): {n} held-out problems x {k} sampled episodes"
    rows: list[dict[str, Any]] = [
        _row(
            "agentic demo: held-out agent accuracy before training, turn credit",
            before["turn"]["sampled_acc"],
            "acc",
            BASE,
            before["episode"]["sampled_acc"],
            note=f"{held_out}; the same model in both arms, so the two differ by sampling only (the agent's requests carry no seed)",
        ),
        _row(
            "agentic demo: held-out agent accuracy after training, turn credit",
            after["turn"]["sampled_acc"],
            "acc",
            BASE,
            after["episode"]["sampled_acc"],
        ),
        _row(
            "agentic demo: held-out agent accuracy change over training, turn credit",
            after["turn"]["sampled_acc"] - before["turn"]["sampled_acc"],
            "acc points",
            BASE,
            after["episode"]["sampled_acc"] - before["episode"]["sampled_acc"],
        ),
        _row(
            "agentic demo: paired p-value of the held-out change, turn credit",
            test["turn"]["p_value"],
            "p",
            BASE,
            test["episode"]["p_value"],
            note="summary.json eval_test: paired sign-flip permutation test, per problem, after against before",
        ),
        _row(
            "agentic demo: held-out greedy agent accuracy after training, turn credit",
            after["turn"]["greedy_acc"],
            "acc",
            BASE,
            after["episode"]["greedy_acc"],
        ),
    ]
    for key, (name, unit) in TOOL_USE.items():
        rows.append(
            _row(
                f"agentic demo: {name} after training (held-out), turn credit",
                after["turn"][key],
                unit,
                BASE,
                after["episode"][key],
                note="the held-out sampled episodes after training, as the gateway counted them (areal/controller/agent_eval.py); "
                f"before training: turn arm {before['turn'][key]:.3f}, episode arm {before['episode'][key]:.3f}",
            )
        )
    for key, (name, unit) in CURVES.items():
        rows.append(
            _row(
                f"agentic demo: {name}, last third of the steps, turn credit",
                _last_third(curves["turn"][key]),
                unit,
                BASE,
                _last_third(curves["episode"][key]),
                curves={arm: curves[arm][key] for arm in ARMS},
                plot="agentic",
                note="per step, the training episodes logged since the previous step (metrics.jsonl)",
            )
        )
    rows.append(_row("agentic demo: wall time of the run, turn credit", walls["turn"], "s", BASE, walls["episode"]))
    return rows


_row = functools.partial(figure, "credit")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="episode against turn credit; prints the rows as JSON lines")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--agentic-only", action="store_true", help="only the agentic demo's pair of runs")
    parser.add_argument("--runs", type=Path, help="keep the run directories here (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="areal-bench-credit-") as tmp:
        runs = args.runs or Path(tmp)
        runs.mkdir(parents=True, exist_ok=True)
        rows = ([] if args.agentic_only else math_rows(args.quick, runs)) + agentic_rows(args.quick, runs)
    for row in rows:
        print(json.dumps(row), flush=True)
