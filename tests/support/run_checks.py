"""Whole runs from the tests: their commands (``train_cmd``; ``three_step_run`` and
``one_step_run``, the two shapes most tests use; ``agent_cmd`` and ``ray_run``), running one
(``run_in_repo``; ``start_in_repo`` and ``started_in_repo`` start one without waiting) and reading its
records (``read_jsonl``); the end-to-end checks of a finished 3-step run (tests/e2e/test_e2e.py,
and the tests that place its parts on Ray nodes: tests/e2e/test_ray_*.py): the tokens the engine
sampled are the tokens trained, versions advance 1..3, and every published episode is trained
exactly once; and a running run's child processes (the tests that kill one:
tests/e2e/test_faults.py, tests/e2e/test_long_evaluation.py)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from paths import ROOT

from areal import forkserver
from areal.controller.audit import AUDITED_RUN
from areal.controller.trajectories import read_saved_trajectories
from areal.process import descendants
from areal.protocol import Trajectory


def check_trained_as_sampled(run_dir: Path, ranks: int = 1) -> list[Trajectory]:
    """Assert the checks on ``run_dir`` (run with ``save_trajectories=true engine.request_log=true``,
    ``trainer.steps=3``, ``rollout.max_head_offpolicyness=0``, ``trainer.ranks=ranks``: every rank
    trained every step); the published trajectories."""
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert [m["version"] for m in steps] == [1, 2, 3]
    assert all(np.isfinite(m["loss"]) for m in steps)

    published = read_saved_trajectories(run_dir / "trajectories.bin")
    seen_versions, recorded_tokens = sampled_as_served(run_dir, published)
    assert seen_versions == {0, 1, 2}  # bound 0: step k trains on episodes of version k-1

    # Exactly once across the hop: each published episode trained once, nothing trained twice or
    # unpublished, and the trainer's loss covered every sampled token the controller published.
    trained = [json.loads(line) for r in range(ranks) for line in (run_dir / f"trained_episodes-r{r}.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trained] == [1, 2, 3] * ranks
    counts = Counter(e for t in trained for e in t["episodes"])
    assert max(counts.values()) == 1
    assert set(counts) == {t.episode_id for t in published}
    trainer_steps = [json.loads(line) for line in (run_dir / "trainer_metrics.jsonl").read_text().splitlines()]
    assert sum(m["tokens"] for m in trainer_steps) == recorded_tokens
    assert (run_dir / "final" / "config.json").is_file()
    return published


def train_cmd(run_dir: Path, *overrides: str) -> list[str]:
    """``python -m areal.train`` writing to ``run_dir``, with ``overrides``."""
    return [sys.executable, "-m", "areal.train", f"hydra.run.dir={run_dir}", *overrides]


def sweep_cmd(sweep_dir: Path, *overrides: str) -> list[str]:
    """``python -m areal.train -m`` (a Hydra sweep) writing its runs under ``sweep_dir``, with ``overrides``."""
    return [sys.executable, "-m", "areal.train", "-m", f"hydra.sweep.dir={sweep_dir}", *overrides]


# A whole run (``python -m areal.train``) starts by fork from a server of the test process's own, a new
# interpreter that has imported the controller's modules and its children's (torch, transformers, the
# engine, the trainer) once: about 3 s of CPU a run less than a new interpreter, of some 80 runs a test
# session starts. The child is what ``python -m areal.train`` would be (areal/forkserver.py: its
# arguments, environment, cwd, sys.path and exit code; its own session), and starts its run's engine
# and trainer from a fork server of its own, as any run does. AREAL_FORKSERVER=0, or a GPU driver,
# starts each run as a new interpreter instead.
RUN_MODULE = "areal.train"
RUN_PRELOAD = ("hydra", "areal.controller.loop", *forkserver.PRELOAD)
_run_server: forkserver.ForkServer | None = None


def run_server() -> forkserver.ForkServer | None:
    """The test process's server for whole runs (started on first use), or None where runs start as
    new interpreters."""
    global _run_server
    if not forkserver.wanted():  # read at each run: a test may switch it off for its own
        return None
    if _run_server is None or not _run_server.alive():
        log = tempfile.NamedTemporaryFile(prefix="areal-test-runs-forkserver-", suffix=".log", delete=False)
        log.close()
        _run_server = forkserver.ForkServer.started(RUN_PRELOAD, log.name, cwd=str(ROOT))
        atexit.register(_close, _run_server, log.name)
    return _run_server


def _close(server: forkserver.ForkServer, log: str) -> None:
    server.close()
    with contextlib.suppress(OSError):
        os.unlink(log)


def _forked(cmd: list[str]) -> forkserver.ForkServer | None:
    """The server that starts ``cmd``, if it is a whole run; else None (a new interpreter)."""
    return run_server() if cmd[:3] == [sys.executable, "-m", RUN_MODULE] else None


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def run_in_repo(cmd: list[str], timeout_s: float = 300) -> subprocess.CompletedProcess:
    """Run ``cmd`` from the repository's root to its end, its output captured (text), as
    ``subprocess.run`` does (``TimeoutExpired`` after ``timeout_s``, the run's process group killed)."""
    server = _forked(cmd)
    if server is None:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    with tempfile.TemporaryDirectory(prefix="areal-run-output-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = server.spawn(RUN_MODULE, cmd[3:], str(out), stderr_path=str(err), cwd=str(ROOT))
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait(60)
            raise subprocess.TimeoutExpired(
                cmd, timeout_s, output=out.read_text(errors="replace"), stderr=err.read_text(errors="replace")
            ) from None
        return subprocess.CompletedProcess(cmd, code, out.read_text(errors="replace"), err.read_text(errors="replace"))


def run_ok(cmd: list[str], timeout_s: float = 300) -> subprocess.CompletedProcess:
    """``run_in_repo``, asserting the command exited 0 (the tails of its output if not)."""
    proc = run_in_repo(cmd, timeout_s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def start_in_repo(cmd: list[str]) -> subprocess.Popen:
    """Start ``cmd`` from the repository's root, its stdout and stderr piped (text)."""
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def started_in_repo(cmd: list[str], log_path: Path) -> Iterator[subprocess.Popen | forkserver.ForkedProcess]:
    """``cmd`` started from the repository's root in a process group of its own, its stdout and
    stderr written to ``log_path``; on leaving, the whole group is killed if it still runs."""
    server = _forked(cmd)
    if server is not None:
        open(log_path, "w").close()
        proc: subprocess.Popen | forkserver.ForkedProcess = server.spawn(RUN_MODULE, cmd[3:], str(log_path), cwd=str(ROOT))
    else:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:  # its own process group: the controller and what it started
            _kill_group(proc.pid)


def agent_cmd(folder: Path, name: str, source: str, *overrides: str) -> tuple[Path, list[str]]:
    """Write an agent's ``source`` to ``folder/name``: (``folder/run``, the ``python -m areal.train``
    command of a run there of that agent's ``run`` on the scripted model, ``overrides`` last)."""
    (folder / name).write_text(source)
    run_dir = folder / "run"
    return run_dir, train_cmd(run_dir, f"rollout.agent={folder / name}:run", "model.path=scripted", *overrides)


def read_jsonl(path: Path) -> list[dict]:
    """The records of a run's JSONL file (episodes.jsonl, metrics.jsonl, ...), in order."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def three_step_run(run_dir: Path, *overrides: str) -> list[str]:
    """``python -m areal.train`` for 3 synchronous steps of 2 groups, evaluation off, with what the
    checks read recorded (trajectories, the engine's request log); ``overrides`` last."""
    return train_cmd(run_dir, *AUDITED_RUN, *overrides)


def one_step_run(run_dir: Path, *overrides: str) -> list[str]:
    """``python -m areal.train`` for one step of inline agents on the scripted model, evaluation
    off: the shortest run; ``overrides`` last (a key given again there wins, as Hydra takes the
    last value)."""
    return train_cmd(run_dir, "model.path=scripted", "rollout.openai.mode=inline", "trainer.steps=1", "data.eval_size=0", *overrides)


def ray_run(run_dir: Path, address: str, mode: str, *overrides: str) -> list[str]:
    """``three_step_run`` of 4 samples a group on the scripted model, its agents in ``mode``
    (``rollout.openai.mode``), on the Ray cluster at ``address``; ``overrides`` last."""
    return three_step_run(
        run_dir,
        "model.path=scripted",
        f"rollout.openai.mode={mode}",
        "rollout.n_samples=4",
        "cluster.kind=ray",
        f"cluster.address={address}",
        *overrides,
    )


def ray_placement_failure(run_dir: Path, address: str, *overrides: str) -> str:
    """Run ``one_step_run`` on the Ray cluster at ``address`` with ``overrides`` and a 3 s placement
    timeout to its end, assert that it failed, and return its stderr."""
    cmd = one_step_run(run_dir, "cluster.kind=ray", f"cluster.address={address}", *overrides, "cluster.placement_timeout_s=3")
    proc = run_in_repo(cmd, timeout_s=120)
    assert proc.returncode != 0
    return proc.stderr


def children(pid: int, module: bytes) -> list[int]:
    """Descendants of ``pid`` running ``module`` (areal.process.descendants; killed by PID only)."""
    return descendants(pid, module)


def ray_torn_down(address: str) -> tuple[dict, dict, dict]:
    """After a run on the Ray cluster at ``address``: (its placement groups, free resources, total
    resources), once every resource is free again (or 20 s)."""
    import ray

    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        deadline = time.monotonic() + 20
        while ray.available_resources() != ray.cluster_resources() and time.monotonic() < deadline:
            time.sleep(0.2)
        return ray.util.placement_group_table(), ray.available_resources(), ray.cluster_resources()
    finally:
        ray.shutdown()


def sampled_as_served(run_dir: Path, trajectories: list[Trajectory]) -> tuple[set[int], int]:
    """Assert that every row's sampled tokens are a generation the engine logged
    (``engine_requests.jsonl``), prompt first, with that generation's logprobs and weight version;
    returns the versions seen and the number of sampled tokens."""
    served: dict[tuple, list[dict]] = {}  # prompt ids -> every generation of that prompt
    for line in (run_dir / "engine_requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        served.setdefault(tuple(r["input_ids"]), []).append(r)
    seen_versions, recorded_tokens = set(), 0
    for traj in trajectories:
        for row in traj.rows():
            mask = row.loss_mask.astype(bool)
            n_prompt = int((~mask).sum())
            assert mask.sum() > 0 and not mask[:n_prompt].any()  # prompt first, then sampled tokens
            prompt, sampled = row.input_ids[:n_prompt].tolist(), row.input_ids[mask].tolist()
            # Samples of one prompt can repeat; their logprobs then differ by batch padding noise
            # (~1e-6), so the generation this row came from is the one whose logprobs it carries.
            matches = [r for r in served[tuple(prompt)] if r["output_ids"] == sampled]
            assert matches, "trajectory tokens that the engine never generated"
            rec = min(matches, key=lambda r: np.abs(np.array(r["output_logprobs"]) - row.logprobs[mask]).max())
            assert row.logprobs[mask].tolist() == pytest.approx(rec["output_logprobs"], abs=1e-6)
            version = int(rec["weight_version"]) if rec["weight_version"].isdigit() else 0
            assert set(row.versions[mask].tolist()) == {version}
            seen_versions.add(version)
            recorded_tokens += int(mask.sum())  # sampled tokens: what the trainer's loss counts
    return seen_versions, recorded_tokens
