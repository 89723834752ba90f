"""The design documents' commands, run as written for a couple of steps on CPU.

Each run starts the real embedded engine, gateway, sandbox (subproc) and trainer processes.
The RolloutWorkflow examples (OpenAI Agents, CAMEL) also have their workflow exercised directly
against the real engine, so their token records are checked even apart from a training run.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT
from run_checks import read_jsonl

TINY = [
    "total_train_steps=2",
    "train_dataset.batch_size=2",
    "gconfig.n_samples=2",
    "valid_dataset.size=4",
    "eval_samples=1",
    "train_dataset.size=50",
]


def _run(cmd: list[str], tmp_path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # `python3 script.py` needs the package importable
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run_dir = Path(out.stdout.split("run directory: ")[1].split()[0])
    assert run_dir.is_relative_to(tmp_path)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] or len(metrics) == 2
    assert (run_dir / "final" / "config.json").is_file() and (run_dir / "areal_config.json").is_file()
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.e2e
def test_agent_workflow_example_via_the_local_launcher_sandboxed(tmp_path):
    summary = _run(
        [
            sys.executable,
            "-m",
            "areal.launcher.local",
            "examples/agent_workflow/train.py",
            "--config",
            "examples/agent_workflow/config.yaml",
            "experiment_name=aw",
            "trial_name=t0",
            f"cluster.fileroot={tmp_path}",
            "rollout.openai.mode=subproc",
            *TINY,
        ],
        tmp_path,
    )
    assert summary["steps"] == 2 and summary["eval_before"]["n"] == 4


@pytest.mark.e2e
def test_agent_workflow_example_as_a_script_inline_with_a_tool_agent(tmp_path):
    summary = _run(
        [
            sys.executable,
            "examples/agent_workflow/train.py",
            "--config",
            "examples/agent_workflow/config.yaml",
            "scheduler.type=local",
            "rollout.openai.mode=inline",
            f"cluster.fileroot={tmp_path}",
            "workflow=areal.workflow.openai.math_agent.MathToolAgent",
            *TINY,
        ],
        tmp_path,
    )
    assert summary["steps"] == 2


def _load(path: str):
    spec = importlib.util.spec_from_file_location(f"example_{Path(path).parent.name.replace('-', '_')}", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_openai_agents_example_workflow_records_every_trajectory_with_its_reward():
    """The example's workflow, greedy, on the scripted model (replies fixed by contract on every
    build): each sample's calculator agent calls the tool, gets 42, answers \\boxed{42}. Every call
    is recorded with the episode's reward, discounted once per later turn."""
    from areal.api.cli_args import AgentRLConfig
    from areal.embedded import ensure_scripted_model
    from areal.embedded.scripted import AFTER_TOOL_TEXT, CALL_TEXT
    from areal.engine.client import EngineClient
    from areal.engine.launch import launch_embedded_engine
    from areal.utils.hf_utils import load_hf_tokenizer

    example = _load("examples/openai-agents/train_agents.py")
    cfg = AgentRLConfig()
    model_dir = str(ensure_scripted_model())
    tok = load_hf_tokenizer(model_dir)
    workflow = example.OpenAIAgentWorkflow(
        "areal.workflow.openai_agent.math_agent.build_calculator_agent",
        {},
        cfg.reward_fn_path,
        cfg.gconfig.new(n_samples=2, max_new_tokens=48, temperature=0.0),
        tok,
    )
    proc = launch_embedded_engine(model_dir)
    try:

        async def episode() -> dict:
            engine = EngineClient(proc.url)
            try:
                return await workflow.arun_episode(
                    engine, {"messages": [{"role": "user", "content": "What is 6 times 7?"}], "answer": "42"}
                )
            finally:
                await engine.close()

        rows = asyncio.run(episode())
    finally:
        proc.stop()
    assert len(rows) == 4  # two samples, a tool call and an answer each
    texts = sorted(tok.decode([t for t, m in zip(r.input_ids, r.loss_mask) if m], skip_special_tokens=False) for r in rows.values())
    assert texts == sorted([AFTER_TOOL_TEXT + tok.eos_token, CALL_TEXT + tok.eos_token] * 2)
    for row in rows.values():
        assert len(row.input_ids) == len(row.loss_mask) == len(row.logprobs)
    assert sorted(r.reward for r in rows.values()) == pytest.approx([0.9, 0.9, 1.0, 1.0])


@pytest.mark.e2e
def test_openai_agents_example_via_the_local_launcher(tmp_path):
    """A RolloutWorkflow object: the controller calls its arun_episode once per group."""
    summary = _run(
        [
            sys.executable,
            "-m",
            "areal.launcher.local",
            "examples/openai-agents/train_agents.py",
            "--config",
            "examples/openai-agents/config.yaml",
            "experiment_name=oa",
            "trial_name=t0",
            f"cluster.fileroot={tmp_path}",
            *TINY,
        ],
        tmp_path,
    )
    assert summary["steps"] == 2


@pytest.mark.e2e
def test_camel_example_via_the_local_launcher(tmp_path):
    """CAMEL ChatAgent on AReaLOpenAICompatibleModel over ArealOpenAI, in a RolloutWorkflow object."""
    summary = _run(
        [
            sys.executable,
            "-m",
            "areal.launcher.local",
            "examples/camel/train.py",
            "--config",
            "examples/camel/config.yaml",
            "experiment_name=camel",
            "trial_name=t0",
            f"cluster.fileroot={tmp_path}",
            *TINY,
        ],
        tmp_path,
    )
    assert summary["steps"] == 2
