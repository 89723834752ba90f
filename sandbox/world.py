"""Tasks with a world: the task directory format, and each episode's private copy-on-write view of it.

    task directory (never visible to an episode: hidden where an exposed path holds it)
      task.json    prompt, protected paths, the workspace's own tests, timeout, reward rule (``load_task``),
                   and optionally "root": a root file system to run in (debootstrap's, an image's tree)
      repo/        the base: the repository the agent works on, shared read-only by every episode
      checks/      the grader's tests (pytest files): /checks in the grader only
      reference/   optional files the checks read: /reference in the grader only

    zygote (a mount namespace of its own from its first world on: ``enter_private_mounts``)
      prepare()    <temp_root>/areal-worlds-<zygote pid>/<slot>: a tmpfs of sandbox.workspace_size_bytes
                   holding upper/ + work/ (the episode's layer) and decoy/ (what it finds at /checks)
      episode      /           with a task root: overlay of the root under root/upper/, writable (the
                               sandbox's own paths bound read-only into it: interpreter, code, socket)
                   /workspace  overlay: repo/ under upper/, writable; the agent's working directory
                   /checks, /reference  decoys: files owned by nobody, readable, access times kept
      grader       /           with a task root: the task's root under a scratch layer (grader-root/), never
                               the episode's changes to it
                   /workspace  overlay: its own scratch layer over upper/ over repo/ (sandbox/grader.py
                               restores the protected paths in it before any check runs)
                   /checks, /reference, /.task/base (repo/), /.task/upper (upper/): read-only
      release()    the tmpfs unmounted, its directory removed, once the grader is done

Sixty-four episodes of one task share one base: each holds only what it changed (its upper
layer), in memory charged to its own cgroup and capped by the tmpfs's size.

Invariants:
- the checks and reference files are never in an episode's root: the task directory and the
  library holding it (its parent) are hidden when an exposed path holds them (``hidden_paths``);
  /checks in an episode is a decoy.
- the tmpfs lives in the zygote's own mount namespace: no host process sees a workspace, and a
  killed zygote's mounts die with it (its empty directories are swept by the next zygote).
- what the sandbox says of a world (checks, tripwires, reward) is applied to the outcome by the
  zygote (``apply_grade``): an episode's own reward for a world is never taken.

What is not covered: a zygote that is not root (it cannot mount the tmpfs; a world episode fails
as infrastructure, naming why); bases and roots that are not directories (an image file: unpack it).
A task root must hold the shared libraries the sandbox's interpreter links (its glibc, as new as
the host's): the interpreter itself is the host's, bound in, so commands such as
``python -m pytest`` run with the sandbox's Python and the root's programs and libraries.
"""

from __future__ import annotations

import ast
import ctypes
import dataclasses
import json
import os
import shutil
import stat
from dataclasses import dataclass

import msgspec

from areal.protocol import EpisodeOutcome, Grade
from sandbox.rootfs import RootPlan, TaskRoot, WorldView, _inside

TASK_FILE = "task.json"
CHECKS, REFERENCE = "/checks", "/reference"
TASK_BASE, TASK_UPPER = "/.task/base", "/.task/upper"  # in the grader's root only
DECOY_OWNER = 65534  # nobody: the agent (uid 0 without capabilities) may read, not write, chmod or touch
DECOY_FILES = {CHECKS: "test_checks.py", REFERENCE: "README"}
REWARD_RULES = ("all", "fraction")
TRIPWIRE_KINDS = (
    "protected_write",  # the agent changed a protected path: discarded, the grader saw the base's
    "runner_replaced",  # the agent wrote a test-runner hook (conftest.py, pytest.ini, sitecustomize.py, *.pth)
    "checks_read",  # a decoy file at /checks or /reference was read
    "checks_listed",  # the decoy directory /checks or /reference was listed
    "grader_exit_early",  # the checks' run was interrupted (pytest.exit, KeyboardInterrupt) from the workspace's code
    "grader_no_verdict",  # the checks' process ended before its report did (os._exit, a signal)
)
_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNS, _MS_REC, _MS_SLAVE, _MS_NOSUID, _MS_NODEV, _MNT_DETACH = 0x00020000, 16384, 1 << 19, 2, 4, 2


@dataclass(frozen=True)
class Task:
    """A task directory, read by ``load_task``."""

    id: str
    dir: str  # absolute, real path
    prompt: str
    protected: tuple[str, ...]  # workspace paths (files or directories) whose edits are discarded
    tests: tuple[str, ...]  # workspace test paths the grader runs beside /checks (each protected)
    pythonpath: tuple[str, ...]  # workspace directories the checks import from
    timeout_s: float  # the checks' wall-clock limit
    reward: str  # "all": 1.0 when every check passes, else 0.0; "fraction": the share that pass
    checks: tuple[str, ...]  # the check names: "checks/test_x.py::test_f", "tests/test_y.py::TestC::test_g"
    root: str = ""  # a root file system (absolute, real path) the episode and its grader run in; "": the host's system paths

    @property
    def base(self) -> str:
        return os.path.join(self.dir, "repo")

    @property
    def checks_dir(self) -> str:
        return os.path.join(self.dir, "checks")

    @property
    def reference_dir(self) -> str:
        return os.path.join(self.dir, "reference")


def load_task(path: str) -> Task:
    """The task in directory ``path`` (module docstring); ``ValueError`` naming what is wrong."""
    path = os.path.realpath(path)
    spec_file = os.path.join(path, TASK_FILE)
    if not os.path.isfile(spec_file):
        raise ValueError(f"task directory {path} has no {TASK_FILE}")
    with open(spec_file) as f:
        spec = json.load(f)
    known = {"id", "prompt", "protected", "tests", "pythonpath", "timeout_s", "reward", "root"}
    if not isinstance(spec, dict) or set(spec) - known:
        raise ValueError(
            f"{spec_file}: an object with keys among {sorted(known)}, got {sorted(spec) if isinstance(spec, dict) else spec!r}"
        )
    for d in ("repo", "checks"):
        if not os.path.isdir(os.path.join(path, d)) or os.path.islink(os.path.join(path, d)):
            raise ValueError(f"task directory {path} has no {d}/ directory")
    prompt = spec.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{spec_file}: prompt must be a non-empty string")
    lists = {}
    for key, default in (("protected", []), ("tests", []), ("pythonpath", ["."])):
        value = spec.get(key, default)
        if not isinstance(value, list) or not all(isinstance(p, str) and _relative(p) for p in value):
            raise ValueError(f"{spec_file}: {key} must be a list of relative paths inside the repository, got {value!r}")
        lists[key] = tuple(os.path.normpath(p) for p in value)
    unprotected = [t for t in lists["tests"] if not any(_inside(t, p) for p in lists["protected"])]
    if unprotected:
        raise ValueError(f"{spec_file}: tests {unprotected} are not under a protected path: the agent could rewrite what grades it")
    timeout = spec.get("timeout_s", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise ValueError(f"{spec_file}: timeout_s must be a number of seconds in (0, 3600], got {timeout!r}")
    reward = spec.get("reward", "all")
    if reward not in REWARD_RULES:
        raise ValueError(f"{spec_file}: reward must be one of {REWARD_RULES}, got {reward!r}")
    task = Task(
        id=str(spec.get("id", os.path.basename(path))),
        dir=path,
        prompt=prompt,
        protected=lists["protected"],
        tests=lists["tests"],
        pythonpath=lists["pythonpath"],
        timeout_s=float(timeout),
        reward=reward,
        checks=(),
        root=task_root(spec_file, path, spec.get("root")),
    )
    names = check_names(task)
    if not names:
        raise ValueError(f"task directory {path}: no test function in checks/ or the task's tests (def test_... in test_*.py)")
    return dataclasses.replace(task, checks=tuple(names))


def task_root(spec_file: str, task_dir: str, value: object) -> str:
    """task.json's "root" (a path relative to the task directory, or absolute) as a real path; "" for none."""
    if value is None:
        return ""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{spec_file}: root must be a path to a root file system (a directory), got {value!r}")
    root = os.path.realpath(os.path.join(task_dir, value))
    if not os.path.isdir(root):
        raise ValueError(f"{spec_file}: root {value!r} is not a directory ({root})")
    if not any(os.path.isfile(os.path.join(root, sh)) or os.path.islink(os.path.join(root, sh)) for sh in ("bin/sh", "usr/bin/sh")):
        raise ValueError(f"{spec_file}: root {root} has no bin/sh or usr/bin/sh: not a root file system (make one with debootstrap)")
    if root == "/" or any(_inside(root, d) for d in ("/proc", "/sys", "/dev")):
        raise ValueError(f"{spec_file}: root {root} is the host's own / or a kernel file system")
    return root


def _relative(p: str) -> bool:
    norm = os.path.normpath(p)
    return bool(p) and not os.path.isabs(p) and norm != ".." and not norm.startswith("../")


def check_names(task: Task) -> list[str]:
    """The checks of ``task``, read from its test files without running them (``ast``): each test
    function of checks/ and of the task's workspace tests, as pytest names it from the root
    (``checks/test_x.py::test_f``; workspace files without the ``workspace/`` prefix)."""
    files: list[tuple[str, str]] = []  # (host path, name prefix)
    for top, prefix in [(task.checks_dir, "checks"), *((os.path.join(task.base, t), t) for t in task.tests)]:
        if os.path.isfile(top):
            files.append((top, prefix))
            continue
        for d, dirs, names in os.walk(top):
            dirs.sort()
            for n in sorted(names):
                if n.endswith(".py") and (n.startswith("test_") or n.endswith("_test.py")):
                    files.append((os.path.join(d, n), os.path.join(prefix, os.path.relpath(os.path.join(d, n), top))))
    out = []
    for path, name in files:
        with open(path) as f:
            try:
                tree = ast.parse(f.read(), path)
            except SyntaxError as e:
                raise ValueError(f"{path}: not Python ({e})") from None
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                out.append(f"{name}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                out += [
                    f"{name}::{node.name}::{m.name}"
                    for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")
                ]
    return out


def task_reward(task: Task, checks: dict[str, float]) -> float:
    """The reward of a graded workspace: ``task.reward``'s rule over every check the task names
    (a check the grader did not report counts as failed)."""
    passed = [checks.get(name, 0.0) for name in task.checks]
    if task.reward == "fraction":
        return sum(passed) / len(passed)
    return float(all(p == 1.0 for p in passed))


def hidden_paths(task: Task, plan: RootPlan) -> tuple[str, ...]:
    """What an episode's root must mask for ``task``: its directory and the library holding it
    (its parent), where an exposed path of ``plan`` holds them (a task library inside a project's
    package directory: its checks would otherwise be readable)."""
    out: list[str] = []
    for path in (os.path.dirname(task.dir), task.dir):
        if any(_inside(path, h) for h in (*plan.hide, *out)):
            continue
        holders = [b for b in plan.binds if _inside(path, b)]
        if path in holders:  # a bind's own root cannot be masked inside it
            raise ValueError(f"task {task.dir}: {path} is exposed to episodes as a whole (sandbox.expose?); its checks would be readable")
        if holders:
            out.append(path)
    inner = [b for b in plan.binds if _inside(b, task.dir) and b != task.dir]
    if inner:
        raise ValueError(f"task {task.dir}: {inner[0]} inside it is exposed to episodes; its checks could be readable")
    return tuple(out)


# ---- the zygote's side --------------------------------------------------------------------


@dataclass
class WorldResources:
    """One episode's world, held by the zygote from its spawn to the end of its grading."""

    task: Task
    dir: str  # the per-episode tmpfs's mountpoint ("" once released)
    decoys: dict[str, int]  # host path of each decoy file and directory -> its access time (ns) when made
    layer: str = "upper"  # the episode's layer, under ``dir``: a branch's kept copy (``keep_branch_layer``) for its grader

    @property
    def upper(self) -> str:
        return os.path.join(self.dir, self.layer)

    @property
    def work(self) -> str:
        return os.path.join(self.dir, "work")

    def decoy(self, path: str) -> str:
        return os.path.join(self.dir, "decoy", path.strip("/"))

    def task_root(self, who: str) -> TaskRoot | None:
        """``who``'s ("root": the episode's, "grader-root": its grader's) layer over the task's root."""
        if not self.task.root:
            return None
        layer = os.path.join(self.dir, who)
        return TaskRoot(self.task.root, os.path.join(layer, "upper"), os.path.join(layer, "work"), os.path.join(self.dir, "empty"))


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter_private_mounts() -> None:
    """Give this process (the zygote) a mount namespace of its own, receiving the host's mount
    events but sending none: the workspaces' tmpfs mounts are seen by no host process and die with
    the zygote. Needs CAP_SYS_ADMIN (a root zygote)."""
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_SLAVE), None), "mount --make-rslave /")


def worlds_dir(temp_root: str, zygote_pid: int) -> str:
    return os.path.join(temp_root, f"areal-worlds-{zygote_pid}")


def sweep_stale_worlds(temp_root: str) -> list[str]:
    """Remove the workspace directories of zygotes that are gone (their mounts died with them):
    empty mountpoints only; a directory holding anything is left as it is (not ours to delete)."""
    removed = []
    for name in os.listdir(temp_root):
        owner = name.removeprefix("areal-worlds-")
        if owner != name and owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            path = os.path.join(temp_root, name)
            for d in [path, *(os.path.join(path, n) for n in os.listdir(path))][::-1]:
                try:
                    os.rmdir(d)
                except OSError:  # not empty: kept; the next sweep tries again
                    continue
                removed.append(d)
    return removed


def prepare(task: Task, name: str, parent: str, size_bytes: int) -> WorldResources:
    """Zygote side, before the episode's fork: its tmpfs under ``parent`` (``worlds_dir``) with its
    layer's directories and its decoys."""
    path = os.path.join(parent, name)
    os.makedirs(path, mode=0o700)
    rc = _libc.mount(b"tmpfs", path.encode(), b"tmpfs", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV), f"size={size_bytes},mode=0700".encode())
    if rc != 0:
        err = ctypes.get_errno()
        os.rmdir(path)
        raise OSError(err, f"mount tmpfs {path}: {os.strerror(err)}")
    res = WorldResources(task, path, {})
    try:
        os.mkdir(res.upper, 0o755)
        os.mkdir(res.work, 0o700)
        if task.root:  # the episode's and the grader's layers over the task's root, and the views' empty lower layer
            for who in ("root", "grader-root"):
                layer = res.task_root(who)
                os.makedirs(layer.upper, 0o755)
                os.mkdir(layer.work, 0o700)
            os.mkdir(os.path.join(path, "empty"), 0o555)
        for where, filename in DECOY_FILES.items():
            d = res.decoy(where)
            os.makedirs(d)
            with open(os.path.join(d, filename), "w") as f:
                f.write("# the checks of this task are not in the episode's view\n")
            for p, mode in ((os.path.join(d, filename), 0o444), (d, 0o555)):
                os.chown(p, DECOY_OWNER, DECOY_OWNER)
                os.chmod(p, mode)
                res.decoys[p] = os.stat(p).st_atime_ns
    except OSError:
        release(res)
        raise
    return res


def release(res: WorldResources) -> None:
    """Unmount the episode's tmpfs and remove its directory (idempotent)."""
    if res.dir:
        _check(_libc.umount2(res.dir.encode(), _MNT_DETACH), f"umount2({res.dir})")
        os.rmdir(res.dir)
        res.dir = ""


def decoy_tripwires(res: WorldResources) -> list[str]:
    """What the decoys saw: a file read, a directory listed (its access time moved)."""
    out = []
    for path, atime in res.decoys.items():
        if os.stat(path).st_atime_ns != atime:
            where = "/" + os.path.relpath(path, os.path.join(res.dir, "decoy"))
            out.append(f"checks_listed: {where}" if os.path.isdir(path) else f"checks_read: {where}")
    return out


BRANCH_POINT = ord("T")  # the request sent at the branch point; after branch i, the request is byte i
MAX_BRANCHES = 16  # as many as the zygote keeps of an outcome (sandbox/zygote.py, episode_says)


@dataclass
class BranchLayers:
    """What the zygote keeps of a world episode's branch point (sandbox/branch.py asks, one byte a
    request, over a pipe of its own): at the branch point, the decoys' tripwires so far; after
    each branch, in order, a copy of the layer it left (``keep_branch_layer``) and what its
    decoys saw. Any other request marks it tampered: no branch of it is then rewarded."""

    trunk_seen: list[str] | None = None  # None: no branch point yet
    kept: list[WorldResources] = dataclasses.field(default_factory=list)
    seen: list[list[str]] = dataclasses.field(default_factory=list)  # by branch, the trunk's first
    grades: dict[int, Grade] = dataclasses.field(default_factory=dict)  # by branch, as their graders report
    tampered: str = ""

    def request(self, res: WorldResources, code: int) -> bool:
        """Act on one request; whether it was done (a copy that failed, the tmpfs full: not done)."""
        if self.tampered:
            return False
        if code == BRANCH_POINT and self.trunk_seen is None:
            self.trunk_seen = decoy_tripwires(res)
            reset_decoys(res)
            return True
        if self.trunk_seen is None or code != len(self.kept) or code >= MAX_BRANCHES:
            self.tampered = f"a request out of order on the channel of its branches' workspaces ({code} after {len(self.kept)} kept)"
            return False
        seen = decoy_tripwires(res)
        reset_decoys(res)
        try:
            kept = keep_branch_layer(res, code)
        except OSError:  # the workspace's tmpfs is full: this branch and the ones after are not graded
            return False
        self.kept.append(kept)
        self.seen.append([*self.trunk_seen, *seen])
        return True


def reset_decoys(res: WorldResources) -> None:
    """The decoys' access times put back as made (their change time moves, so that a later read
    moves the access time again): what a branch's decoys saw is that branch's alone."""
    for path, atime in res.decoys.items():
        os.utime(path, ns=(atime, os.stat(path).st_mtime_ns))


def keep_branch_layer(res: WorldResources, index: int) -> WorldResources:
    """A copy of the episode's layer as branch ``index`` of a branch point left it, on the same
    tmpfs (its size counts), for that branch's grader: the world ``index``'s grader is given.
    Whiteouts and the overlay's attributes (an opaque directory) are copied as they are."""
    kept = dataclasses.replace(res, layer=os.path.join("branches", f"b{index}"))
    os.makedirs(os.path.dirname(kept.upper), mode=0o700, exist_ok=True)
    shutil.copytree(res.upper, kept.upper, symlinks=True, copy_function=_copy_node)
    return kept


def _copy_node(src: str, dst: str) -> None:
    st = os.lstat(src)
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout: the base's entry deleted
        os.mknod(dst, stat.S_IFCHR | stat.S_IMODE(st.st_mode), 0)
        return
    if not stat.S_ISREG(st.st_mode):  # an agent's fifo or socket in its layer: nothing a check reads
        return
    shutil.copy2(src, dst, follow_symlinks=False)  # its bytes, times and attributes


def episode_view(res: WorldResources) -> WorldView:
    return WorldView(
        lower=(res.task.base,),
        upper=res.upper,
        work=res.work,
        decoys=tuple((p, res.decoy(p)) for p in DECOY_FILES),
        root=res.task_root("root"),
    )


def grader_view(res: WorldResources) -> WorldView:
    readonly = [(CHECKS, res.task.checks_dir), (TASK_BASE, res.task.base), (TASK_UPPER, res.upper)]
    if os.path.isdir(res.task.reference_dir):
        readonly.append((REFERENCE, res.task.reference_dir))
    return WorldView(lower=(res.upper, res.task.base), upper="", work="", readonly=tuple(readonly), root=res.task_root("grader-root"))


def apply_branch_grades(
    outcome: EpisodeOutcome, grades: list[Grade], res: WorldResources, seen: list[list[str]], tampered: str
) -> EpisodeOutcome:
    """A branched world episode's outcome: each branch graded on its own kept layer (``grades``;
    ``seen``: the decoys' tripwires of the trunk and of the branch, by branch); the trunk holds no reward.
    ``tampered`` (the episode asked for layers out of order), or layers without branches: every
    grade an error, never a reward taken from a workspace that was not the branch's own."""
    if tampered or not outcome.branches:
        error = Grade("error", detail=tampered or f"the episode kept {len(grades)} branch workspaces but reported no branch")
        seen_all = sorted({w for s in seen for w in s})
        branches = [apply_grade(b, error, res, seen_all) for b in outcome.branches]
        return msgspec.structs.replace(apply_grade(outcome, error, res, seen_all), branches=branches)
    missing = Grade("error", detail="its workspace could not be kept for grading")
    branches = [
        apply_grade(b, grades[i] if i < len(grades) else missing, res, seen[i] if i < len(seen) else [])
        for i, b in enumerate(outcome.branches)
    ]
    return msgspec.structs.replace(outcome, reward=None, rewards_by_id={}, branches=branches, grader=f"graded per branch ({len(grades)})")


def apply_grade(outcome: EpisodeOutcome, grade: Grade, res: WorldResources, seen: list[str]) -> EpisodeOutcome:
    """``outcome`` with the sandbox's word on its world: the grader's checks and verdict, its
    tripwires and ``seen`` (the decoys'), and the reward by the task's rule when the episode ended
    ok (the episode's own reward is dropped whatever it said)."""
    verdict = grade.verdict if not grade.detail else f"{grade.verdict}: {grade.detail}"
    return msgspec.structs.replace(
        outcome,
        reward=task_reward(res.task, grade.checks) if outcome.status == "ok" else None,
        rewards_by_id={},
        checks={name: grade.checks.get(name, 0.0) for name in res.task.checks},
        tripwires=[*seen, *grade.tripwires],
        grader=verdict[:2000],
    )
