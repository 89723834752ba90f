"""Agents used by tests/integration/sandbox/test_sandbox.py and tests/integration/sandbox/test_sandbox_attacks.py. Each case is one behaviour (or one escape attempt).

``ProbeAgent.run`` dispatches on ``data["case"]`` so that one zygote serves every test.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import msgspec
import openai


class ProbeAgent:
    async def run(self, data: dict, **kw: Any) -> float | dict[str, float]:
        return await getattr(self, data["case"])(data, **kw)

    async def reward(self, data: dict, **kw: Any) -> float:
        print("agent stdout line")  # must land in the episode log, not on the control channel
        return float(data["value"])

    async def data_size(self, data: dict, **kw: Any) -> float:
        return float(len(json.dumps(data)))  # proves the whole spawn frame arrived

    async def rewards(self, data: dict, **kw: Any) -> dict[str, float]:
        return {"a": 1.0, "b": 0.25}

    async def lazy_import(self, data: dict, **kw: Any) -> float:
        # Imported only now, after the fork and the private /tmp: the module must stay reachable.
        return float(importlib.import_module(data["module"]).VALUE)

    async def write_file(self, data: dict, **kw: Any) -> float:
        with open(data["path"], "w") as f:
            f.write("escape")
        return 1.0

    async def raises(self, data: dict, **kw: Any) -> float:
        raise ValueError("agent failed on purpose " + data["tag"])

    async def sleep_forever(self, data: dict, **kw: Any) -> float:
        # Escape attempt: a grandchild in its own session outlives the process group kill unless
        # the PID namespace takes it down.
        subprocess.Popen(["sleep", data["marker"]], start_new_session=True)
        await asyncio.sleep(3600)
        return 0.0

    async def block_loop(self, data: dict, **kw: Any) -> float:
        time.sleep(3600)  # blocks the event loop itself; only the deadline can end this
        return 0.0

    async def segfault(self, data: dict, **kw: Any) -> float:
        ctypes.string_at(0)  # a real SIGSEGV (kill() to PID 1 from inside its namespace is ignored)
        return 0.0

    async def openai_env(self, data: dict, **kw: Any) -> dict[str, float]:
        client = openai.AsyncOpenAI()  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
        return await _chat(client, data)

    async def openai_http_client(self, data: dict, *, base_url: str, api_key: str, http_client: Any, **kw: Any) -> dict[str, float]:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client)
        return await _chat(client, data)

    async def openai_stream(self, data: dict, *, base_url: str, api_key: str, http_client: Any, **kw: Any) -> dict[str, float]:
        out = {}
        for label, client in (
            ("relay", openai.AsyncOpenAI()),
            ("zmq", openai.AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client)),
        ):
            stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream])
            out[label] = float(text == data["expect"])
        return out

    async def openai_sync(self, data: dict, **kw: Any) -> dict[str, float]:
        """A sync client of its own (OPENAI_BASE_URL): a call on the loop's thread, a streamed one,
        and one from another thread; and whether the loopback relay stayed unused."""
        from sandbox import branch

        client = openai.OpenAI(max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        plain = client.chat.completions.create(model="m", messages=messages).choices[0].message.content
        stream = client.chat.completions.create(model="m", messages=messages, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in stream)
        threaded = await asyncio.to_thread(lambda: client.chat.completions.create(model="m", messages=messages).choices[0].message.content)
        relay = branch.ARMED.relay if branch.ARMED else None
        return {
            "plain": float(plain == data["expect"]),
            "stream": float(streamed == data["expect"]),
            "thread": float(threaded == data["expect"]),
            "direct": float(relay is not None and not relay._started.is_set()),
        }

    async def connect_host(self, data: dict, **kw: Any) -> float:
        # Escape attempt: reach a TCP listener on the host's loopback.
        try:
            socket.create_connection(("127.0.0.1", data["port"]), timeout=3).close()
        except OSError:
            return 0.0
        return 1.0

    async def environment(self, data: dict, **kw: Any) -> dict[str, float]:
        return {name: 1.0 for name in os.environ}

    async def environment_values(self, data: dict, **kw: Any) -> dict[str, float]:
        return {f"{name}={os.environ.get(name)}": 1.0 for name in data["names"]}

    async def identity(self, data: dict, **kw: Any) -> dict[str, float]:
        visible = [p for p in os.listdir("/proc") if p.isdigit()]
        return {
            "pid": float(os.getpid()),
            "visible_pids": float(len(visible)),
            "host_file_visible": float(os.path.exists(data["host_file"])),
            "tmp_writable": float(_write_tmp()),
        }

    async def namespaces(self, data: dict, **kw: Any) -> dict[str, float]:
        """Which namespaces the agent is in (inode numbers), who it is outside, what network it has."""
        out = {f"ns_{name}": float(os.stat(f"/proc/self/ns/{name}").st_ino) for name in ("user", "net", "mnt", "pid")}
        inside, outside, _ = open("/proc/self/uid_map").read().split("\n")[0].split()
        out.update(
            uid=float(os.getuid()),
            uid_map_inside=float(inside),
            uid_map_outside=float(outside),
            interfaces=float(len(socket.if_nameindex())),
            only_loopback=float(all(name == "lo" for _, name in socket.if_nameindex())),
        )
        for label, addr in (("host_port_reached", ("127.0.0.1", data["port"])), ("outside_reached", ("192.0.2.1", 80))):
            try:
                socket.create_connection(addr, timeout=2).close()
                out[label] = 1.0
            except OSError:
                out[label] = 0.0
        return out

    async def remount(self, data: dict, **kw: Any) -> float:
        # Escape attempt: root in the sandbox tries to undo the private /tmp.
        libc = ctypes.CDLL(None, use_errno=True)
        return float(libc.umount2(b"/tmp", 2) == 0)  # MNT_DETACH

    async def allocate(self, data: dict, **kw: Any) -> float:
        blocks = [bytearray(1 << 20) for _ in range(data["mib"])]  # touched pages count
        return float(len(blocks))


def _write_tmp() -> bool:
    with open(os.path.join(os.environ["TMPDIR"], "x"), "w") as f:
        f.write("ok")
    return True


async def _chat(client: openai.AsyncOpenAI, data: dict) -> dict[str, float]:
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    return {"matched": float(reply.choices[0].message.content == data["expect"])}


async def function_agent(data: dict, **kw: Any) -> float:
    """A plain async function as the agent."""
    return 2.5


async def module_loaded_agent(data: dict, **kw: Any) -> float:
    """1.0 when ``data["module"]`` was imported before run() (by the zygote, before the fork)."""
    return float(data["module"] in sys.modules)


async def lazy_import_agent(data: dict, **kw: Any) -> float:
    """Imports a module inside run(), as an agent with a lazy import does; then fails if asked."""
    importlib.import_module(data["module"])
    if data.get("fail"):
        raise RuntimeError("the agent failed after its import")
    return 1.0


def _attempts(tries: dict[str, Any]) -> None:
    """Run each escape attempt; raise naming every failure (the episode's error is the reason),
    or return normally if any attempt succeeded (the test then sees an escape)."""
    reasons, escaped = [], []
    for name, attempt in tries.items():
        try:
            attempt()
            escaped.append(name)
        except OSError as e:
            reasons.append(f"{name}: {type(e).__name__} errno={e.errno} {e.strerror}")
    if not escaped:
        raise PermissionError("every attempt was blocked: " + "; ".join(reasons))
    print("ESCAPED:", escaped, reasons)


def _libc_call(fn: str, *args: Any) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, fn)(*args) == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _running(arg: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if arg.encode() in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0"):
                return True
        except OSError:  # exited while we looked
            pass
    return False


def _keys_in_own_memory(prefix: bytes) -> set[bytes]:
    """Every ``prefix`` + 32 url-safe characters in this process's writable memory (what the
    zygote left us: session keys are ``sk-areal-`` + ``secrets.token_urlsafe(24)``)."""
    found = set()
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", buffering=0) as mem:
        for line in maps:
            addresses, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            lo, hi = (int(a, 16) for a in addresses.split("-"))
            try:
                mem.seek(lo)
                chunk = mem.read(hi - lo)
            except OSError:  # e.g. a guard region
                continue
            found.update(re.findall(re.escape(prefix) + rb"[A-Za-z0-9_-]{32}", chunk))
    return found


def _child_sleeping() -> int:
    pid = os.fork()
    if pid == 0:
        time.sleep(3600)
        os._exit(0)
    return pid


def _gateway_root() -> str:
    """The relay's address without the episode's own session: OPENAI_BASE_URL is
    ``http://127.0.0.1:<port>/sessions/<key>/v1``, whose session wins over any header key, so a key
    is tried on its own only on a base URL that names no session."""
    base = os.environ["OPENAI_BASE_URL"]
    return base.split("/sessions/", 1)[0] if "/sessions/" in base else base.removesuffix("/v1")


class AttackAgent:
    """One escape attempt per case; ``well_behaved`` is the concurrent control episode."""

    async def run(self, data: dict, **kw: Any) -> float | dict[str, float]:
        return await getattr(self, data["case"])(data, **kw)

    async def well_behaved(self, data: dict, **kw: Any) -> float:
        reply = await openai.AsyncOpenAI().chat.completions.create(model="m", messages=[{"role": "user", "content": "what is 6*7?"}])
        return float(reply.choices[0].message.content == data["expect"])

    async def connect_ports(self, data: dict, **kw: Any) -> float:
        _attempts({f"127.0.0.1:{p}": lambda p=p: socket.create_connection(("127.0.0.1", p), timeout=2).close() for p in data["ports"]})
        return 1.0

    async def connect_outside(self, data: dict, **kw: Any) -> float:
        _attempts(
            {
                f"{h}:{p}": lambda h=h, p=p: socket.create_connection((h, p), timeout=2).close()
                for h, p in (("192.0.2.1", 80), ("8.8.8.8", 53), ("10.0.0.1", 443))
            }
            | {"dns example.com": lambda: socket.getaddrinfo("example.com", 80)}
        )
        return 1.0

    async def fork_bomb(self, data: dict, **kw: Any) -> float:
        n = 0
        while True:
            pid = os.fork()  # raises BlockingIOError (EAGAIN) at the pids cgroup limit
            if pid == 0:
                while True:  # every child forks too, until the limit; then it idles
                    try:
                        os.fork()
                    except OSError:
                        time.sleep(3600)
            n += 1
            if n > 100_000:
                return float(n)

    async def spin(self, data: dict, **kw: Any) -> float:
        if os.fork() == 0:
            while True:
                pass
        while True:
            pass

    async def fill_disk(self, data: dict, **kw: Any) -> float:
        chunk = b"x" * (1 << 20)
        for i in range(100_000):  # many files: each stays under RLIMIT_FSIZE, the tmpfs fills up
            with open(os.path.join(os.environ["TMPDIR"], f"fill-{i // 4}"), "ab") as f:
                f.write(chunk)
        return 1.0

    async def write_outside(self, data: dict, **kw: Any) -> float:
        def write(path: str) -> None:
            with open(path, "a") as f:
                f.write("escaped")

        _attempts(
            {p: lambda p=p: write(p) for p in data["paths"]}
            | {"mkdir cgroup": lambda: os.mkdir("/sys/fs/cgroup/pids/areal/escape"), "sysctl": lambda: write("/proc/sys/kernel/hostname")}
        )
        return 1.0

    async def read_files(self, data: dict, **kw: Any) -> float:
        def read(path: str) -> None:
            with open(path, "rb") as f:
                f.read(1)

        def listing(path: str) -> None:  # a directory that shows anything the run did not expose
            shown = sorted(os.listdir(path))
            if [n for n in shown if n not in data.get("allowed_entries", [])]:
                return None
            raise FileNotFoundError(errno.ENOENT, f"only {shown}")

        _attempts({p: lambda p=p: read(p) for p in data["paths"]} | {f"ls {d}": lambda d=d: listing(d) for d in data.get("dirs", [])})
        return 1.0

    async def read_exposed(self, data: dict, **kw: Any) -> float:
        with open(data["path"]) as f:
            return float(f.read() == data["expect"])

    async def read_environ(self, data: dict, **kw: Any) -> float:
        for pid in filter(str.isdigit, os.listdir("/proc")):  # whatever is visible must not hold it
            with open(f"/proc/{pid}/environ", "rb") as f:
                if data["secret"].encode() in f.read():
                    return 1.0
        _attempts({f"/proc/{p}/environ": lambda p=p: open(f"/proc/{p}/environ", "rb").read() for p in data["pids"]})
        return 1.0

    async def signal_parent(self, data: dict, **kw: Any) -> float:
        _attempts(
            {f"kill {p}": lambda p=p: os.kill(p, signal.SIGKILL) for p in data["pids"]}
            | {f"killpg {p}": lambda p=p: os.killpg(p, signal.SIGKILL) for p in data["pids"]}
        )
        return 1.0

    async def open_shm(self, data: dict, **kw: Any) -> float:
        from multiprocessing import shared_memory

        if os.listdir("/dev/shm"):
            return 1.0
        _attempts(
            {
                "open": lambda: open(f"/dev/shm/{data['name']}", "rb").read(),
                "SharedMemory": lambda: shared_memory.SharedMemory(data["name"]).close(),
            }
        )
        return 1.0

    async def ptrace(self, data: dict, **kw: Any) -> float:
        own = _child_sleeping()  # a sibling inside the sandbox: visible, but seccomp says no
        local = ctypes.create_string_buffer(8)
        iov = (ctypes.c_void_p * 2)(ctypes.addressof(local), 8)
        _attempts(
            {
                "see other episode": lambda: os.stat(f"/proc/{data['pid']}"),
                "attach other episode": lambda: _libc_call("ptrace", 16, data["pid"], 0, 0),
                "attach own child": lambda: _libc_call("ptrace", 16, own, 0, 0),
                "seize own child": lambda: _libc_call("ptrace", 0x4206, own, 0, 0),
                "process_vm_readv": lambda: _libc_call("process_vm_readv", own, iov, 1, iov, 1, 0),
            }
        )
        return 1.0

    async def sleep_marker(self, data: dict, **kw: Any) -> float:
        proc = await asyncio.create_subprocess_exec("sleep", data["marker"])
        await proc.wait()
        return 1.0

    async def daemonize(self, data: dict, **kw: Any) -> float:
        if os.fork() == 0:  # classic double fork: the grandchild is reparented, in its own session
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", data["marker"]])
            os._exit(0)
        deadline = time.monotonic() + 10
        while not _running(data["marker"]):  # return only once the daemon really runs
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon did not start")
            time.sleep(0.01)
        return 1.0

    async def forge_key(self, data: dict, **kw: Any) -> dict[str, float]:
        own_key = kw["api_key"]  # mutated: the last character changed (to "y" when it already is "x")
        forged = {
            "guessed": "sk-areal-" + "A" * 32,
            "mutated": own_key[:-1] + ("y" if own_key.endswith("x") else "x"),
            "other session id": data["other_episode"],
        }
        accepted = 0.0
        root = _gateway_root()
        for key in forged.values():  # in the header (a base URL naming no session), then in the URL path
            for client in (
                openai.AsyncOpenAI(api_key=key, base_url=f"{root}/v1", max_retries=0),
                openai.AsyncOpenAI(api_key="placeholder", base_url=f"{root}/sessions/{key}/v1", max_retries=0),
            ):
                try:
                    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
                    accepted += 1
                except openai.AuthenticationError:
                    pass
        own = await openai.AsyncOpenAI().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        known = {kw["api_key"].encode(), *(k.encode() for k in forged.values())}
        found = _keys_in_own_memory(data["prefix"].encode()) - known
        print("keys found in memory:", found)
        return {
            "forged_accepted": accepted,
            "own_ok": float(bool(own.choices[0].message.content)),
            "other_keys_in_memory": float(len(found)),
        }

    async def flood(self, data: dict, **kw: Any) -> float:
        line = "flood " * 20000 + "\n"
        while True:  # ends with OSError(EFBIG) once the episode log reaches RLIMIT_FSIZE
            sys.stdout.write(line)
            sys.stderr.write(line)

    async def allocate(self, data: dict, **kw: Any) -> float:
        blocks = [bytearray(1 << 20) for _ in range(data["mib"])]
        return float(len(blocks))

    async def leak_own_key(self, data: dict, *, api_key: str, **kw: Any) -> float:
        """Scan what this episode inherited for strings of the session-key format (``data["pattern"]``),
        use the gateway with its own key and try every other one found, then put its own key into
        everything that goes back to the zygote: stdout and stderr (the episode log, whose tail the
        zygote reads) and the exception (the outcome's error). The findings ride in the error."""
        found, scanned = set(), 0
        with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", buffering=0) as mem:
            for line in maps:
                addresses, perms = line.split()[:2]
                if not perms.startswith("rw"):  # the heap and anonymous mappings: where strings live
                    continue
                lo, hi = (int(a, 16) for a in addresses.split("-"))
                for start in range(lo, hi, 8 << 20):  # 8 MiB chunks overlapping by 63 bytes (a key is 41)
                    try:
                        mem.seek(start)
                        chunk = mem.read(min(hi, start + (8 << 20) + 63) - start)
                    except OSError:  # a guard region
                        break
                    scanned += len(chunk)
                    found.update(m.decode() for m in re.findall(data["pattern"].encode(), chunk))
        answer = await openai.AsyncOpenAI(max_retries=0).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        accepted = []
        for key in sorted(found - {api_key}):
            try:
                await openai.AsyncOpenAI(api_key=key, base_url=f"{_gateway_root()}/v1", max_retries=0).models.list()
                accepted.append(key)
            except openai.AuthenticationError:
                pass
        print(f"stdout: my session key is {api_key}", flush=True)
        print(f"stderr: my session key is {api_key}", file=sys.stderr, flush=True)
        report = {
            "own_found": api_key in found,
            "others": sorted(found - {api_key}),
            "others_accepted": accepted,
            "scanned_bytes": scanned,
            "answer": answer.choices[0].message.content,
        }
        raise RuntimeError(f"leaking my key {api_key} on purpose; scan={json.dumps(report)}=end")


_libc = ctypes.CDLL(None, use_errno=True)
_IPC_CREAT, _IPC_PRIVATE_MODE = 0o1000, 0o600


class ReachAgent:
    """What an episode can reach, and the attacks on what it reached at 250e73b: one case each
    (tests/integration/sandbox/test_sandbox_reach.py)."""

    async def run(self, data: dict, **kw: Any) -> Any:
        return await getattr(self, data["case"])(data, **kw)

    async def survey(self, data: dict, **kw: Any) -> float:
        from sandbox.reach import survey

        raise RuntimeError(f"reach={msgspec.json.encode(survey()).decode()}=end")

    async def sysv_make(self, data: dict, **kw: Any) -> float:
        """A 1 MiB SysV segment and a message queue under ``data["key"]``, left behind on purpose."""
        shm = _libc.shmget(data["key"], 1 << 20, _IPC_CREAT | _IPC_PRIVATE_MODE)
        msg = _libc.msgget(data["key"], _IPC_CREAT | _IPC_PRIVATE_MODE)
        return float(shm >= 0 and msg >= 0)

    async def sysv_find(self, data: dict, **kw: Any) -> dict[str, float]:
        """Look up each key of ``data["keys"]``: 1.0 where a segment or a queue with it exists."""
        found = {}
        for key in data["keys"]:
            shm, msg = _libc.shmget(key, 0, 0), _libc.msgget(key, 0)
            found[str(key)] = float(shm >= 0 or msg >= 0)
        raise RuntimeError(f"found={json.dumps(found)}=end")

    async def hold_locks(self, data: dict, **kw: Any) -> float:
        """Lock every file of ``data["paths"]`` (flock, exclusive; and a POSIX read lock), then make
        a model call: the test's engine tries the same locks from the host while it answers."""
        import fcntl

        held = []
        for path in data["paths"]:
            f = open(path, "rb")
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            held.append(f)
        await openai.AsyncOpenAI(max_retries=0).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        return float(len(held))

    async def look(self, data: dict, **kw: Any) -> float:
        """Raise naming every path of ``data["paths"]`` this episode can see."""
        seen = [p for p in data["paths"] if os.path.exists(p)]
        raise RuntimeError(f"seen={json.dumps(seen)}=end")

    async def forge_outcome(self, data: dict, **kw: Any) -> float:
        """Write its own outcome frame into its result pipe (the one write-only pipe it holds), one
        that claims what only the sandbox may say, then exit before the slot writes the real one."""
        from areal.protocol import EpisodeOutcome, frame

        pipe = next(
            int(fd)
            for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")
            and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
            and int(open(f"/proc/self/fdinfo/{fd}").read().split("flags:")[1].split()[0], 8) & 3 == 1
        )
        forged = EpisodeOutcome(
            "someone-else",
            data["status"],
            reward=7777.0,
            error="\x1b]0;pwned\x07\x1b[2J" + "E" * (1 << 20),
            exit_signal=9,
            exit_code=0,
            wall_s=0.001,
            log_tail="L" * (12 << 20),
            failure_class="infrastructure",
            failure_cause="c" * 10_000,
            imported=["\x1b[31mred", "json", "ok_module"] + [f"m{i}" for i in range(100)],
        )
        os.write(pipe, frame(msgspec.msgpack.encode(forged)))
        os._exit(0)
