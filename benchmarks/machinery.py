"""The machinery: the share of a training run's wall time in which neither the engine generates nor
the trainer computes (waiting on weight pushes, sandbox spawns, the gateway, the rings).

Each configuration is one real run (`python -m areal.train`, sandboxed episodes, no held-out
evaluation) with `engine.busy_log=true`: the embedded engine writes its compute spans
(`engine_busy-<i>.jsonl`: generating, loading weights; areal/engine/busy.py) and the trainer's
step rows carry the wall-clock start of each optimizer step and of each weight push
(`step_started` + `step_s`, `publish_started` + `publish_s` in metrics.jsonl). Over the window
from the first optimizer step to the end of the last weight push (start-up excluded: the first
rollouts overlap the trainer's start):

    compute    = union(engine generating, trainer stepping)
    machinery  = window - compute           the figure; its part inside weight pushes
                                            (the trainer publishing or an engine loading) beside it

Rows: the machinery share of each configuration, against the same run's share of time in which
the engine generates (the baseline: how busy the run kept its engine), and the machinery's part
inside weight pushes. The first repeat of each configuration carries its timeline (engine,
trainer, weight push lanes), drawn as `machinery_<config>_timeline.png` by the report.

Configurations: the default config (the embedded model, the single-turn task) and
`--config-name smollm2` (SmolLM2-135M-Instruct, a 538 MB save and reload a step). Quick mode: the
embedded model alone, 3 steps of 2 groups; full: both, 8 steps (the SmolLM2 run at its config's
4 groups a step). Target (issue 35): under 10 % on SmolLM2.
"""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path
from typing import Any

from areal.engine.busy import read_spans
from benchmarks.e2e import _jsonl, train_run
from benchmarks.report import figure

_row = functools.partial(figure, "machinery")
Span = tuple[float, float]


def union(spans: list[Span]) -> list[Span]:
    """``spans`` merged where they overlap or touch, sorted; empty spans dropped."""
    out: list[Span] = []
    for s, e in sorted(x for x in spans if x[1] > x[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def clip(spans: list[Span], lo: float, hi: float) -> list[Span]:
    """``spans`` cut to the window [lo, hi]."""
    return [(max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi]


def length(spans: list[Span]) -> float:
    """Total length of ``spans`` (taken as disjoint: pass a ``union``)."""
    return sum(e - s for s, e in spans)


def gaps(spans: list[Span], lo: float, hi: float) -> list[Span]:
    """The parts of [lo, hi] that the disjoint, sorted ``spans`` do not cover."""
    out, at = [], lo
    for s, e in spans:
        if s > at:
            out.append((at, s))
        at = max(at, e)
    if at < hi:
        out.append((at, hi))
    return out


def overlap(a: list[Span], b: list[Span]) -> float:
    """Length of the intersection of two disjoint, sorted span lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def machinery_of(run_dir: Path) -> dict[str, Any]:
    """The run's window, its compute and machinery shares, the machinery's part inside weight
    pushes, and the lanes of its timeline (seconds from the window's start)."""
    engine = [x for f in sorted(run_dir.glob("engine_busy-*.jsonl")) for x in read_spans(f)]
    if not engine:
        raise ValueError(f"{run_dir}: no engine_busy-*.jsonl spans (engine.busy_log=true, embedded engine only)")
    steps = [m for m in _jsonl(run_dir / "metrics.jsonl") if "step_started" in m]
    if not steps:
        raise ValueError(f"{run_dir}: metrics.jsonl has no step_started: a trainer older than the busy log")
    generate = union([(s, e) for kind, s, e in engine if kind == "generate"])
    trainer = union([(m["step_started"], m["step_started"] + m["step_s"]) for m in steps])
    pushes = union(
        [(m["publish_started"], m["publish_started"] + m["publish_s"]) for m in steps if "publish_started" in m]
        + [(s, e) for kind, s, e in engine if kind == "load"]
    )
    # from the first optimizer step (the trainer's start-up, which the first rollouts overlap, is
    # not machinery of the loop) to the end of the last weight push
    lo, hi = trainer[0][0], max(e for _, e in pushes) if pushes else trainer[-1][1]
    window = hi - lo
    compute = union(clip(generate, lo, hi) + clip(trainer, lo, hi))
    idle = gaps(compute, lo, hi)

    def lane(spans: list[Span]) -> list[list[float]]:
        return [[round(s - lo, 4), round(e - lo, 4)] for s, e in clip(spans, lo, hi)]

    return {
        "window_s": window,
        "steps": len(steps),
        "machinery": length(idle) / window,
        "generating": length(clip(generate, lo, hi)) / window,
        "training": length(clip(trainer, lo, hi)) / window,
        "in_pushes": overlap(idle, union(clip(pushes, lo, hi))) / window,
        "timeline": {"engine generates": lane(generate), "trainer steps": lane(trainer), "weight push": lane(pushes)},
    }


CONFIGS = {  # name -> overrides of the run (beside the shared ones in _run)
    "embedded": ["rollout.groups_per_step=2"],
    "smollm2": ["--config-name", "smollm2"],
}


def _run(name: str, steps: int, tmp: str) -> dict[str, Any]:
    run_dir = Path(tmp) / name
    overrides = [
        *CONFIGS[name],
        f"trainer.steps={steps}",
        "data.eval_size=0",
        "engine.busy_log=true",
        "trainer.checkpoint_every=0",
        f"experiment_name=bench-machinery-{name}",
    ]
    train_run(overrides, run_dir, timeout_s=3600.0)
    return machinery_of(run_dir)


def main(quick: bool) -> list[dict]:
    names, steps = (["embedded"], 3) if quick else (["embedded", "smollm2"], 8)
    rows = []
    with tempfile.TemporaryDirectory(prefix="areal-bench-machinery-") as tmp:
        for name in names:
            m = _run(name, steps, tmp)
            what = f"{m['steps']} steps, {m['window_s']:.0f} s from the first optimizer step to the last weight push"
            rows += [
                _row(
                    f"machinery share of the run, {name}",
                    100 * m["machinery"],
                    "%",
                    "share in which the engine generates",
                    100 * m["generating"],
                    note=f"{what}; neither the engine generating nor the trainer stepping (benchmarks/machinery.py)",
                    timeline=m["timeline"],
                    plot=f"{name}_timeline",
                ),
                _row(
                    f"machinery inside weight pushes, {name}",
                    100 * m["in_pushes"],
                    "%",
                    "machinery share of the run",
                    100 * m["machinery"],
                    note="the trainer saving and pushing, or an engine loading, while nothing computes",
                ),
                _row(
                    f"share in which the trainer steps, {name}",
                    100 * m["training"],
                    "%",
                    "share in which the engine generates",
                    100 * m["generating"],
                ),
            ]
    return rows


if __name__ == "__main__":
    for row in main(quick="--quick" in sys.argv[1:]):
        print({k: v for k, v in row.items() if k != "timeline"})
