"""Gateway overhead: added latency per call against calling the engine directly, requests/s per
core, and the CPU cost of building prompts for a 200-turn episode. Every figure has a same-run
baseline.

    client ──ZeroMQ DEALER / HTTP──► gateway process ──HTTP /generate──► engine process
    client ──────────────────────────HTTP /generate──────────────────────► engine process  (baseline)

- Latency: sequential calls through the gateway (ZeroMQ and HTTP front doors) and straight to
  the engine with the same prompt, the three taking turns call by call. "added p50" is the
  gateway's p50 minus the direct p50; "added p99" is the p99 of per-call differences (each
  gateway call minus the direct call made just before it). Run against the instant engine
  (``gateway_engine``) and against the embedded CPU engine (greedy, 8 tokens). All three paths
  use blocking clients of a few µs each (a raw keep-alive HTTP socket, a blocking pyzmq DEALER),
  so the difference is the gateway's, not the client libraries'. With the instant engine, the
  gateway process's CPU per call (all its threads, libzmq's I/O thread included, from /proc
  schedstat in ns) is reported too, against the engine's CPU per direct call.
- Transport floors take turns with the rest: a request-sized message to an echo server and back
  through libzmq at both ends (a DEALER to a ROUTER, the gateway door's socket types) and over
  TCP. A gateway call makes the ZeroMQ hop on top of the TCP hop a direct call makes, so no
  gateway can add less than the ZeroMQ echo.
- Splitting the added latency in the same run: a second gateway process with its core taken out
  (``core="none"``: the door, a task, one ``/generate`` over the engine client, a fixed reply) is
  the "plumbing only" row; a third takes the engine client out as well (``core="raw"``: a
  prebuilt ``/generate`` written and its answer read on one connection): the "door + raw engine
  exchange" row, the floor under this gateway's request path.
- Placement: unpinned, the scheduler now and then wakes a process on the other, idle vCPU, which
  costs tens of µs on a small VM; a gateway call has four wake-ups where a direct call has two,
  so the unpinned figure carries more of that and swings between runs. ``one_vcpu_rows`` pins
  all three processes to one vCPU and measures again in the same run: the gap is placement.
- Requests/s on one core: several client processes keep the gateway busy; the figure is calls
  answered per CPU-second of the gateway process (read from /proc, every thread), so other load
  on a shared machine does not count against it. Baseline: the instant engine's own calls per
  CPU-second serving the same load directly.
- Prompt building: 200 turns of one episode, each turn's prompt built incrementally on the
  parent's recorded tokens (``PromptBuilder.build``) vs rendering and tokenising the whole
  history every turn, as AReaL does. CPU time in total per episode, the least of 3 (see
  ``prompt_building_rows``).

Modules: this one (the rows and ``main``), ``gateway_engine`` (the instant engine and the
gateway under test, each a process), ``gateway_clients`` (clients, echo floors, timing).

    python -m benchmarks.run gateway [--quick]
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import sys
import time
from typing import Any

from instant_engine import launch_instant_engine

from benchmarks.gateway_clients import (
    MESSAGES,
    BlockingHttpClient,
    BlockingZmqClient,
    EchoProcess,
    HttpClient,
    ZmqClient,
    _chat_body,
    _engine_body,
    _p,
    _prompt_ids,
    _reply_ids,
    proc_cpu_ns,
    take_turns,
)
from benchmarks.gateway_engine import GatewayProcess

__all__ = ["MESSAGES", "main", "prompt_building_rows"]  # prompt_building uses these

_FLOORS = {
    "zmq": "the hop a gateway call adds, through libzmq at both ends (an I/O thread on each side): the least it could add",
    "tcp": "the hop both paths make to the engine",
}


def latency_rows(
    engine: str,
    engine_url: str,
    gateway: GatewayProcess,
    prompt_ids: list[int],
    n: int,
    max_tokens: int,
    engine_pid: int | None = None,
    floors: bool = False,
) -> list[dict]:
    """Latency added per call over ZeroMQ and HTTP against direct engine calls, and (with
    ``engine_pid``) CPU per call of the gateway process against the engine's per direct call.

    Latency: the three clients take turns call by call (direct, zmq, http, direct, ...), so each
    gateway call has a direct call made just before it under the same background load. "added
    p50" is the gateway's p50 minus the direct p50; "added p99" is the p99 of the per-call
    differences (gateway call minus the direct call paired with it): a difference of two p99s
    is not an added latency, and under noise it even came out negative.
    CPU: in blocks of calls per door, from /proc/<pid>/task/*/schedstat (ns, every thread of the
    process, ZeroMQ's I/O thread included); clock-tick counters were too coarse for the engine.
    Floors (``floors``): the round trip of a request-sized message to a ZeroMQ ROUTER echo and to
    a TCP echo, taking turns with the rest. A gateway call over ZeroMQ makes both hops (client to
    gateway, gateway to engine) where a direct call makes the TCP one, so the ZeroMQ echo is the
    least any gateway could add on this machine before doing any work.
    """
    clients = {
        "direct": BlockingHttpClient(engine_url + "/generate", _engine_body(prompt_ids, max_tokens)),
        "zmq": BlockingZmqClient(gateway.zmq, gateway.key, _chat_body(max_tokens)),
        "http": BlockingHttpClient(gateway.http + "/v1/chat/completions", _chat_body(max_tokens), gateway.key),
    }
    echoes: dict[str, EchoProcess] = {}
    stripped: dict[str, GatewayProcess] = {}  # client name -> gateway with parts taken out
    try:
        if floors:
            echoes = {f"{kind} echo": EchoProcess(kind, len(_chat_body(max_tokens))) for kind in _FLOORS}
            clients.update(echoes)
            for name, core in (("zmq no core", "none"), ("zmq raw exchange", "raw")):
                stripped[name] = GatewayProcess(engine_url, core=core)
                clients[name] = BlockingZmqClient(stripped[name].zmq, stripped[name].key, _chat_body(max_tokens))
        lat = take_turns(clients, n)
    finally:
        for name in stripped:
            if name in clients:
                clients.pop(name).close()
        for name, echo in echoes.items():  # an echo is its own client
            clients.pop(name, None)
            echo.close()
        for process in stripped.values():
            process.stop()
    rows = []
    direct50, direct99 = _p(lat["direct"], 0.5) * 1e6, _p(lat["direct"], 0.99) * 1e6
    for door in ("zmq", "http"):
        rows.append(
            {
                "benchmark": "gateway",
                "metric": f"added p50 {door}, {engine} engine",
                "value": _p(lat[door], 0.5) * 1e6 - direct50,
                "unit": "us",
                "baseline": f"direct {engine} p50",
                "baseline_value": direct50,
            }
        )
    for door in ("zmq", "http"):
        paired = [g - d for g, d in zip(lat[door], lat["direct"])]
        rows.append(
            {
                "benchmark": "gateway",
                "metric": f"added p99 {door}, {engine} engine",
                "value": _p(paired, 0.99) * 1e6,
                "unit": "us",
                "baseline": f"direct {engine} p99",
                "baseline_value": direct99,
                "note": "p99 of per-call differences, each gateway call minus the direct call just before it",
            }
        )
    for kind, note in _FLOORS.items() if floors else ():
        rows.append(
            {
                "benchmark": "gateway",
                "metric": f"{kind} echo round trip p50 (transport floor)",
                "value": _p(lat[f"{kind} echo"], 0.5) * 1e6,
                "unit": "us",
                "baseline": f"direct {engine} p50",
                "baseline_value": direct50,
                "note": "a request-sized message to an echo server and back, no gateway, no engine: " + note,
            }
        )
    if floors:
        rows.append(
            {
                "benchmark": "gateway",
                "metric": f"added p50 zmq, plumbing only (no core), {engine} engine",
                "value": _p(lat["zmq no core"], 0.5) * 1e6 - direct50,
                "unit": "us",
                "baseline": f"direct {engine} p50",
                "baseline_value": direct50,
                "note": "a gateway process with its core taken out: the ZeroMQ door, a task, one /generate over "
                "the engine client, a fixed reply; the rest of 'added p50 zmq' is the core's",
            }
        )
        rows.append(
            {
                "benchmark": "gateway",
                "metric": f"added p50 zmq, door + raw engine exchange, {engine} engine",
                "value": _p(lat["zmq raw exchange"], 0.5) * 1e6 - direct50,
                "unit": "us",
                "baseline": f"direct {engine} p50",
                "baseline_value": direct50,
                "note": "a gateway process with its core and its engine client taken out: the ZeroMQ door, a task, "
                "a prebuilt /generate written and its answer read on one connection, a fixed reply: the "
                "least this door adds while making the engine call",
            }
        )
    if engine_pid is not None:
        cpu = {}
        for name, client in clients.items():
            pid = engine_pid if name == "direct" else gateway.popen.pid
            cpu0 = proc_cpu_ns(pid)
            for _ in range(n):
                client.call()
            cpu[name] = (proc_cpu_ns(pid) - cpu0) / n / 1e3
        for door in ("zmq", "http"):
            rows.append(
                {
                    "benchmark": "gateway",
                    "metric": f"gateway CPU per call, {door}, {engine} engine",
                    "value": cpu[door],
                    "unit": "us CPU",
                    "baseline": f"{engine} engine CPU per direct call",
                    "baseline_value": cpu["direct"],
                }
            )
    for client in clients.values():
        client.close()
    return rows


def _threads(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def one_vcpu_rows(
    engine: str, engine_url: str, gateway: GatewayProcess, engine_pid: int, prompt_ids: list[int], n: int, max_tokens: int
) -> list[dict]:
    """Added latency with the client, the gateway and the engine pinned to one vCPU, direct and
    ZeroMQ calls taking turns; every thread's affinity is put back afterwards.

    Unpinned, the three processes of a gateway call mostly run one after another on one vCPU, but
    now and then the scheduler wakes one on the other, idle vCPU. On this KVM guest (guest halt
    polling off) such a wake-up costs tens of µs, and a gateway call has four wake-ups where a
    direct call has two, so the unpinned figure carries more of that cost and swings from run to
    run. Pinned, no call wakes another vCPU: what is left is the gateway's own cost (its CPU,
    user and kernel). This row is the same-run measure of that part, next to the unpinned one.
    """
    pids = (os.getpid(), gateway.popen.pid, engine_pid)
    saved = {tid: os.sched_getaffinity(tid) for pid in pids for tid in _threads(pid)}
    cpu = min(os.sched_getaffinity(0))
    clients = {
        "direct": BlockingHttpClient(engine_url + "/generate", _engine_body(prompt_ids, max_tokens)),
        "zmq": BlockingZmqClient(gateway.zmq, gateway.key, _chat_body(max_tokens)),
    }
    try:
        for tid in saved:
            os.sched_setaffinity(tid, {cpu})
        lat = take_turns(clients, n)
    finally:
        for tid, cpus in saved.items():
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
        for client in clients.values():
            client.close()
    direct50 = _p(lat["direct"], 0.5) * 1e6
    return [
        {
            "benchmark": "gateway",
            "metric": f"added p50 zmq, all on one vCPU, {engine} engine",
            "value": _p(lat["zmq"], 0.5) * 1e6 - direct50,
            "unit": "us",
            "baseline": f"direct {engine} p50, one vCPU",
            "baseline_value": direct50,
            "note": "client, gateway and engine pinned to one vCPU: no call wakes a process on another vCPU "
            "(one_vcpu_rows); the unpinned row is the headline",
        }
    ]


def _load_client(door: str, url: str, key: str | None, body: bytes, concurrency: int, start_at: float, stop_at: float, queue: Any) -> None:
    """Closed-loop load from ``start_at`` to ``stop_at`` (wall clock); puts the calls answered."""

    async def go() -> int:
        # one DEALER carries one request at a time in ZmqClient: one client per worker
        clients = [ZmqClient(url, key or "", body) if door == "zmq" else HttpClient(url, body, key) for _ in range(concurrency)]
        await clients[0].call()  # connect before the clock starts
        await asyncio.sleep(max(0.0, start_at - time.time()))
        done = 0

        async def worker(client: Any) -> None:
            nonlocal done
            while time.time() < stop_at:
                await client.call()
                done += 1

        await asyncio.gather(*(worker(c) for c in clients))
        for c in clients:
            await c.aclose()
        return done

    queue.put(asyncio.run(go()))


def throughput(door: str, url: str, key: str | None, body: bytes, server_pid: int, seconds: float, clients: int = 3) -> tuple[float, float]:
    """(calls per CPU-second of the server process, calls per wall second) under a closed-loop load."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start_at = time.time() + 4.0  # after the clients' spawn and imports
    procs = [ctx.Process(target=_load_client, args=(door, url, key, body, 16, start_at, start_at + seconds, queue)) for _ in range(clients)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = proc_cpu_ns(server_pid)
    time.sleep(seconds)
    cpu1 = proc_cpu_ns(server_pid)
    total = sum(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    return total / max((cpu1 - cpu0) / 1e9, 1e-9), total / seconds


# ---- prompt building for a long episode --------------------------------------------------------


def prompt_building_rows(turns: int, repeats: int = 1) -> list[dict]:
    """CPU time to build every prompt of a ``turns``-turn episode: incremental vs full re-render.

    Each way is timed ``repeats`` times, interleaved, after an untimed 10-turn warm-up of both;
    the figure is the least of each way's times (as ``timeit`` reports): CPU time is inflated by
    whatever else shares the caches and cores, which on this shared 2-core machine varied the
    same code between 24 and 45 ms from run to run, and the least is the best estimate of the
    code's own cost. Both ways get the same number of repeats, so the ratio stays fair."""
    from transformers import AutoTokenizer

    from areal.embedded import ensure_embedded_model
    from areal.gateway.render import PromptBuilder, PromptIndex
    from areal.gateway.tree import Interaction

    tok = AutoTokenizer.from_pretrained(ensure_embedded_model())
    tok.model_max_length = 1 << 30  # a 200-turn history passes the model's context; only its length is measured here
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    builder = PromptBuilder(tok, [im_end])
    reply_text = "The calculator says 42, so the answer is \\boxed{42}."
    reply_ids = tok.encode(reply_text, add_special_tokens=False) + [im_end]

    def episode(incremental: bool, turns: int) -> tuple[float, int]:
        index, interactions = PromptIndex(), {}
        messages: list[dict] = [{"role": "system", "content": "You are a helpful assistant."}]
        total_ids = 0
        t0 = time.process_time()
        for t in range(turns):
            messages.append({"role": "user", "content": f"Step {t}: what is {t} * 7 plus 3?"})
            if incremental:
                prompt = builder.build(index, interactions, messages, None)
                ids = prompt.ids
                inter = Interaction(
                    id=f"i{t}",
                    prompt_ids=ids,
                    output_ids=reply_ids,
                    output_logprobs=[0.0] * len(reply_ids),
                    version=0,
                    finish_reason="stop",
                    created=0.0,
                    parent_id=prompt.parent_id,
                )
                interactions[inter.id] = inter
                reply = {"role": "assistant", "content": reply_text}
                builder.record(index, prompt, inter, reply)
            else:  # AReaL's way: the whole history through the chat template and the tokenizer
                ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"]
                reply = {"role": "assistant", "content": reply_text}
            total_ids += len(ids)
            messages.append(reply)
        elapsed = time.process_time() - t0
        if incremental:
            assert index.incremental == turns - 1, (index.incremental, index.drift)
        return elapsed, total_ids

    episode(True, 10)
    episode(False, 10)
    inc, full = float("inf"), float("inf")
    for _ in range(repeats):
        inc_s, inc_ids = episode(True, turns)
        full_s, full_ids = episode(False, turns)
        assert inc_ids == full_ids  # same prompts, token for token in length (equality is tested in tests/)
        inc, full = min(inc, inc_s), min(full, full_s)
    return [
        {
            "benchmark": "gateway",
            "metric": f"prompt building, {turns}-turn episode",
            "value": inc * 1e3,
            "unit": "ms CPU",
            "baseline": "full re-render every turn (apply_chat_template, as AReaL)",
            "baseline_value": full * 1e3,
        }
    ]


# ---- main ----------------------------------------------------------------------------------------


def main(quick: bool) -> list[dict]:
    from areal.embedded import ensure_embedded_model
    from areal.engine.launch import launch_embedded_engine

    rows: list[dict] = []
    prompt_ids = _prompt_ids()
    n = 100 if quick else 2000  # quick: a smoke of every row, not a measurement
    with launch_instant_engine(_reply_ids()) as engine:
        gateway = GatewayProcess(engine.url)
        try:
            rows += latency_rows("instant", engine.url, gateway, prompt_ids, n, max_tokens=64, engine_pid=engine.popen.pid, floors=True)
            rows += one_vcpu_rows("instant", engine.url, gateway, engine.popen.pid, prompt_ids, n, max_tokens=64)
            seconds = 1.0 if quick else 10.0
            gw_rate, gw_wall = throughput("zmq", gateway.zmq, gateway.key, _chat_body(64), gateway.popen.pid, seconds)
            eng_rate, eng_wall = throughput("http", engine.url + "/generate", None, _engine_body(prompt_ids, 64), engine.popen.pid, seconds)
            rows.append(
                {
                    "benchmark": "gateway",
                    "metric": "requests/s per gateway core, zmq, instant",
                    "value": gw_rate,
                    "unit": "req/s",
                    "baseline": "instant engine, direct",
                    "baseline_value": eng_rate,
                }
            )
            rows.append(
                {
                    "benchmark": "gateway",
                    "metric": "requests/s wall, zmq, 3 clients, instant",
                    "value": gw_wall,
                    "unit": "req/s",
                    "baseline": "instant engine wall, direct",
                    "baseline_value": eng_wall,
                }
            )
        finally:
            gateway.stop()
    embedded = launch_embedded_engine(str(ensure_embedded_model()))
    try:
        gateway = GatewayProcess(embedded.url)
        try:
            rows += latency_rows("embedded", embedded.url, gateway, prompt_ids, 10 if quick else 100, max_tokens=8)
        finally:
            gateway.stop()
    finally:
        embedded.stop()
    rows += prompt_building_rows(200, repeats=3)
    return rows


if __name__ == "__main__":
    for row in main(quick="--quick" in sys.argv[1:]):
        print(row)
