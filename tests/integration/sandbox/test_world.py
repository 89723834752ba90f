"""Tasks with a world, for real: a zygote forks episodes whose /workspace is an overlay on a task's
base, and a grader process runs the task's checks on what each left behind (sandbox/world.py,
sandbox/grader.py).

The agent is tests/support/swe_agents.py:ShellAgent (files written, shell commands run in its
workspace, no model), so no gateway serves: the gateway's socket is only bound. The task library
lies inside a directory the zygote exposes to episodes (``sandbox.expose``), so every test also
runs with the library masked in its episodes' roots. After every test nothing of a world is left:
no mount in the zygote's namespace or the host's, no workspace directory, no grader cgroup, no
episode or grader process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator

import msgspec
import pytest
import zmq
from world_tasks import CHECKS, FIXED, HIDDEN_MARK, ROOT_PROGRAMS, ROOT_RELEASE, make_root, make_task, tree_digest, world_leftovers
from zygote_harness import busy_children, loop_thread, processes_with_arg, run, zygote_env

from areal.protocol import EpisodeOutcome
from sandbox import reach
from sandbox.isolation import SandboxConfig
from sandbox.world import load_task
from sandbox.zygote_client import Zygote

KEY = "sk-world-test-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("world")
    exposed = root / "exposed"
    (exposed / "signals").mkdir(parents=True)
    library = exposed / "library"
    return {
        "root": str(root),
        "exposed": str(exposed),
        "signals": str(exposed / "signals"),
        "task": make_task(str(library)),
        "fraction": make_task(str(library), "calc-fraction", reward="fraction"),
        "rooted": make_task(str(library), "calc-rooted", root=make_root(str(root / "system"))),
    }


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    with loop_thread() as loop:
        yield loop


@contextlib.contextmanager
def gateway_socket(path: str) -> Iterator[str]:
    """A bound ROUTER at ``path``: the gateway's socket file must exist; nothing here calls it."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    try:
        sock.bind(f"ipc://{path}")
        yield f"ipc://{path}"
    finally:
        sock.close(0)
        ctx.term()


@pytest.fixture(scope="module")
def zygote(loop, place) -> Iterator[Zygote]:
    config = SandboxConfig(deadline_s=60.0, memory_limit_bytes=512 << 20, expose=[place["exposed"]], warm_slots=1)
    with gateway_socket(f"{place['root']}/gateway.sock") as addr, zygote_env():
        z = run(loop, Zygote.start("swe_agents:ShellAgent", addr, config, os.path.join(place["root"], "log")))
        try:
            yield z
        finally:
            run(loop, z.close())
        assert world_leftovers(z.ready.pid, config.temp_root) == []


@pytest.fixture(autouse=True)
def nothing_left(zygote) -> Iterator[None]:
    yield
    assert busy_children(zygote) == []
    assert world_leftovers(zygote.ready.pid, zygote.config.temp_root) == []


def episode(loop, zygote: Zygote, task: str, **data) -> EpisodeOutcome:
    return run(loop, zygote.run_episode(f"w-{uuid.uuid4().hex[:8]}", {"world": task, **data}, KEY), timeout=120)


def observed(outcome: EpisodeOutcome) -> list[dict]:
    """What a reporting ShellAgent's commands printed (swe_agents.Observed)."""
    assert outcome.status == "error" and "OBSERVED " in outcome.error, outcome.error[-3000:]
    return json.loads(outcome.error.rsplit("OBSERVED ", 1)[1].splitlines()[0])


def test_an_agent_that_fixes_the_bug_gets_reward_one_whatever_it_claims(loop, zygote, place):
    out = episode(loop, zygote, place["task"], files={"calc/__init__.py": FIXED}, commands=["python -m pytest -q tests"], claim=0.25)
    assert (out.status, out.reward, out.grader) == ("ok", 1.0, "complete"), (out.error, out.log_tail, out.grader)
    assert out.checks == dict.fromkeys(CHECKS, 1.0)
    assert out.tripwires == [] and out.rewards_by_id == {}


def test_an_unfixed_workspace_fails_its_checks_and_fraction_counts_the_passing_ones(loop, zygote, place):
    out = episode(loop, zygote, place["task"], commands=["python -m pytest -q tests || true"])
    assert (out.status, out.reward, out.tripwires) == ("ok", 0.0, [])
    assert out.checks == {CHECKS[0]: 0.0, CHECKS[1]: 1.0, CHECKS[2]: 0.0}
    fraction = episode(loop, zygote, place["fraction"])
    assert fraction.reward == pytest.approx(1 / 3)


def test_the_agent_works_in_its_workspace_and_sees_the_base(loop, zygote, place):
    seen = observed(episode(loop, zygote, place["task"], commands=["pwd", "cat calc/__init__.py", "touch new.txt && ls"], report=True))
    assert seen[0]["cwd"] == "/workspace" and seen[1]["out"].strip() == "/workspace"
    assert "return a - b" in seen[2]["out"]
    assert "new.txt" in seen[3]["out"].split()


@pytest.mark.parametrize(
    "attack",
    [
        "sed -i 's/== 5/== -1/' tests/test_calc.py",  # the visible test rewritten to pass on the bug
        "rm -rf tests",  # the protected directory deleted
        "rm -rf tests && ln -s /tmp tests",  # ... and replaced by a link
        "echo 'import calc; calc.add = lambda a, b: a + b' > conftest.py",  # a runner hook patching the code under test
    ],
)
def test_edits_to_the_tests_are_discarded_and_recorded(loop, zygote, place, attack):
    before = tree_digest(os.path.join(place["task"], "repo"))
    out = episode(loop, zygote, place["task"], commands=[attack])
    assert out.status == "ok" and out.grader == "complete", (out.error, out.grader)
    # The grader ran the base's tests and hooks: the bug still fails them, and every check reported.
    assert out.checks == {CHECKS[0]: 0.0, CHECKS[1]: 1.0, CHECKS[2]: 0.0}
    assert out.reward == 0.0
    kinds = {t.split(":")[0] for t in out.tripwires}
    assert kinds == ({"runner_replaced"} if "conftest" in attack else {"protected_write"}), out.tripwires
    assert tree_digest(os.path.join(place["task"], "repo")) == before


def test_the_checks_are_absent_and_seeking_them_is_recorded(loop, zygote, place):
    task = place["task"]
    seen = observed(
        episode(
            loop,
            zygote,
            task,
            report=True,
            commands=[
                "ls -la /checks",
                "cat /checks/*",
                f"cat {task}/checks/test_hidden.py",  # the host's path: masked with its library
                f"ls -A {os.path.dirname(task)}",  # the library: an empty mask
                f"find {place['exposed']}",  # what the exposed directory shows
            ],
        )
    )
    printed = " ".join(s.get("out", "") + s.get("err", "") for s in seen)
    assert HIDDEN_MARK not in printed and "test_hidden.py" not in seen[5]["out"]
    assert "test_checks.py" in seen[1]["out"] and "not in the episode's view" in seen[2]["out"]  # the decoy
    assert seen[3]["rc"] != 0 and seen[4]["out"].strip() == "" and "signals" in seen[5]["out"]
    out = episode(loop, zygote, task, commands=["ls /checks", "cat /checks/test_checks.py"])
    assert sorted(out.tripwires) == ["checks_listed: /checks", "checks_read: /checks/test_checks.py"]
    quiet = episode(loop, zygote, task, commands=["ls /", "ls -la"])  # the decoys' names listed, not opened
    assert quiet.tripwires == []


FORGE = """import importlib.util, marshal, os, sys
import pytest
source = open("tests/test_calc.py", "rb").read()
code = compile("def test_add():\\n    assert True\\n", os.path.abspath("tests/test_calc.py"), "exec")
os.makedirs("tests/__pycache__", exist_ok=True)
with open(f"tests/__pycache__/test_calc.{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc", "wb") as f:
    f.write(importlib.util.MAGIC_NUMBER + bytes([3, 0, 0, 0]) + importlib.util.source_hash(source) + marshal.dumps(code))
"""


def test_bytecode_planted_for_an_untouched_test_is_never_run(loop, zygote, place):
    # pytest's assertion rewriter takes a cached module whose recorded hash matches its source's:
    # the visible test, left as it is, passes on the bug in the agent's own run.
    out = episode(
        loop, zygote, place["task"], files={"forge.py": FORGE}, commands=["python forge.py", "python -m pytest -q tests"], report=True
    )
    seen = observed(out)
    assert seen[1]["rc"] == 0 and seen[2]["rc"] == 0, seen  # the forgery fools pytest in the episode
    assert out.grader == "complete" and out.checks[CHECKS[2]] == 0.0  # not the grader: it ran the source


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("import os\n\n\ndef add(a, b):\n    os._exit(0)\n", "grader_no_verdict"),
        ("def add(a, b):\n    import pytest\n\n    pytest.exit('all good', returncode=0)\n", "grader_exit_early"),
    ],
)
def test_code_that_ends_the_checks_run_early_is_recorded(loop, zygote, place, code, kind):
    out = episode(loop, zygote, place["task"], files={"calc/__init__.py": code})
    assert out.status == "ok" and out.grader.startswith("no verdict"), out.grader
    assert [t.split(":")[0] for t in out.tripwires] == [kind]
    assert out.reward == 0.0


def test_concurrent_episodes_on_one_base_see_only_their_own_writes(loop, zygote, place):
    task, signals = place["task"], place["signals"]
    before = tree_digest(os.path.join(task, "repo"))
    # Made before the episodes and changed, not created, to signal: exposed paths are read-only
    # overlays, which show a file's new content but not a file that appears after the mount.
    go = os.path.join(signals, f"go-{uuid.uuid4().hex[:8]}")
    with open(go, "w") as f:
        f.write("wait")
    wait = f"python -c 'import sys,time\nwhile open(sys.argv[1]).read() != \"go\": time.sleep(0.02)' {go} {{marker}}"
    markers = [f"marker-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    futures = [
        asyncio.run_coroutine_threadsafe(
            zygote.run_episode(
                f"c{i}-{m}",
                {
                    "world": task,
                    "report": True,
                    "commands": [
                        f"echo {m} > {m}.txt && echo mine >> calc/__init__.py",
                        wait.format(marker=m),
                        "ls",
                        "cat calc/__init__.py",
                    ],
                },
                KEY,
            ),
            loop,
        )
        for i, m in enumerate(markers)
    ]
    deadline = time.monotonic() + 60
    while not all(processes_with_arg(m) for m in markers):  # both wait at once: their lives overlap
        assert time.monotonic() < deadline, "the two episodes never ran side by side"
        time.sleep(0.05)
    with open(go, "w") as f:
        f.write("go")
    for m, future in zip(markers, futures):
        seen = observed(future.result(120))
        files = seen[3]["out"].split()
        assert f"{m}.txt" in files and not any(f.startswith("marker-") and f != f"{m}.txt" for f in files)
        assert seen[4]["out"].count("mine") == 1  # its own append only
    assert tree_digest(os.path.join(task, "repo")) == before


def surveyed_mounts(loop, zygote: Zygote, task: str) -> dict[str, tuple[str, bool]]:
    """An episode of ``task`` surveys what it reaches (sandbox/reach.py); checked to be nothing
    isolation does not allow, its mounts are returned: point -> (file system type, read-only)."""
    seen = observed(episode(loop, zygote, task, survey=True, report=True))
    found = msgspec.json.decode(seen[1]["survey"], type=reach.Reach)
    zpid = zygote.ready.pid
    host_ns = {n: os.readlink(f"/proc/{zpid}/ns/{n}") for n in os.listdir(f"/proc/{zpid}/ns")}
    unlisted = reach.unlisted(found, host_ns, zygote.ready.isolation, zygote.ready.root, zygote.gateway_addr.removeprefix("ipc://"))
    assert unlisted == [], "\n".join(unlisted)
    return {m.point: (m.fstype, m.readonly) for m in found.mounts}


def test_a_world_episode_reaches_only_what_isolation_allows(loop, zygote, place):
    points = surveyed_mounts(loop, zygote, place["task"])
    assert points["/workspace"] == ("overlay", False) and points["/checks"] == ("tmpfs", False)
    assert points[os.path.dirname(place["task"])] == ("tmpfs", True)  # the library, masked


def test_a_world_episode_leaves_nothing_behind(loop, zygote, place):
    out = episode(loop, zygote, place["task"], commands=["head -c 1000000 /dev/zero > big.bin", "mkdir -p a/b/c && touch a/b/c/d"])
    assert out.status == "ok"
    # Checked after every test too (``nothing_left``); here explicitly, and the zygote still serves.
    assert world_leftovers(zygote.ready.pid, zygote.config.temp_root) == []
    assert busy_children(zygote) == []
    assert episode(loop, zygote, place["task"], files={"calc/__init__.py": FIXED}).reward == 1.0


def test_a_zygote_shut_down_mid_episode_leaves_no_world_behind(loop, place):
    config = SandboxConfig(deadline_s=60.0, expose=[place["exposed"]], warm_slots=0)
    marker = f"hold-{uuid.uuid4().hex[:8]}"
    hold = {"world": place["task"], "commands": [f"python -c 'import time; time.sleep(600)' {marker}"]}
    with gateway_socket(f"{place['root']}/gateway-shutdown.sock") as addr, zygote_env():
        z = run(loop, Zygote.start("swe_agents:ShellAgent", addr, config, os.path.join(place["root"], "log-shutdown")))
        try:
            held = asyncio.run_coroutine_threadsafe(z.run_episode("held", hold, KEY), loop)
            deadline = time.monotonic() + 60
            while not processes_with_arg(marker):
                assert time.monotonic() < deadline, "the episode never started"
                time.sleep(0.05)
        finally:
            run(loop, z.close())
    out = held.result(60)
    assert out.status == "crashed" and "shut down" in out.error
    assert processes_with_arg(marker) == []
    assert world_leftovers(z.ready.pid, config.temp_root) == []


def test_a_bad_task_directory_is_an_infrastructure_error(loop, zygote, place):
    out = episode(loop, zygote, os.path.join(place["root"], "no-such-task"))
    assert out.status == "error" and out.failure_class == "infrastructure" and "task.json" in out.error


def test_a_task_root_is_the_episodes_system_and_what_it_changes_there_is_its_own(loop, zygote, place):
    """task.json's "root": the episode's programs, libraries and /etc are the task's root file
    system's, not the host's; it may write anywhere in it (its own layer); the root on disk, and
    the next episode, see none of it; the grader runs the checks in the pristine root."""
    task = place["rooted"]
    system = os.path.join(place["root"], "system")
    before = tree_digest(system)
    commands = [
        "cat /etc/os-release",
        "ls /usr/bin",
        "echo planted > /usr/bin/planted && echo x >> /etc/os-release && cat /usr/bin/planted",
        "ls /usr/bin/apt /usr/bin/python3* 2>&1; echo done",
    ]
    seen = observed(episode(loop, zygote, task, commands=commands, report=True))
    assert seen[0]["cwd"] == "/workspace" and seen[1]["out"] == ROOT_RELEASE, seen
    assert set(seen[2]["out"].split()) == {*ROOT_PROGRAMS, "dash"}  # the root's programs alone (sh is dash)
    assert seen[3]["rc"] == 0 and seen[3]["out"] == "planted\n"
    assert "No such file" in seen[4]["out"]  # the host's programs are absent
    assert tree_digest(system) == before  # the root on disk is untouched
    again = observed(episode(loop, zygote, task, commands=["cat /etc/os-release", "ls /usr/bin/planted 2>&1 || true"], report=True))
    assert again[1]["out"] == ROOT_RELEASE and "No such file" in again[2]["out"]  # nor does the next episode see it
    graded = episode(loop, zygote, task, files={"calc/__init__.py": FIXED}, commands=["rm -f /usr/bin/cat"])
    assert (graded.status, graded.reward, graded.grader) == ("ok", 1.0, "complete"), (graded.error, graded.grader)


def test_an_episode_on_a_task_root_reaches_only_what_isolation_allows(loop, zygote, place):
    points = surveyed_mounts(loop, zygote, place["rooted"])
    assert points["/"] == ("overlay", False) and points["/workspace"] == ("overlay", False) and points["/proc"][1]
    assert not any(p == "/usr" or p.startswith("/usr/") or p.startswith("/etc/") for p in points)  # none of the host's bound


def test_a_task_root_that_is_not_a_root_file_system_is_refused_naming_it(place, tmp_path):
    bad = make_task(str(tmp_path / "lib"), "no-root", root="nothing-here")
    with pytest.raises(ValueError, match="root 'nothing-here' is not a directory"):
        load_task(bad)
    os.makedirs(os.path.join(bad, "empty-root"))
    with open(os.path.join(bad, "task.json")) as f:
        spec = json.load(f)
    with open(os.path.join(bad, "task.json"), "w") as f:
        json.dump({**spec, "root": "empty-root"}, f)
    with pytest.raises(ValueError, match="no bin/sh or usr/bin/sh"):
        load_task(bad)
