"""Branch points, the episode's half: a sandboxed episode forked at a model call into N branches.

    agent ──call k──► ZmqTransport (async clients) or SyncZmqTransport (sync clients, on the
                      loop's thread) ──x-areal-branchable──► gateway (areal/gateway/branching.py)
                          ◄── branch order: call k, keys K_0..K_N-1 ──┘
      take() / take_sync(): the checks below; any fails ─► the call sent again with
              x-areal-branch-refused: why
              (served as if nothing happened; the reason is kept on both sides)
        the episode process becomes the branches' supervisor: its ZeroMQ context closed (no
        libzmq thread is forked), the other branches' keys zeroed wherever they lie in its
        memory but one vault, its files and descriptor offsets recorded, then, one branch at a time:
          fork ─► branch i: its own key (the vault zeroed), a fresh event-loop selector, its
          │       result pipe on the slot's result fd; call k sent again with K_i, and the agent
          │       goes on from there, unchanged, to its own outcome (sandbox/zygote.py writes it)
          └─ wait for it; kill what it left; restore the files and offsets as they were at call k
        then one EpisodeOutcome with ``branches`` (one per branch) to the zygote; exit.
      a world's episode: /workspace is copied and restored with the temp dir, and the zygote keeps
      each branch's layer for that branch's grader (``_keep``; world.BranchLayers, zygote._branch_requests)

Why one branch at a time: an unprivileged sandboxed process (no capability, seccomp forbids
unshare) cannot give a forked child a mount namespace of its own, so concurrent branches would
share /tmp. Run one after another from the frozen supervisor, each branch starts from the state
of call k (memory: the fork; files under the private temp dir and /dev/shm: restored from the
supervisor's copy; descriptor offsets: reset, as a fork shares them) and no branch is alive
while another runs, so none can observe, signal or change another. The supervisor is not
dumpable (no branch reads or writes its memory through /proc) and, as PID 1 of the episode's PID
namespace, cannot be killed from inside it, and kills everything a branch left before the next
(without the pidns layer: the branch's process group only, and a branch that kills the
supervisor crashes the episode, reported as such). Branches count against the episode's
limits: its deadline covers the trunk and every branch; each branch is one more process
(RLIMIT_NPROC, the pids cgroup) while it runs, and the supervisor's copy of the files is memory
of the episode (its cgroup). A first fork the limits refuse refuses the branch point; a later
one ends the branching there, saying so (``EpisodeOutcome.branch_refused``).

Refused, with the reason recorded (never branched wrongly): not a sandboxed slot; a world on a
task root (its writes outside /workspace are not restored); an event loop that is not asyncio's
selector loop (uvloop's state cannot be rebuilt after a fork); a call not on the main thread;
a sync call made off the loop's thread (``asyncio.to_thread``), or while another thread holds a
connection to the gateway; the loopback relay has served (its thread holds ZeroMQ sockets);
other threads (the loop's idle thread pool is shut down and remade on use; one with work
running is refused); child
processes (fork copies one process: a process tree needs checkpoint/restore, e.g. CRIU, not
implemented); SysV IPC objects; open sockets, pipes, epoll or event descriptors other than the
loop's own and the slot's; files that are not regular files, directories or symlinks under the
private temp dir; more than ``SNAPSHOT_LIMIT`` bytes there.

Not covered: forking an ``exec:`` agent or any call through the loopback relay (only the
transports of sandbox/relay.py can fork the process: the gateway refuses it, or, with
``rollout.branch.replay``, branches the episode by replay instead); nested branch points; a
branch's memory still holds the trunk's key, which the gateway has retired (409).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import selectors
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from areal.protocol import BRANCH_REASON_LIMIT as REASON_LIMIT
from areal.protocol import BRANCH_REFUSED_HEADER as REFUSED
from areal.protocol import BRANCHABLE_HEADER as BRANCHABLE
from areal.protocol import FRAME_HEADER, EpisodeOutcome, frame
from sandbox import keys
from sandbox.rootfs import WORKSPACE
from sandbox.world import BRANCH_POINT

if TYPE_CHECKING:
    from sandbox.relay import Relay

SNAPSHOT_LIMIT = 64 << 20  # bytes of files a branch point may copy under each of the temp dir, /dev/shm and a world's /workspace
OUTCOME_LIMIT = 16 << 20  # bytes of one branch's outcome frame kept
SCRUB_PIECE = 8 << 20  # bytes of memory read at a time when zeroing the other branches' keys
KEEP_WAIT_S = 120.0  # how long the zygote may take to keep a branch's workspace (a copy of its layer)
_PR_SET_DUMPABLE = 4
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(EpisodeOutcome)


class Refused(Exception):
    """The episode cannot branch here; the message says why."""


@dataclass
class Arm:
    """What a slot tells this module before run() starts (sandbox/episode.py)."""

    result_fd: int  # the slot's result pipe: a branch's outcome goes to its own pipe on this number
    api_key: str
    episode_id: str
    relay: Relay | None
    world: tuple[int, int, bool] | None = None  # a world's: the zygote's channel (request fd, answer fd), and whether rooted


ARMED: Arm | None = None
OWN_KEY: tuple[str, str] | None = None  # in a branch: (the trunk's key, its own), swapped in every request


def arm(result_fd: int, api_key: str, episode_id: str, relay: Relay | None, world: tuple[int, int, bool] | None = None) -> None:
    global ARMED
    ARMED = Arm(result_fd, api_key, episode_id, relay, world) if result_fd >= 0 else None


async def take(channel: Any, order: dict) -> str:
    """At the ordered call, in the episode: fork into the order's branches. Returns, in each
    branch, that branch's key; the supervisor never returns. Raises Refused before anything of
    the episode changed but what it remakes on use: its ZeroMQ connection, the loop's idle
    thread pool."""
    armed, names = _ordered(order)
    loop = asyncio.get_running_loop()
    _check_process(armed, loop)
    channel.close()  # its reader tasks are cancelled on the next turns of the loop, here
    for _ in range(3):
        await asyncio.sleep(0)
    return _fork(armed, loop, names, int(order.get("call", 0)))


def take_sync(order: dict, close_channels: Callable[[], None]) -> str:
    """``take`` at a call of a sync client (``httpx.Client``, sandbox/relay.py's SyncZmqTransport),
    made on the loop's thread while it blocks the loop. ``close_channels`` closes every ZeroMQ
    connection of the process (the loop's async one: its reader tasks end on the loop's next turn,
    in each branch), or raises Refused for one another thread holds."""
    armed, names = _ordered(order)
    if threading.current_thread() is not threading.main_thread():
        raise Refused("the call was made from a thread other than the main one")
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise Refused("a sync call made while no event loop runs: the agent's run() is not on the loop") from None
    _check_process(armed, loop)
    close_channels()
    return _fork(armed, loop, names, int(order.get("call", 0)))


def _ordered(order: dict) -> tuple[Arm, list[str]]:
    armed = ARMED
    if armed is None:
        raise Refused("not a sandboxed episode's process (no zygote slot armed the branch point)")
    names = order.get("keys")
    if not isinstance(names, list) or len(names) < 2 or not all(isinstance(k, str) and k.isascii() for k in names):
        raise Refused(f"a malformed branch order: {str(order)[:200]}")
    return armed, names


def _fork(armed: Arm, loop: asyncio.AbstractEventLoop, names: list[str], call: int) -> str:
    """Both ``take``s once the process's own connections are closed: the last checks, the copies
    each branch starts from, then the branches (``_supervise``)."""
    executor = loop._default_executor  # type: ignore[attr-defined]
    if executor is not None:  # its idle workers would be missing in a branch: the loop makes a new one on use
        idle = getattr(getattr(executor, "_idle_semaphore", None), "_value", 0)
        if len(getattr(executor, "_threads", ())) > idle or not executor._work_queue.empty():
            raise Refused("work runs in the event loop's thread pool (asyncio.to_thread, run_in_executor)")
        loop._default_executor = None  # type: ignore[attr-defined]
        executor.shutdown(wait=True)
    _close_zmq()
    fds = _check_descriptors(armed, loop)
    try:
        snapshot = {root: _snapshot(root) for root in [*_private_roots(), *([WORKSPACE] if armed.world else [])]}
        offsets = {fd: os.lseek(fd, 0, os.SEEK_CUR) for fd in fds}
    except OSError as e:
        raise Refused(f"the episode's files could not be copied for the branches: {e!r}") from e
    if armed.world and (why := _keep(armed.world, BRANCH_POINT)):
        raise Refused(f"the zygote did not take the branch point of the world's workspace: {why}")
    vault = bytearray(b"".join(k.encode() for k in names))
    sizes = [len(k) for k in names]
    _scrub([k.encode() for k in names], vault)
    return _supervise(armed, loop, vault, sizes, call, snapshot, offsets)  # returns in a branch only


def _check_process(armed: Arm, loop: asyncio.AbstractEventLoop) -> None:
    if os.path.ismount(WORKSPACE) and armed.world is None:
        raise Refused("a world's episode without the zygote's channel to keep each branch's workspace")
    if armed.world and armed.world[2]:
        raise Refused("a world on a task root of its own: its writes outside /workspace would not be each branch's own")
    if not isinstance(getattr(loop, "_selector", None), selectors.BaseSelector):
        raise Refused(f"the event loop ({type(loop).__module__}.{type(loop).__name__}) is not asyncio's selector loop")
    if threading.current_thread() is not threading.main_thread():
        raise Refused("the call was made from a thread other than the main one")
    relay = armed.relay
    if relay is not None and relay._started.is_set():
        raise Refused("the episode's loopback HTTP relay has served requests: its thread holds ZeroMQ sockets")
    children = _children()
    if children:
        raise Refused(f"the episode has child processes ({', '.join(children[:5])}): fork copies one process")
    for kind in ("shm", "msg", "sem"):
        path = f"/proc/sysvipc/{kind}"
        if os.path.exists(path) and len(open(path).read().splitlines()) > 1:
            raise Refused(f"the episode holds SysV IPC objects ({kind}), which branches would share")


def _children() -> list[str]:
    """'pid (name)' of this process's live children."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = open(f"/proc/{entry}/stat").read()
        except OSError:  # gone meanwhile
            continue
        name, _, rest = text.rpartition(")")
        fields = rest.split()
        if int(fields[1]) == me and fields[0] != "Z":
            found.append(f"{entry} ({name.partition('(')[2]})")
    return found


def _close_zmq() -> None:
    """Terminate the process's ZeroMQ context, so that no libzmq thread or socket is forked; then
    Refused if any thread but this one (and the relay's, idle) is left."""
    import zmq.asyncio

    ctx = zmq.asyncio.Context._instance  # type: ignore[attr-defined]
    if ctx is not None and not ctx.closed:
        live = [s for s in list(ctx._sockets) if not s.closed]
        if live:
            raise Refused(f"{len(live)} ZeroMQ sockets other than the handed client's are open")
        ctx.term()
    relay_tid = getattr(ARMED.relay._thread, "native_id", None) if ARMED and ARMED.relay else None
    for _ in range(100):  # a thread just joined (the loop's pool, libzmq's) leaves /proc/self/task a moment later
        tasks = [t for t in os.listdir("/proc/self/task") if int(t) != threading.get_native_id()]  # called on the main thread
        others = [t for t in tasks if int(t) != relay_tid]
        live = {t.native_id for t in threading.enumerate()}
        if not others or any(int(t) in live for t in others):
            break
        time.sleep(0.01)
    if others:
        known = {t.native_id: t.name for t in threading.enumerate()}
        names = [known.get(int(t)) or open(f"/proc/self/task/{t}/comm").read().strip() for t in others[:5]]
        raise Refused(f"the episode runs other threads ({', '.join(names)}): fork copies only the calling one")


def _check_descriptors(armed: Arm, loop: asyncio.AbstractEventLoop) -> list[int]:
    """The seekable descriptors whose offsets each branch must start from; Refused for a kind of
    descriptor branches would share."""
    selector = loop._selector  # type: ignore[attr-defined]
    own = {0, 1, 2, armed.result_fd, selector.fileno()}
    for sock in ("_ssock", "_csock"):
        if getattr(loop, sock, None) is not None:
            own.add(getattr(loop, sock).fileno())
    if armed.relay is not None:
        own.add(armed.relay._sock.fileno())
    own.update(armed.world[:2] if armed.world else ())
    seekable = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            mode = os.fstat(fd).st_mode
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if fd in own:
            continue
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            seekable.append(fd)
        elif not stat.S_ISCHR(mode):
            raise Refused(f"descriptor {fd} ({target}) would be shared by the branches")
    return seekable


def _private_roots() -> list[str]:
    """The episode's private writable trees: its temp dir, and /dev/shm where /tmp is its own."""
    tmp = os.environ.get("TMPDIR", "/tmp")
    return [tmp, "/dev/shm"] if tmp == "/tmp" and os.path.isdir("/dev/shm") else [tmp]


def _mounts_under(root: str) -> set[str]:
    """The mount points strictly under ``root``: the sandbox's (the gateway's socket, code), not
    the episode's files. (Not told by st_dev: an overlay's files carry their layer's.)"""
    found = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if point.startswith(root.rstrip("/") + "/"):
                found.add(point)
    return found


def _snapshot(root: str) -> dict[str, tuple]:
    """{relative path: ("d", mode) | ("f", mode, bytes, mtime_ns) | ("l", target)} of ``root``."""
    top = os.lstat(root)
    mounts = _mounts_under(root)
    out: dict[str, tuple] = {".": ("d", stat.S_IMODE(top.st_mode))}
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in mounts]
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if path in mounts:  # mounted here by the sandbox: not the episode's
                continue
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > SNAPSHOT_LIMIT:
                    raise Refused(f"more than {SNAPSHOT_LIMIT} bytes of files under {root} to copy for the branches")
                with open(path, "rb") as f:
                    out[rel] = ("f", stat.S_IMODE(st.st_mode), f.read(), st.st_mtime_ns)
            else:
                raise Refused(f"{path} is neither a file, a directory nor a symlink: branches cannot each have their own")
    return out


def _restore(root: str, snap: dict[str, tuple]) -> None:
    """Make ``root`` hold what ``snap`` recorded, files rewritten in place (their inodes kept, as
    the supervisor's descriptors refer to them). What already holds what was recorded is not
    touched: on a world's workspace a write copies the base's file into the episode's layer."""
    mounts = _mounts_under(root)
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        if any(dirpath == m or dirpath.startswith(m + "/") for m in mounts):  # a mount of the sandbox's, as in ``_snapshot``
            continue
        for name in filenames + dirnames:
            path = os.path.join(dirpath, name)
            if path in mounts:
                continue
            kind = snap.get(os.path.relpath(path, root))
            st = os.lstat(path)
            actual = "l" if stat.S_ISLNK(st.st_mode) else "d" if stat.S_ISDIR(st.st_mode) else "f" if stat.S_ISREG(st.st_mode) else "?"
            if kind is None or kind[0] != actual or (actual == "l" and os.readlink(path) != kind[1]):
                if actual == "d":
                    os.chmod(path, 0o700)
                    for sub in os.listdir(path):  # emptied bottom-up already, but for what is kept
                        _remove(os.path.join(path, sub))
                    os.rmdir(path)
                else:
                    os.unlink(path)
    for rel, entry in sorted(snap.items()):
        path = os.path.join(root, rel)
        if entry[0] == "d":  # writable while its files are written; its own mode last
            if not os.path.isdir(path):
                os.mkdir(path, 0o700)
            elif stat.S_IMODE(os.lstat(path).st_mode) & 0o700 != 0o700:
                os.chmod(path, 0o700)
        elif entry[0] == "l":
            if not os.path.islink(path):
                os.symlink(entry[1], path)
        elif not _holds(path, entry):
            if os.path.exists(path):
                os.chmod(path, 0o600)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                view = memoryview(entry[2])
                while view:
                    view = view[os.write(fd, view) :]
                os.ftruncate(fd, len(entry[2]))
                os.fchmod(fd, entry[1])
            finally:
                os.close(fd)
            os.utime(path, ns=(entry[3], entry[3]))
    for rel, entry in sorted(snap.items(), reverse=True):  # the deepest first
        path = os.path.join(root, rel)
        if entry[0] == "d" and stat.S_IMODE(os.lstat(path).st_mode) != entry[1]:
            os.chmod(path, entry[1])


def _holds(path: str, entry: tuple) -> bool:
    """Whether the file at ``path`` is the recorded ``entry``: its mode, bytes and time."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or (stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns) != (entry[1], len(entry[2]), entry[3]):
            return False
        with open(path, "rb") as f:
            return f.read() == entry[2]
    except OSError:  # unreadable to us (mode 000): written anew
        return False


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
        for sub in os.listdir(path):
            _remove(os.path.join(path, sub))
        os.rmdir(path)
    else:
        os.unlink(path)


def _scrub(secrets: list[bytes], vault: bytearray) -> int:
    """Zero every copy of ``secrets`` in this process's writable memory but ``vault``'s (the
    order's body, its decoded strings, libzmq's freed receive buffers); how many were zeroed."""
    lo_vault = keys._address(vault)
    hi_vault = lo_vault + len(vault)
    pattern = re.compile(b"|".join(re.escape(s) for s in secrets))
    zeroed = 0
    with open("/proc/self/maps") as maps:
        regions = [line.split()[:2] for line in maps]
    overlap = max(len(s) for s in secrets) - 1  # a copy across two pieces is in one of them whole
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        for addresses, perms in regions:
            if not perms.startswith("rw"):
                continue
            lo, hi = (int(a, 16) for a in addresses.split("-"))
            for at in range(lo, hi, SCRUB_PIECE):  # in pieces: a region may reserve far more than the memory limit
                try:
                    mem.seek(at)
                    chunk = mem.read(min(SCRUB_PIECE + overlap, hi - at))
                except OSError:  # a guard region
                    break
                hits = [(m.start(), m.end()) for m in pattern.finditer(chunk)]
                ctypes.memset(id(chunk) + sys.getsizeof(chunk) - len(chunk) - 1, 0, len(chunk))  # the copy read
                for start, end in hits:
                    if not lo_vault <= at + start < hi_vault:
                        ctypes.memset(at + start, 0, end - start)
                        zeroed += 1
    return zeroed


def _supervise(
    armed: Arm,
    loop: asyncio.AbstractEventLoop,
    vault: bytearray,
    sizes: list[int],
    call: int,
    snapshot: dict[str, dict[str, tuple]],
    offsets: dict[int, int],
) -> str:
    """Run the branches one after another; in a branch, return its key."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # no branch reads or writes us through /proc
    outcomes: list[EpisodeOutcome] = []
    cut = ""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    for i, size in enumerate(sizes):
        if i:
            try:
                for root, snap in snapshot.items():
                    _restore(root, snap)
                for fd, offset in offsets.items():
                    os.lseek(fd, offset, os.SEEK_SET)
            except OSError as e:
                cut = f"the files of call {call} could not be restored after branch {i - 1} ({e!r}): branches {i}.. were not run"
                break
        sys.stdout.flush()
        sys.stderr.flush()
        r, w = os.pipe()
        started = time.monotonic()
        try:
            pid = os.fork()
        except OSError as e:  # the pids cgroup, RLIMIT_NPROC or memory: the sandbox's limits count branches
            os.close(r)
            os.close(w)
            if i == 0:  # nothing ran yet: the episode goes on unbranched
                ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
                raise Refused(f"the first branch could not be forked ({e!r}): the sandbox's process or memory limit") from e
            cut = f"branch {i} could not be forked ({e!r}): the sandbox's process or memory limit; branches {i}.. were not run"
            break
        if pid == 0:
            os.close(r)
            os.dup2(w, armed.result_fd)
            os.close(w)
            for fd in armed.world[:2] if armed.world else ():  # the zygote's word on a branch is the supervisor's to ask
                os.close(fd)
            key = bytes(vault[starts[i] : starts[i] + size]).decode()
            keys.zero(vault)
            _fresh_selector(loop)
            return key
        os.close(w)
        data, status = _collect(r, pid)
        _kill_leftovers(pid)
        outcomes.append(_branch_outcome(f"{armed.episode_id}/b{i}", data, status, time.monotonic() - started))
        if armed.world and (why := _keep(armed.world, i)):  # its workspace kept for its grader before the next restore
            cut = f"the workspace of branch {i} could not be kept for its grade ({why}): branches {i + 1}.. were not run"
            break
    combined = EpisodeOutcome(
        armed.episode_id, "ok", branches=outcomes, branch_point=f"call {call} of {armed.episode_id}", branch_refused=cut[:REASON_LIMIT]
    )
    encoded = bytearray(frame(_encoder.encode(combined)))
    for start, size in zip(starts, sizes):
        keys.mask(encoded, bytes(vault[start : start + size]))
    keys.mask(encoded, armed.api_key.encode())
    keys.zero(vault)
    payload = memoryview(encoded)
    while payload:
        payload = payload[os.write(armed.result_fd, payload) :]
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _keep(channel: tuple[int, int, bool], code: int) -> str:
    """Ask the zygote to act on the world's workspace (``world.BranchLayers.request``): "" once
    done, else why not."""
    ask, answer, _ = channel
    try:
        os.write(ask, bytes([code]))
        poll = __import__("select").poll()
        poll.register(answer, 1)
        if not poll.poll(KEEP_WAIT_S * 1000):
            return f"no answer in {KEEP_WAIT_S:.0f} s"
        said = os.read(answer, 1)
    except OSError as e:
        return repr(e)
    return "" if said == b"+" else "the zygote could not copy it: the workspace's size limit"


def _fresh_selector(loop: asyncio.AbstractEventLoop) -> None:
    """In a branch: an epoll instance of its own (a forked one is shared with the supervisor and
    every later branch) holding the same registrations, and a self-pipe of its own."""
    asyncio.events._set_running_loop(loop)  # asyncio keys the running loop by pid: ours is the one we run in
    old = loop._selector  # type: ignore[attr-defined]
    new = type(old)()
    for key in list(old.get_map().values()):
        new.register(key.fileobj, key.events, key.data)
    old.close()
    loop._selector = new  # type: ignore[attr-defined]
    if hasattr(loop, "_close_self_pipe"):
        loop._close_self_pipe()  # type: ignore[attr-defined]
        loop._make_self_pipe()  # type: ignore[attr-defined]


def _collect(r: int, pid: int) -> tuple[bytearray, int]:
    """A branch's result bytes (up to OUTCOME_LIMIT) and wait status, once it exited (what it
    left holding the pipe is not waited for)."""
    data = bytearray()
    pidfd = os.pidfd_open(pid)
    os.set_blocking(r, False)
    poll = __import__("select").poll()
    poll.register(r, 1)
    poll.register(pidfd, 1)
    exited = False
    while True:
        events = dict(poll.poll(None if not exited else 0))
        got = False
        if r in events:
            try:
                chunk = os.read(r, 1 << 16)
            except BlockingIOError:
                chunk = None
            if chunk == b"":
                break
            if chunk:
                got = True
                if len(data) < OUTCOME_LIMIT:
                    data += chunk
        if pidfd in events:
            exited = True
        if exited and not got:
            break
    os.close(r)
    os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    return data, status


def _kill_leftovers(pid: int) -> None:
    """Kill whatever the branch left running: everything in the PID namespace but us where we are
    its init, else the branch's process group; reap it."""
    try:
        os.kill(-1, signal.SIGKILL) if os.getpid() == 1 else os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.01)
        except ChildProcessError:
            return


def _branch_outcome(episode_id: str, data: bytearray, status: int, wall: float) -> EpisodeOutcome:
    """A branch's own outcome (its frame), or the supervisor's verdict on how it ended."""
    if len(data) >= 4 and len(data) >= 4 + FRAME_HEADER.unpack_from(data)[0]:
        try:
            reported = _decoder.decode(memoryview(data)[4 : 4 + FRAME_HEADER.unpack_from(data)[0]])
            return msgspec.structs.replace(reported, episode_id=episode_id, wall_s=wall)
        except msgspec.DecodeError as e:
            return EpisodeOutcome(episode_id, "crashed", error=f"bad result frame from the branch: {e}", wall_s=wall)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return EpisodeOutcome(
            episode_id, "crashed", exit_signal=sig, wall_s=wall, error=f"branch died by signal {signal.Signals(sig).name}"
        )
    code = os.waitstatus_to_exitcode(status)
    return EpisodeOutcome(episode_id, "crashed", exit_code=code, wall_s=wall, error=f"branch exited with code {code} without a result")


def outgoing(transport: Any, path: str, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
    """A request of a client routed to the gateway (sandbox/relay.py's transports) as it leaves:
    it says it can branch; after a branch point, this branch's key in place of the trunk's
    (headers and ``/sessions/<key>/`` path); once after a refusal, the reason."""
    headers = {k.lower(): v for k, v in headers.items()}
    headers[BRANCHABLE] = "1"
    if transport.branch_refused:
        headers[REFUSED], transport.branch_refused = transport.branch_refused, ""
    if OWN_KEY is not None:
        old, new = OWN_KEY
        headers = {k: v.replace(old, new) for k, v in headers.items()}
        path = path.replace(f"/sessions/{old}/", f"/sessions/{new}/")
    return path, headers


def _order_of(reply_body: bytes) -> dict:
    try:
        order = msgspec.json.decode(reply_body)
    except msgspec.DecodeError as e:
        raise Refused(f"a malformed branch order: {e}") from e
    return order.get("branch", {}) if isinstance(order, dict) else {}


def _refuse(transport: Any, e: Refused) -> None:
    transport.branch_refused = re.sub(r"[^ -~]", "?", str(e))[:REASON_LIMIT]  # a header: printable ASCII


def _adopt(own: str) -> None:
    """In a branch: its key, for every client (``outgoing``) and in the environment."""
    global OWN_KEY
    assert ARMED is not None
    OWN_KEY = (ARMED.api_key, own)
    for name, value in list(os.environ.items()):
        if ARMED.api_key in value:
            os.environ[name] = value.replace(ARMED.api_key, own)


async def follow(transport: Any, request: Any, reply_body: bytes) -> Any:
    """An async client's answer to a branch order: in each branch, the call sent again with its
    own key; refused, the call sent again with the reason. The supervisor never returns."""
    try:
        own = await take(transport.channel, _order_of(reply_body))
    except Refused as e:
        _refuse(transport, e)
    else:
        _adopt(own)
    return await transport.handle_async_request(request)


def follow_sync(transport: Any, request: Any, reply_body: bytes) -> Any:
    """``follow`` for a sync client's call."""
    try:
        own = take_sync(_order_of(reply_body), transport.close_channels)
    except Refused as e:
        _refuse(transport, e)
    else:
        _adopt(own)
    return transport.handle_request(request)
