"""How fast a run notices a dead component, same run: SIGKILL the sandbox zygote, or the engine,
in the middle of a real short training run, and time what follows.

Figures (seconds from the kill), each next to the run's own median step time (the time between
two metrics lines before the kill), the rhythm a user watches the run by:
- zygote killed: until the controller says it restarts it, and until the first episode of a
  re-admitted group is logged (the run works again);
- engine killed: until the run has stopped, naming the engine (before, a run whose trainer was
  waiting for data went on until a 600 s no-data timeout).

Agents sleep 0.4 s per episode so that kills land with episodes in flight; the model is the
scripted one (areal/embedded/scripted.py), so the figures do not depend on a build.
Quick mode runs the zygote's run 6 steps instead of 12 (the kill lands after step 3 in both).

    python -m benchmarks.run [--quick] faults
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from areal.process import descendants

ROOT = Path(__file__).resolve().parents[1]
AGENT = """
import asyncio
from openai import AsyncOpenAI

async def run(data, **kw):
    await asyncio.sleep(0.4)
    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["question"]}], max_tokens=8)
    return 1.0
"""


def _child(pid: int, module: bytes) -> int | None:
    """The descendant of ``pid`` running ``module`` (the run's engine and trainer are children of
    its fork server)."""
    found = descendants(pid, module)
    return found[0] if found else None


class _Run:
    """A training run whose output lines are time-stamped as they arrive."""

    def __init__(self, tmp: Path, mode: str, steps: int) -> None:
        (tmp / "agent.py").write_text(AGENT)
        self.run_dir = tmp / f"run-{mode}"
        cmd = [
            sys.executable,
            "-m",
            "areal.train",
            f"hydra.run.dir={self.run_dir}",
            f"rollout.agent={tmp / 'agent.py'}:run",
            "model.path=scripted",
            f"rollout.openai.mode={mode}",
            f"trainer.steps={steps}",
            "rollout.groups_per_step=2",
            "rollout.n_samples=2",
            "rollout.max_head_offpolicyness=0",
            "data.eval_size=0",
        ]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    def step_times(self) -> list[float]:
        """Wall times at which metrics lines appeared (read back from metrics.jsonl's own clock)."""
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(x)["time"] for x in path.read_text().splitlines()] if path.exists() else []

    def wait_steps(self, n: int, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.step_times()) < n:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"run ended or stalled before step {n}: {''.join(x for _, x in self.lines[-20:])}")
            time.sleep(0.05)

    def wait_line(self, text: str, after: float, timeout_s: float = 120) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if t >= after and text in line:
                    return t
            time.sleep(0.01)
        raise RuntimeError(f"no line with {text!r} within {timeout_s}s")

    def median_step_s(self) -> float:
        times = self.step_times()
        return statistics.median(b - a for a, b in zip(times, times[1:]))


def _zygote(tmp: Path, steps: int) -> tuple[float, float, float]:
    run = _Run(tmp, "subproc", steps=steps)
    try:
        run.wait_steps(3)
        step = run.median_step_s()
        episodes = run.run_dir / "episodes.jsonl"
        before = len(episodes.read_text().splitlines())
        zygote = _child(run.proc.pid, b"sandbox.zygote")
        assert zygote is not None, "no zygote found"
        os.kill(zygote, signal.SIGKILL)
        killed = time.monotonic()
        noticed = run.wait_line("the zygote died; restarting it", killed) - killed
        while not any(
            json.loads(x)["status"] == "ok" and "-retry" in json.loads(x)["episode_id"] for x in episodes.read_text().splitlines()[before:]
        ):
            if time.monotonic() - killed > 120:
                raise RuntimeError("no re-admitted episode within 120 s")
            time.sleep(0.01)
        recovered = time.monotonic() - killed
        run.proc.wait(timeout=300)
        return noticed, recovered, step
    finally:
        if run.proc.poll() is None:
            run.proc.kill()


def _engine(tmp: Path) -> tuple[float, float]:
    run = _Run(tmp, "inline", steps=50)
    try:
        run.wait_steps(3)
        step = run.median_step_s()
        engine = _child(run.proc.pid, b"areal.engine.server")
        assert engine is not None, "no engine found"
        os.kill(engine, signal.SIGKILL)
        killed = time.monotonic()
        run.proc.wait(timeout=120)
        stopped = time.monotonic() - killed
        if f"the inference engine (pid {engine}) died" not in "".join(x for _, x in run.lines):
            raise RuntimeError("the run stopped without naming the engine")
        return stopped, step
    finally:
        if run.proc.poll() is None:
            run.proc.kill()


def main(quick: bool) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        noticed, recovered, step_z = _zygote(Path(tmp), steps=6 if quick else 12)  # killed after step 3 either way
        stopped, step_e = _engine(Path(tmp))
    base = "median step time, same run"
    return [
        {
            "benchmark": "faults",
            "metric": "zygote SIGKILL -> restart announced",
            "value": noticed,
            "unit": "s",
            "baseline": base,
            "baseline_value": step_z,
        },
        {
            "benchmark": "faults",
            "metric": "zygote SIGKILL -> first re-admitted episode done",
            "value": recovered,
            "unit": "s",
            "baseline": base,
            "baseline_value": step_z,
        },
        {
            "benchmark": "faults",
            "metric": "engine SIGKILL -> run stopped, engine named",
            "value": stopped,
            "unit": "s",
            "baseline": base,
            "baseline_value": step_e,
        },
    ]


if __name__ == "__main__":
    for row in main("--quick" in sys.argv):
        print(json.dumps(row))
