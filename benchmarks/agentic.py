"""The agentic demo, measured: `make demo`'s run (conf/agentic.yaml: the calculator agent on
the embedded model's agentic variant), then the agent's held-out accuracy before and after RL.

    python -m benchmarks.agentic [--steps N] [--problems N] [--out DIR] [key=value ...]
    python -m benchmarks.run agentic [--quick]

Figures, from one run:
  * held-out accuracy of the agent (the calculator loop of ``agents/openai_tools.py``, run
    in-process by ``areal.embedded.agentic.probe_agent`` with the gateway's own tool-call parser
    and the agent's own calculator, sampled at temperature 1) on the same held-out problems and
    seeds with the initial and the trained weights, and the paired permutation test between them;
  * tool use on those problems, before and after: well-formed calls per episode, malformed-call
    replies per episode, tool errors per episode, share of answers equal to a tool result, share
    answered unaided;
  * the same statistics of the training episodes themselves, per fifth of the run (decoded from
    the run's calls.jsonl, which the viewer reads), next to the batch reward (metrics.jsonl);
  * the run's wall time.

The run evaluates the agent itself too (agentic.yaml sets data.eval_mode=agent): its summary.json
and evals.jsonl hold the agent's held-out accuracy before and after (the sandboxed agent through
the gateway, on the run's own held-out problems) with the paired test, and the tool-use statistics
counted by the gateway (areal/controller/agent_eval.py). This benchmark scores more problems, in-process,
with the figures the run does not count (tool errors, unaided answers); ``run_eval`` below is
the run's own evaluation, in its mode.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from areal.embedded.agentic import tool_use
from benchmarks.e2e import train_run

STATS = ("calls", "malformed", "tool_errors", "used_result", "answered_unaided")


def agent_eval(model_dir: str | Path, n: int, samples: int, seed: int = 0) -> dict[str, Any]:
    """``probe_agent`` on ``n`` held-out problems, ``samples`` seeded episodes each (1 thread)."""
    import torch
    from transformers import AutoModelForCausalLM

    from areal.embedded.agentic import probe_agent
    from areal.embedded.corpus import make_leveled_problems
    from areal.embedded.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    problems = make_leveled_problems("test", n, seed=seed)
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    runs = [probe_agent(model, tok, problems, seed=seed * 1000 + s) for s in range(samples)]
    per_problem = [sum(r["per_problem"][i] for r in runs) / samples for i in range(n)]
    return {
        "accuracy": sum(per_problem) / n,
        **{k: sum(r[k] for r in runs) / samples for k in STATS},
        "per_problem": per_problem,
    }


def training_tool_use(run_dir: Path, parts: int = 5) -> list[dict[str, Any]]:
    """Tool-use statistics of the recorded training episodes, per ``parts``-th of the versions."""
    pieces = json.loads((run_dir / "vocab.json").read_text())
    episodes = []
    for line in (run_dir / "calls.jsonl").read_text().splitlines():
        calls = json.loads(line)["calls"]
        if not calls:
            continue
        text = lambda ids: "".join(pieces[i] if i < len(pieces) else "" for i in ids)  # noqa: E731  # the lm head's padding rows: no text
        replies = [text(c["output_ids"]).replace("<|im_end|>", "") for c in calls]
        results = []
        for c in calls[1:]:  # each later call's new prompt tokens hold the tool responses it answers
            added = text(c["prompt_ids"])
            results += [r.split("</tool_response>")[0].strip("\n") for r in added.split("<tool_response>")[1:]]
        from areal.gateway.parsers import parse_output

        answer = parse_output(replies[-1], "qwen25", None).content
        episodes.append((calls[0]["versions"][0] if calls[0]["versions"] else 0, tool_use(replies, results, answer)))
    if not episodes:
        return []
    last = max(v for v, _ in episodes) + 1
    out = []
    for k in range(parts):
        lo, hi = last * k // parts, last * (k + 1) // parts
        chunk = [s for v, s in episodes if lo <= v < hi]
        if chunk:
            out.append({"versions": f"{lo}-{hi - 1}", "episodes": len(chunk), **{s: sum(e[s] for e in chunk) / len(chunk) for s in STATS}})
    return out


def measure(run_dir: Path, overrides: list[str], problems: int, samples: int, timeout_s: float) -> dict[str, Any]:
    from areal.controller.evaluation import paired_test
    from areal.embedded.agentic import ensure_agent_model

    initial = ensure_agent_model(progress=False)  # built before the clock starts
    wall = train_run(["--config-name", "agentic", *overrides], run_dir, timeout_s=timeout_s) if timeout_s else float("nan")
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    t0 = time.monotonic()
    before = agent_eval(initial, problems, samples)
    after = agent_eval(summary["final_model"], problems, samples)
    fifth = max(1, len(metrics) // 5)
    return {
        "run_dir": str(run_dir),
        "wall_s": round(wall, 1),
        "steps": len(metrics),
        "eval_s": round(time.monotonic() - t0, 1),
        "before": {k: v for k, v in before.items() if k != "per_problem"},
        "after": {k: v for k, v in after.items() if k != "per_problem"},
        "paired_test": paired_test(before["per_problem"], after["per_problem"]),
        "batch_reward": [
            {"steps": f"{m[0]['step']}-{m[-1]['step']}", "reward_mean": sum(x["reward_mean"] for x in m) / len(m)}
            for m in (metrics[i : i + fifth] for i in range(0, len(metrics), fifth))
        ],
        "training_tool_use": training_tool_use(run_dir),
        "run_eval": {
            "mode": summary.get("eval_mode"),
            **{k: (summary.get(k) or {}).get("sampled_acc") for k in ("eval_before", "eval_after")},
            "p_value": (summary.get("eval_test") or {}).get("p_value"),
        },
    }


def main(quick: bool) -> list[dict]:
    """The harness's entry: one run (quick, a smoke run: 4 steps, 20 problems; else the demo's settings)."""
    overrides = ["trainer.steps=4", "rollout.groups_per_step=2", "data.eval_size=10"] if quick else []
    with tempfile.TemporaryDirectory() as tmp:
        r = measure(Path(tmp) / "run", overrides, 20 if quick else 300, 1 if quick else 2, 1800.0)
    gain = r["after"]["accuracy"] - r["before"]["accuracy"]
    rows = [
        {
            "benchmark": "agentic",
            "metric": "held-out agent accuracy after RL",
            "value": r["after"]["accuracy"],
            "unit": "share",
            "baseline": "before RL, same problems and seeds",
            "baseline_value": r["before"]["accuracy"],
            "p_value": r["paired_test"]["p_value"],
        },
        {
            "benchmark": "agentic",
            "metric": "run wall time",
            "value": r["wall_s"],
            "unit": "s",
            "baseline": "the 15-minute budget",
            "baseline_value": 900.0,
        },
    ]
    rows += [
        {
            "benchmark": "agentic",
            "metric": f"{k} per episode after RL",
            "value": r["after"][k],
            "unit": "per episode",
            "baseline": "before RL",
            "baseline_value": r["before"][k],
        }
        for k in STATS
    ]
    print(f"agentic: held-out agent accuracy {r['before']['accuracy']:.3f} -> {r['after']['accuracy']:.3f} ({gain:+.3f})", file=sys.stderr)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=300, help="held-out problems scored before and after")
    parser.add_argument("--samples", type=int, default=2, help="episodes per held-out problem")
    parser.add_argument("--out", default="", help="run directory (default: a new one under runs/bench-agentic/)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="of the run; 0: measure the finished run in --out again")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of conf/agentic.yaml")
    args = parser.parse_args()
    out = Path(args.out or f"runs/bench-agentic/{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    result = measure(out, args.overrides, args.problems, args.samples, args.timeout)
    (out.parent / f"{out.name}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
