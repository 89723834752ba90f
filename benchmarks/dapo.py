"""DAPO's dynamic sampling on the agentic demo, against the same run without it.

Two runs of `make demo`'s run (`--config-name agentic`: the calculator agent, up to 4 calls,
sandboxed, on the embedded model's agentic variant), identical but for `rollout.dynamic_sampling`
(docs/algorithms.md: a finished group whose rewards are all equal is dropped, recorded, and
replaced by another prompt's). Full mode: the config's 60 steps x 8
groups x 8 episodes and its evaluation (100 held-out problems x 2 sampled episodes); quick: 2
steps x 2 groups, 4 x 1. The two runs go side by side (same load on each). Figures, from the run
directories:

  * the run's own held-out agent accuracy after training (summary.json), its change from before,
    and the paired sign-flip p-value of that change;
  * the groups that trained nothing (all advantages 0) per step in the baseline arm against the
    groups dropped and replaced with dynamic sampling (metrics.jsonl: adv_nonzero_frac,
    groups_dropped, groups_sampled);
  * learning curves per step: batch reward of the trained groups (reward_mean) and the share of
    trained episodes with a nonzero advantage, both arms on the same axes
    (`dapo_curves.png`);
  * the wall time of each run: dropped groups are episodes sampled and not trained on.

Not covered: several seeds per arm (the agent's requests carry no seed, so two runs of one arm
differ too); the overlong settings (the demo's calls rarely reach their max_tokens).

    python -m benchmarks.run dapo [--quick]
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.credit import _jsonl, _last_third, agentic_demo_overrides
from benchmarks.e2e import train_run
from benchmarks.report import figure

_row = functools.partial(figure, "dapo")
BASE = "the same run without dynamic sampling, same harness run"
CURVES = {"reward_mean": "batch reward", "adv_nonzero_frac": "share of trained episodes with a nonzero advantage"}


def arm_overrides(quick: bool, dynamic: bool) -> list[str]:
    name = f"bench-dapo-{'dynamic' if dynamic else 'plain'}"
    return agentic_demo_overrides(quick, name, f"rollout.dynamic_sampling={str(dynamic).lower()}")


def main(quick: bool) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="areal-bench-dapo-") as tmp:
        return rows(quick, Path(tmp))


def rows(quick: bool, runs: Path) -> list[dict[str, Any]]:
    summaries: dict[bool, dict[str, Any]] = {}
    metrics: dict[bool, list[dict[str, Any]]] = {}
    dirs = {dynamic: runs / ("dynamic" if dynamic else "plain") for dynamic in (False, True)}
    # The two arms side by side, so that both see the same machine load (each gets about one core)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {d: pool.submit(train_run, arm_overrides(quick, d), run_dir, 3600.0) for d, run_dir in dirs.items()}
        walls = {d: f.result() for d, f in futures.items()}
    for dynamic, run_dir in dirs.items():
        summaries[dynamic] = json.loads((run_dir / "summary.json").read_text())
        metrics[dynamic] = [m for m in _jsonl(run_dir / "metrics.jsonl") if "reward_mean" in m]
    before = {d: s["eval_before"]["sampled_acc"] for d, s in summaries.items()}
    after = {d: s["eval_after"]["sampled_acc"] for d, s in summaries.items()}
    p_value = {d: s["eval_test"]["p_value"] for d, s in summaries.items()}
    curves = {key: {"dynamic sampling": [m[key] for m in metrics[True]], "without": [m[key] for m in metrics[False]]} for key in CURVES}
    dropped = sum(m.get("groups_dropped", 0) for m in metrics[True])
    sampled = sum(m.get("groups_sampled", 0) for m in metrics[True])
    idle = sum(1.0 - m["adv_nonzero_frac"] for m in metrics[False]) / max(len(metrics[False]), 1)
    held_out = "the run's own agent evaluation (summary.json)"
    out = [
        _row("held-out agent accuracy after training, dynamic sampling", after[True], "acc", BASE, after[False], note=held_out),
        _row(
            "held-out agent accuracy change over training, dynamic sampling",
            after[True] - before[True],
            "acc points",
            BASE,
            after[False] - before[False],
        ),
        _row("paired p-value of the held-out change, dynamic sampling", p_value[True], "p", BASE, p_value[False]),
        _row("wall time of the run, dynamic sampling", walls[True], "s", BASE, walls[False], note="both evaluations included"),
    ]
    notes = {
        "adv_nonzero_frac": f"without: on average {idle:.3f} of a step's episodes train nothing; with: {dropped} groups dropped "
        f"and replaced, {sampled} groups with signal",
        "reward_mean": "the trained groups' mean reward: with dynamic sampling only groups with both outcomes are trained, so it "
        "is not the policy's success rate",
    }
    for key, name in CURVES.items():  # each curve's last third, both arms, with the curves for the plot
        out.insert(
            -1,
            _row(
                f"{name}, last third of the steps, dynamic sampling",
                _last_third(curves[key]["dynamic sampling"]),
                "share" if key == "adv_nonzero_frac" else "reward",
                BASE,
                _last_third(curves[key]["without"]),
                curves={f"{name}: {arm}": ys for arm, ys in curves[key].items()},
                note=notes[key],
            ),
        )
    return out


if __name__ == "__main__":
    import sys

    for r in main("--quick" in sys.argv):
        print(json.dumps(r))
