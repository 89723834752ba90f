"""Agents branched at a model call by tests/integration/sandbox/test_branching.py, and in a
training run by tests/e2e/test_branched_run.py (``TwoCallAgent``).

``BranchAgent.run`` dispatches on ``data["case"]``, so one zygote serves every test. Each episode
makes three calls with the OpenAI SDK (the Anthropic SDK for ``anthropic``) over the handed client (``own``: a client
of its own from OPENAI_BASE_URL; ``sync``: a sync ``openai.OpenAI()`` of its own, on the loop's
thread; ``sync-thread``: the same in ``asyncio.to_thread``; ``mixed``: the handed client but for
call 2, made with the sync one; ``anthropic-own`` / ``anthropic-sync``: an Anthropic SDK client
of its own from ANTHROPIC_BASE_URL, async or sync, on httpx2; ``relay``: urllib to it). Before each call it bumps a
counter in memory and appends a line to a file in its private temp dir; after the second (the
branch point the tests set) it writes a file named after its reply, and its third call's user
message is a report of what it sees: the counter, the notes file, the files other branches
would have written, and the session keys in its own memory other than its own and the trunk's.
The reward is the number in its second reply, so each branch's reward is its own sample's.

``world`` and ``world-forge`` run in a task's world (tests/support/world_tasks.py): the trunk writes
/workspace/trunk.txt; a branch whose reply says "fix" fixes calc, "tamper" rewrites the protected
test and reads the decoy checks; each writes /workspace/mine-<reply>; the report names the mine-
files and trunk.txt it finds there. The sandbox's grade is its reward. ``world-replay`` is
``world`` holding a thread of its own, so that its branch point is taken by replay. ``world-forge`` first
writes a request of its own on its branch channel (``sandbox.branch.ARMED``), as a policy could.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import threading
import urllib.request
from typing import Any

import anthropic
import openai


def _keys_in_own_memory(prefix: bytes = b"sk-areal-") -> set[str]:
    found: set[str] = set()
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", buffering=0) as mem:
        for line in maps:
            addresses, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            lo, hi = (int(a, 16) for a in addresses.split("-"))
            try:
                mem.seek(lo)
                chunk = mem.read(hi - lo)
            except OSError:
                continue
            found.update(k.decode() for k in re.findall(re.escape(prefix) + rb"[A-Za-z0-9_-]{32}", chunk))
    return found


class BranchAgent:
    async def run(self, data: dict, **kw: Any) -> float:
        case = data["case"]
        sync: Any = None  # "sync", "sync-thread": every call with a sync client of its own; "mixed": call 2 only
        if case in ("sync", "sync-thread", "mixed"):
            sync = openai.OpenAI(max_retries=0)  # from OPENAI_BASE_URL and OPENAI_API_KEY, as a user's agent builds it
        if case in ("own", "relay"):  # a client of its own from OPENAI_BASE_URL; "relay" calls with urllib (below)
            client: Any = openai.AsyncOpenAI(max_retries=0)
        elif case == "anthropic":  # through the httpx2 bridge (areal/agent/httpx2_bridge.py)
            root = kw["base_url"].removesuffix("/v1")
            client = anthropic.AsyncAnthropic(base_url=root, api_key=kw["api_key"], http_client=kw["http_client"], max_retries=0)
        elif case == "anthropic-own":  # its own, from ANTHROPIC_BASE_URL: an httpx2 client
            client = anthropic.AsyncAnthropic(max_retries=0)
        elif case == "anthropic-sync":
            client = anthropic.Anthropic(max_retries=0)
        else:
            client = openai.AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw["http_client"], max_retries=0)
        held: Any = None
        if case == "child":  # a tool server of its own: fork copies one process
            held = subprocess.Popen(["sleep", "600"])
        elif case in ("thread", "world-replay"):  # "world-replay": a world episode that cannot fork (branched by replay)
            stop = threading.Event()
            held = threading.Thread(target=stop.wait, name="held", daemon=True)
            held.start()
        cgroup = open("/proc/self/cgroup").read()  # before the branch point
        world = case.startswith("world")
        if world:
            with open("/workspace/trunk.txt", "w") as f:
                f.write("trunk")
        if case == "world-forge":
            from sandbox import branch

            os.write(branch.ARMED.world[0], b"T")
        tmp = os.environ["TMPDIR"]
        notes = os.path.join(tmp, "notes.txt")
        counter = 0
        messages = [{"role": "user", "content": "start"}]
        replies = []
        for call in (1, 2, 3):
            counter += 1
            with open(notes, "a") as f:
                f.write(f"before {call};")
            if call == 2:
                messages.append({"role": "user", "content": "next"})
            if call == 3:
                own = os.environ["OPENAI_API_KEY"]
                others = sorted(_keys_in_own_memory() - {own, kw["api_key"]})
                seen = sorted(n for n in os.listdir(tmp) if n.startswith("mine-"))
                with open(notes) as f:
                    text = f.read()
                report = f"report counter={counter} notes={text} seen={seen} keys={len(others)}"
                if world:
                    found = sorted(n for n in os.listdir("/workspace") if n.startswith(("mine-", "trunk")))
                    report += f" workspace={found}"
                if case == "attack":
                    report += " " + _attack(cgroup)
                messages.append({"role": "user", "content": report})
            if case == "relay":  # another HTTP stack than httpx (as an exec: program's): to the loopback relay
                reply = _urllib_chat(messages)
            elif case == "sync-thread":  # a sync call off the loop's thread, as `await asyncio.to_thread(...)` makes it
                r = await asyncio.to_thread(sync.chat.completions.create, model="m", messages=messages, max_tokens=16)
                reply = r.choices[0].message.content or ""
            elif case == "sync" or (case == "mixed" and call == 2):  # blocking the loop, as a sync agent step does
                r = sync.chat.completions.create(model="m", messages=messages, max_tokens=16)
                reply = r.choices[0].message.content or ""
            elif case in ("anthropic", "anthropic-own", "anthropic-sync"):
                m = client.messages.create(model="m", messages=messages, max_tokens=16)
                m = m if case == "anthropic-sync" else await m
                reply = "".join(block.text for block in m.content if block.type == "text")
            else:
                r = await client.chat.completions.create(model="m", messages=messages, max_tokens=16)
                reply = r.choices[0].message.content or ""
            replies.append(reply)
            messages.append({"role": "assistant", "content": reply})
            if call == 2:
                with open(os.path.join(tmp, f"mine-{reply.replace(' ', '-')}"), "w") as f:
                    f.write(reply)
                if world:
                    _work_on_the_world(reply)
        if isinstance(held, subprocess.Popen):
            held.kill()
            held.wait()
        return float(re.findall(r"\d+", replies[1])[0])


class TwoCallAgent:
    """Two chat calls over the handed client, the second after the first's reply; its reward is a
    coin flip drawn at the end from os.urandom (branches share the interpreter's random state, not
    the kernel's), so siblings' rewards differ by chance, whatever the model replies."""

    async def run(self, data: dict, **kw: Any) -> float:
        client = openai.AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw["http_client"], max_retries=0)
        messages = [{"role": "user", "content": str(data.get("question", "start"))}]
        for _ in range(2):
            r = await client.chat.completions.create(model="m", messages=messages, max_tokens=16)
            messages += [{"role": "assistant", "content": r.choices[0].message.content or ""}, {"role": "user", "content": "again"}]
        return float(os.urandom(1)[0] % 2)


def _work_on_the_world(reply: str) -> None:
    with open(f"/workspace/mine-{reply.replace(' ', '-')}", "w") as f:
        f.write(reply)
    if "fix" in reply:
        with open("/workspace/calc/__init__.py", "w") as f:
            f.write("def add(a, b):\n    return a + b\n")
    if "tamper" in reply:
        with open("/workspace/tests/test_calc.py", "w") as f:
            f.write("def test_add():\n    pass\n")
        with open("/checks/test_checks.py") as f:
            f.read()


def _urllib_chat(messages: list[dict]) -> str:
    """One chat call by urllib to OPENAI_BASE_URL with OPENAI_API_KEY; the reply's text."""
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": "m", "messages": messages, "max_tokens": 16}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.load(r)["choices"][0]["message"]["content"] or ""


def _attack(cgroup: str) -> str:
    """In a branch, after the branch point: what another branch left running; reading and killing
    the supervisor (it runs every later branch); a daemon left behind for the next branch to meet;
    whether this branch is in the trunk's cgroup (its limits)."""
    me, sup = os.getpid(), os.getppid()
    strays = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (me, sup)]
    try:
        with open(f"/proc/{sup}/maps") as maps:
            writable = next(line for line in maps if line.split()[1].startswith("rw"))
        with open(f"/proc/{sup}/mem", "rb", buffering=0) as mem:
            mem.seek(int(writable.split("-")[0], 16))
            mem.read(1)
        memory = "read"
    except OSError as e:
        memory = f"denied({type(e).__name__})"
    try:
        os.kill(sup, signal.SIGKILL)  # PID 1 of the namespace: ignored from inside it
    except OSError:
        pass
    subprocess.Popen(["sleep", "600"], start_new_session=True)  # left behind on purpose
    same = open("/proc/self/cgroup").read() == cgroup
    return f"strays={len(strays)} supervisor-memory={memory} same-cgroup={same}"


class NoisyAgent:
    """Two chat calls over the handed client whose first message carries a number drawn from
    os.urandom: no replay of it repeats the first call (``rollout.branch.replay`` names the
    divergence). A thread of its own keeps it from forking (the branch point is refused)."""

    async def run(self, data: dict, **kw: Any) -> float:
        threading.Thread(target=threading.Event().wait, name="held", daemon=True).start()
        client = openai.AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw["http_client"], max_retries=0)
        messages = [{"role": "user", "content": f"draw {int.from_bytes(os.urandom(4), 'big')}"}]
        for _ in range(2):
            r = await client.chat.completions.create(model="m", messages=messages, max_tokens=16)
            messages += [{"role": "assistant", "content": r.choices[0].message.content or ""}, {"role": "user", "content": "again"}]
        return 1.0
