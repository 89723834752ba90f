"""Asynchronous against synchronous RL: steps/s with an agent that waits on a tool.

Each call runs `python -m areal.train` twice with the same small configuration and the agent
`benchmarks/slow_agent.py:SlowAgent` (sleeps `SLOW_AGENT_TOOL_S` to emulate tool latency, then one
gateway call), in `inline` mode so the figure is about scheduling, not sandbox spawn cost:

  * async: `rollout.max_head_offpolicyness=1`: episodes of step i+1 run while the trainer does
    step i and pushes its weights;
  * sync (baseline): `max_head_offpolicyness=0`: no episode starts before the weights it will
    be sampled with are in the engine, so rollouts and training alternate.

Figures come from the run directories through `benchmarks/e2e.py:run_stats` (steady state between
the first and last optimizer step; see that docstring for how idle time and staleness are
derived). Published anchors for the same ratio on GPUs: AReaL 2.77x, verl fully-async
2.35-2.67x; with one tool wait per episode and a trainer step shorter than the wait, the
ideal here is (wait + generation + step + push) / max(wait + generation, step + push).

    python -m benchmarks.run async_rl [--quick]
"""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path

from benchmarks.e2e import run_stats, small_run, train_run
from benchmarks.report import figure

AGENT = "benchmarks/slow_agent.py:SlowAgent"


_row = functools.partial(figure, "async_rl")


def main(quick: bool) -> list[dict]:
    tool_s = 0.25 if quick else 1.0  # quick: a smoke; a shorter wait keeps the two runs short
    stats = {}
    with tempfile.TemporaryDirectory(prefix="areal-bench-async-") as tmp:
        for name, offpolicy in (("async", 1), ("sync", 0)):
            run_dir = Path(tmp) / name
            train_run(
                [
                    *small_run(quick),
                    f"rollout.agent={AGENT}",
                    "rollout.openai.mode=inline",
                    f"rollout.max_head_offpolicyness={offpolicy}",
                    f"experiment_name=bench-async-{name}",
                ],
                run_dir,
                env={"SLOW_AGENT_TOOL_S": str(tool_s)},
            )
            stats[name] = run_stats(run_dir)
    a, s = stats["async"], stats["sync"]
    return [
        _row(
            f"steps/s, async (staleness bound 1), tool {tool_s:g} s",
            a["steps_per_s"],
            "steps/s",
            "sync (bound 0), same agent",
            s["steps_per_s"],
            note="steady state: (steps - 1) / time between the first and last step's report",
        ),
        _row("episodes/s, async", a["episodes_per_s"], "ep/s", "sync", s["episodes_per_s"]),
        _row(
            "trainer idle fraction, async",
            a["idle_fraction"],
            "fraction",
            "sync",
            s["idle_fraction"],
            note="time the trainer waited for each batch's last trajectory after its previous step, / span",
        ),
        _row(
            "staleness mean, async",
            a["staleness_mean"],
            "versions",
            "sync (0 by construction)",
            s["staleness_mean"],
            histogram={str(k): n for k, n in a["staleness_hist"].items()},
        ),
    ]


if __name__ == "__main__":
    for row in main(quick="--quick" in sys.argv[1:]):
        print(row)
