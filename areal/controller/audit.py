"""Auditing a finished run: every trained token against what the engine served.

A run made with ``AUDITED_RUN`` (3 synchronous steps of 2 groups, trajectories saved, the
engine's request log on) leaves what ``audit_run`` joins: the engine's ``engine_requests.jsonl``
(prompt ids, sampled ids, logprobs, weight version per generation), the controller's
``trajectories.bin`` (what it published to the trainer) and the trainer's
``trained_episodes-r*.jsonl`` and ``trainer_metrics.jsonl``. The tests' checks
(tests/support/run_checks.py) and the GPU proof (benchmarks/gpu_check.py) read runs this way.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from areal.controller.trajectories import read_saved_trajectories

# The overrides of an audited run: synchronous (bound 0: step k trains on version k-1's episodes),
# 3 steps of 2 groups, no evaluation, with what the audit reads recorded
AUDITED_RUN = (
    "trainer.steps=3",
    "rollout.groups_per_step=2",
    "rollout.max_head_offpolicyness=0",
    "data.eval_size=0",
    "save_trajectories=true",
    "engine.request_log=true",
)


def audit_run(run_dir: Path) -> dict:
    """Every trained token of a finished run against the engine's request log: each row's sampled
    tokens are a generation the engine served (prompt first), with its logprobs and weight
    version; each published episode trained exactly once; the trainer's token count equals the
    sampled tokens published. Returns the counts and what did not hold."""
    served: dict[tuple, list[dict]] = {}
    for line in (run_dir / "engine_requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        served.setdefault(tuple(r["input_ids"]), []).append(r)
    published = read_saved_trajectories(run_dir / "trajectories.bin")
    problems, tokens, rows, worst = [], 0, 0, 0.0
    for traj in published:
        for row in traj.rows():
            rows += 1
            mask = row.loss_mask.astype(bool)
            n_prompt = int((~mask).sum())
            prompt, sampled = tuple(row.input_ids[:n_prompt].tolist()), row.input_ids[mask].tolist()
            matches = [r for r in served.get(prompt, []) if r["output_ids"] == sampled]
            if not matches:
                problems.append(f"episode {traj.episode_id}: sampled tokens the engine never served")
                continue
            gap = min(float(np.abs(np.array(r["output_logprobs"]) - row.logprobs[mask]).max()) for r in matches)
            worst = max(worst, gap)
            versions = {int(r["weight_version"]) for r in matches if str(r["weight_version"]).isdigit()}
            if not set(row.versions[mask].tolist()) <= versions:
                problems.append(f"episode {traj.episode_id}: versions {set(row.versions[mask].tolist())} not the served {versions}")
            tokens += int(mask.sum())
    trained = [json.loads(line) for line in (run_dir / "trained_episodes-r0.jsonl").read_text().splitlines()]
    ids = [e for t in trained for e in t["episodes"]]
    if sorted(ids) != sorted(t.episode_id for t in published):
        problems.append("the episodes trained are not each published episode exactly once")
    trainer_tokens = sum(json.loads(line)["tokens"] for line in (run_dir / "trainer_metrics.jsonl").read_text().splitlines())
    if trainer_tokens != tokens:
        problems.append(f"the trainer counted {trainer_tokens} tokens, the published rows hold {tokens} sampled")
    if worst > 1e-6:
        problems.append(f"recorded logprobs differ from the served ones by {worst:.2e}")
    return {"episodes": len(published), "rows": rows, "tokens_checked": tokens, "problems": problems}
