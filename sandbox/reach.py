"""What an episode can reach, listed from inside it, and held to the allow-list of sandbox/isolation.py.

    episode process ── survey() ──► Reach: every descriptor, shared mapping, namespace, SysV IPC
                                    object, mount and process it can see, read from /proc
    anyone ── unlisted(reach, ...) ──► one line per thing reached that isolation.REACH_* does not
                                       allow, naming it and the rule it broke

The allow-list is written by kind, not by case: a descriptor is allowed because of what it is
(its own log, its result pipe, a socket of its own network namespace, a file it can open by path
anyway), never because of its number. So a leak fails ``unlisted`` whatever caused it: an event
loop that ignores ``close_fds``, a launcher's shell, a new buffer, a new mount. Any agent can call
``survey()``; tests/integration/sandbox/test_sandbox_reach.py does, under both event loops the controller may run.
"""

from __future__ import annotations

import os
import stat

import msgspec

from sandbox import isolation


class Descriptor(msgspec.Struct, frozen=True):
    fd: int
    target: str  # readlink(/proc/self/fd/N): a path, "pipe:[ino]", "socket:[ino]", "anon_inode:[eventfd]", ...
    access: str  # "r", "w" or "rw" (fdinfo flags)
    kind: str  # "file", "dir", "pipe", "socket", "anon", "other"
    reachable_by_path: bool  # a file or directory the episode could open by its path anyway
    own_netns: bool  # a socket of the episode's own network namespace


class Mount(msgspec.Struct, frozen=True):
    point: str
    fstype: str
    readonly: bool
    char_device: bool  # the mount point is a character device (/dev/null bound over a hidden file)


class Reach(msgspec.Struct, frozen=True):
    descriptors: list[Descriptor]
    shared_mappings: list[str]  # MAP_SHARED mappings but read-only ones of files it can read anyway: "<perms> <path or [anon]>"
    namespaces: dict[str, str]  # name -> "net:[4026531840]"
    ipc_objects: list[str]  # SysV segments, queues, semaphore sets: "shm key=... id=..."
    mounts: list[Mount]
    foreign_processes: list[int]  # visible pids whose PID namespace is not the episode's


def survey() -> Reach:
    """In an episode: what it can reach right now."""
    own_sockets = _own_socket_inodes()
    descriptors = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            st = os.fstat(fd)
            flags = int(_fdinfo(fd).get("flags", "0"), 8)
        except OSError:  # the listing's own descriptor, closed by now
            continue
        descriptors.append(_descriptor(fd, target, st, flags, own_sockets))
    return Reach(
        descriptors=descriptors,
        shared_mappings=_shared_mappings(),
        namespaces={n: os.readlink(f"/proc/self/ns/{n}") for n in sorted(os.listdir("/proc/self/ns"))},
        ipc_objects=_ipc_objects(),
        mounts=_mounts(),
        foreign_processes=_foreign_processes(),
    )


def unlisted(reach: Reach, host_namespaces: dict[str, str], layers: list[str], root: list[str], socket_path: str) -> list[str]:
    """Everything in ``reach`` that isolation.REACH_* does not allow, one line each. Given from
    outside the episode: the namespaces of the host (the zygote's), the layers applied, the
    paths the episode's root exposes (``ZygoteReady.root``) and the gateway's socket file."""
    out = []
    pipes = sorted((d for d in reach.descriptors if d.kind == "pipe"), key=lambda d: d.access)
    world = any(m.point == "/workspace" for m in reach.mounts)
    for d in reach.descriptors:
        if d.fd == 0 and d.target == "/dev/null" and d.access == "r":
            continue
        if d.fd in (1, 2) and d.kind == "file" and d.access == "w":
            continue  # its own log (the same write-only file on both; the directory is masked)
        if d.kind == "pipe" and [p.access for p in pipes] in (["w"], sorted(["w", "w", "r"]) if world else ["w"]):
            continue  # its result pipe (the zygote reads the other end); a world's: its branch channel's two too
        if d.kind == "socket" and d.own_netns:
            continue
        if d.kind in ("file", "dir") and d.reachable_by_path:
            continue
        if d.kind == "anon" and d.target in isolation.REACH_ANON_INODES:
            continue
        out.append(f"descriptor {d.fd} -> {d.target} ({d.kind}, {d.access}): not in isolation.REACH_DESCRIPTORS")
    out += [f"shared mapping {m}: not in isolation.REACH_SHARED_MAPPINGS" for m in reach.shared_mappings]
    for name, layer in isolation.REACH_OWN_NAMESPACES.items():
        if layer in layers and reach.namespaces.get(name) == host_namespaces.get(name):
            out.append(f"namespace {name} is the host's ({reach.namespaces.get(name)}) although the {layer} layer is on")
    if "ipcns" in layers:
        out += [f"IPC object {o}: an episode's IPC namespace starts empty" for o in reach.ipc_objects]
    if "pidns" in layers:
        out += [f"process {pid} of another PID namespace is visible" for pid in reach.foreign_processes]
    if "readonly_root" in layers:
        out += _unlisted_mounts(reach.mounts, root, socket_path)
    return out


def _unlisted_mounts(mounts: list[Mount], root: list[str], socket_path: str) -> list[str]:
    allowed_files = {f"/dev/{d}" for d in isolation.rootfs.DEVICES} | {os.path.realpath(socket_path)}
    out = []
    for m in mounts:
        rule = isolation.REACH_MOUNTS.get(m.fstype)
        if m.point in allowed_files:
            continue  # a device node, or the gateway's socket: bound, nothing to list or lock
        if isolation.REACH_WORLD_MOUNTS.get(m.point) == m.fstype:
            continue  # a world's workspace and decoys (sandbox/world.py)
        if rule is None:
            out.append(f"mount {m.point} ({m.fstype}): no file system of this type is in isolation.REACH_MOUNTS")
        elif m.fstype == "overlay" and not (m.readonly and any(_under(m.point, p) for p in root)):
            out.append(f"mount {m.point} (overlay, {'ro' if m.readonly else 'rw'}): not a read-only view of a path the root plans")
        elif m.fstype == "tmpfs" and not (m.point in isolation.REACH_WRITABLE or m.readonly):
            out.append(f"mount {m.point} (tmpfs, rw): only {', '.join(isolation.REACH_WRITABLE)} are writable")
        elif m.fstype == "proc" and m.point != "/proc":
            out.append(f"mount {m.point} (proc): a proc file system anywhere but /proc")
        elif m.fstype == "devtmpfs" and not m.char_device:
            out.append(f"mount {m.point} (devtmpfs): not a device node")
    return out


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _descriptor(fd: int, target: str, st: os.stat_result, flags: int, own_sockets: set[int]) -> Descriptor:
    access = ("r", "w", "rw")[flags & 3] if flags & 3 < 3 else "rw"
    if stat.S_ISFIFO(st.st_mode):
        kind = "pipe"
    elif stat.S_ISSOCK(st.st_mode):
        kind = "socket"
    elif target.startswith("anon_inode:"):
        kind = "anon"
    elif stat.S_ISREG(st.st_mode) or stat.S_ISCHR(st.st_mode):
        kind = "file"
    elif stat.S_ISDIR(st.st_mode):
        kind = "dir"
    else:
        kind = "other"
    by_path = False
    if kind in ("file", "dir") and target.startswith("/"):
        try:
            there = os.stat(target)
            by_path = (there.st_dev, there.st_ino) == (st.st_dev, st.st_ino)
        except OSError:
            by_path = False
    return Descriptor(fd, target, access, kind, by_path, kind == "socket" and st.st_ino in own_sockets)


def _fdinfo(fd: int) -> dict[str, str]:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return dict(line.split(":", 1) for line in f.read().split("\n") if ":" in line)


def _own_socket_inodes() -> set[int]:
    """Inodes of the sockets of this process's network namespace (/proc/net lists only those)."""
    inodes: set[int] = set()
    for table, column in (("unix", 6), ("tcp", 9), ("tcp6", 9), ("udp", 9), ("udp6", 9), ("raw", 9), ("raw6", 9), ("netlink", 8)):
        try:
            with open(f"/proc/self/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > column and fields[column].isdigit():
                inodes.add(int(fields[column]))
    return inodes


def _shared_mappings() -> list[str]:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            perms, path = fields[1], fields[5].strip() if len(fields) > 5 else "[anon]"
            readonly_file = perms[1] == "-" and path.startswith("/")
            # a host system file the zygote mapped (the C library's locale caches) comes with the fork onto a task's root
            system = any(path.startswith(d + "/") for d in isolation.rootfs.SYSTEM_DIRS)
            if perms[3] == "s" and not (readonly_file and (os.path.isfile(path) or system)):
                out.append(f"{perms} {path}")
    return out


def _ipc_objects() -> list[str]:
    out = []
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        out += [f"{kind} key={row.split()[0]} id={row.split()[1]}" for row in rows if row.strip()]
    return out


def _mounts() -> list[Mount]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            before, _, after = line.partition(" - ")
            fields = before.split()
            point, options = fields[4].replace("\\040", " "), fields[5].split(",")
            try:
                char_device = stat.S_ISCHR(os.stat(point).st_mode)
            except OSError:  # covered by a later mount
                char_device = False
            out.append(Mount(point, after.split()[0], "ro" in options, char_device))
    return out


def _foreign_processes() -> list[int]:
    own = os.readlink("/proc/self/ns/pid")
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/ns/pid") != own:
                    out.append(int(name))
            except OSError:  # exited, or not ours to read
                continue
    return out
