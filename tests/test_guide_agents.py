"""The guide's agents run the way a training run calls them: handed the runner's ``http_client``
(an ``httpx`` client), inline and sandboxed. anthropic >= 2.11 is built on ``httpx2`` and refuses
that client, which failed every episode of the Anthropic guide agent (80 of 80)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mode", ["inline", "subproc"])
def test_the_anthropic_guide_agent_runs_its_episodes(tmp_path, mode):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "areal.train",
            f"hydra.run.dir={run_dir}",
            "model.path=scripted",
            "rollout.agent=areal.workflow.anthropic.math_agent:MathAgent",
            f"rollout.openai.mode={mode}",
            "trainer.steps=1",
            "rollout.groups_per_step=1",
            "rollout.n_samples=2",
            "data.eval_size=0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    episodes = [json.loads(x) for x in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert episodes and all(e["status"] == "ok" and e["interactions"] == 1 for e in episodes), episodes
    assert proc.returncode == 0, proc.stderr[-3000:]
