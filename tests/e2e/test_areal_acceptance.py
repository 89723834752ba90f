"""Acceptance for AReaL users (issue 22): scripts and configs written the AReaL way run unchanged.

tests/support/areal_examples/ holds a training script in the shape of each of AReaL's examples (its
imports, ``load_expr_config``, ``PPOTrainer``, both workflow styles) and a config.yaml carrying
every key of AReaL's example config. Each runs through ``python -m areal.launcher.local`` with
only the model and dataset paths and the run's length overridden (``key=value``; ``~key``
deletes one), on the embedded default model, fetching nothing. Checked: one warning names every
key that has no effect, each with its own reason; the keys that do have one reach the run; the
grouping follows the workflow's style; the run trains (a step with a non-zero advantage), or
says loudly for each step that it cannot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from paths import ROOT
from run_checks import read_jsonl

from areal.api.areal_keys import UNKNOWN_KEY

EXAMPLES = ROOT / "tests" / "support" / "areal_examples"
SHORT = [
    "actor.path=embedded",
    "train_dataset.path=embedded",
    "valid_dataset.path=embedded",
    "total_train_steps=2",
    "train_dataset.size=50",
    "valid_dataset.size=4",
    "eval_samples=1",
]
WARNING_HEAD = "AReaL config key(s) have no effect in this system:"
DEAD_STEP = "this step trains nothing"


def _launch(script: str, config: str, tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    cmd = [sys.executable, "-m", "areal.launcher.local", str(EXAMPLES / script), "--config", str(EXAMPLES / config)]
    cmd += [*SHORT, f"cluster.fileroot={tmp_path}", *overrides]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the launcher adds the project itself
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = OmegaConf.load(EXAMPLES / config)
    return proc, tmp_path / names.experiment_name / names.trial_name


def _ignored(stderr: str) -> dict[str, str]:
    """The one warning's keys, each with its reason."""
    assert stderr.count(WARNING_HEAD) == 1, stderr[-3000:]
    out: dict[str, str] = {}
    for line in stderr.split(WARNING_HEAD, 1)[1].splitlines()[1:]:
        keys, _, why = line.strip().partition(": ")
        if not line.startswith("  ") or not why:
            break
        out.update(dict.fromkeys(keys.split(", "), why))
    return out


def _check_trains(proc: subprocess.CompletedProcess, run_dir: Path) -> None:
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    dead = proc.stdout.count(DEAD_STEP)  # one per step's worth of groups published, trained or not yet
    assert any(m["adv_nonzero_frac"] > 0 for m in metrics) or dead >= len(metrics), (metrics, proc.stdout[-2000:])
    assert (run_dir / "final" / "config.json").is_file()


def _calls_per_group(run_dir: Path) -> dict[str, list[int]]:
    """Each group's calls (episodes), as the interactions each recorded (0 for a failed call)."""
    groups: dict[str, list[int]] = {}
    for line in (run_dir / "episodes.jsonl").read_text().splitlines():
        e = json.loads(line)
        groups.setdefault(e["group_id"], []).append(e["interactions"] if e["status"] == "ok" else 0)
    return groups


@pytest.mark.e2e
def test_the_agent_workflow_script_runs_sandboxed_with_every_areal_key(tmp_path):
    proc, run_dir = _launch("agent_workflow/train.py", "agent_workflow/config.yaml", tmp_path, "~perf_tracer")
    ignored = _ignored(proc.stderr)
    for key in ("enable_offload", "cluster.n_gpus_per_node", "rollout.backend", "rollout.queue_size", "actor.backend", "actor.dtype"):
        assert key in ignored, key
    for key in (
        "actor.reward_scaling",
        "actor.adv_norm",
        "actor.rejection_sampling",
        "ref",
        "sglang",
        "vllm",
        "saver",
        "recover.freq_secs",
    ):
        assert key in ignored, key
    assert "evaluator.freq_epochs" in ignored and "evaluator.freq_steps" not in ignored  # freq_steps: data.eval_every
    assert "stats_logger.wandb" not in ignored  # wandb.mode: disabled is honoured
    assert not [k for k, why in ignored.items() if why == UNKNOWN_KEY]  # each key of AReaL's file has its own reason
    assert "perf_tracer" not in ignored  # deleted with ~perf_tracer
    assert "read as 'embedded'" in ignored["rollout.backend"]
    config = json.loads((run_dir / "config.json").read_text())
    rollout, trainer = config["rollout"], config["trainer"]
    assert config["recover"] == {"mode": "off"}  # recover.mode: disabled, honoured
    assert rollout["agent"] == "areal.workflow.openai.math_agent:MathAgent" and rollout["openai"]["mode"] == "subproc"
    assert rollout["agent_kwargs"] == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 1024, "max_completion_tokens": 48, "max_turns": 4}
    assert (rollout["n_samples"], rollout["groups_per_step"], config["seed"]) == (4, 2, 7)
    assert (trainer["lr"], trainer["clip_eps"], trainer["loss"]) == (3e-5, 0.2, "ppo")
    assert config["gateway"]["reasoning_parser"] == "think"  # reasoning_parser: qwen3, SGLang's name of this parser
    assert config["data"]["eval_temperature"] == 0.6  # the script's eval_workflow_kwargs
    assert all(len(calls) == 4 for calls in _calls_per_group(run_dir).values())  # an agent: one episode per sample
    _check_trains(proc, run_dir)


@pytest.mark.e2e
@pytest.mark.parametrize("one_per_call", [False, True], ids=["group_per_call", "one_trajectory_per_call"])
def test_the_openai_agents_script_runs_in_both_workflow_styles(tmp_path, one_per_call):
    overrides = ["~launcher", f"one_trajectory_per_call={str(one_per_call).lower()}"]
    overrides += ["agent_builder_path=areal.workflow.openai_agent.math_agent.build_calculator_agent"]
    proc, run_dir = _launch("openai_agents/train_agents.py", "openai_agents/config.yaml", tmp_path, *overrides)
    ignored = _ignored(proc.stderr)
    for key in ("allocation_mode", "actor.group_size", "rollout.consumer_batch_size", "sglang", "ref"):
        assert key in ignored, key
    assert not [k for k, why in ignored.items() if why == UNKNOWN_KEY] and "launcher" not in ignored
    config = json.loads((run_dir / "config.json").read_text())
    assert "actor.dynamic_sampling" not in ignored and config["rollout"]["dynamic_sampling"] is False  # honoured: the file says false
    assert config["trainer"]["behav_weight_cap"] == 4.0 and config["trainer"]["weight_decay"] == 0.01
    assert config["gateway"]["context_length"] == 1024  # gconfig.max_tokens: AReaL's limit of prompt + sampled tokens
    calls = _calls_per_group(run_dir)
    if one_per_call:  # AReaL now: n_samples calls per prompt, each one trajectory
        assert all(len(c) == 4 for c in calls.values()), calls
    else:  # the call samples the group itself: one call per prompt, n_samples clients in it (besides
        # calls that failed on what the model wrote, e.g. a tool name it made up: logged, 0 here)
        assert all(len(c) - c.count(0) <= 1 for c in calls.values()), calls  # at most one ok call a group
        assert any(n >= 4 for c in calls.values() for n in c), calls
    _check_trains(proc, run_dir)
