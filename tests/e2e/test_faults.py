"""Components killed (SIGKILL) in the middle of a real training run, and runs that keep failing.

The sandbox zygote: without supervision every later episode came back at once as ``crashed: zygote not running``,
failed groups were replaced without end, and a minute wrote 634,096 crashed episodes to
``episodes.jsonl``. Now the controller restarts the zygote, logs the groups it cut short as
infrastructure failures and runs them again; past ``rollout.max_zygote_restarts`` the run stops,
naming the death, after a bounded number of lines.
"""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from paths import ROOT
from run_checks import agent_cmd, children, read_jsonl, run_in_repo, start_in_repo

AGENT = """
import asyncio
from openai import AsyncOpenAI

async def run(data, **kw):
    await asyncio.sleep(0.4)  # long enough that a kill lands with episodes in flight
    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["question"]}], max_tokens=8)
    return 1.0
"""


def _agent_run(
    tmp_path: Path, source: str, mode: str, steps: int, groups: int, *extra: str, name: str = "slow_agent.py"
) -> tuple[Path, list[str]]:
    """``agent_cmd`` for this file's runs: the agent ``source`` written to ``tmp_path/name``, its
    agents in ``mode`` (``rollout.openai.mode``), ``steps`` steps of ``groups`` groups of 2
    samples, evaluation off, ``extra`` last: (the run's folder, the command)."""
    overrides = (f"rollout.openai.mode={mode}", f"trainer.steps={steps}", f"rollout.groups_per_step={groups}", "rollout.n_samples=2")
    return agent_cmd(tmp_path, name, source, *overrides, "data.eval_size=0", *extra)


def _zygotes(pid: int) -> list[int]:
    return children(pid, b"sandbox.zygote")


def _run_and_kill(tmp_path: Path, kills: int, extra: list[str]) -> tuple[subprocess.CompletedProcess, list[dict]]:
    run_dir, cmd = _agent_run(tmp_path, AGENT, "subproc", 3, 2, *extra)
    proc = start_in_repo(cmd)
    killed: set[int] = set()
    deadline = time.monotonic() + 240
    log = run_dir / "episodes.jsonl"
    while len(killed) < kills and proc.poll() is None and time.monotonic() < deadline:
        lines = len(log.read_text().splitlines()) if log.exists() else 0
        live = [z for z in _zygotes(proc.pid) if z not in killed]
        if live and lines >= 2 * (len(killed) + 1):  # some episodes done since the last kill
            os.kill(live[0], signal.SIGKILL)
            killed.add(live[0])
        time.sleep(0.05)
    out, err = proc.communicate(timeout=300)
    assert len(killed) == kills, (killed, err[-3000:])
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), [json.loads(x) for x in log.read_text().splitlines()]


@pytest.mark.e2e
def test_a_killed_zygote_is_restarted_and_its_groups_run_again(tmp_path):
    proc, episodes = _run_and_kill(tmp_path, 1, [])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "[sandbox] the zygote died; restarting it (1/3)" in proc.stdout + proc.stderr
    cut = [e for e in episodes if e["status"] == "crashed"]
    assert cut and all(e["error"].startswith("infrastructure failure, group re-admitted:") for e in cut), cut
    steps = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in steps] == [1, 2, 3]


@pytest.mark.e2e
def test_past_its_restart_bound_the_run_stops_naming_the_zygote(tmp_path):
    proc, episodes = _run_and_kill(tmp_path, 2, ["rollout.max_zygote_restarts=1"])
    assert proc.returncode != 0
    assert "the sandbox zygote died 2 times (rollout.max_zygote_restarts=1)" in proc.stderr, proc.stderr[-3000:]
    assert len(episodes) <= 3 * 4 * 2 + 8  # bounded: nothing like a hot loop of crashed episodes


FAILING_LATER = """
from openai import AsyncOpenAI

calls = 0

async def run(data, **kw):
    global calls
    calls += 1
    if calls > 8:
        raise RuntimeError("this agent broke after its first 8 episodes")
    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["question"]}], max_tokens=8)
    return 1.0
"""


@pytest.mark.e2e
def test_a_run_whose_episodes_keep_failing_stops_whatever_it_accepted_before(tmp_path):
    """The old stop rule fired only while no group had been accepted: a run that had accepted some
    and then failed every episode replaced failed groups for ever."""
    run_dir, cmd = _agent_run(tmp_path, FAILING_LATER, "inline", 50, 2, "rollout.failure_window=8", name="failing_later.py")
    proc = run_in_repo(cmd, timeout_s=300)
    assert proc.returncode != 0
    assert "8 of the last 8 episodes failed (rollout.max_failure_rate=0.9)" in proc.stderr, proc.stderr[-3000:]
    assert "this agent broke after its first 8 episodes" in proc.stderr
    episodes = (run_dir / "episodes.jsonl").read_text().splitlines()
    assert 16 <= len(episodes) <= 8 + 8 + 4 * 2  # the 8 good ones, the window of failures, groups in flight


@pytest.mark.e2e
def test_a_killed_engine_stops_the_run_within_seconds_naming_it(tmp_path):
    """The trainer waits for data (bound 0) while slow episodes run: nothing else would notice."""
    slow_agent = AGENT.replace("asyncio.sleep(0.4)", "asyncio.sleep(2.0)")
    run_dir, cmd = _agent_run(tmp_path, slow_agent, "inline", 20, 1, "rollout.max_head_offpolicyness=0")
    proc = start_in_repo(cmd)
    deadline, engine = time.monotonic() + 120, None
    while engine is None and proc.poll() is None and time.monotonic() < deadline:
        metrics = run_dir / "metrics.jsonl"
        engines = children(proc.pid, b"areal.engine.server")
        if engines and metrics.exists() and metrics.read_text():  # a step trained: mid-run
            engine = engines[0]
            os.kill(engine, signal.SIGKILL)
        time.sleep(0.05)
    assert engine is not None, proc.communicate(timeout=60)[1][-3000:]
    out, err = proc.communicate(timeout=60)  # before: it ran on until a 600 s no-data timeout
    assert proc.returncode != 0
    assert f"the inference engine (pid {engine}) died (signal SIGKILL); log tail" in err, err[-3000:]
    # Every episode that started has exactly one line; those cut off by the stop say why.
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    ids = [e["episode_id"] for e in episodes]
    assert len(ids) == len(set(ids))
    cancelled = [e for e in episodes if e["status"] == "cancelled"]
    assert cancelled and all(f"the inference engine (pid {engine}) died" in e["error"] for e in cancelled), episodes
    untrained = run_dir / "untrained_episodes.json"
    if untrained.exists():  # accepted but not trained when the run stopped: listed, and each has its line
        assert set(json.loads(untrained.read_text())["episodes"]) <= {e["episode_id"] for e in episodes if e["status"] == "ok"}


def test_temp_folders_of_dead_runs_are_reclaimed_and_live_ones_kept(tmp_path):
    """A SIGKILLed run skips its cleanup: its socket folder and engine scratch are removed by the
    next start (``reclaim_temp_dirs``), named for their owner's pid; a live owner's are kept."""
    from areal.process import reclaim_temp_dirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    stale = [tmp_path / f"areal-run-{dead.pid}-x1", tmp_path / f"areal-engine-{dead.pid}-x2"]
    live = [tmp_path / f"areal-engine-{os.getpid()}-x3", tmp_path / "areal-unrelated-1-x4"]
    for d in stale + live:
        d.mkdir()
        (d / "gateway.sock").write_text("")
    assert sorted(reclaim_temp_dirs(str(tmp_path))) == sorted(str(d) for d in stale)
    assert [d.exists() for d in stale + live] == [False, False, True, True]


NOISY_FAILURE = """
import sys

async def run(data, **kw):
    sys.stdout.write("x" * 2_000_000)  # a long log
    raise ValueError("the real reason, at the head" + "!" * 40_000)
"""


@pytest.mark.e2e
def test_a_failure_keeps_its_reason_first_and_its_log_tail_apart(tmp_path):
    """Before, the record kept the last 2,000 characters of reason + log: a long log left only
    'xxxx...'. Now the reason leads (cut only past 16,000 characters, saying so) and the log
    tail is its own bounded field."""
    run_dir, cmd = _agent_run(tmp_path, NOISY_FAILURE, "subproc", 1, 1, name="noisy.py")
    proc = run_in_repo(cmd, timeout_s=300)
    assert proc.returncode != 0  # every group failed
    # the run stops once its first groups have all failed; an episode of a replacement group still
    # running then is cut and logged as cancelled (timing decides whether one is)
    episodes = [e for e in read_jsonl(run_dir / "episodes.jsonl") if e["status"] != "cancelled"]
    assert episodes and all(e["status"] == "error" for e in episodes)
    for e in episodes:
        assert e["error"].startswith("Traceback") and "ValueError: the real reason, at the head" in e["error"]
        assert e["error"].endswith("more characters)") and len(e["error"]) < 16_100
        assert e["log_tail"].startswith("--- ") and e["log_tail"].rstrip().endswith("x" * 100) and len(e["log_tail"]) < 5_000


@pytest.mark.e2e
@pytest.mark.parametrize("component", ["zygote", "engine", "trainer"])
def test_a_component_killed_at_a_random_point_leaves_one_whole_record(tmp_path, component):
    """SIGKILL one component at a random point of a short run (the seed is in every message).
    Whatever the point: the zygote's death is absorbed (the run finishes), the engine's or the
    trainer's stops the run naming it; every episode has one line; the accepted-but-untrained
    ones are listed; no partial write and no temp folder of the run is left behind."""
    seed = int(os.environ.get("FAULT_SEED", int.from_bytes(os.urandom(4), "little")))  # FAULT_SEED replays a case
    rng = random.Random(seed)
    after_lines, extra_s = rng.randint(1, 10), rng.uniform(0.0, 1.5)
    why = f"seed {seed}: kill the {component} after {after_lines} episode lines + {extra_s:.2f} s"
    run_dir, cmd = _agent_run(tmp_path, AGENT, "subproc", 4, 2, "trainer.checkpoint_every=1")
    started = time.time()
    proc = start_in_repo(cmd)
    module = {"zygote": b"sandbox.zygote", "engine": b"areal.engine.server", "trainer": b"areal.trainer"}[component]
    log, killed, deadline = run_dir / "episodes.jsonl", None, time.monotonic() + 240
    while killed is None and proc.poll() is None and time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= after_lines:
            time.sleep(extra_s)
            victims = children(proc.pid, module)
            if victims:
                os.kill(victims[0], signal.SIGKILL)
                killed = victims[0]
        time.sleep(0.02)
    out, err = proc.communicate(timeout=300)
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if proc.returncode == 0:  # the death was absorbed, or came after the last step's work was done
        assert steps == [1, 2, 3, 4], (why, steps, err[-3000:])
    else:
        named = {
            "zygote": "the sandbox zygote died",
            "engine": f"the inference engine (pid {killed}) died (signal SIGKILL)",
            "trainer": "trainer process exited with code",
        }[component]
        assert component != "zygote" and named in err, (why, err[-8000:])
    if component == "zygote":
        cut = [json.loads(x) for x in log.read_text().splitlines() if '"crashed"' in x]
        assert all(e["error"].startswith("infrastructure failure, group re-admitted:") for e in cut), (why, cut)
    episodes = [json.loads(x) for x in log.read_text().splitlines()]
    ids = [e["episode_id"] for e in episodes]
    assert len(ids) == len(set(ids)), why
    assert all(e["status"] in ("ok", "crashed", "cancelled", "error", "timeout") for e in episodes), why
    untrained = run_dir / "untrained_episodes.json"
    if untrained.exists():
        assert set(json.loads(untrained.read_text())["episodes"]) <= {e["episode_id"] for e in episodes if e["status"] == "ok"}, why
    assert not list(run_dir.rglob(".tmp-*")), (why, list(run_dir.rglob(".tmp-*")))
    # the run's own temp folders carry its pid; a folder of that name made before the run started
    # belongs to an earlier process that had the same pid (a SIGKILLed Ray worker of another test)
    left = [p for p in glob.glob(os.path.join(tempfile.gettempdir(), f"areal-*-{proc.pid}-*")) if os.stat(p).st_mtime >= started - 1]
    assert not left, (why, left)


@pytest.mark.e2e
def test_with_two_engines_a_killed_one_is_restarted_and_the_run_goes_on(tmp_path):
    """One of two launched engines killed mid-run: its sessions move to the other, the trainer's
    pushes skip it while it is down, it comes back at the newest version, and the run finishes.
    Episodes hold (a file the agent polls) from the kill until the run logs the engine's return,
    so the run cannot end before it, however slow the machine."""
    hold = tmp_path / "hold"
    agent = AGENT.replace("asyncio.sleep(0.4)", "asyncio.sleep(2.0)")
    agent = agent.replace(
        "    client = AsyncOpenAI(",
        f"    while os.path.exists({str(hold)!r}):  # the engine is down: wait for its return\n"
        "        await asyncio.sleep(0.1)\n"
        "    client = AsyncOpenAI(",
    ).replace("import asyncio\n", "import asyncio\nimport os\n", 1)
    run_dir, cmd = _agent_run(tmp_path, agent, "inline", 12, 2, "engine.replicas=2")
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, killed = time.monotonic() + 180, None
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            metrics = run_dir / "metrics.jsonl"
            engines = children(proc.pid, b"areal.engine.server")
            if len(engines) == 2 and metrics.exists() and metrics.read_text():  # a step trained: mid-run
                hold.touch()
                killed = engines[0]
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
        while hold.exists() and proc.poll() is None and time.monotonic() < deadline + 180:
            if " is back (pid " in log_path.read_text():
                hold.unlink()
            time.sleep(0.05)
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = log_path.read_text(), ""
    assert killed is not None, out[-3000:]
    assert proc.returncode == 0, out[-4000:]
    assert f"[engine] the inference engine (pid {killed}) died (signal SIGKILL); restarting it" in out, out[-4000:]
    assert " is back (pid " in out + err
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13))
    ids = [json.loads(x)["episode_id"] for x in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids))
    back = int((out + err).split(" is back (pid ")[1].split(")")[0])
    assert not Path(f"/proc/{back}").exists()  # the run stopped the restarted engine too (no orphan)


@pytest.mark.e2e
def test_servers_launched_from_a_command_serve_the_run_and_stop_with_it(tmp_path):
    """engine.launch: the run starts two servers from a command template (here our own engine,
    which speaks SGLang's HTTP API), each with its share of engine.launch.gpus as its
    CUDA_VISIBLE_DEVICES, routes through both, pushes weights to both, logs each to the run dir,
    and stops them at the end."""
    serve = "{python} -m areal.engine.server --model-path {model} --host {host} --port {port}"
    command = f'sh -c "echo gpus=$CUDA_VISIBLE_DEVICES; exec {serve}"'
    launch = ("engine.kind=sglang", f"engine.launch.command='{command}'", "engine.launch.count=2", "engine.launch.gpus=[5,6]")
    run_dir, cmd = _agent_run(tmp_path, AGENT, "inline", 3, 2, *launch)
    proc = run_in_repo(cmd, timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "gpus=5\n" in (run_dir / "engine.log").read_text() and "gpus=6\n" in (run_dir / "engine-1.log").read_text()
    urls = json.loads((run_dir / "trainer_config.json").read_text())["engine_urls"]
    assert len(set(urls)) == 2
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in steps] == [1, 2, 3] and all(m["engines_updated"] == 2 for m in steps), steps
    assert json.loads((run_dir / "config.json").read_text())["engine"]["launch"]["command"] == command
    for url in urls:  # stopped with the run
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=5)
