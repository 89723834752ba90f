"""Isolation layers for one agent episode, applied in the forked child before user code runs.

    zygote (host namespaces)
      │ prepare(): cgroup dirs memory+pids/areal/<zygote pid>-<slot seq>, fallback temp dir
      └─fork─► episode process (new session = own process group), ahead of its spawn (a warm
               slot, sandbox/zygote.py): every step below runs before the spawn arrives. A root
               zygote forks it as PID 1 of a new PID namespace (``fork_pid_namespace_init``).
                 enter(): join cgroups · [not root: unshare user, uid/gid 0 inside mapped to
                 the zygote's own] · unshare net (lo up) · unshare mount + pivot_root into a
                 minimal read-only root (sandbox/rootfs.py: programs, an /etc allow-list, the
                 interpreter and the agent's code; private /tmp tmpfs, empty /dev/shm tmpfs,
                 gateway socket bound in) · rlimits · no_new_privs · scrubbed env
                 root zygote: mount_proc() (fresh read-only /proc of its PID namespace)
                 not root: └─fork─► agent, PID 1 of a new PID namespace created inside the
                          user namespace (fresh read-only /proc); the episode process waits and
                          forwards its exit status (``fork_into_pid_namespace``)
                 then, in the agent: capabilities dropped, the seccomp filter of sandbox/seccomp.py
      release(): SIGKILL whatever is left in the cgroup, rmdir it (zygote, after the reap)

Each layer is probed once at zygote start (``probe`` tries it in a throwaway child); a layer
the kernel refuses is skipped for every episode and reported as a warning naming it, never
silently. A layer that probed fine but fails for an episode raises: the episode errors.

The user namespace ("userns") is a layer only when the zygote does not run as root. There it is
what makes the others possible: unshare(CLONE_NEWUSER) needs no privilege, and inside it the
episode is uid/gid 0 (mapped to the zygote's uid/gid, one id each, setgroups denied) with every
capability *over its own namespaces*, enough to create its network, mount and PID namespaces,
mount its tmpfs and /proc and make its mounts read-only. Outside it is still the zygote's user:
files, signals and ptrace are checked against that uid, and it gains nothing it did not have.
Layers that need real root stay refused and are warned about: joining a root-owned cgroup v1
hierarchy ("cgroup"; the memory and pids limits then rest on RLIMIT_AS and RLIMIT_NPROC,
which is enforced for a non-root uid). As root the layer is not used (not probed, not listed):
root needs no user namespace to unshare the others, and an identity mapping of root would
restrict nothing the dropped capabilities, no_new_privs and seccomp do not already restrict;
mapping root to an unprivileged uid instead would cost the agent read access to whatever only
root may read, such as an interpreter installed under /root (as on this machine).

What an episode reaches is held to an allow-list (the REACH_* constants below): sandbox/reach.py
surveys an episode from inside (descriptors, shared mappings, namespaces, IPC objects, mounts,
processes) and names whatever the list does not allow, whatever put it there; the survey runs in
tests/integration/sandbox/test_sandbox_reach.py under both event loops the controller may use.

What is covered (each line has an attack in tests/integration/sandbox/test_sandbox_attacks.py):
- network: no interface but its own loopback; the host's loopback ports (gateway HTTP, engine)
  and outside addresses are unreachable. The only way out is the gateway's ipc:// socket *file*
  (a filesystem path; the abstract namespace is per network namespace), where the agent's
  session key is the only key it holds.
- descriptors: only its own (REACH_DESCRIPTORS). The slot closes every descriptor but its spawn
  and result pipes right after the fork, whatever the zygote held or inherited (the zygote too
  closes all but stdio at start: uvloop, for one, gives a child non-close-on-exec copies of its
  pipes and ignores close_fds), so no control channel, sibling pipe or launcher leak reaches it.
- IPC: its own IPC namespace (ipcns): SysV segments, queues and semaphores, and POSIX queues,
  are its own and die with it; none of the host's or another episode's can be attached.
- processes: own session/process group, PID namespace (no other process is visible, so none
  can be signalled, ptraced or have its /proc/<pid>/environ read; everything dies with the
  agent, so a daemonised grandchild or a deadline kill leaves nothing behind), pids cgroup
  (fork bombs stop at ``max_pids``).
- memory: cgroup v1 memory limit on the pages really used (OOM kills are reported as "oom";
  tmpfs pages count too). RLIMIT_AS is off by default (``address_space_bytes``): Node, Bun and
  other runtimes reserve tens of GiB of address space they never touch, and a cap on it fails
  them in every episode (tests/integration/sandbox/test_node_agent.py).
- CPU time (RLIMIT_CPU and the wall-clock deadline), open files, file size (also caps the
  per-episode log, so a stdout flood ends with EFBIG), no core dumps.
- files: the episode's root is minimal (sandbox/rootfs.py): the system's programs and libraries,
  an allow-list of /etc (no shadow, no ssh keys), the interpreter and its site-packages, the
  modules and packages of the other sys.path entries (not the project directory itself: other
  runs' outputs, a .env or .git there are absent), the agent's own directory and
  ``sandbox.expose``, all read-only; the run directory (checkpoints, logs) and ``sandbox.hide``
  masked. Every exposed file is seen through an overlay, so a lock an episode takes on it
  (flock, fcntl) is the overlay's: no host process building a model waits on an episode. Home directories, /root, /var, /run, /sys and other users' and runs'
  files are absent, so a root-owned 0600 file is not readable even by the agent's uid 0. Writable:
  a private size-capped tmpfs on /tmp (HOME and TMPDIR point there) and an empty tmpfs on
  /dev/shm, so the trainer's shared-memory rings are invisible; /proc is the namespace's own,
  read-only; in a world's episode, /workspace (an overlay of its task's base, sandbox/world.py). Secrets in the controller's environment are not inherited (ENV_ALLOW below, and the
  names the user lists in ``sandbox.env``).
- privileges: no_new_privs; all capabilities dropped in the agent (bounding set included), so
  root inside cannot remount, raise rlimits or leave its cgroup; a seccomp deny-list (ptrace,
  mount, namespaces, kernel modules, bpf, keyrings, io_uring, ...; see sandbox/seccomp.py).

What is not covered:
- under a root zygote the agent runs as uid 0 without a user namespace: the read-only mounts,
  dropped capabilities and seccomp are what keep it from root's powers; a kernel bug in an
  allowed syscall is not contained (no VM, no gVisor). Under a non-root zygote it is that user
  outside its user namespace; episodes of one zygote share that uid (no per-episode uid).
- RLIMIT_NPROC is not enforced for root; the pids cgroup is the effective process limit. Under a
  non-root zygote there is no cgroup (see above): RLIMIT_NPROC counts the user's processes.
- CPU shares/quotas (no cpu cgroup): a spinning agent takes a core until its deadline.
- disk bandwidth; the per-episode log on the host disk is bounded only by RLIMIT_FSIZE.
- the cgroup v2 hierarchy (only v1 controllers are used; v2-only hosts skip the cgroup layer).
- readable files inside what is exposed: a package directory of the project is exposed whole
  but for the run directory and ``sandbox.hide``, so a secret or a run's output kept inside a
  package is readable; keep them outside packages, or hide them. Namespaces not made per
  episode: UTS, cgroup, time (and the user namespace under a root zygote). Without the readonly_root layer (skipped,
  or refused by the kernel and warned about) the host's root is visible, and writable where the
  agent's uid may write.
- anything under /tmp that the agent module imports lazily after the fork is hidden by the
  private /tmp unless it is on sys.path (the module itself is imported by the zygote before).
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import re
import resource
import shutil
import signal
import socket
import struct
import sys
import tempfile
from dataclasses import dataclass, field

from sandbox import rootfs, seccomp

log = logging.getLogger("sandbox.isolation")

# Probed in this order, all in one throwaway child: userns before the namespaces it enables,
# readonly_root after cgroup (which needs a writable /sys/fs/cgroup), and before caps (which
# removes the right to remount).
LAYERS = (
    "session",
    "userns",
    "netns",
    "ipcns",
    "mountns",
    "pidns",
    "rlimits",
    "cgroup",
    "env",
    "readonly_root",
    "no_new_privs",
    "caps",
    "seccomp",
)
LAYER_NEEDS = {"readonly_root": "mountns", "seccomp": "no_new_privs"}  # applied only on top of those
CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_CONTROLLERS = ("memory", "pids")
CGROUP_KNOBS = {"memory": "memory.limit_in_bytes", "pids": "pids.max"}  # the v1 file each episode's limit goes to
# Variables an agent may inherit from the zygote; everything else (tokens, keys) is dropped.
# AREAL_CACHE is a path, no secret: an agent that loads the embedded tokenizer ("embedded") must
# find the models where the run built them, not look in its private HOME and build again. So are
# the private venvs' locations: a verifiers or mini-swe-agent episode runs its venv's interpreter
# from inside the sandbox, where the run was told to find it.
ENV_ALLOW = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONHASHSEED",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONIOENCODING",
    "PYTHONUTF8",
    "VIRTUAL_ENV",
    "AREAL_CACHE",
    "AREAL_VERIFIERS_VENV",
    "AREAL_MINI_SWE_VENV",
)
# Set by the sandbox for every episode (scrub_environment; the endpoint variables of
# areal/agent/environment.py, by sandbox/episode.py): never passed from the controller.
SET_PER_EPISODE = (
    "HOME",
    "TMPDIR",
    "NO_PROXY",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_API_KEY",
)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
_CLONE_NEWIPC = 0x08000000

# The allow-list of what an episode reaches once its layers are on (sandbox/reach.py checks it).
REACH_OWN_NAMESPACES = {"net": "netns", "ipc": "ipcns", "mnt": "mountns", "pid": "pidns"}  # never the host's while the layer is on
REACH_DESCRIPTORS = (
    "stdin: /dev/null, read-only",
    "stdout and stderr: its own log file, write-only (its directory is masked)",
    "one pipe, write-only: its result pipe (the zygote reads the other end)",
    "a world's episode: two more pipes to the zygote, one write-only, one read-only: the branch point's channel (sandbox/branch.py)",
    "sockets of its own network namespace: the relay's, the gateway socket file's, its event loop's",
    "files and directories it could open by their path anyway",
    "anonymous inodes of its own event loops (REACH_ANON_INODES)",
)
REACH_ANON_INODES = ("anon_inode:[eventfd]", "anon_inode:[eventpoll]", "anon_inode:[timerfd]", "anon_inode:[signalfd]")
# MAP_SHARED: only read-only mappings of files it can read anyway (glibc maps its gconv cache so);
# none writable, none of memory outside its root (a ring, a SysV segment, a sibling's pages).
REACH_SHARED_MAPPINGS = (
    "read-only mappings of files reachable by path",
    "read-only mappings of the host's system files (rootfs.SYSTEM_DIRS), readable by path on the host's root; "
    "on a task's root, the zygote's own (the C library's locale caches) come with the fork",
)
REACH_MOUNTS = {  # file system type -> where an episode's root may have one (readonly_root layer)
    "tmpfs": "/ (read-only), the writable REACH_WRITABLE, read-only masks over hidden paths",
    "overlay": "read-only views of the planned paths (ZygoteReady.root): locks there stay inside",
    "proc": "/proc, its PID namespace's",
    "devtmpfs": "device nodes (rootfs.DEVICES) and /dev/null over hidden files",
}
REACH_WRITABLE = ("/tmp", "/dev/shm")
# A world's episode (sandbox/world.py): mount point -> its file system type, writable.
REACH_WORLD_MOUNTS = {
    "/": "overlay",  # a task's root file system under a layer of its own (task.json "root")
    "/workspace": "overlay",  # its task's base under a layer of its own: the agent's working copy
    "/checks": "tmpfs",  # decoys: files owned by nobody, readable, not writable (their access times are the evidence)
    "/reference": "tmpfs",
}
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 24, 38
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class SandboxConfig:
    """Limits for every episode of one zygote. ``None`` disables a limit."""

    deadline_s: float = 600.0  # wall-clock deadline when SpawnEpisode/run_episode gives none
    cpu_seconds: int | None = 600  # RLIMIT_CPU (SIGXCPU, then SIGKILL) of each process
    # RLIMIT_AS, off by default: runtimes reserve far more address space than they touch (Node's V8
    # and WebAssembly reserve tens of GiB), so a cap on it fails them; memory_limit_bytes (the
    # cgroup) bounds the pages really used.
    address_space_bytes: int | None = None
    max_processes: int | None = 4096  # RLIMIT_NPROC (per uid; ignored for root, see max_pids)
    open_files: int | None = 1024  # RLIMIT_NOFILE
    file_size_bytes: int | None = 64 << 20  # RLIMIT_FSIZE: largest file, including the episode log
    memory_limit_bytes: int | None = 2 << 30  # cgroup memory.limit_in_bytes per episode
    max_pids: int | None = 256  # cgroup pids.max per episode (threads count)
    tmp_size_bytes: int = 256 << 20  # size of the private tmpfs mounted on /tmp
    shm_size_bytes: int = 64 << 20  # size of the empty tmpfs that replaces /dev/shm
    temp_root: str = field(default_factory=tempfile.gettempdir)  # host dir for temp dirs without mountns
    log_tail_bytes: int = 4096  # how much of the episode log a failed outcome carries
    skip_layers: list[str] = field(default_factory=list)  # layers not to apply, from LAYERS
    warm_slots: int = 2  # episode processes kept set up (every layer applied) and waiting for a spawn
    # Back the zygote's preloaded heap by huge pages (sandbox/heap.py): fewer page-table entries
    # for every episode's fork to copy and its exit to drop. False: 4 KiB pages, as allocated.
    huge_pages: bool = True
    # The minimal root (sandbox/rootfs.py): extra paths episodes may read (model or tool files), and
    # paths masked even inside an exposed directory (the controller adds its run directory).
    expose: list[str] = field(default_factory=list)
    hide: list[str] = field(default_factory=list)
    # Modules the zygote imports before its first fork, beside what the agent's module imports at
    # its top (always preloaded). A module an episode imports at run time is imported again by
    # every episode (an SDK: ~0.5 s of CPU each): the controller names such modules once
    # (EpisodeOutcome.imported); list them here. Each module listed costs every fork its pages.
    preload: list[str] = field(default_factory=lambda: ["openai", "anthropic"])
    # Names of variables of the controller's environment that episodes get too (a tool's token, a
    # config path), beside ENV_ALLOW; every other variable is dropped. Inline episodes see the whole
    # environment anyway. Not the ones the sandbox sets for each episode (SET_PER_EPISODE).
    env: list[str] = field(default_factory=list)
    # Size of the tmpfs that holds each world episode's writable layer of /workspace (sandbox/world.py):
    # what an agent may change or add to its task's repository; its pages count to its memory limit too.
    workspace_size_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        if not self.deadline_s > 0:
            raise ValueError(f"sandbox.deadline_s must be > 0, got {self.deadline_s}")
        for name in (
            "cpu_seconds",
            "address_space_bytes",
            "max_processes",
            "open_files",
            "file_size_bytes",
            "memory_limit_bytes",
            "max_pids",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"sandbox.{name} must be a positive int or None, got {value!r}")
        for name in ("tmp_size_bytes", "shm_size_bytes", "workspace_size_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox.{name} must be > 0, got {getattr(self, name)}")
        if not isinstance(self.warm_slots, int) or self.warm_slots < 0:
            raise ValueError(f"sandbox.warm_slots must be an int >= 0, got {self.warm_slots!r}")
        if self.log_tail_bytes < 0:
            raise ValueError(f"sandbox.log_tail_bytes must be >= 0, got {self.log_tail_bytes}")
        if not os.path.isdir(self.temp_root):
            raise ValueError(f"sandbox.temp_root {self.temp_root!r} is not a directory")
        for p in self.expose:
            if not os.path.isabs(p) or not os.path.exists(p):
                raise ValueError(f"sandbox.expose entry {p!r} is not an existing absolute path")
        for p in self.hide:
            if not os.path.isabs(p):
                raise ValueError(f"sandbox.hide entry {p!r} is not an absolute path")
        bad = [m for m in self.preload if not isinstance(m, str) or not all(part.isidentifier() for part in m.split("."))]
        if bad:
            raise ValueError(f"sandbox.preload entries must be module names (e.g. anthropic, langchain_openai), got {bad!r}")
        bad = [n for n in self.env if not isinstance(n, str) or not ENV_NAME.fullmatch(n)]
        if bad:
            raise ValueError(f"sandbox.env entries must be environment variable names (letters, digits, _; not a digit first), got {bad!r}")
        own = sorted(set(self.env) & set(SET_PER_EPISODE))
        if own:
            raise ValueError(f"sandbox.env cannot pass {own}: the sandbox sets them for every episode")
        unknown = sorted(set(self.skip_layers) - set(LAYERS))
        if unknown:
            raise ValueError(f"sandbox.skip_layers has unknown layer(s) {unknown}; known: {list(LAYERS)}")


@dataclass
class EpisodeResources:
    """Host-side state of one episode, created by the zygote before the fork."""

    name: str  # "<zygote pid>-<slot seq>"
    cgroups: list[str]  # cgroup directories the episode joins
    host_tmp: str  # private temp dir on the host; used only when the mount layer is off


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags: int, what: str) -> None:
    _check(_libc.unshare(flags), f"unshare({what})")


def _cstr(s: str | None) -> bytes | None:
    return s.encode() if s is not None else None


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc.mount(_cstr(src), _cstr(target), _cstr(fstype), ctypes.c_ulong(flags), _cstr(data))
    _check(rc, f"mount {target}")


def _prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def set_parent_death_signal() -> None:
    """Die with SIGKILL when the parent dies, so a killed zygote leaves no episodes behind."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def wanted_layers() -> tuple[str, ...]:
    """The layers this process probes: LAYERS, less "userns" when it runs as root (see above)."""
    return tuple(layer for layer in LAYERS if layer != "userns" or os.geteuid() != 0)


def _enter_user_namespace() -> None:
    """New user namespace in which this process is uid 0 and gid 0, mapped to its effective
    uid and gid outside (the only mapping an unprivileged process may write for itself)."""
    uid, gid = os.geteuid(), os.getegid()  # before the unshare: inside, they read as the overflow id
    _unshare(_CLONE_NEWUSER, "CLONE_NEWUSER")
    # "deny" before gid_map: the kernel lets an unprivileged writer set gid_map only once
    # setgroups() is disabled, so that dropping a group cannot lift a group-based deny.
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())  # a map must arrive in one write
        finally:
            os.close(fd)


def _loopback_up() -> None:
    # A new network namespace has only "lo", and it is down: bring it up so the relay can listen.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0))
        flags = struct.unpack("16sH14x", ifr)[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _code_dirs_under_tmp() -> list[str]:
    """Directories the agent's Python needs that live under /tmp (a venv or a checkout there):
    the interpreter prefixes and every sys.path entry, reduced to the outermost ones."""
    found = sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *sys.path) if p and os.path.isdir(p)})
    kept: list[str] = []
    for p in found:
        if p.startswith("/tmp/") and not any(p.startswith(k + "/") for k in kept):
            kept.append(p)
    return kept


def _private_tmp(size: int, keep_path: str, shm_size: int = 1 << 20) -> None:
    """New mount namespace with a tmpfs on /tmp and an empty one on /dev/shm (the trainer's
    rings and other processes' segments live there), the host's root otherwise as it is: the
    mountns layer without readonly_root (whose minimal root, sandbox/rootfs.py, replaces all of
    this). Kept visible: ``keep_path`` (the gateway socket), and, read-only, the code the agent
    imports lazily if it lives under /tmp (without this, a project cloned into /tmp would lose
    its own virtualenv inside the sandbox)."""
    keep = os.path.realpath(keep_path) if keep_path else ""
    _unshare(_CLONE_NEWNS, "CLONE_NEWNS")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # keep our mounts from propagating to the host
    # Opened inside the new namespace: a bind source must be a mount of the caller's namespace.
    # O_PATH fds keep the originals reachable once the tmpfs hides their paths.
    binds = [(d, os.open(d, os.O_PATH), True) for d in _code_dirs_under_tmp()]
    if keep.startswith("/tmp/"):
        binds.append((keep, os.open(keep, os.O_PATH), False))
    _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={size},mode=1777")
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, f"size={shm_size},mode=1777")
    for path, fd, is_dir in binds:
        if is_dir:
            os.makedirs(path, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
            _mount(None, path, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY)
        else:  # the socket inode, bound onto an empty file at the same path
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()
            _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND)
        os.close(fd)


def close_all_fds_but(keep: tuple[int, ...]) -> None:
    """Close every descriptor of this process but ``keep``, whoever opened it and whatever its
    close-on-exec flag (``close_range`` over each gap). What a process forked from the zygote
    holds is otherwise whatever the zygote held: its control channel, other slots' pipes, and
    descriptors its own launcher leaked into it."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    end = 1 << 20 if hard == resource.RLIM_INFINITY else max(hard, 1024)
    low = 0
    for fd in sorted(set(keep)):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, end)


def _rlimits(config: SandboxConfig) -> None:
    limits = {
        resource.RLIMIT_CPU: config.cpu_seconds,
        resource.RLIMIT_AS: config.address_space_bytes,
        resource.RLIMIT_NPROC: config.max_processes,
        resource.RLIMIT_NOFILE: config.open_files,
        resource.RLIMIT_FSIZE: config.file_size_bytes,
        resource.RLIMIT_CORE: 0,
    }
    for which, value in limits.items():
        if value is not None:
            resource.setrlimit(which, (value, value))
    # Python ignores SIGXFSZ, so an oversized write raises OSError(EFBIG) instead of killing.


def _drop_capabilities() -> None:
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        _prctl(_PR_CAPBSET_DROP, cap)
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = ctypes.create_string_buffer(24)  # two zeroed {effective, permitted, inheritable}
    _check(_libc.capset(ctypes.c_char_p(header), data), "capset")


def scrub_environment(home: str, passed: list[str] | tuple[str, ...] = ()) -> None:
    """Keep only ENV_ALLOW and ``passed`` (``sandbox.env``); HOME and TMPDIR point at the private temp dir."""
    kept = {k: v for k, v in os.environ.items() if k in ENV_ALLOW or k in passed}
    os.environ.clear()  # unsetenv as well, so subprocesses of the agent see the same
    os.environ.update(kept, HOME=home, TMPDIR=home, NO_PROXY="127.0.0.1,localhost")


def probe(config: SandboxConfig) -> tuple[list[str], list[str]]:
    """Try every layer in a throwaway child; returns (available layers, one warning per other)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # probe child: report "layer=error" lines, never return
        os.close(r)
        lines, wanted = [], wanted_layers()  # before the userns probe: inside it, every uid reads 0
        for layer in wanted:
            try:
                # A skipped layer is not applied here either: the later probes must run in the
                # state episodes will have (without userns, a non-root netns probe must fail).
                if layer not in config.skip_layers:
                    _probe_layer(layer, config, root="userns" not in wanted)
                lines.append(f"{layer}=")
            except BaseException as e:  # process boundary: every failure becomes a report line
                lines.append(f"{layer}={type(e).__name__}: {e}".replace("\n", " "))
        os.write(w, "\n".join(lines).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        report = f.read().decode()
    os.waitpid(pid, 0)
    available, warnings = [], []
    for line in report.splitlines():
        layer, _, error = line.partition("=")
        need = LAYER_NEEDS.get(layer)
        if need and not error and (need in config.skip_layers or need not in available):
            error = f"needs the {need} layer"
        if layer in config.skip_layers:
            warnings.append(f"{layer}: skipped by sandbox.skip_layers")
        elif error:
            warnings.append(f"{layer}: not available ({error}); episodes run without it")
        else:
            available.append(layer)
    for warning in warnings:
        log.warning("isolation layer %s", warning)
    if "seccomp" in available:
        seccomp.compile_filter()  # once here, in the zygote: episodes only load the program
    return available, warnings


def _probe_layer(layer: str, config: SandboxConfig, root: bool) -> None:
    if layer == "session":
        os.setsid()
    elif layer == "userns":  # first: the namespace probes below then run inside it, as episodes do
        _enter_user_namespace()
    elif layer == "netns":
        _unshare(_CLONE_NEWNET, "CLONE_NEWNET")
        _loopback_up()
    elif layer == "ipcns":
        _unshare(_CLONE_NEWIPC, "CLONE_NEWIPC")
    elif layer == "mountns":
        _private_tmp(1 << 20, "")
    elif layer == "readonly_root":  # a namespace of its own: never touch the host's mount table
        secret = "/etc/shadow" if os.path.exists("/etc/shadow") else ""
        rootfs.enter_minimal_root(rootfs.plan_root([], [], [])[0], 1 << 20, 1 << 20, "")
        if secret and os.path.exists(secret):
            raise OSError(f"the minimal root still shows {secret}")
    elif layer == "pidns":  # as the zygote will fork episodes: fork_pid_namespace_init as root
        if root:
            pid = fork_pid_namespace_init()
        else:
            _unshare(_CLONE_NEWPID, "CLONE_NEWPID")
            pid = os.fork()
        if pid == 0:
            os._exit(0 if os.getpid() == 1 else 1)
        if os.waitpid(pid, 0)[1] != 0:
            raise OSError("first child of the new PID namespace is not PID 1")
    elif layer == "cgroup":  # what prepare() will do: a directory per controller, its limit written
        limits = {"memory": config.memory_limit_bytes, "pids": config.max_pids}
        for c in CGROUP_CONTROLLERS:
            if not os.path.exists(os.path.join(CGROUP_ROOT, c, "tasks")):  # every v1 group has it, no v2 one
                # A cgroup v2 host: mkdir there succeeds (a nested v2 group), a v1 limit does not.
                raise OSError(f"no cgroup v1 {c} hierarchy at {os.path.join(CGROUP_ROOT, c)} (cgroup v2 is not used)")
            d = os.path.join(CGROUP_ROOT, c, "areal", f"probe-{os.getpid()}")
            os.makedirs(d)
            try:
                if limits[c] is not None:
                    with open(os.path.join(d, CGROUP_KNOBS[c]), "w") as f:
                        f.write(str(limits[c]))
            finally:
                os.rmdir(d)
    elif layer == "rlimits":
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    elif layer == "no_new_privs":
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    elif layer == "caps":
        _drop_capabilities()
    elif layer == "seccomp":
        seccomp.install_filter()
    # "env" needs no kernel support


def sweep_stale_cgroups() -> list[str]:
    """Remove empty episode cgroups whose zygote is gone (it was SIGKILLed); returns them."""
    removed = []
    for c in CGROUP_CONTROLLERS:
        parent = os.path.join(CGROUP_ROOT, c, "areal")
        if not os.path.isdir(parent):
            continue
        for name in os.listdir(parent):
            d = os.path.join(parent, name)
            owner = name.split("-", 1)[0]
            if not (os.path.isdir(d) and owner.isdigit()) or os.path.exists(f"/proc/{owner}"):
                continue
            # Another zygote's sweep may remove the same group meanwhile (ENOENT, or ENODEV on a
            # group being removed), or a process may still be leaving it (EBUSY): skip it then.
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    if f.read().split():
                        continue
                os.rmdir(d)
            except OSError:
                continue
            removed.append(d)
    return removed


def prepare(config: SandboxConfig, layers: list[str], name: str) -> EpisodeResources:
    """Zygote side, before the fork: create the episode's cgroups and fallback temp dir."""
    cgroups = []
    if "cgroup" in layers:
        limits = {"memory": config.memory_limit_bytes, "pids": config.max_pids}
        for c in CGROUP_CONTROLLERS:
            d = os.path.join(CGROUP_ROOT, c, "areal", name)
            os.makedirs(d)
            cgroups.append(d)
            if limits[c] is not None:
                with open(os.path.join(d, CGROUP_KNOBS[c]), "w") as f:
                    f.write(str(limits[c]))
    host_tmp = "" if "mountns" in layers else tempfile.mkdtemp(prefix=f"areal-{name}-", dir=config.temp_root)
    return EpisodeResources(name=name, cgroups=cgroups, host_tmp=host_tmp)


def enter(
    config: SandboxConfig,
    layers: list[str],
    res: EpisodeResources,
    gateway_path: str,
    plan: rootfs.RootPlan | None = None,
    view: rootfs.WorldView | None = None,
) -> str:
    """Episode child side: apply every available layer but the PID namespace; returns the home dir.
    ``plan``: the minimal root (``rootfs.plan_root``), used when the readonly_root layer is on;
    ``view``: a world's mounts in it (sandbox/world.py), whose /workspace becomes the working
    directory. ``gateway_path`` "": no way out (a grader)."""
    if view is not None and not {"mountns", "readonly_root"} <= set(layers):
        raise OSError("a world needs the mountns and readonly_root layers, which this zygote does not have")
    if "session" in layers:
        os.setsid()  # own process group: the zygote kills the episode with one killpg
    for d in res.cgroups:
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write("0")  # the writer itself: its getpid() may be 1, of a PID namespace of its own
    if "userns" in layers:  # after the cgroup join, which the namespace's root could not do
        _enter_user_namespace()
        # Linux keeps the death signal across this unshare (the new credentials are a subset of
        # the old); armed again so that a kernel clearing it on any credential change cannot orphan us.
        set_parent_death_signal()
    if "netns" in layers:
        _unshare(_CLONE_NEWNET, "CLONE_NEWNET")
        _loopback_up()
    if "ipcns" in layers:  # SysV segments, queues, semaphores and POSIX queues of its own, gone with it
        _unshare(_CLONE_NEWIPC, "CLONE_NEWIPC")
    home = res.host_tmp
    if "mountns" in layers and "readonly_root" in layers:
        if plan is None:
            raise ValueError("the readonly_root layer needs a RootPlan (rootfs.plan_root)")
        rootfs.enter_minimal_root(plan, config.tmp_size_bytes, config.shm_size_bytes, gateway_path, view)
        home = "/tmp"
    elif "mountns" in layers:
        _private_tmp(config.tmp_size_bytes, gateway_path, shm_size=config.shm_size_bytes)
        home = "/tmp"
    if "rlimits" in layers:
        _rlimits(config)
    if "no_new_privs" in layers:
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if "env" in layers:
        scrub_environment(home, config.env)
    if view is not None:  # the shell commands of a world's agent find the sandbox's interpreter (and its pytest) first
        os.environ["PATH"] = os.pathsep.join(p for p in (os.path.dirname(sys.executable), os.environ.get("PATH", "")) if p)
        os.chdir(rootfs.WORKSPACE)
    else:
        os.chdir(home)
    return home


def forks_pid_namespace_init(layers: list[str]) -> bool:
    """Whether the zygote forks episodes straight into their PID namespace (it may create one:
    root) rather than the episode forking once more inside its user namespace."""
    return "pidns" in layers and "userns" not in layers


_own_pid_namespace: int | None = None  # an fd of the zygote's PID namespace, opened once


def fork_pid_namespace_init() -> int:
    """``os.fork``, the child being PID 1 of a new PID namespace (needs CAP_SYS_ADMIN: a root
    zygote). One fork of the zygote per episode instead of two (``fork_into_pid_namespace``):
    the second one would copy the zygote's page tables again and keep a second copy of them
    alive for the whole episode. unshare(CLONE_NEWPID) only sets where the caller's next
    children go; setns back to its own namespace restores that, so the zygote's other forks
    (its reporter) stay in the host namespace."""
    global _own_pid_namespace
    if _own_pid_namespace is None:
        _own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    _unshare(_CLONE_NEWPID, "CLONE_NEWPID")
    try:
        pid = os.fork()
    except BaseException:
        _check(_libc.setns(_own_pid_namespace, _CLONE_NEWPID), "setns(CLONE_NEWPID)")
        raise
    if pid:  # the parent: its next fork goes to its own namespace again
        _check(_libc.setns(_own_pid_namespace, _CLONE_NEWPID), "setns(CLONE_NEWPID)")
    else:  # the episode keeps no handle on the host's PID namespace
        os.close(_own_pid_namespace)
        _own_pid_namespace = None
    return pid


def mount_proc(readonly: bool) -> None:
    """In PID 1 of a PID namespace with private mounts: a /proc that shows only that namespace.
    Read-only: uid 0 without capabilities may still write root-owned /proc/sys files."""
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | (_MS_RDONLY if readonly else 0))


def fork_into_pid_namespace(mount_proc_too: bool, readonly_proc: bool = False) -> None:
    """Returns only in the new namespace's PID 1; the caller's process waits and mirrors its end.
    For a zygote that cannot create a PID namespace itself (not root: only inside the episode's
    user namespace)."""
    _unshare(_CLONE_NEWPID, "CLONE_NEWPID")
    pid = os.fork()
    if pid == 0:
        set_parent_death_signal()
        if mount_proc_too:
            mount_proc(readonly_proc)
        return
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # the two that cannot be caught or reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # die by the same signal so the zygote sees it
        os._exit(128 + sig)  # signals whose default action is to ignore
    os._exit(os.waitstatus_to_exitcode(status))


def finish_agent_setup(layers: list[str]) -> None:
    """In the agent process, last steps before user code: drop every capability, then load the
    seccomp filter (needs no_new_privs, set in ``enter``; the process is still single-threaded,
    so the filter covers every thread the agent starts)."""
    if "caps" in layers:
        _drop_capabilities()
    if "seccomp" in layers:
        seccomp.install_filter()


def oom_killed(res: EpisodeResources) -> bool:
    """True when the episode's memory cgroup recorded an OOM kill."""
    for d in res.cgroups:
        path = os.path.join(d, "memory.oom_control")
        if os.path.exists(path):
            for line in open(path).read().splitlines():
                if line.startswith("oom_kill ") and int(line.split()[1]) > 0:
                    return True
    return False


def release(res: EpisodeResources) -> bool:
    """SIGKILL what is left in the episode's cgroups and remove them; True once all are gone."""
    for d in list(res.cgroups):
        pids = [int(p) for p in open(os.path.join(d, "cgroup.procs")).read().split()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # exited between the read and the kill
                pass
        if pids:
            return False
        os.rmdir(d)
        res.cgroups.remove(d)
    if res.host_tmp:
        shutil.rmtree(res.host_tmp, ignore_errors=True)
        res.host_tmp = ""
    return True
