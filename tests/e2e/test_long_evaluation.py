"""A long evaluation before training, in whole runs.

The report: on SmolLM2-135M-Instruct with 40 held-out problems, the evaluation before training
outlasted the trainer's fixed 600 s wait for its first trajectory, so the trainer exited; the
controller, busy evaluating, noticed only minutes later; the console said nothing meanwhile.

Each run here has an inline agent whose held-out episode on the row marked ``gated`` waits for a
file the test writes, so the evaluation before training lasts as long as the test wants (the
row marked ``quick`` is done at once); data.eval_mode is left at auto, which picks that agent.
Nothing is timed: each test waits for an event (a progress
line, the trainer waiting on its ring) before it acts.
- The evaluation outlasts ``trainer.record_timeout_s``, and the run still trains.
- The trainer killed while the evaluation waits stops the run, naming the trainer and its log;
  the evaluation, still waiting, never finished.
- The evaluation's progress lines reach the console while it runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

import pytest
from paths import ROOT
from run_checks import children, one_step_run, read_jsonl

pytestmark = pytest.mark.e2e  # whole runs

RECORD_TIMEOUT_S = 0.5
AGENT = """
import asyncio
import os

from openai import AsyncOpenAI


async def run(data, **kw):
    if data.get("held_out") == "quick":
        return 1.0
    if data.get("held_out") == "gated":  # waits for the test
        while not os.path.exists(GATE):
            await asyncio.sleep(0.05)
        return 0.0
    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["question"]}], max_tokens=8)
    return 1.0
"""


class Run:
    """``python -m areal.train`` in the background, its stdout and stderr read as they come."""

    def __init__(self, tmp_path: Path) -> None:
        self.run_dir, self.gate = tmp_path / "run", tmp_path / "gate"
        (tmp_path / "gated_agent.py").write_text(f"GATE = {str(self.gate)!r}\n" + AGENT)
        rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
        (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        held_out = [{"question": "quick", "answer": "1", "held_out": "quick"}, {"question": "gated", "answer": "1", "held_out": "gated"}]
        (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held_out))
        cmd = one_step_run(
            self.run_dir,
            f"rollout.agent={tmp_path / 'gated_agent.py'}:run",
            f"data.train={tmp_path / 'train.jsonl'}",
            f"data.eval={tmp_path / 'eval.jsonl'}",
            # data.eval_mode=auto (the default): the run's own agent (rollout.agent is the test's) scores the held-out rows
            "data.eval_samples=1",  # 2 problems x (1 sampled + 1 greedy): 4 episodes, 2 of them gated
            "rollout.groups_per_step=1",
            "rollout.n_samples=2",
            "rollout.deadline_s=3600",  # a gated episode ends when the test opens the gate, never by its deadline
            f"trainer.record_timeout_s={RECORD_TIMEOUT_S}",
        )
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # lines as they are written, as on a terminal
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self.out: list[str] = []
        self.err: list[str] = []
        streams = ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        self.readers = [threading.Thread(target=self._read, args=stream, daemon=True) for stream in streams]
        for t in self.readers:
            t.start()

    @staticmethod
    def _read(stream: IO[str], lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def console(self) -> str:
        return "".join(self.out) + "".join(self.err)

    def wait_for_line(self, text: str, timeout_s: float = 240) -> None:
        """Until a line of stdout holds ``text`` (the run still going)."""
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.out):
            assert self.proc.poll() is None, f"the run ended (code {self.proc.returncode}) before {text!r}:\n{self.console()[-4000:]}"
            assert time.monotonic() < deadline, f"no {text!r} in {timeout_s} s:\n{self.console()[-4000:]}"
            time.sleep(0.05)

    def trainer_waiting(self, timeout_s: float = 240) -> int:
        """The trainer's pid once it waits for records (its ring mapped); 0 when it has exited
        already (the old fixed wait ran out)."""
        deadline, seen = time.monotonic() + timeout_s, 0
        while time.monotonic() < deadline:
            trainers = children(self.proc.pid, b"areal.trainer")
            if seen and seen not in trainers:
                return 0
            if trainers:
                seen = trainers[0]
                try:
                    if "/dev/shm/areal-" in Path(f"/proc/{seen}/maps").read_text():
                        return seen
                except (FileNotFoundError, ProcessLookupError):
                    return 0
            assert self.proc.poll() is None, f"the run ended (code {self.proc.returncode}):\n{self.console()[-4000:]}"
            time.sleep(0.05)
        raise AssertionError(f"the trainer did not start waiting for records in {timeout_s} s:\n{self.console()[-4000:]}")

    def wait(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout=timeout_s)
        for t in self.readers:
            t.join(timeout=10)
        return code

    def stop(self) -> None:
        """The run and whatever it started, by its process group (the run leads its own)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _evals(run_dir: Path) -> list[dict]:
    path = run_dir / "evals.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_an_evaluation_before_training_longer_than_the_record_timeout_still_trains(tmp_path):
    """Before, the trainer gave up after trainer.record_timeout_s without a record, evaluation or not."""
    run = Run(tmp_path)
    try:
        run.wait_for_line("[eval] before training: 2/4 episodes")  # under way: the gated half waits
        run.trainer_waiting()
        time.sleep(4 * RECORD_TIMEOUT_S)  # the trainer has waited for its first record past its record timeout
        run.gate.touch()
        code = run.wait(300)
    finally:
        run.stop()
    assert code == 0, run.console()[-5000:]
    steps = read_jsonl(run.run_dir / "metrics.jsonl")
    assert [m["step"] for m in steps] == [1]
    before = [e for e in _evals(run.run_dir) if e["name"] == "before"]
    assert len(before) == 1 and before[0]["n"] == 2
    # the console followed the evaluation: a line as it started, then one per tenth of its episodes
    out = "".join(run.out)
    for done in range(5):
        assert f"[eval] before training: {done}/4 episodes" in out, out[-3000:]
    assert "[eval] after training (v1): 4/4 episodes" in out
    # each ended with its summary line; the one before training took as long as the gate stayed shut
    assert "[eval] before training: done in " in out and "[eval] after training (v1): done in " in out, out[-3000:]
    assert before[0]["wall_s"] >= 4 * RECORD_TIMEOUT_S and before[0]["sampled_acc"] == 0.5  # quick 1.0, gated 0.0: the agent's rewards


def test_a_trainer_killed_during_the_evaluation_before_training_stops_the_run_naming_it(tmp_path):
    """Before, the controller listened to the trainer only after the evaluation: killed while it
    ran, the trainer's death went unnoticed until it ended (here: never, the gate stays shut)."""
    run = Run(tmp_path)
    try:
        run.wait_for_line("[eval] before training: 2/4 episodes")  # the progress shows while it runs
        trainer = run.trainer_waiting()
        assert trainer, run.console()[-4000:]
        os.killpg(trainer, signal.SIGKILL)  # the trainer leads its own process group
        code = run.wait(120)
    finally:
        run.stop()
    err = "".join(run.err)
    assert code != 0
    assert "trainer process exited with code -9 without finishing; log tail (trainer.log)" in err, err[-4000:]
    # The evaluation never finished (its gated episodes were still waiting): nothing of it recorded, nothing trained.
    assert not run.gate.exists()
    assert not [e for e in _evals(run.run_dir) if e["name"] == "before"]
    assert not (run.run_dir / "eval_episodes.jsonl").exists()  # written only by a finished evaluation
    assert not (run.run_dir / "metrics.jsonl").exists() or not (run.run_dir / "metrics.jsonl").read_text()
