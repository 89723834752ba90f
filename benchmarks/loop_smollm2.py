"""The training loop on a real model: asynchronous against synchronous, sandboxed against inline.

Three runs of `python -m areal.train --config-name smollm2` (SmolLM2-135M-Instruct on
reasoning-gym's chain_sum, as `make demo-smollm2` trains it), one after another, the same steps
and groups, no evaluation, DAPO's dynamic sampling off (every step then samples exactly its
groups, so the arms do the same work a step):

  * async: the config as it is: sandboxed episodes, staleness bound 1 (`max_head_offpolicyness`),
    so a step's episodes run while the trainer does the step before and pushes its weights;
  * sync: the same with the bound 0: rollouts and training alternate;
  * inline: async, with the agent in the controller's event loop instead of a sandbox.

Figures (benchmarks/e2e.py:run_stats, the steady state between the first and last step's
report): steps/s of async against sync (issue 35's target: >= 1.5x at the default bound) and
episodes/s of async (sandboxed) against inline (target: >= 0.95x), with the load average at each
run's start. On two cores the engine and the trainer each have one: async can hide the shorter
of generation and training, so its ceiling is (generate + train) / max(generate, train).

    python -m benchmarks.run loop_smollm2 [--quick]     # quick: 3 steps a run, 2 groups a step
    python -m benchmarks.loop_smollm2 [--quick]         # the same, its table printed

Each call trains a 135M model three times (full: 6 steps of 4 groups of 8 episodes each, about
4 minutes a run on two idle cores).
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.e2e import run_stats, train_run
from benchmarks.report import figure

ARMS = {
    "async": [],
    "sync": ["rollout.max_head_offpolicyness=0"],
    "inline": ["rollout.openai.mode=inline"],
}

_row = functools.partial(figure, "loop_smollm2")


def runs(quick: bool, tmp: str) -> dict[str, dict]:
    """Each arm's run_stats and its load average at start."""
    steps, groups = (3, 2) if quick else (6, 4)
    out = {}
    for name, overrides in ARMS.items():
        load = os.getloadavg()[0]
        run_dir = Path(tmp) / name
        wall = train_run(
            [
                "--config-name",
                "smollm2",
                f"trainer.steps={steps}",
                f"rollout.groups_per_step={groups}",
                "rollout.dynamic_sampling=false",
                "data.eval_size=0",
                "trainer.checkpoint_every=0",
                "save_trajectories=true",
                f"experiment_name=bench-loop-smollm2-{name}",
                *overrides,
            ],
            run_dir,
            timeout_s=3600,
        )
        out[name] = {**run_stats(run_dir), "load": load, "wall_s": wall}
    return out


def main(quick: bool) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="areal-bench-loop-smollm2-") as tmp:
        stats = runs(quick, tmp)
    a, s, i = stats["async"], stats["sync"], stats["inline"]
    loads = ", ".join(f"{name} {st['load']:.1f}" for name, st in stats.items())
    return [
        _row(
            "SmolLM2 loop steps/s, async (staleness bound 1)",
            a["steps_per_s"],
            "steps/s",
            "sync (bound 0), same run otherwise",
            s["steps_per_s"],
            note=f"steady state over {a['steps']} steps; load average at each run's start: {loads}",
        ),
        _row(
            "SmolLM2 loop episodes/s, sandboxed",
            a["episodes_per_s"],
            "ep/s",
            "inline (the controller's event loop)",
            i["episodes_per_s"],
            note="both asynchronous (bound 1)",
        ),
        _row("SmolLM2 loop trainer idle fraction, async", a["idle_fraction"], "fraction", "sync", s["idle_fraction"]),
        _row(
            "SmolLM2 loop mean step time, async",
            a["step_s_mean"],
            "s",
            "sync",
            s["step_s_mean"],
            note="the trainer's own step (metrics step_s)",
        ),
    ]


if __name__ == "__main__":
    for row in main(quick="--quick" in sys.argv[1:]):
        print(
            f"{row['metric']}: {row['value']:.4g} {row['unit']} against {row['baseline']} {row['baseline_value']:.4g}  {row.get('note', '')}"
        )
