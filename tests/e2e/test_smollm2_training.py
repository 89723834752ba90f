"""SmolLM2-135M-Instruct (``model.path=smollm2-135m-instruct``), a real pretrained model, trained by
whole runs: full fine-tuning on one rank with sandboxed agents, and LoRA on two DDP ranks killed
with SIGKILL after a checkpoint and started again with the same command.

Mechanics only, never a learning figure: every trained token is one the engine served, with its
logprob and version (``check_trained_as_sampled``); the second start continues at the checkpoint's
step and every step is logged once; each step logs its seconds and the largest rank's peak RSS.
The agent's reward varies within every group whatever the model says, so each step moves weights.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from paths import ROOT
from run_checks import check_trained_as_sampled, read_jsonl, run_ok, three_step_run, train_cmd

MODEL = "model.path=smollm2-135m-instruct"
AGENT = """
import os
from openai import AsyncOpenAI

async def run(data, **kw):
    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["question"]}], max_tokens=12)
    return os.urandom(1)[0] / 255  # differs within a group whatever the model says
"""


def _agent(tmp_path: Path) -> str:
    (tmp_path / "agent.py").write_text(AGENT)
    return f"rollout.agent={tmp_path / 'agent.py'}:run"


def _steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return sum(1 for line in path.read_text().splitlines() if line.strip()) if path.is_file() else 0


@pytest.mark.e2e
def test_full_fine_tuning_trains_exactly_the_tokens_the_engine_served(tmp_path):
    run_dir = tmp_path / "run"
    run_ok(three_step_run(run_dir, MODEL, _agent(tmp_path), "rollout.n_samples=2", "trainer.lr=1e-5"), timeout_s=900)
    check_trained_as_sampled(run_dir)
    trainer_steps = read_jsonl(run_dir / "trainer_metrics.jsonl")
    assert all(m["step_s"] > 0 and m["peak_rss_mb"] > 500 for m in trainer_steps), trainer_steps  # fp32 weights alone are 538 MB
    assert json.loads((run_dir / "final" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


@pytest.mark.e2e
def test_lora_on_two_ranks_killed_after_a_checkpoint_continues_with_the_same_command(tmp_path):
    run_dir = tmp_path / "run"
    cmd = train_cmd(
        run_dir,
        MODEL,
        _agent(tmp_path),
        "rollout.openai.mode=inline",
        "trainer.steps=3",
        "rollout.groups_per_step=2",
        "rollout.n_samples=2",
        "rollout.max_head_offpolicyness=0",
        "data.eval_size=0",
        "trainer.ranks=2",
        "trainer.lora.rank=8",
        "trainer.lr=1e-4",
        "trainer.checkpoint_every=1",
    )
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 900
        while _steps_logged(run_dir) < 2:  # step 2 logged: the checkpoint of step 1 is whole
            assert proc.poll() is None, f"the run ended before the kill: {proc.stderr.read().decode()[-3000:]}"
            assert time.monotonic() < deadline, "no second step in time"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, "the run finished before the kill"
    assert (run_dir / "checkpoints" / f"step-{1:08d}").is_dir()

    again = run_ok(cmd, timeout_s=900)
    assert "resuming from step" in again.stdout + again.stderr, again.stderr[-3000:]
    plan = json.loads(sorted(run_dir.glob("resume-*.json"))[-1].read_text())
    assert plan["step"] >= 1
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3]
    trainer_steps = read_jsonl(run_dir / "trainer_metrics.jsonl")
    assert [m["step"] for m in trainer_steps] == [1, 2, 3]
    assert all(m["peak_rss_mb"] > 0 and m["step_s"] > 0 for m in trainer_steps)
    # Each rank trained its share of every step, and no episode twice across the two starts.
    trained = [t for r in (0, 1) for t in read_jsonl(run_dir / f"trained_episodes-r{r}.jsonl")]
    assert sorted(t["step"] for t in trained) == [1, 1, 2, 2, 3, 3]
    assert max(Counter(e for t in trained for e in t["episodes"]).values()) == 1
    assert (run_dir / "final" / "config.json").is_file()
