"""The episode's filesystem: a minimal read-only root made of bind mounts, entered by pivot_root.

    host                                      episode root (a tmpfs, read-only once built)
    /usr /bin→usr/bin /lib /lib64 …  ─ro─►   same paths, symlinks as they were     programs, libraries
    /etc/{passwd,hosts,ssl,…}         ─ro─►   /etc/{…}            an allow-list (ETC_ALLOW); no shadow
    python prefixes, sys.path dirs    ─ro─►   same paths          the interpreter, site-packages, code
    the agent's dir, sandbox.expose   ─ro─►   same paths          what the agent needs, named in config
    sandbox.hide (under any of those) ─ro─►   an empty directory  the run directory: checkpoints, logs
    the gateway's socket              ─────►  same path           the one way out
    /dev/{null,zero,full,random,urandom,tty} ► /dev/…             /dev/shm: an empty tmpfs
                                              /tmp: a private size-capped tmpfs (HOME, TMPDIR)
                                              /proc: the PID namespace's own (isolation.mount_proc),
                                                     over a read-only bind of the host's

Everything else of the host is absent, not merely protected: home directories and /root (ssh
keys, .netrc, tracker tokens, cloud credentials), /etc's secrets, /var, /run, /sys, other users'
files, other runs. This matters because under a root zygote the agent is uid 0: capabilities
are dropped, but an owner's permission check still passes, so a root-owned mode-0600 file that is
visible is readable. A file is readable only if the plan names it or a directory above it.

The plan (``plan_root``) is made once in the zygote, where the host is visible; every episode
builds its root from it (``enter_minimal_root``) in its own mount namespace, before the spawn
arrives (a warm slot), so the mounts cost no episode latency. Paths are resolved to real paths
and nested ones dropped, so each exposed tree is one recursive bind.

A world (sandbox/world.py) adds a ``WorldView`` to an episode's or a grader's root: a writable
overlay at /workspace over the task's read-only layers, read-only binds (the grader's checks), and
decoys (directories of files owned by nobody, readable, with access times kept: what an episode
finds where the grader's checks are mounted). Its sources are opened before anything is hidden,
its mountpoints made before the read-only pass, its mounts made after it (``_mount_view``).

Refused as too broad to expose (a sys.path entry such as the zygote's working directory, or a
``sandbox.expose`` entry): ``/``, ``/tmp``, and any home directory or a directory above one. A user whose
agent lives in a home directory exposes that project's directory, not the home.

Invariants:
- The new root and every bind in it are read-only (one recursive ``mount_setattr``) before the
  writable /tmp and /dev/shm are mounted; binds under /tmp (a venv or a checkout there) are made
  inside the private /tmp from file descriptors opened before anything was hidden.
- The old root is detached (``umount2(MNT_DETACH)``) right after ``pivot_root``: no path leads
  back to it.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import struct
import sys
from dataclasses import dataclass

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What programs read from /etc: users and groups (without password hashes), name resolution, TLS
# roots, the dynamic linker's cache, time zone, MIME and protocol tables, the OS's name.
ETC_ALLOW = (
    "passwd",
    "group",
    "hosts",
    "hostname",
    "resolv.conf",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    "mime.types",
    "os-release",
    "debian_version",
    "alternatives",
    "protocols",
    "services",
    "networks",
    "magic",
    "magic.mime",
)
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

_libc = ctypes.CDLL(None, use_errno=True)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE, _MS_STRICTATIME = 4096, 16384, 1 << 18, 1 << 24
_CLONE_NEWNS, _MNT_DETACH = 0x00020000, 2
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine, 155)
_SYS_MOUNT_SETATTR = 442  # the same on every architecture (numbered after the syscall tables merged)
_AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = -100, 0x8000, 1


@dataclass(frozen=True)
class TaskRoot:
    """A task's own root file system as an episode's / (host directories): ``lower``, the tree (a
    debootstrap, a container image's unpacked layers), read-only and shared; ``upper`` and
    ``work``, the episode's writable layer over it; ``empty``, an empty directory no episode sees
    (the second lower layer of the read-only views of the host's paths)."""

    lower: str
    upper: str
    work: str
    empty: str


@dataclass(frozen=True)
class WorldView:
    """What a world adds to a root (sandbox/world.py makes it; paths on the left are in the root)."""

    lower: tuple[str, ...]  # /workspace's read-only layers, topmost first (host directories)
    upper: str  # /workspace's writable layer (a host directory); "": a fresh one in the root's private /tmp
    work: str  # overlayfs's work directory beside ``upper`` ("" with it)
    readonly: tuple[tuple[str, str], ...] = ()  # (path, host directory): bound read-only
    decoys: tuple[tuple[str, str], ...] = ()  # (path, host directory): bound with strict access times
    root: TaskRoot | None = None  # the task's root file system in place of the host's system paths

    def targets(self) -> list[str]:
        return [WORKSPACE, *(p for p, _ in self.readonly), *(p for p, _ in self.decoys)]

    def host_dirs(self) -> list[str]:
        """Every host directory the view names (opened before anything is hidden)."""
        dirs = [*self.lower, self.upper, self.work, *(d for _, d in (*self.readonly, *self.decoys))]
        if self.root is not None:
            dirs += [self.root.lower, self.root.upper, self.root.work, self.root.empty]
        return [d for d in dirs if d]


WORKSPACE = "/workspace"


@dataclass(frozen=True)
class RootPlan:
    """What an episode's root holds; made by ``plan_root`` in the zygote."""

    binds: tuple[str, ...]  # paths (directories or files) bound read-only at the same path
    links: tuple[tuple[str, str], ...]  # (path, target): symlinks recreated, e.g. /bin -> usr/bin
    hide: tuple[str, ...]  # paths inside ``binds`` replaced by an empty read-only directory or file
    # the paths of ``binds``' making (the interpreter, code, the agent's) that lie inside a system path
    # and so are not binds of their own: bound themselves when a task's root replaces the system paths
    nested: tuple[str, ...] = ()

    def own_binds(self) -> list[str]:
        """What a root on a task's root file system binds: the plan's paths but the host's system
        paths and /etc entries (the task's root has its own), with the ones nested in them."""
        system = [*SYSTEM_DIRS, "/etc"]
        return sorted({*(b for b in self.binds if not any(_inside(b, d) for d in system)), *self.nested})


def home_dirs() -> set[str]:
    """Home directories of people: root's, every login user's (uid >= 1000, not nobody) and
    $HOME. System accounts' homes (/bin for sync, /usr/games, /var/spool/...) are not homes."""
    people = [p.pw_dir for p in pwd.getpwall() if p.pw_uid == 0 or 1000 <= p.pw_uid < 65534]
    homes = {os.path.realpath(h) for h in [*people, os.path.expanduser("~")] if h not in ("", "/", "/nonexistent")}
    return homes - {"/"}


def broad_paths() -> set[str]:
    """``/``, the shared temp dirs, and every home directory with the directories above it:
    never exposed whole."""
    out = {"/", "/tmp", "/var/tmp", "/dev/shm"}
    for home in home_dirs():
        while home not in ("/", ""):
            out.add(home)
            home = os.path.dirname(home)
    return out


def python_paths() -> list[str]:
    """The interpreter's prefixes and every sys.path entry under them (the standard library,
    site-packages): exposed whole."""
    prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    inside = [p for p in sys.path if p and any(_inside(os.path.realpath(p), os.path.realpath(x)) for x in prefixes)]
    return [p for p in (*prefixes, *inside) if p and os.path.exists(p)]


def code_paths() -> list[str]:
    """What Python can import from the sys.path entries outside the interpreter's prefixes (a
    project's checkout, PYTHONPATH): each entry's modules and package directories, not the entry
    itself. A project directory also holds what no episode may read: other runs' outputs
    (``runs/``, ``multirun/``: prompts, completions, weights), a ``.env``, ``.git``; none of them
    is a package, so none is exposed, including a run started after the zygote."""
    exposed, broad = set(python_paths()), broad_paths()
    out: list[str] = []
    for entry in sys.path:
        entry = os.path.abspath(entry or os.getcwd())
        if entry in exposed or not os.path.exists(entry):
            continue
        if not os.path.isdir(entry) or {entry, os.path.realpath(entry)} & broad:  # a zip; or /, a home: refused by plan_root
            out.append(entry)
            continue
        for name in sorted(os.listdir(entry)):
            path = os.path.join(entry, name)
            if _importable(path, depth=2):
                out.append(path)
    return out


_MODULE_SUFFIXES = (".py", ".pyc", ".so")


def _importable(path: str, depth: int) -> bool:
    """A module file, or a directory named like a package that holds one within ``depth`` levels
    (a regular package, a namespace package, ``examples/<name>/agent.py``)."""
    name = os.path.basename(path)
    if name.startswith("."):
        return False
    if os.path.isfile(path):
        return name.endswith(_MODULE_SUFFIXES)
    if not (os.path.isdir(path) and name.isidentifier()) or depth == 0:
        return False
    try:
        children = os.listdir(path)
    except OSError:
        return False
    files = [c for c in children if c.endswith(_MODULE_SUFFIXES) and os.path.isfile(os.path.join(path, c))]
    return bool(files) or any(_importable(os.path.join(path, c), depth - 1) for c in children if not c.endswith(_MODULE_SUFFIXES))


def plan_root(expose: list[str], hide: list[str], extra: list[str]) -> tuple[RootPlan, list[str]]:
    """The plan for ``expose`` (config: must exist, not too broad) plus the system, Python and
    ``extra`` paths (the agent's own; skipped with a warning when too broad); returns
    (plan, warnings)."""
    broad, homes, warnings = broad_paths(), home_dirs(), []
    for p in expose:
        if not os.path.isabs(p) or not os.path.exists(p):
            raise ValueError(f"sandbox.expose entry {p!r} is not an existing absolute path")
        if os.path.realpath(p) in broad:
            raise ValueError(f"sandbox.expose entry {p!r} is / or a home directory (or above one): expose the project or file inside it")
    links = tuple((d, os.readlink(d)) for d in SYSTEM_DIRS if os.path.islink(d))
    # Targets: /etc entries at their own path (a symlinked resolv.conf must still be /etc/resolv.conf);
    # every other path at its real path and, when it differs, at the path as named too.
    targets = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    targets += [f"/etc/{n}" for n in ETC_ALLOW if os.path.exists(f"/etc/{n}")]
    own: list[str] = []  # the interpreter's, the code's, the agent's and the config's paths
    for p in [*python_paths(), *code_paths(), *extra, *expose]:
        p = os.path.abspath(p)
        forms = {p, os.path.realpath(p)}
        if forms & broad:
            if forms & homes:  # code may live there (a zygote started in a home directory): say so
                warnings.append(
                    f"not exposed to episodes: {p} (a home directory); "
                    "put the agent's code in a project directory or name one in sandbox.expose"
                )
            continue
        own += sorted(forms)
    targets += own
    kept: list[str] = []
    for p in sorted(set(targets)):
        if not any(_inside(p, k) for k in kept):
            kept.append(p)
    nested: list[str] = []  # own paths inside a system one, each once (not inside another)
    for p in sorted(set(own)):
        if any(_inside(p, d) for d in (*SYSTEM_DIRS, "/etc")) and not any(_inside(p, n) for n in nested):
            nested.append(p)
    hidden = sorted({h for h in (os.path.abspath(h) for h in hide) for k in kept if _inside(h, k) and h != k})
    return RootPlan(binds=tuple(kept), links=links, hide=tuple(hidden), nested=tuple(nested)), warnings


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None
    _check(_libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _readonly_tree(path: str) -> None:
    attr = struct.pack("QQQQ", _MOUNT_ATTR_RDONLY, 0, 0, 0)  # struct mount_attr: set, clr, propagation, userns
    rc = _libc.syscall(
        ctypes.c_long(_SYS_MOUNT_SETATTR),
        ctypes.c_int(_AT_FDCWD),
        path.encode(),
        ctypes.c_uint(_AT_RECURSIVE),
        attr,
        ctypes.c_size_t(len(attr)),
    )
    _check(rc, f"mount_setattr({path}, AT_RECURSIVE, MOUNT_ATTR_RDONLY)")


def _mountpoint(path: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(path, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _bind(fd: int, target: str, is_dir: bool, readonly: bool) -> None:
    _mountpoint(target, is_dir)
    _mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)
    if readonly:
        _readonly_tree(target)


def _overlay(fd: int, target: str, empty: str) -> None:
    """The directory ``fd`` at ``target``, seen through a read-only overlay (its lower layers: the
    directory and ``empty``; no upper layer, so nothing can be written): a file opened there is
    the overlay's, so a lock taken on it (flock, fcntl) is not a lock on the host's file."""
    _mountpoint(target, is_dir=True)
    _mount("overlay", target, "overlay", _MS_RDONLY | _MS_NOSUID | _MS_NODEV, f"lowerdir=/proc/self/fd/{fd}:{empty}")


def _expose(
    sources: list[tuple[str, int, bool]], real: dict[str, str], parents: dict[str, int], root: str, empty: str, staging: str
) -> None:
    """Each source at ``root + path`` through an overlay (``_overlay``; ``empty``: an empty
    directory, its second lower layer): a directory as its own overlay; a file bound from an
    overlay of its parent, made once per parent on ``staging`` and detached once its files are
    bound (the binds keep it; no path leads to it). ``real``: each file's real path; ``parents``:
    an O_PATH descriptor of each real path's directory, opened before anything was hidden."""
    by_parent: dict[str, list[str]] = {}
    for path, fd, is_dir in sources:
        if is_dir:
            _overlay(fd, root + path, empty)
        else:
            by_parent.setdefault(os.path.dirname(real[path]), []).append(path)
    for parent, files in by_parent.items():
        _overlay(parents[parent], staging, empty)
        for path in files:
            _mountpoint(root + path, is_dir=False)
            _mount(f"{staging}/{os.path.basename(real[path])}", root + path, None, _MS_BIND)
        _check(_libc.umount2(staging.encode(), _MNT_DETACH), f"umount2({staging})")
    if os.path.isdir(staging):
        os.rmdir(staging)


def _mount_view(root: str, view: WorldView, fds: dict[str, int]) -> None:
    """``view`` into ``root`` (after its read-only pass and its /tmp); ``fds``: an O_PATH
    descriptor of each host directory it names, opened before anything was hidden."""
    upper, work = (f"/proc/self/fd/{fds[view.upper]}", f"/proc/self/fd/{fds[view.work]}") if view.upper else ("", "")
    if not view.upper:  # the grader's scratch layer: what its checks write stays in its own /tmp
        upper, work = f"{root}/tmp/.world/upper", f"{root}/tmp/.world/work"
        os.makedirs(upper, mode=0o755)
        os.makedirs(work, mode=0o700)
    lower = ":".join(f"/proc/self/fd/{fds[d]}" for d in view.lower)
    # No redirects and no metacopy: an episode's upper layer holds whole files and plain
    # directories, so that it can serve as a lower layer of the grader's view as it is.
    options = f"lowerdir={lower},upperdir={upper},workdir={work},redirect_dir=off,metacopy=off,index=off"
    _mount("overlay", root + WORKSPACE, "overlay", _MS_NOSUID | _MS_NODEV, options)
    for path, source in view.readonly:
        _bind(fds[source], root + path, is_dir=True, readonly=True)
    for path, source in view.decoys:
        _bind(fds[source], root + path, is_dir=True, readonly=False)
        # Access times updated on every read: the evidence of sandbox/world.py's decoys.
        _mount(None, root + path, None, _MS_BIND | _MS_REMOUNT | _MS_STRICTATIME | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)


def _stage_root(root: str, task_root: TaskRoot | None, fds: dict[str, int]) -> str:
    """The new root's file system at ``root``: a small tmpfs, or the task's tree under the episode's
    own layer (writable: every change the episode's alone); returns the empty directory the views
    of the host's paths take as their second lower layer, which no episode can write into (read-only
    with the tmpfs, or outside the task's root)."""
    if task_root is None:
        _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
        os.makedirs(f"{root}/.empty", mode=0o755)
        return f"{root}/.empty"
    fd = {k: f"/proc/self/fd/{fds[getattr(task_root, k)]}" for k in ("lower", "upper", "work", "empty")}
    options = f"lowerdir={fd['lower']},upperdir={fd['upper']},workdir={fd['work']},redirect_dir=off,metacopy=off,index=off"
    _mount("overlay", root, "overlay", _MS_NOSUID | _MS_NODEV, options)
    return fd["empty"]


def enter_minimal_root(plan: RootPlan, tmp_size: int, shm_size: int, socket_path: str, view: WorldView | None = None) -> None:
    """A new mount namespace whose root holds only ``plan`` (read-only), a private /tmp, an empty
    /dev/shm, the devices of DEVICES and the gateway's socket (none for ""), and ``view``'s
    mounts; and the host's /proc, read-only,
    which the PID namespace's own /proc then covers (``isolation.mount_proc``). It must be
    there: in a user namespace the kernel mounts a new proc only where a fully visible one exists."""
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing of ours propagates to the host
    task_root = view.root if view is not None else None
    # Every source is opened before the staging tmpfs goes over /tmp (O_PATH: no access needed).
    sources = [(p, os.open(p, os.O_PATH), os.path.isdir(p)) for p in (plan.own_binds() if task_root else plan.binds)]
    # A file is bound from an overlay of the directory really holding it (/etc/localtime is a link).
    real = {p: os.path.realpath(p) for p, _, is_dir in sources if not is_dir}
    parents = {d: os.open(d, os.O_PATH | os.O_DIRECTORY) for d in sorted({os.path.dirname(r) for r in real.values()})}
    devices = [(f"/dev/{d}", os.open(f"/dev/{d}", os.O_PATH)) for d in DEVICES if os.path.exists(f"/dev/{d}")]
    sock = os.path.realpath(socket_path) if socket_path else ""
    sock_fd = os.open(sock, os.O_PATH) if sock else -1
    proc_fd = os.open("/proc", os.O_PATH)
    view_fds = {d: os.open(d, os.O_PATH | os.O_DIRECTORY) for d in (view.host_dirs() if view else ())}
    root = "/tmp"  # staging: over /tmp, in this namespace only; it becomes /
    empty = _stage_root(root, task_root, view_fds)
    # Under /tmp: exposed inside the private /tmp, which is mounted after the read-only pass.
    late = [(path, fd, is_dir) for path, fd, is_dir in sources if path == "/tmp" or path.startswith("/tmp/")]
    _expose([s for s in sources if s not in late], real, parents, root, empty, f"{root}/.staging")
    for path, target in plan.links if task_root is None else ():  # a task's root has its own
        os.symlink(target, root + path)
    masks = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | (_MS_RDONLY if task_root else 0)  # else read-only by the pass below
    for path in plan.hide:
        if os.path.exists(root + path) and not (path == "/tmp" or path.startswith("/tmp/")):
            _mount("tmpfs", root + path, "tmpfs", masks, "size=4k,mode=0755") if os.path.isdir(root + path) else _mount(
                "/dev/null", root + path, None, _MS_BIND
            )
    for path, fd in devices:
        _mountpoint(root + path, is_dir=False)
        _mount(f"/proc/self/fd/{fd}", root + path, None, _MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        if not os.path.lexists(f"{root}/dev/{name}"):  # a task's root may have them
            os.symlink(target, f"{root}/dev/{name}")
    for d in ("/proc", "/tmp", "/dev/shm", *(view.targets() if view else ())):
        os.makedirs(root + d, mode=0o755, exist_ok=True)
    _mount(f"/proc/self/fd/{proc_fd}", root + "/proc", None, _MS_BIND | _MS_REC)
    if sock and not sock.startswith("/tmp/"):
        _bind(sock_fd, root + sock, is_dir=False, readonly=False)
    if task_root is None:
        _readonly_tree(root)
    else:  # the root stays writable (the episode's layer); what was bound into it is read-only already, but the host's /proc
        _readonly_tree(root + "/proc")
    _mount("tmpfs", root + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={tmp_size},mode=1777")
    _expose(late, real, parents, root, empty, f"{root}/tmp/.staging")  # overlays are read-only already
    if sock.startswith("/tmp/"):
        _bind(sock_fd, root + sock, is_dir=False, readonly=False)
    for path in plan.hide:  # hidden paths under /tmp (a run directory there)
        if (path == "/tmp" or path.startswith("/tmp/")) and os.path.isdir(root + path):
            _mount("tmpfs", root + path, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY, "size=4k,mode=0755")
    _mount("tmpfs", root + "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, f"size={shm_size},mode=1777")
    if view is not None:
        _mount_view(root, view, view_fds)
    for fd in view_fds.values():
        os.close(fd)
    for _, fd, _ in sources:
        os.close(fd)
    for fd in [fd for _, fd in devices] + list(parents.values()) + [f for f in (sock_fd, proc_fd) if f != -1]:
        os.close(fd)
    os.chdir(root)
    # pivot_root(".", "."): the old root is stacked under the new one; detach it at once.
    _check(_libc.syscall(ctypes.c_long(_SYS_PIVOT_ROOT), b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", _MNT_DETACH), "umount2(old root)")
    os.chdir("/")
