"""No episode finds another session's key in its memory, whatever earlier episodes sent back.

Issue 18, item 2: an agent scanning its own memory found a key that was not its own, in episodes
of the third and fourth groups of a run. Here a real zygote runs ``WAVES`` waves of ``WAVE``
episodes of tests/support/sandbox_agents.py:AttackAgent.leak_own_key, one after the other, with
``warm_slots=WAVE``: the slots of wave k+2 are forked while wave k+1 is handed over, after wave
k's outcomes went back through the zygote. Every episode scans its writable memory for the
session-key format, then puts its own key into everything that goes back (stdout, stderr, the
exception that becomes its outcome's error), so every fork after the first wave happens in a
zygote that has handled keys of finished episodes.

The world is real: ``areal.gateway.Gateway`` served over ZeroMQ (ipc://), the embedded model's
tokenizer, sessions opened and closed around each episode as the controller does. Only the
engine is a stand-in (SGLang's ``/generate`` on loopback, always "42").

The scan cannot pass vacuously: every episode must find its own key (in its environment and its
arguments) and ``DECOY``, a string of the key format that reaches it only inside its dataset row;
besides those it may find only ``GUESS``, a constant of the agent module's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from instant_engine import start_instant_engine
from transformers import AutoTokenizer
from zygote_harness import run, zygote_env

from areal.embedded import ensure_embedded_model
from areal.engine.client import EngineClient
from areal.gateway import Gateway, serve_zmq
from areal.protocol import EpisodeOutcome
from sandbox.isolation import SandboxConfig
from sandbox.zygote_client import Zygote

# areal/gateway/core.py: "sk-areal-" + secrets.token_urlsafe(24), i.e. 32 characters of base64url.
KEY_PATTERN = r"sk-areal-[A-Za-z0-9_-]{32}"
DECOY = "sk-areal-" + "DECOYdecoy-_" * 2 + "DECOYdec"
GUESS = "sk-areal-" + "A" * 32  # AttackAgent.forge_key's guess: a constant of the agent's code, no session
WAVES, WAVE = 4, 6
ANSWER = "42"


Episode = Callable[[str, dict], Awaitable[tuple[str, str, EpisodeOutcome]]]


@contextlib.asynccontextmanager
async def _world(tmp: str, warm_slots: int, on_call: Callable[[], Awaitable[None] | None] | None = None) -> AsyncIterator[Episode]:
    """Gateway, stand-in engine and a zygote of AttackAgent; yields ``episode(eid, data)``, which
    opens its session, runs ``leak_own_key`` with ``data`` and closes the session, as the
    controller does: ``(episode id, key, outcome)``."""
    tok = AutoTokenizer.from_pretrained(ensure_embedded_model())
    engine = await start_instant_engine(tok, ANSWER, on_call=on_call)
    gateway = Gateway(EngineClient(f"http://127.0.0.1:{engine.addresses[0][1]}"), tok)
    addr, ready = f"ipc://{tmp}/gateway.sock", asyncio.Event()
    door = asyncio.ensure_future(serve_zmq(gateway, addr, ready))
    await ready.wait()
    config = SandboxConfig(deadline_s=120.0, memory_limit_bytes=512 << 20, max_pids=64, warm_slots=warm_slots)
    with zygote_env():
        zygote = await Zygote.start("sandbox_agents:AttackAgent", addr, config, os.path.join(tmp, "log"))

    async def episode(eid: str, data: dict) -> tuple[str, str, EpisodeOutcome]:
        key = gateway.open_session(eid)
        try:
            out = await zygote.run_episode(eid, {"case": "leak_own_key", "pattern": KEY_PATTERN, "decoy": DECOY, **data}, key)
        finally:
            gateway.close_session(key)
        return eid, key, out

    try:
        yield episode
    finally:
        await zygote.close()
        door.cancel()
        await engine.cleanup()
        await gateway.engine.close()


def _in_a_thread(work: Coroutine[Any, Any, Any]) -> Any:
    """Run ``work`` on an event loop of its own thread (the zygote's subprocess needs a running loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        return run(loop, work, timeout=240)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()


async def _waves(tmp: str) -> list[tuple[str, str, EpisodeOutcome]]:
    """(episode id, key, outcome) of every episode, each wave started once the last one ended."""
    async with _world(tmp, warm_slots=WAVE) as episode:
        results = []
        for w in range(WAVES):
            results += await asyncio.gather(*(episode(f"wave{w}-e{i}", {}) for i in range(WAVE)))
        return results


def test_no_episode_finds_another_sessions_key(tmp_path):
    results = _in_a_thread(_waves(str(tmp_path)))
    owner = {key: eid for eid, key, _ in results}
    reports, leaks = {}, []
    for eid, key, out in results:
        match = re.search(r"scan=(\{\"own_found\".*?\})=end", out.error)
        assert out.status == "error" and match, f"{eid}: {out.status} {out.error[-3000:]}"
        report = reports[eid] = json.loads(match.group(1))
        foreign = [k for k in report["others"] if k not in (DECOY, GUESS)]
        leaks += [
            f"{eid} found the key of {owner.get(k, repr(k))}{' (the gateway accepted it)' if k in report['others_accepted'] else ''}"
            for k in foreign
        ]
    assert leaks == [], "\n".join(leaks)
    for eid, key, out in results:
        report = reports[eid]
        assert report["own_found"] and DECOY in report["others"], f"{eid}: the scan missed a key it holds: {report}"
        assert report["scanned_bytes"] > 16 << 20 and report["answer"] == ANSWER, report
        assert report["others_accepted"] == [], report  # the decoy is no session
        assert key not in out.error, f"{eid}: its own key came back in its outcome: {out.error[-2000:]}"


LIVE = 12
PROMPT = "a dataset row of a realistic size " * 8


async def _live_siblings(tmp: str) -> tuple[list[tuple[str, str, EpisodeOutcome]], bool]:
    """``LIVE`` episodes, none answered until all of them have scanned and called: every scan runs
    while every sibling handed over before it is alive, its key live in the gateway. Returns the
    results and whether the engine held them all at once."""
    arrived, all_in = 0, asyncio.Event()

    async def hold() -> None:
        nonlocal arrived
        arrived += 1
        if arrived == LIVE:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 120)

    # One warm slot, spawns in bursts of 4: within a batch, slots are forked on the spot right
    # after the handover of a live sibling's frame, where its key was found at 250e73b.
    async with _world(tmp, warm_slots=1, on_call=hold) as episode:
        tasks = []
        for i in range(LIVE):
            tasks.append(asyncio.ensure_future(episode(f"live-e{i}", {"prompt": PROMPT})))
            if i % 4 == 3:  # bursts: within a batch, slots are forked on the spot after earlier handovers
                await asyncio.sleep(0.05)
        return list(await asyncio.gather(*tasks)), all_in.is_set()


def test_no_episode_finds_the_key_of_a_live_sibling(tmp_path):
    results, held_together = _in_a_thread(_live_siblings(str(tmp_path)))
    assert held_together  # every episode scanned while all its earlier siblings were alive
    owner = {key: eid for eid, key, _ in results}
    leaks = []
    for eid, key, out in results:
        found = re.findall(r"scan=(\{\"own_found\".*?\})=end", out.error)
        assert out.status == "error" and found, f"{eid}: {out.status} {out.error[-3000:]}"
        report = json.loads(found[-1])
        assert report["own_found"] and DECOY in report["others"] and report["answer"] == ANSWER, report
        leaks += [f"{eid} found the live key of {owner.get(k, repr(k))}" for k in report["others"] if k not in (DECOY, GUESS)]
    assert leaks == [], "\n".join(leaks)
