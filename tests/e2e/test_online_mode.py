"""Online mode (areal/controller/online.py): agents that run outside the run start sessions over the
gateway's HTTP door with the admin key, call the model with the key they get, set their reward and
end or refresh the session; the run trains on those sessions.

The external agent here is a thread of the test process (the OpenAI SDK, given the gateway's root
as its base URL, as AReaL's online examples configure theirs), against a real run on the scripted
model: ``python -m areal.train rollout.openai.mode=online``, and an AReaL-shaped online script
(``PPOTrainer(config).train()`` with AReaL's online config keys) through
``python -m areal.launcher.local``. Checked: the refusals (a wrong admin key, a key the run did not
issue, a reward that is no number), a refresh reusing its key, every session trained with the
reward its client set (an unrewarded one with 0), the step's sessions forming one group.
Not covered: many concurrent external clients (the slots are claimed oldest first, one lock).
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from paths import ROOT
from run_checks import read_jsonl, train_cmd

ADMIN = "sk-online-admin-key-for-tests"
URL_LINE = re.compile(r"\[online\] external agents start episodes at (http://[^ ]+)/rl/start_session")


def _root_url(proc: subprocess.Popen, lines: queue.Queue[str], seen: list[str], timeout_s: float = 240) -> str:
    """The run's HTTP root, read off its console line (its output up to it goes to ``seen``, the rest
    on to ``lines``)."""
    deadline = time.monotonic() + timeout_s

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line == "":
            break
        seen.append(line)
        if m := URL_LINE.search(line):
            return m.group(1)
    raise AssertionError("the run never printed its online URL:\n" + "".join(seen)[-4000:])


def _external_agent(root: str, rewards: list[float | None], started_status: int) -> list[str]:
    """One session per entry of ``rewards`` (None: ended without one), refreshing its key between
    them and ending the last; checks the refusals on the way, and that each start is answered
    ``started_status`` (AReaL's v1 gateway: 200, its v2 one: 201). Returns the session ids."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=root, timeout=180) as http:
        assert http.post("/rl/start_session", json={}, headers={"Authorization": "Bearer sk-wrong-admin-key-123"}).status_code == 401
        assert http.post("/rl/start_session", json={"api_key": "sk-areal-not-issued"}, headers=admin).status_code == 400
        ids, key = [], None
        for i, reward in enumerate(rewards):
            started = http.post("/rl/start_session", json={"task_id": f"t{i}", **({"api_key": key} if key else {})}, headers=admin)
            assert started.status_code == started_status, started.text
            body = started.json()
            assert key is None or body["api_key"] == key  # a refresh keeps the key the agent was configured with
            key = body["api_key"]
            assert body["sessions"] == [{"session_id": body["session_id"], "session_api_key": key}]
            ids.append(body["session_id"])
            client = openai.OpenAI(base_url=root, api_key=key, max_retries=0)  # the root, without /v1
            for turn in range(1 + i % 2):
                reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"turn {turn}"}], max_tokens=4)
                assert reply.choices[0].message is not None
            mine = {"Authorization": f"Bearer {key}"}
            assert http.post("/rl/set_reward", json={"reward": "high"}, headers=mine).status_code == 400
            if reward is not None:
                assert http.post("/rl/set_reward", json={"reward": reward}, headers=mine).status_code == 200
        ended = http.post("/rl/end_session", headers={"Authorization": f"Bearer {key}"})
        assert ended.status_code == 200 and ended.json()["session_id"] == ids[-1], ended.text
        return ids


def _drive(
    cmd: list[str], cwd: Path, rewards: list[float | None], env: dict[str, str] | None = None, started_status: int = 200
) -> tuple[list[str], str]:
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    try:
        ids = _external_agent(_root_url(proc, lines, seen), rewards, started_status)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    while (line := lines.get(timeout=10)) != "":  # the pump ends with "" once the output closes
        seen.append(line)
    out = "".join(seen)
    assert proc.returncode == 0, out[-6000:]
    return ids, out


def _check_trained(run_dir: Path, ids: list[str], rewards: list[float | None]) -> None:
    episodes = {e["episode_id"]: e for e in read_jsonl(run_dir / "episodes.jsonl")}
    assert set(episodes) == set(ids)
    for episode_id, reward in zip(ids, rewards, strict=True):
        assert episodes[episode_id]["status"] == "ok", episodes[episode_id]
        assert episodes[episode_id]["reward"] == (reward or 0.0)
    assert len({e["group_id"] for e in episodes.values()}) == len(read_jsonl(run_dir / "metrics.jsonl"))  # a step's sessions: one group
    trained = [e for t in read_jsonl(run_dir / "trained_episodes-r0.jsonl") for e in t["episodes"]]
    assert sorted(trained) == sorted(ids)


@pytest.mark.e2e
def test_external_sessions_are_started_scored_refreshed_and_trained(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    rewards: list[float | None] = [1.0, 0.0, None, 0.5]
    cmd = train_cmd(
        run_dir,
        "model.path=scripted",
        "rollout.openai.mode=online",
        f"gateway.admin_key={ADMIN}",
        "trainer.steps=2",
        "rollout.groups_per_step=2",
        "rollout.n_samples=1",
        "rollout.max_head_offpolicyness=0",
        "data.eval_size=0",
    )
    ids, out = _drive(cmd, ROOT, rewards)
    assert "form one group" in out
    _check_trained(run_dir, ids, rewards)


ONLINE_SCRIPT = '''"""A training script in the shape of AReaL's online examples: no dataset, no workflow."""
import sys

from areal import PPOTrainer
from areal.api.cli_args import PPOConfig, load_expr_config

if __name__ == "__main__":
    config, _ = load_expr_config(sys.argv[1:], PPOConfig)
    with PPOTrainer(config) as trainer:  # as AReaL's openclaw example: no datasets, train() with no workflow
        trainer.train()
'''

ONLINE_CONFIG = """experiment_name: online-rl
trial_name: trial0
seed: 1
total_train_steps: 2
tokenizer_path: ${actor.path}
cluster:
  fileroot: /tmp/areal/experiments
scheduler:
  type: local
rollout:
  backend: "sglang:d1"
  _version: v2
  max_concurrent_rollouts: 256
  consumer_batch_size: ${train_dataset.batch_size}
  max_head_offpolicyness: 0
  agent:
    mode: online
    tool_call_parser: qwen
    export_style: individual
    turn_discount: 1.0
gconfig:
  n_samples: 1
  max_new_tokens: 64
  temperature: 1.0
actor:
  path: Qwen/Qwen2.5-1.5B-Instruct
  eps_clip: 0.4
  use_decoupled_loss: true
train_dataset:
  batch_size: 2
  path: "null"
  type: rl
"""


@pytest.mark.e2e
def test_an_areal_online_script_trains_on_external_sessions(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(ONLINE_SCRIPT)
    (tmp_path / "config.yaml").write_text(ONLINE_CONFIG)
    cmd = [sys.executable, "-m", "areal.launcher.local", str(tmp_path / "train.py"), "--config", str(tmp_path / "config.yaml")]
    cmd += ["actor.path=scripted", f"cluster.fileroot={tmp_path}", f"rollout.agent.admin_api_key={ADMIN}"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    rewards: list[float | None] = [1.0, 0.0, 0.0, 1.0]
    ids, _ = _drive(cmd, tmp_path, rewards, env, started_status=201)  # rollout._version: v2, as AReaL's hermes config
    run_dir = tmp_path / "online-rl" / "trial0"
    _check_trained(run_dir, ids, rewards)
    assert json.loads((run_dir / "config.json").read_text())["rollout"]["openai"]["mode"] == "online"


def test_a_short_admin_key_is_refused_naming_the_key() -> None:
    from areal.api.cli_args import InferenceEngineConfig, OpenAIProxyConfig

    with pytest.raises(ValueError, match="rollout.agent.admin_api_key must be at least 16 characters"):
        InferenceEngineConfig(openai=OpenAIProxyConfig(mode="online", admin_api_key="sk-test123456"))
