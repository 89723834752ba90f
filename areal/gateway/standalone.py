"""The gateway on its own (``python -m areal.gateway``): one model served, one key for every API,
every call recorded where the run viewer opens it.

    model.path ─► hf_model_dir ─► start_engines (a run's engines: the embedded one launched,
                  engine.launch.command's started, or engine.urls reached)
    gateway ─► gateway_config (capped at the model's positions) ─► Gateway ─► serve_http(host, port)
    one Session, its key printed with the base URLs (OpenAI: <url>/v1; Anthropic: <url>)
    every second: new calls and rewards ─► CallRecord ─► <record>/episodes.jsonl, calls.jsonl
    SIGINT / SIGTERM ─► the HTTP door closed, the record flushed, the engine stopped

What a session is here. A run opens a session per episode and closes it when the episode ends; its
budgets (calls, sampled tokens) and its idle expiry bound one episode. Alone, the gateway serves
whoever holds the key for as long as it runs: one session, opened at the start, which never expires
and has no budget of calls or tokens (the per-request limits, ``max_tokens_cap`` and the context,
stay the run's). Its calls are told apart by the conversation tree the gateway already builds: a
call whose prompt extends an earlier call's prompt + reply is that call's child; any other call
starts a conversation (an agent's new run, a history it rewrote, each of n choices).

The record directory has a run directory's layout, so ``python -m areal.view DIR`` opens it
(``areal/view/data.py``): ``config.json`` (what was served: model, engine, gateway settings),
``vocab.json``, ``engine.log`` (an engine the gateway launched), ``episodes.jsonl`` (one line per
conversation: status ok, its calls, the policy versions) and ``calls.jsonl`` (its tree, token by
token: ids, logprobs, versions, rewards set with ``POST /v1/rewards``). A conversation is written
once a second while it changes (a new call, a reward) and at the end; a later line replaces an
earlier one of the same conversation. The viewer reads the directory when it starts.

Invariants:
- Nothing the gateway started outlives it: on a signal, a failure, or the death of the engine it
  launched (which stops the gateway with the engine's log tail), the engine's process group is
  stopped, and a kill of the gateway itself takes the engine with it (``die_with_parent``).
- Every call the gateway answered before it stopped is in the record; a call cut by the stop was
  not answered and is not recorded.
- A record directory holds one gateway's calls: one that already holds ``episodes.jsonl`` is refused.
- Bad input is refused before anything starts, naming the option: a port in use, a model path
  that is no model, a used record directory (``StartFailed``; the config's keys fail at composition).

Not covered: memory grows with the calls served (the session keeps every call: later calls are
matched against them); the ZeroMQ door of the sandboxes is not opened (agents reach the gateway over
HTTP); vLLM servers at ``engine.urls`` with a tied model are refused as a run refuses them, though
nothing here pushes weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from areal.embedded.resolve import hf_model_dir
from areal.engine.config import EngineConfig
from areal.engine.serving import start_engines
from areal.gateway.core import Gateway, GatewayConfig, Session
from areal.gateway.families import gateway_config
from areal.gateway.server import serve_http
from areal.gateway.tree import Interaction
from areal.jsonl import json_line
from areal.view.data import call_tree_line, vocabulary

_KEY = re.compile(r"[A-Za-z0-9._~-]{16,}")  # it may stand in a URL path (/sessions/<key>/v1)
FLUSH_S = 1.0  # how often new calls reach the record (and the engine's death is noticed)


class StartFailed(RuntimeError):
    """The gateway could not start; the message names the option and what to do."""


class EngineDied(RuntimeError):
    """The engine the gateway launched died; the message holds its exit status and log tail."""


@dataclass
class StandaloneConfig:
    """What the gateway on its own adds to a run's settings (``python -m areal.gateway``'s flags)."""

    record: str  # the record directory (the viewer's run-directory layout); must not hold a record yet
    host: str = "127.0.0.1"  # the HTTP door's address; loopback: only this machine reaches it
    port: int = 8777  # 0: any free one (printed)
    api_key: str = ""  # the session's key; "": a random one, new at every start

    def __post_init__(self) -> None:
        if not self.record:
            raise ValueError("--record must name a directory")
        if not self.host:
            raise ValueError("--host must name an address (127.0.0.1: this machine only)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be a port number (0: any free one), got {self.port}")
        if self.api_key and not _KEY.fullmatch(self.api_key):
            raise ValueError("--api-key must be at least 16 characters of A-Z a-z 0-9 . _ ~ - (it may stand in a URL path)")


def check_port(host: str, port: int) -> None:
    """Refuse, before an engine is started for nothing, a port something already listens on."""
    if port == 0:
        return
    try:
        socket.create_server((host, port)).close()  # SO_REUSEADDR, as the HTTP door binds
    except OSError as e:
        why = os.strerror(e.errno) if e.errno else str(e)
        raise StartFailed(f"--port {port}: cannot listen on {host}:{port} ({why}); choose another (--port 0: any free one)") from None


def model_dir_of(path: str) -> Path:
    """``model.path``'s HF directory, or ``StartFailed`` naming it."""
    try:
        return hf_model_dir(path)
    except FileNotFoundError as e:
        raise StartFailed(str(e)) from None


class CallRecord:
    """The record directory: every call of one session, grouped into conversations (trees)."""

    def __init__(self, directory: Path) -> None:
        if (directory / "episodes.jsonl").exists():
            raise StartFailed(
                f"--record {directory} already holds a record (episodes.jsonl); a record directory holds one gateway's "
                "calls: choose another or remove it"
            )
        self.directory = directory
        self.root: dict[str, str] = {}  # call id -> the id of its conversation's first call
        self.conversations: dict[str, list[Interaction]] = {}  # first call's id -> its calls, in order
        self.written: dict[str, tuple] = {}  # first call's id -> (calls, their rewards) as last written
        self.seen = 0  # calls of the session grouped so far
        self.last_used = -1.0  # the session's last_used when last looked at: nothing new since
        self.calls_log: TextIO | None = None
        self.episode_log: TextIO | None = None

    def open(self, settings: dict[str, Any], tokenizer: Any) -> None:
        """Start the directory: what is served (config.json), every token's text (vocab.json), the logs."""
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "config.json").write_text(json.dumps(settings, indent=2))
        (self.directory / "vocab.json").write_text(json.dumps(vocabulary(tokenizer)))
        self.calls_log = open(self.directory / "calls.jsonl", "a")
        self.episode_log = open(self.directory / "episodes.jsonl", "a")

    def update(self, session: Session) -> list[Interaction]:
        """Write the conversations that changed since the last update; returns the new calls."""
        if self.episode_log is None or self.calls_log is None:
            return []
        if len(session.interactions) == self.seen and session.last_used == self.last_used:
            return []  # no request since: no call, no reward
        self.last_used = session.last_used
        new = list(itertools.islice(session.interactions.values(), self.seen, None))
        self.seen += len(new)
        for call in new:
            root = self.root.get(call.parent_id, call.id) if call.parent_id else call.id
            self.root[call.id] = root
            self.conversations.setdefault(root, []).append(call)
        for root, calls in self.conversations.items():
            state = (len(calls), tuple(c.reward for c in calls))
            if self.written.get(root) == state:
                continue
            self.written[root] = state
            self.calls_log.write(call_tree_line(root, calls, {}))
            self.episode_log.write(json_line(_episode(root, calls)))
        self.calls_log.flush()
        self.episode_log.flush()
        return new

    def close(self, session: Session | None) -> None:
        """The last update (every call answered is in), then the files closed."""
        if session is not None:
            self.update(session)
        for log in (self.calls_log, self.episode_log):
            if log is not None:
                log.close()
        self.calls_log = self.episode_log = None


def _episode(root: str, calls: list[Interaction]) -> dict[str, Any]:
    """A conversation's line of episodes.jsonl, as the viewer lists an episode."""
    versions = sorted({v for c in calls for v in (c.output_versions or [c.version])})
    return {
        "episode_id": root,
        "status": "ok",
        "reward": None,
        "versions": versions,
        "interactions": len(calls),
        "started": calls[0].created,
    }


def standalone_limits(gw: GatewayConfig) -> GatewayConfig:
    """``gw`` for one long-lived session: no budget of calls or sampled tokens, no idle expiry
    (they bound an episode); every per-request limit as configured."""
    return dataclasses.replace(gw, max_calls_per_session=0, max_sampled_tokens_per_session=0, session_idle_s=0)


async def serve(
    model_path: str, engine: EngineConfig, gateway: GatewayConfig, options: StandaloneConfig, write: Callable[[str], None] = print
) -> None:
    """Serve ``model_path`` on ``engine`` behind a gateway of ``gateway``'s settings until cancelled
    (SIGINT, SIGTERM: ``areal.aio.until_signalled``), recording every call; raises ``StartFailed``
    (bad input, before anything starts) or ``EngineDied``."""
    check_port(options.host, options.port)
    model_dir = model_dir_of(model_path)
    record = CallRecord(Path(options.record))
    from transformers import AutoTokenizer  # deferred: the checks above answer without it

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    session: Session | None = None
    created = not record.directory.exists()
    try:
        async with contextlib.AsyncExitStack() as stack:
            record.directory.mkdir(parents=True, exist_ok=True)  # the engine's log goes there
            try:
                engines = await start_engines(engine, model_dir, record.directory, stack, write)
            except ValueError as e:  # a setting start_engines refuses (vLLM at engine.urls with a tied model), named there
                raise StartFailed(str(e)) from None
            if engines.fleet is None and not await engines.client.health():
                raise StartFailed(f"engine.urls {engines.urls}: no server answers /health there; start it first, or correct the URL")
            core = Gateway(engines.client, tokenizer, standalone_limits(gateway_config(gateway, model_dir, write)))
            session = core.sessions[core.open_session("areal.gateway", key=options.api_key or None)]
            settings = {
                "experiment_name": "areal.gateway",
                "model": {"path": model_path, "dir": str(model_dir)},
                "engine": {**dataclasses.asdict(engine), "served_at": engines.urls},
                "gateway": dataclasses.asdict(core.config),
            }
            record.open(settings, tokenizer)
            stack.callback(record.close, session)  # after the door has closed: every answered call is in
            runner, url = await serve_http(core, options.host, options.port)
            stack.push_async_callback(runner.cleanup)
            write(_ready(model_path, engine.kind, engines.urls, url, session.key, record.directory))
            await _watch(record, session, engines.fleet, write)
    finally:
        if session is None and created and record.directory.is_dir() and not any(record.directory.iterdir()):
            record.directory.rmdir()  # it never started: no empty record left behind
        if session is not None:
            n = sum(len(calls) for calls in record.conversations.values())
            write(
                f"[gateway] stopped; calls recorded: {n}, in conversations: {len(record.conversations)}, in {record.directory} "
                f"(python -m areal.view {record.directory})"
            )


async def _watch(record: CallRecord, session: Session, fleet: Any, write: Callable[[str], None]) -> None:
    """Every ``FLUSH_S``: the new calls to the record and the console; the engine's death (of an
    engine this gateway launched) ends the gateway with its story."""
    numbers: dict[str, int] = {}  # conversation -> its number, in order of first call
    while True:
        await asyncio.sleep(FLUSH_S)
        for call in record.update(session):
            root = record.root[call.id]
            number = numbers.setdefault(root, len(numbers) + 1)
            turn = record.conversations[root].index(call) + 1
            write(
                f"[call] {call.id}: {len(call.prompt_ids)} prompt + {len(call.output_ids)} sampled tokens ({call.finish_reason}); "
                f"conversation {number}, call {turn}"
            )
        death = fleet.death() if fleet is not None else None
        if death is not None:
            raise EngineDied(death)


def _ready(model_path: str, kind: str, engine_urls: list[str], url: str, key: str, record: Path) -> str:
    """What the user pastes: a base URL and the key for each API, and where the calls go."""
    return "\n".join(
        [
            f"[gateway] serving model.path={model_path} on the {kind} engine at {', '.join(engine_urls)}",
            f"[gateway] every call is recorded in {record}: python -m areal.view {record}",
            "",
            "OpenAI Chat Completions and Responses:",
            f"export OPENAI_BASE_URL={url}/v1 OPENAI_API_KEY={key}",
            "Anthropic Messages:",
            f"export ANTHROPIC_BASE_URL={url} ANTHROPIC_API_KEY={key}",
            "",
            "Ctrl-C stops the gateway and the engine it started.",
        ]
    )
