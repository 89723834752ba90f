"""The sandbox zygote: imports the agent SDKs once, keeps warm episode processes, runs one per episode.

    controller (Zygote, any loop) ──stdin: SpawnEpisode | Shutdown──────────────► zygote process
                                 ◄─stdout: ZygoteReady, EpisodeOutcome per spawn─┘   │ fork ahead
        warm slot (episode process): isolation.enter, PID namespace, caps, seccomp, ◄┘
        relay up; then blocks on its spawn pipe ◄── the SpawnEpisode frame, copied from the
        control buffer at handover ── runs agent.run ──result pipe: one EpisodeOutcome──► zygote
        reporter (forked per batch of finished episodes): each agent's EpisodeOutcome + log tail
        ──pipe──► zygote ──► controller (episode bytes stay in zeroed buffers here, sandbox/keys.py)

Run as ``python -m sandbox.zygote --agent MODULE:ATTR --gateway ipc:///path.sock
[--config JSON] [--log-dir DIR]``. Frames are ``protocol.frame`` (4-byte LE length + msgpack).

Warm slots: every isolation layer costs time on the spawn's path when applied after the fork
(joining the cgroup, the PID namespace, unshare(NET) and the mounts, the relay's thread), and a
burst of spawns met by forks on the spot is serialised in this single-threaded loop. So
``config.warm_slots`` episode processes are forked ahead of time and
apply all of it while idle; a spawn only writes its frame into an idle slot's pipe, and the
zygote forks the replacement right after the handover, off that episode's path. A burst larger
than the pool forks slots on the spot and hands them their frame at once (the same code path;
``warm_slots=0`` makes every spawn take it). A slot whose setup failed still takes its spawn and
reports the setup traceback as the episode's error. Its deadline starts at the handover.

Worlds: a spawn naming a task directory (``SpawnEpisode.world``, sandbox/world.py) is forked on
the spot, never handed to a warm slot, as its root holds its own workspace (an overlay on the
task's base; the zygote enters a mount namespace of its own at the first, for the workspaces'
tmpfs). Once every process of such an episode is gone, a grader process (sandbox/grader.py) is
forked with the same layers, no gateway socket and the task's checks; the episode is reported when
its Grade is in, the grader's verdict its reward (``world.apply_grade``), and its workspace is
released. A world episode's wall time therefore includes its slot's setup, not its grading.

Fork cost: the kernel time of an episode is mostly its process's life cycle (copying the page
tables of a zygote holding the SDKs, copy-on-write faults, the exit's teardown), not its
namespaces. So there is one fork of the zygote per episode: a root zygote forks each slot
straight into a new PID namespace, as its PID 1 (``isolation.fork_pid_namespace_init``; a
non-root one forks once more inside the slot's user namespace), and the preloaded heap is
collapsed into huge pages before the first fork (sandbox/heap.py, ``config.huge_pages``).

Invariants:
- exactly one EpisodeOutcome per SpawnEpisode, always (timeout, crash, OOM, shutdown included);
  an episode branched at a model call sends one too, its branches' in it (sandbox/branch.py);
  an outcome is sent only after every process of the episode is gone (its cgroup is empty).
  An idle slot gets no outcome: nothing was asked of it; one that dies idle is reaped, drained
  and logged, and not replaced until the next control message (no respawn loop).
- no leftovers: at shutdown every slot, idle or busy, is killed and its cgroups removed; between
  episodes only the ``warm_slots`` idle ones exist (their log file keeps the bare slot name,
  ``<zygote pid>-<seq>.log``; a handover renames it to ``<zygote pid>-<seq>-<episode>.log``).
- the zygote is single-threaded and creates no ZeroMQ context: one selector loop over stdin,
  the result pipes, spawn pipes with unwritten bytes and a SIGCHLD wake-up pipe; it never
  blocks on a slot (a frame larger than the pipe is written as the slot reads it), only on its
  reporter, for at most ``REPORT_LIMIT_S``.
- the control frames never use fd 1: the real stdout is dup'ed to a private fd at start and
  fd 1 points at stderr, so a stray print cannot corrupt the channel. An episode's stdout and
  stderr go to its log in ``<log-dir>`` (capped by RLIMIT_FSIZE), kept only when it failed;
  its tail is attached to a failed outcome's error (session keys in it masked).
- the deadline kills the episode's process group and cgroup; the PID namespace takes the rest.
- an episode's memory holds no session key but its own (sandbox/keys.py): a slot is forked
  before its spawn exists and receives only its own frame; what the zygote held at fork time
  (unread frames, spawns not yet handed over, other slots' unwritten frames, results not yet
  reported) is zeroed in the child before any setup; the zygote zeroes its copies once written.
  What an episode sends back (result frame, log) is decoded only in the reporter, never forked
  from. The zygote's environment is already the agents' allow-listed one (a fork inherits the
  exec-time block).

The controller side (``Zygote``) is sandbox/zygote_client.py; the frames both read and write are
areal/protocol.py's. An episode's result frame is the policy's output: only what an episode may
say of itself is taken from it (sandbox/outcome.py: the zygote's ``verdict``, completed by
``read_back`` with ``episode_says``). What runs in an episode process around the agent (its
relay, the spawn it reads, run() itself) is in sandbox/episode.py; the key hygiene this module
relies on is in sandbox/keys.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import json
import logging
import os
import re
import select
import selectors
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import msgspec

from areal.agent.failures import INFRASTRUCTURE, classify_exception, raised_types
from areal.agent.spec import AgentRun, load_agent
from areal.protocol import FRAME_HEADER, EpisodeOutcome, Grade, Shutdown, SpawnEpisode, ZygoteInbound, ZygoteOutbound, ZygoteReady, frame
from sandbox import episode, grader, heap, isolation, keys, rootfs, world
from sandbox.isolation import EpisodeResources, SandboxConfig
from sandbox.outcome import RESULT_LIMIT, read_back, verdict
from sandbox.world import BranchLayers

log = logging.getLogger("sandbox.zygote")
_encoder = msgspec.msgpack.Encoder()
DRAIN_LIMIT_S = 5.0  # how long a reaped episode may wait for its cgroup to empty
REPORT_LIMIT_S = 10.0  # how long a reporter may take (it reads agents' logs: a FIFO there must not hang us)
RESULT_INITIAL_BYTES = 64 << 10
TASK_CACHE = 1024  # task directories whose task.json the zygote keeps read


@dataclass
class _Slot:
    """One forked episode process: idle (warm, ``spawn`` is None) until a SpawnEpisode is handed
    over through its spawn pipe, then busy until its outcome is sent."""

    pid: int  # the episode process (leader of its process group)
    name: str  # "<zygote pid>-<seq>": its cgroups and log file
    result_fd: int  # read end: one EpisodeOutcome frame
    spawn_fd: int  # write end: one SpawnEpisode frame; -1 once written and closed
    log_path: str
    res: EpisodeResources
    spawn: SpawnEpisode | None = None
    started: float = 0.0
    deadline: float = 0.0
    unsent: bytearray = dataclasses.field(default_factory=bytearray)  # the spawn frame, zeroed once written
    sent: int = 0  # bytes of ``unsent`` the pipe has taken
    result: keys.ControlBuffer = dataclasses.field(  # what the agent wrote to its pipe; never decoded here
        default_factory=lambda: keys.ControlBuffer(RESULT_INITIAL_BYTES)
    )
    timed_out: bool = False
    outcome: EpisodeOutcome | None = None  # the zygote's verdict at reap; sent once the cgroup is empty
    read_back: bool = False  # the verdict is completed from what the episode sent back (``_report``)
    has_result: bool = False  # ... by the agent's own outcome, if its frame decodes
    reaped_at: float = 0.0
    world: world.WorldResources | None = None  # its task's world (sandbox/world.py), until graded
    plan: rootfs.RootPlan | None = None  # its root: the zygote's, with its task's library masked
    seen: list[str] = dataclasses.field(default_factory=list)  # what the world's decoys saw
    grade: Grade | None = None  # the grader's verdict, applied to its outcome when reported
    # A world episode's branch point (sandbox/branch.py): requests read from ``layer_fd``, answered on ``ack_fd``.
    layer_fd: int = -1
    ack_fd: int = -1
    branching: BranchLayers = dataclasses.field(default_factory=BranchLayers)


class ZygoteServer:
    """The zygote's single-threaded loop: keep warm slots, hand spawns over, reap, enforce
    deadlines, report."""

    def __init__(
        self,
        run: AgentRun,
        agent: str,
        gateway_addr: str,
        config: SandboxConfig,
        log_dir: str,
        ctrl_out: int,
        layers: list[str],
        plan: rootfs.RootPlan | None = None,
    ) -> None:
        self.run, self.agent, self.gateway_addr, self.plan = run, agent, gateway_addr, plan
        self.config, self.log_dir, self.ctrl_out, self.layers = config, log_dir, ctrl_out, layers
        self.gateway_path = gateway_addr.removeprefix("ipc://")
        self.slots: dict[int, _Slot] = {}  # by pid: idle and busy, until reaped and (if busy) reported
        self.idle: list[_Slot] = []
        self.draining: list[_Slot] = []
        self.seq = 0
        self.graders: dict[int, grader.GraderProcess] = {}  # by pid, until reaped, drained and reported
        self.tasks: dict[str, world.Task] = {}  # read task directories (sandbox/world.py), by path
        self.worlds = ""  # where the workspaces' tmpfs mounts go, once the first world made it
        self.stopping = False  # shutting down: no grader is started any more
        self.controller_gone = False
        self.inbuf = keys.ControlBuffer()
        self.unspawned: list[SpawnEpisode] = []  # decoded, not yet handed over (their keys live here)
        self.decoder = msgspec.msgpack.Decoder(ZygoteInbound)
        self.outcome_decoder = msgspec.msgpack.Decoder(EpisodeOutcome)
        self.reports = keys.ControlBuffer(RESULT_INITIAL_BYTES)  # a reporter's outcome frame, zeroed once forwarded
        self.scratch = bytearray(RESULT_INITIAL_BYTES)  # result bytes past RESULT_LIMIT, zeroed once read
        self.pid_init = isolation.forks_pid_namespace_init(layers)  # each slot is PID 1 of its own namespace
        self.alive_fd = os.pidfd_open(os.getpid())  # readable once the zygote is gone, from any PID namespace
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler is needed for the wake-up fd
        signal.set_wakeup_fd(self.wake_w)
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, "control")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")

    def send(self, msg: ZygoteOutbound) -> None:
        """Only for messages the zygote made itself: episode bytes go through ``_report``."""
        self._write_ctrl(memoryview(frame(_encoder.encode(msg))))

    def _write_ctrl(self, data: memoryview) -> None:
        try:
            while data:
                data = data[os.write(self.ctrl_out, data) :]
        except BrokenPipeError:  # the controller is gone: stop serving, still clean up children
            self.controller_gone = True

    def serve(self) -> None:
        """Run until Shutdown or stdin EOF."""
        while True:
            for key, events in self.sel.select(self._timeout()):
                if key.data == "control":
                    if not self._read_control():
                        return
                    self.refill()  # after the handovers: the new slots' setup is off their path
                elif key.data == "wake":
                    os.read(self.wake_r, 4096)  # anything left over wakes the next select
                elif key.fd == key.data.spawn_fd:
                    self._write_spawn(key.data)
                elif key.fd == key.data.layer_fd:
                    self._branch_requests(key.data)
                else:
                    self._read_result(key.data)
            self._reap()
            self._enforce_deadlines()
            self._send_drained()
            if self.controller_gone:
                return

    def refill(self) -> None:
        """Fork warm slots up to ``config.warm_slots``. A slot that cannot be prepared (cgroup
        creation refused) is not retried until the next control message."""
        while len(self.idle) < self.config.warm_slots:
            try:
                self.idle.append(self._fork_slot())
            except OSError as e:
                log.warning("cannot prepare a warm slot: %r", e)
                return

    def _timeout(self) -> float:
        if self.draining or any(g.status is not None for g in self.graders.values()):
            return 0.02
        deadlines = [s.deadline for s in self.slots.values() if s.spawn is not None and s.outcome is None]
        deadlines += [g.deadline for g in self.graders.values() if g.status is None]
        return max(0.0, min(deadlines, default=time.monotonic() + 1.0) - time.monotonic())

    def _read_control(self) -> bool:
        if not self.inbuf.read_from(0):
            return False  # controller went away
        views = self.inbuf.frames()
        messages = [self.decoder.decode(v) for v in views]  # from the buffer itself: no copies
        self.unspawned = [m for m in messages if isinstance(m, SpawnEpisode)]
        running = True
        for msg, view in zip(messages, views):
            match msg:
                case SpawnEpisode() if running:
                    self.unspawned.remove(msg)
                    self._spawn(msg, view)
                    keys.wipe_str(msg.api_key)  # the slot has it; no later fork gets a copy
                case Shutdown():
                    running = False
        for v in views:
            v.release()
        self.inbuf.consume()  # zeroes the frames, keys included
        return running

    def _spawn(self, spawn: SpawnEpisode, raw: memoryview) -> None:
        """Hand ``raw`` (the SpawnEpisode frame's body) to an idle slot, or to a slot forked now. An
        episode with a world always gets a slot forked now: its root holds its task's workspace."""
        if self.idle and not spawn.world:
            slot = self.idle.pop(0)  # the oldest: the most likely to have finished its setup
        else:
            try:
                slot = self._fork_slot(self._task(spawn.world) if spawn.world else None)
            except (OSError, ValueError) as e:  # e.g. cgroup creation refused, a bad task: this episode fails, the zygote serves on
                self.send(
                    EpisodeOutcome(
                        spawn.episode_id,
                        "error",
                        error=f"sandbox preparation failed: {e!r}",
                        failure_class=INFRASTRUCTURE,
                        failure_cause="sandbox preparation",
                    )
                )
                return
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", spawn.episode_id)[:64]
        log_path = os.path.join(self.log_dir, f"{slot.name}-{safe}.log")
        os.rename(slot.log_path, log_path)  # the slot's open fd follows the file
        now = time.monotonic()
        slot.spawn, slot.log_path, slot.started, slot.deadline = spawn, log_path, now, now + spawn.deadline_s
        # One copy of the frame, written as the pipe takes it and zeroed once written: the
        # control buffer is zeroed right after this batch, and a later fork must not find the key.
        slot.unsent = bytearray(4 + len(raw))
        FRAME_HEADER.pack_into(slot.unsent, 0, len(raw))
        with memoryview(slot.unsent) as into:  # straight into place: a bytearray slice assignment
            into[4:] = raw  # from a memoryview copies it into a temporary freed unzeroed (a key)
        self._write_spawn(slot)
        if slot.spawn_fd != -1:
            self.sel.register(slot.spawn_fd, selectors.EVENT_WRITE, slot)

    def _write_spawn(self, slot: _Slot) -> None:
        """Write what the slot's spawn pipe takes; close it once the whole frame is in."""
        view = memoryview(slot.unsent)
        try:
            while slot.sent < len(view):
                slot.sent += os.write(slot.spawn_fd, view[slot.sent :])
        except BlockingIOError:
            return
        except BrokenPipeError:  # the slot died before reading: its reap reports the episode
            pass
        finally:
            view.release()
        keys.zero(slot.unsent)
        if slot.spawn_fd in self.sel.get_map():
            self.sel.unregister(slot.spawn_fd)
        os.close(slot.spawn_fd)
        slot.spawn_fd = -1

    def _task(self, path: str) -> world.Task:
        """The task at ``path``, read once; the zygote's own mount namespace made at the first."""
        if not {"mountns", "readonly_root"} <= set(self.layers) or os.geteuid() != 0:
            raise OSError(f"a world needs a root zygote with the mountns and readonly_root layers (layers here: {self.layers})")
        if not self.worlds:
            world.enter_private_mounts()
            self.worlds = world.worlds_dir(self.config.temp_root, os.getpid())
            os.makedirs(self.worlds, mode=0o700, exist_ok=True)
        if path not in self.tasks:
            if len(self.tasks) >= TASK_CACHE:
                self.tasks.clear()
            self.tasks[path] = world.load_task(path)
        return self.tasks[path]

    def _fork_slot(self, task: world.Task | None = None) -> _Slot:
        self.seq += 1
        name = f"{os.getpid()}-{self.seq}"
        plan = self.plan
        if task is not None:  # its library masked in its root, before anything is made for it
            assert plan is not None
            plan = dataclasses.replace(plan, hide=tuple(sorted({*plan.hide, *world.hidden_paths(task, plan)})))
        res = isolation.prepare(self.config, self.layers, name)
        try:
            found = world.prepare(task, name, self.worlds, self.config.workspace_size_bytes) if task is not None else None
        except OSError:
            isolation.release(res)
            raise
        log_path = os.path.join(self.log_dir, f"{name}.log")
        # Created here, not in the child: a handover renames it, maybe before the child runs.
        logfd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        result_r, result_w = os.pipe()
        spawn_r, spawn_w = os.pipe()
        # A world's: the branches' channel (requests up, answers down), for a branch point to keep each branch's layer.
        (layer_r, layer_w), (ack_r, ack_w) = (os.pipe(), os.pipe()) if found else ((-1, -1), (-1, -1))
        sys.stdout.flush()
        sys.stderr.flush()
        pid = isolation.fork_pid_namespace_init() if self.pid_init else os.fork()
        if pid == 0:
            os.close(result_r)
            os.close(spawn_w)
            view = world.episode_view(found) if found else None
            self._child(spawn_r, result_w, logfd, res, plan, view, (layer_w, ack_r) if found else None)  # never returns
        for fd in (logfd, result_w, spawn_r, layer_w, ack_r):
            if fd != -1:
                os.close(fd)
        for fd in (result_r, spawn_w, layer_r, ack_w):
            if fd != -1:
                os.set_blocking(fd, False)
        slot = _Slot(pid, name, result_r, spawn_w, log_path, res, world=found, plan=plan, layer_fd=layer_r, ack_fd=ack_w)
        self.slots[pid] = slot
        self.sel.register(result_r, selectors.EVENT_READ, slot)
        if layer_r != -1:
            self.sel.register(layer_r, selectors.EVENT_READ, slot)
        return slot

    def _branch_requests(self, slot: _Slot) -> None:
        """A world episode's branch point asks to keep a layer (world.BranchLayers): act on each
        request, answer each ("+" done, "-" not); once tampered, nothing more is read or answered."""
        assert slot.world is not None
        try:
            asked = os.read(slot.layer_fd, 64)
        except BlockingIOError:
            return
        for code in asked:
            try:
                done = slot.branching.request(slot.world, code)
            except OSError as e:  # its world's files (the decoys): never the zygote's end
                log.warning("slot %s: a branch request could not be acted on: %r", slot.name, e)
                done = False
            if slot.branching.tampered:
                asked = b""
                break
            try:
                os.write(slot.ack_fd, b"+" if done else b"-")
            except (BlockingIOError, BrokenPipeError):  # answers it does not read: it waits for none
                pass
        if not asked:  # its end closed, or tampered
            self._close_branch_channel(slot)

    def _close_branch_channel(self, slot: _Slot) -> None:
        for fd in (slot.layer_fd, slot.ack_fd):
            if fd != -1:
                if fd in self.sel.get_map():
                    self.sel.unregister(fd)
                os.close(fd)
        slot.layer_fd = slot.ack_fd = -1

    def _forget(self, logfd: int, keep: tuple[int, ...]) -> None:
        """In a forked child, first: die with the zygote, hold nothing of other episodes, stdio on
        ``logfd``, no descriptor but ``keep``."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        isolation.set_parent_death_signal()
        gone = select.poll()  # not select.select: fds may pass FD_SETSIZE
        gone.register(self.alive_fd, select.POLLIN)
        if gone.poll(0):  # the zygote died before the death signal was armed
            os._exit(1)
        # Other episodes' keys: frames not yet read, spawns not yet handed over or written.
        self.inbuf.wipe()
        for other in self.unspawned:
            keys.wipe_str(other.api_key)
        for slot in [*self.slots.values(), *(g.episode for g in self.graders.values())]:
            keys.zero(slot.unsent)
            slot.result.wipe()  # other episodes' results, their keys maybe (masked only if honest)
        self.reports.wipe()
        self.sel.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(logfd, 1)
        os.dup2(logfd, 2)
        # Every descriptor but the child's own, whoever opened it: the zygote's control channel,
        # its other slots' pipes, and whatever its launcher leaked into it (isolation.OWN_FDS).
        isolation.close_all_fds_but(keep)

    def _child(
        self,
        spawn_r: int,
        result_w: int,
        logfd: int,
        res: EpisodeResources,
        plan: rootfs.RootPlan | None,
        view: rootfs.WorldView | None,
        layers: tuple[int, int] | None,
    ) -> None:
        """The slot: every isolation layer and the relay first, then wait for the spawn, run it.
        ``layers``: a world's branch channel (its request and answer ends, sandbox/branch.py)."""
        setup_error = ""
        try:
            self._forget(logfd, (0, 1, 2, spawn_r, result_w, *(layers or ())))
            isolation.enter(self.config, self.layers, res, self.gateway_path, plan, view)
            if self.pid_init and "mountns" in self.layers:  # already PID 1 of its namespace
                isolation.mount_proc(readonly="readonly_root" in self.layers)
            elif "pidns" in self.layers and not self.pid_init:
                isolation.fork_into_pid_namespace("mountns" in self.layers, readonly_proc="readonly_root" in self.layers)
            isolation.finish_agent_setup(self.layers)
            relay = episode.start_relay(self.gateway_addr)
        except BaseException:  # process boundary: a failed setup becomes the episode's outcome
            setup_error = traceback.format_exc()
        spawn = episode.read_spawn(spawn_r)
        if spawn is None:  # the zygote closed an idle slot
            os._exit(0)
        os.close(spawn_r)  # one frame per slot: the agent holds no descriptor it does not need
        try:
            if setup_error:
                outcome = EpisodeOutcome(
                    spawn.episode_id, "error", error=setup_error, failure_class=INFRASTRUCTURE, failure_cause="sandbox setup"
                )
            else:
                world_channel = (*layers, view.root is not None) if layers and view else None
                outcome = episode.run_agent(self.run, spawn, self.gateway_addr, relay, result_w, world_channel)
        except BaseException as e:  # process boundary: whatever happened becomes the outcome
            failure_class, failure_cause = classify_exception(e)
            outcome = EpisodeOutcome(
                spawn.episode_id,
                "error",
                error=traceback.format_exc(),
                failure_class=failure_class,
                failure_cause=failure_cause,
                raised=raised_types(e),
            )
        outcome = msgspec.structs.replace(outcome, imported=episode.imported_by_agent())  # failed or not
        encoded = bytearray(frame(_encoder.encode(outcome)))
        keys.mask(encoded, spawn.api_key.encode())  # its error text may quote it (a traceback, an SDK message)
        payload = memoryview(encoded)
        while payload:
            payload = payload[os.write(result_w, payload) :]
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # skip the zygote's atexit handlers and the relay thread

    def _read_result(self, slot: _Slot) -> None:
        """Into the slot's zeroed buffer (an ``os.read`` would leave a bytes object in freed memory)."""
        while True:
            try:
                if slot.result.end < RESULT_LIMIT:
                    n = slot.result.read_from(slot.result_fd)
                else:  # read and dropped
                    n = os.readv(slot.result_fd, [self.scratch])
                    keys.zero(self.scratch)
            except BlockingIOError:
                return
            if not n:
                if slot.result_fd in self.sel.get_map():
                    self.sel.unregister(slot.result_fd)
                return

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = self.slots.get(pid)
            if slot is None:
                if pid in self.graders:
                    self._grader_reaped(self.graders[pid], status)
                continue
            self._read_result(slot)
            for fd in (slot.result_fd, slot.spawn_fd):
                if fd != -1 and fd in self.sel.get_map():
                    self.sel.unregister(fd)
            os.close(slot.result_fd)
            if slot.spawn_fd != -1:
                keys.zero(slot.unsent)
                os.close(slot.spawn_fd)
                slot.spawn_fd = -1
            self._close_branch_channel(slot)
            if slot.spawn is None:  # died while idle: no episode to report, only its cgroup to drain
                log.warning("warm slot %s (pid %d) exited while idle, status %d; see %s", slot.name, pid, status, slot.log_path)
                self.idle.remove(slot)
            else:
                slot.outcome, slot.read_back = verdict(slot, status, self.config.memory_limit_bytes), True
            slot.reaped_at = time.monotonic()
            self.draining.append(slot)

    def _report(self, slots: list[_Slot]) -> None:
        """Send the outcomes of ``slots`` completed by a reporter (``keys.run_apart``, see
        ``outcome.read_back``); here its frames only pass through zeroed buffers. A slot it wrote no
        whole frame for gets the zygote's own verdict."""

        def work(fd: int) -> None:
            for slot in slots:
                payload = memoryview(frame(_encoder.encode(read_back(slot, self.outcome_decoder, self.config.log_tail_bytes))))
                while payload:
                    payload = payload[os.write(fd, payload) :]

        try:
            failure = keys.run_apart(work, self.reports, REPORT_LIMIT_S)
            frames = self.reports.frames()
            whole = memoryview(self.reports.buf)[self.reports.start : self.reports.start + sum(4 + len(f) for f in frames)]
            self._write_ctrl(whole)
            whole.release()
            for f in frames:
                f.release()
        finally:
            self.reports.wipe()
            for slot in slots:
                slot.result.wipe()
        for slot in slots[len(frames) :]:
            assert slot.outcome is not None
            failure = failure or "wrote no whole frame for it"
            log.warning("episode %s: no outcome from the reporter: %s", slot.outcome.episode_id, failure)
            self.send(
                msgspec.structs.replace(
                    slot.outcome,
                    error=f"{slot.outcome.error} (the episode's result and "
                    f"log could not be read back: the reporter {failure}; see {slot.log_path} and zygote.log)",
                )
            )

    def _kill(self, slot: _Slot | grader.GraderProcess) -> None:
        for kill in (os.killpg, os.kill):  # killpg misses only if the child has not yet called setsid
            try:
                kill(slot.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for slot in self.slots.values():
            if slot.spawn is not None and slot.outcome is None and not slot.timed_out and now >= slot.deadline:
                slot.timed_out = True
                self._kill(slot)
                isolation.release(slot.res)  # also kills what left the process group
        for g in self.graders.values():
            if g.status is None and not g.timed_out and now >= g.deadline:
                g.timed_out = True
                self._kill(g)
                isolation.release(g.res)

    def _send_drained(self) -> None:
        read_back: list[_Slot] = []  # reported together: one reporter for a burst
        for slot in list(self.draining):
            done = isolation.release(slot.res)
            if not done and time.monotonic() - slot.reaped_at < DRAIN_LIMIT_S:
                continue
            if not done:
                log.warning("slot %s: cgroup %s not empty after %.0fs", slot.name, slot.res.cgroups, DRAIN_LIMIT_S)
            self.draining.remove(slot)
            del self.slots[slot.pid]
            if slot.read_back and slot.world is not None and slot.grade is None:
                if not self.stopping:
                    self._start_grader(slot)  # reported once graded
                    continue
                slot.grade = Grade("error", detail="the zygote shut down before grading")
                world.release(slot.world)
            if slot.read_back:
                read_back.append(slot)
                continue
            if slot.world is not None:
                world.release(slot.world)
            slot.result.wipe()
            if slot.outcome is None:  # an idle slot: nothing was asked of it
                os.unlink(slot.log_path)
            else:  # at shutdown: nothing of the episode's is read back
                self.send(slot.outcome)
        read_back += self._graded()
        if read_back:
            self._report(read_back)

    # ---- graders: one per world episode, once its processes are gone ----------------------

    def _start_grader(self, slot: _Slot) -> None:
        """Fork the grader of ``slot``'s world (sandbox/grader.py); the episode is reported once its
        Grade is in (``_graded``). A grader that cannot be prepared is the episode's grade."""
        assert slot.world is not None and slot.plan is not None
        slot.seen = world.decoy_tripwires(slot.world)  # before anything else can touch them
        kept = slot.branching.kept  # a branch point: one grader per branch, on the layer it left
        started = []
        try:
            for i, found in enumerate(kept or [slot.world]):
                name = f"{slot.name}-grader" + (f"-b{i}" if kept else "")
                started.append(grader.start(slot, found, slot.plan, name, self.config, self.layers, self.log_dir, self._forget))
                started[-1].branch = i if kept else -1
        except OSError as e:
            for g in started:  # their verdicts are not waited for: the episode's grade is this error
                self._kill(g)
                os.waitpid(g.pid, 0)
                os.close(g.result_fd)
                isolation.release(g.res)
            slot.grade = Grade("error", detail=f"the grader could not be prepared: {e!r}")
            slot.branching = BranchLayers()  # graded as a whole: that error
            world.release(slot.world)
            self._report([slot])
            return
        for g in started:
            self.graders[g.pid] = g
            self.sel.register(g.result_fd, selectors.EVENT_READ, g)

    def _grader_reaped(self, g: grader.GraderProcess, status: int) -> None:
        self._read_result(g)
        if g.result_fd in self.sel.get_map():
            self.sel.unregister(g.result_fd)
        os.close(g.result_fd)
        g.status, g.reaped_at = status, time.monotonic()

    def _graded(self) -> list[_Slot]:
        """The episodes whose grader is reaped and drained, their Grade set and their world released."""
        done = []
        for g in [g for g in self.graders.values() if g.status is not None]:
            if not isolation.release(g.res) and time.monotonic() - g.reaped_at < DRAIN_LIMIT_S:
                continue
            del self.graders[g.pid]
            slot = g.episode
            verdict = grader.verdict(g)
            if g.branch >= 0:  # one of a branch point's: the episode is done once every branch's is in
                slot.branching.grades[g.branch] = slot.grade or verdict  # the zygote's, when it shut down meanwhile
                if len(slot.branching.grades) < len(slot.branching.kept):
                    continue
                verdict = Grade("complete", detail=f"graded per branch ({len(slot.branching.kept)})")
            slot.grade = slot.grade or verdict  # decided already when the zygote shut down
            world.release(slot.world)
            done.append(slot)
        return done

    def kill_all(self) -> None:
        """Kill every slot and wait for it; report each busy one as crashed (the zygote stops)."""
        self.stopping = True
        live = [s for s in self.slots.values() if s.outcome is None and s not in self.draining]
        for slot in live:
            self._kill(slot)
        for slot in live:
            try:
                os.waitpid(slot.pid, 0)
            except ChildProcessError:  # reaped just before the loop stopped
                pass
            os.close(slot.result_fd)
            if slot.spawn_fd != -1:
                keys.zero(slot.unsent)
                os.close(slot.spawn_fd)
            self._close_branch_channel(slot)
            if slot.spawn is not None:
                slot.outcome = EpisodeOutcome(
                    slot.spawn.episode_id, "crashed", error="the zygote shut down", wall_s=time.monotonic() - slot.started
                )
            slot.reaped_at = time.monotonic()
            self.draining.append(slot)
        self.idle.clear()
        for g in self.graders.values():
            if g.status is None:
                g.episode.grade = Grade("error", detail="the zygote shut down while grading")
                self._kill(g)
                os.waitpid(g.pid, 0)
                self._grader_reaped(g, 0)
        while self.draining or self.graders:
            self._send_drained()
            time.sleep(0.01)
        if self.worlds:
            os.rmdir(self.worlds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sandbox.zygote")
    parser.add_argument("--agent", required=True, help="MODULE:ATTR")
    parser.add_argument("--gateway", required=True, help="ipc:///path/to/gateway.sock")
    parser.add_argument("--config", default="{}", help="SandboxConfig as JSON")
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--agent-kwargs", default="{}", help="the agent class's constructor arguments as JSON")
    args = parser.parse_args(argv)
    # Nothing but stdio crosses from the launcher: an event loop (uvloop gives its children
    # non-close-on-exec duplicates of their pipes) or a shell may leak descriptors into us, and
    # every episode would inherit them. The slots close theirs again (isolation.close_all_fds_but).
    isolation.close_all_fds_but((0, 1, 2))
    ctrl_out = os.dup(1)  # the frame channel; fd 1 now points at stderr
    os.dup2(2, 1)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s zygote %(levelname)s %(message)s")
    config = SandboxConfig(**json.loads(args.config))
    log_dir = args.log_dir or config.temp_root
    os.makedirs(log_dir, exist_ok=True)

    import aiohttp.web  # noqa: F401  -- preload: every episode pays the import cost zero times
    import httpx  # noqa: F401

    import sandbox.relay  # noqa: F401

    for module in config.preload:  # the modules the agent imports at its top come with it, below
        try:
            importlib.import_module(module)
        except ImportError as e:
            log.info("sandbox.preload: %s not preloaded (%s)", module, e)
    run = load_agent(args.agent, json.loads(args.agent_kwargs))
    episode.warm_up_sdks()  # the SDKs loaded by now
    # Masked even where exposed: the episodes' logs (the controller adds its whole run directory).
    plan, plan_warnings = rootfs.plan_root(config.expose, [*config.hide, os.path.abspath(log_dir)], episode.agent_paths(args.agent))
    if threading.active_count() > 1:
        log.warning("%d threads exist before forking; they do not exist in the episodes", threading.active_count())
    layers, warnings = isolation.probe(config)
    warnings += plan_warnings if "readonly_root" in layers else []
    layers = [layer for layer in layers if layer not in config.skip_layers]
    if "cgroup" in layers:
        for d in isolation.sweep_stale_cgroups():
            log.info("removed stale cgroup %s", d)
    for d in world.sweep_stale_worlds(config.temp_root):
        log.info("removed the workspace directory of a zygote that is gone: %s", d)
    gc.freeze()  # keep imported objects out of later collections: fewer copy-on-write page faults
    if config.huge_pages:
        collapsed, refused = heap.collapse_heap()  # fewer page-table entries for every fork to copy
        log.info("heap: %d MiB collapsed into huge pages, %d MiB refused", collapsed >> 20, refused >> 20)
    server = ZygoteServer(run, args.agent, args.gateway, config, log_dir, ctrl_out, layers, plan)
    try:
        server.refill()  # before ZygoteReady: the first episodes find their slots set up
        exposed = list(plan.binds) if "readonly_root" in layers else []
        server.send(ZygoteReady(pid=os.getpid(), agent=args.agent, isolation=layers, warnings=warnings, root=exposed))
        log.info("ready: agent=%s layers=%s warm_slots=%d", args.agent, layers, config.warm_slots)
        server.serve()
    finally:
        server.kill_all()


if __name__ == "__main__":
    main()
