"""Replay recorded episodes: the run's agent against its recorded completions, with no engine.

    python -m areal.replay RUN_DIR EPISODE [--reward MODULE:ATTR]
    python -m areal.replay RUN_DIR --all [--reward MODULE:ATTR]

    RUN_DIR/calls.jsonl ─► RecordedEngine ─► Gateway (the run's settings) ─► the run's agent
    RUN_DIR/episodes.jsonl ("data": the row) ───────────────────────────────► (sandboxed, or inline)
    RUN_DIR/config.json: agent, agent_kwargs, gateway, sandbox, temperature, model (its tokenizer)

The agent runs as it ran in the run (the sandbox zygote for ``rollout.openai.mode=subproc``, the
inline runner for ``inline``), posed the episode's recorded dataset row, in a gateway session at
``rollout.temperature``. ``RecordedEngine`` stands in for the engine behind the gateway: it
answers a request whose prompt ids equal a recorded call's whole prompt (its parent chain's
prompt + output, then the tokens it adds) with that call's recorded output ids and logprobs, each
recorded call once, in any order. A request that equals none is the divergence: it is refused
(the agent gets the gateway's error) and named against the next unused recorded call: its index
in calls.jsonl and the first prompt token position that differs, both tokens decoded. A replay
that ends with recorded calls unused diverged too (the agent made fewer calls).

The replay is settled as the run settles an episode (``Episodes.settle``: the agent's reward, else
the run's reward function); ``--reward`` scores every replayed episode's last reply with another
function of the run's ``reward=`` signature (``Episodes.score``), in place of either. The rows go
to RUN_DIR/replay.jsonl: episode, calls recorded and matched, the old (recorded) and new reward.

What is covered: any agent the run named by ``rollout.agent``, single- or multi-turn, streamed or
not, with several calls in flight at once. What is not: an agent that draws random numbers
(Python's ``random`` is reseeded in every forked episode), reads the clock or the network, or
whose tool results change between runs, makes other calls and diverges; an agent object handed
to ``Controller`` in Python (config.json names only ``rollout.agent``); online runs (their agents
ran outside the run); episodes whose row (``"data_recorded": false``, over 64 KiB of JSON, or a
run recorded before rows were) or whose calls (``"calls_recorded": false``, ``view_record_mb``)
were not recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec

from areal.agent.spec import EpisodeRunner, InlineRunner, load_reward_fn
from areal.config import TrainConfig
from areal.controller.episodes import DATA_RECORD_BYTES, Episodes
from areal.controller.problems import run_reward
from areal.controller.run_setup import gateway_config, hf_model_dir, sandbox_config
from areal.dataclass_config import build_dataclass
from areal.engine.client import EngineError, GenerateResult
from areal.gateway import Gateway, serve_http, serve_zmq
from areal.gateway.tree import first_difference
from areal.jsonl import json_line
from areal.process import owned_temp_dir
from areal.protocol import EpisodeOutcome
from sandbox.zygote_client import Zygote

NONDETERMINISM = (
    "an agent that draws random numbers (Python's random is reseeded in every forked episode), "
    "reads the clock, or gets different tool results replays other calls"
)


@dataclasses.dataclass
class RecordedCall:
    """One recorded engine call of an episode, its prompt whole."""

    index: int  # its position in the episode's line of calls.jsonl
    id: str
    prompt_ids: list[int]  # the whole prompt: the parent chain's prompt + output, then its own tokens
    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str


def recorded_calls(tree: list[dict[str, Any]]) -> list[RecordedCall]:
    """An episode's calls from its calls.jsonl line, each prompt rebuilt along its parent chain
    (a parent is recorded before its children)."""
    by_id: dict[str, RecordedCall] = {}
    out = []
    for i, c in enumerate(tree):
        parent = by_id[c["parent"]] if c["parent"] is not None else None
        shared = parent.prompt_ids + parent.output_ids if parent is not None else []
        call = RecordedCall(i, c["id"], shared + c["prompt_ids"], c["output_ids"], c["logprobs"], c["versions"], c["finish_reason"])
        by_id[call.id] = call
        out.append(call)
    return out


class RecordedEngine:
    """The engine's ``generate`` / ``generate_stream`` (``areal.engine.interface``) answered from
    recorded calls, per episode: a request's ``session_key`` (the gateway's episode id) picks the
    episode's calls. ``divergence[episode]``: the first request that matched no unused call."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.calls: dict[str, list[RecordedCall]] = {}
        self.used: dict[str, list[bool]] = {}
        self.divergence: dict[str, str] = {}

    def expect(self, episode_id: str, calls: list[RecordedCall]) -> None:
        self.calls[episode_id], self.used[episode_id] = calls, [False] * len(calls)

    def matched(self, episode_id: str) -> int:
        return sum(self.used[episode_id])

    def missing(self, episode_id: str) -> str | None:
        """The first recorded call the replay never made, named; None when it made them all."""
        unused = [c for c, u in zip(self.calls[episode_id], self.used[episode_id]) if not u]
        if not unused:
            return None
        c = unused[0]
        return f"recorded call {c.index} ({c.id}) was never made: the replay made fewer calls ({len(unused)} unused); {NONDETERMINISM}"

    def _answer(self, episode_id: str | None, input_ids: list[int]) -> RecordedCall:
        if episode_id not in self.calls:
            raise EngineError(400, f"replay: no recorded calls for episode {episode_id!r}")
        calls, used = self.calls[episode_id], self.used[episode_id]
        for c in calls:
            if not used[c.index] and c.prompt_ids == input_ids:
                used[c.index] = True
                return c
        message = self._diverged(calls, used, input_ids)
        self.divergence.setdefault(episode_id, message)
        raise EngineError(400, f"replay diverged: {message}")

    def _diverged(self, calls: list[RecordedCall], used: list[bool], input_ids: list[int]) -> str:
        """The request named against the next unused recorded call in order."""
        nxt = next((c for c in calls if not used[c.index]), None)
        if nxt is None:
            return f"the replay made a call beyond the {len(calls)} recorded ({len(input_ids)} prompt tokens); {NONDETERMINISM}"

        def token(ids: list[int], i: int) -> str:
            return f"{ids[i]} {self.decode([ids[i]])!r}" if i < len(ids) else "(end of prompt)"

        pos = first_difference(nxt.prompt_ids, input_ids)
        return (
            f"call {nxt.index} ({nxt.id}) differs at prompt token {pos}: recorded {token(nxt.prompt_ids, pos)}, "
            f"replayed {token(input_ids, pos)} (prompts of {len(nxt.prompt_ids)} and {len(input_ids)} tokens); {NONDETERMINISM}"
        )

    @staticmethod
    def _result(c: RecordedCall, n: int, prompt_tokens: int) -> GenerateResult:
        versions = [str(v) for v in c.versions[:n]]
        return GenerateResult(
            output_ids=c.output_ids[:n],
            output_logprobs=c.logprobs[:n],
            finish_reason=c.finish_reason if n == len(c.output_ids) else "",
            weight_version=versions[-1] if versions else "0",
            prompt_tokens=prompt_tokens,
            completion_tokens=n,
            output_versions=versions,
        )

    async def generate(
        self, input_ids: list[int], sampling_params: dict, return_logprob: bool = True, rid: str | None = None, **kw: Any
    ) -> GenerateResult:
        c = self._answer(kw.get("session_key"), list(input_ids))
        return self._result(c, len(c.output_ids), len(input_ids))

    async def generate_stream(
        self, input_ids: list[int], sampling_params: dict, return_logprob: bool = True, rid: str | None = None, **kw: Any
    ) -> AsyncIterator[GenerateResult]:
        c = self._answer(kw.get("session_key"), list(input_ids))
        for n in range(1, len(c.output_ids) + 1):  # cumulative, one token per update, as the engine streams
            yield self._result(c, n, len(input_ids))

    async def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None:
        return None

    async def health(self) -> bool:
        return True

    async def model_info(self) -> dict:
        return {"model_path": "replay", "weight_version": "0", "is_generation": True}

    async def close(self) -> None:
        return None


@dataclasses.dataclass
class ReplayRow:
    """One episode's replay: its line of replay.jsonl."""

    episode_id: str
    calls_recorded: int
    calls_matched: int
    old_reward: float | None
    new_reward: float | None
    status: str  # the replayed episode's status; "skipped" when it could not be replayed
    divergence: str  # "" when it made the recorded calls, and only those

    @property
    def ok(self) -> bool:
        return self.status != "skipped" and not self.divergence and self.calls_matched == self.calls_recorded


class RunFiles:
    """A run directory's records as replay reads them: config, episodes, calls."""

    def __init__(self, run_dir: Path) -> None:
        for name in ("config.json", "episodes.jsonl", "calls.jsonl"):
            if not (run_dir / name).is_file():
                raise FileNotFoundError(f"{run_dir} holds no {name}: not the directory of a run of areal.train with view_record_mb > 0")
        self.run_dir = run_dir
        self.config = build_dataclass(TrainConfig, json.loads((run_dir / "config.json").read_text()))
        self.records = {e["episode_id"]: e for e in _jsonl(run_dir / "episodes.jsonl")}
        self.trees = {t["episode_id"]: t["calls"] for t in _jsonl(run_dir / "calls.jsonl")}

    def unreplayable(self, episode_id: str) -> str:
        """Why the episode cannot be replayed; "" when it can."""
        record = self.records.get(episode_id)
        if record is None:
            return f"no episode {episode_id!r} in episodes.jsonl"
        if record.get("data_recorded") is False:
            return f"its dataset row was not recorded (over {DATA_RECORD_BYTES >> 10} KiB of JSON, or not JSON): data_recorded is false"
        if "data" not in record:
            return "episodes.jsonl holds no dataset row for it (the run was recorded before rows were)"
        if episode_id not in self.trees:
            return "calls.jsonl holds none of its calls (it made none, or they were over view_record_mb: calls_recorded is false)"
        return ""


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The lines of a .jsonl file that parse (a last line cut by a killed run is left out)."""
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def total_reward(outcome: EpisodeOutcome) -> float | None:
    """An outcome's reward as episodes.jsonl records it (a dict of rewards: their sum); None when failed."""
    if outcome.status != "ok":
        return None
    return outcome.reward if outcome.reward is not None else sum(outcome.rewards_by_id.values())


async def replay(run: RunFiles, episode_ids: list[str], reward: str = "", write: Callable[[str], None] = print) -> list[ReplayRow]:
    """Replay ``episode_ids`` of ``run`` (at most rollout.max_concurrent_episodes at once, up to 16);
    ``reward``: MODULE:ATTR re-scoring each, else the run's own scoring. One row per episode, in order."""
    from transformers import AutoTokenizer

    cfg = run.config
    if cfg.rollout.openai.mode == "online":
        raise ValueError("an online run's agents ran outside the run (rollout.openai.mode=online): there is no agent to replay")
    model_dir = hf_model_dir(cfg.model.path)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = RecordedEngine(tokenizer.decode)
    gateway = Gateway(engine, tokenizer, gateway_config(cfg.gateway, model_dir, write))
    rows_data = [run.records[e]["data"] for e in episode_ids if not run.unreplayable(e)]
    run_reward_name = run_reward(cfg.reward, rows_data or None, cfg.rollout.agent)
    new_fn = load_reward_fn(reward) if reward else None
    sock_dir = Path(owned_temp_dir("replay"))  # ipc paths must stay short
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, sock_dir, True)
        runner, zygote = await _start_agent(cfg, run.run_dir, gateway, sock_dir, stack)

        def fail(why: str) -> None:  # a zygote dead past its restarts: said; its episodes end crashed
            write(f"[replay] {why}")

        run_fn = load_reward_fn(run_reward_name) if run_reward_name else None
        episodes = Episodes(runner, gateway, cfg.rollout, run_fn, run_reward_name, tokenizer, write, fail, zygote=zygote)
        stack.push_async_callback(episodes.close)
        # --reward: only its ``score`` is used (the runner is the one above, closed with it)
        rescore = Episodes(runner, gateway, cfg.rollout, new_fn, reward, tokenizer, write, fail) if new_fn is not None else None
        limit = asyncio.Semaphore(min(16, cfg.rollout.max_concurrent_episodes))

        async def one(episode_id: str) -> ReplayRow:
            async with limit:
                return await _replay_one(run, episode_id, episodes, engine, rescore)

        return list(await asyncio.gather(*(one(e) for e in episode_ids)))


async def _start_agent(
    cfg: TrainConfig, run_dir: Path, gateway: Gateway, sock_dir: Path, stack: contextlib.AsyncExitStack
) -> tuple[EpisodeRunner, Zygote | None]:
    """The run's agent behind ``gateway``, as the run ran it: the sandbox zygote, or inline."""
    if cfg.rollout.openai.mode == "subproc":
        address = f"ipc://{sock_dir}/gateway.sock"
        serving = asyncio.create_task(serve_zmq(gateway, address))
        stack.callback(serving.cancel)
        sandbox = sandbox_config(cfg.sandbox, run_dir)
        zygote = await Zygote.start(cfg.rollout.agent, address, sandbox, str(sock_dir / "sandbox"), cfg.rollout.agent_kwargs)
        return zygote, zygote
    http_runner, url = await serve_http(gateway, "127.0.0.1", 0)
    stack.push_async_callback(http_runner.cleanup)
    return InlineRunner(cfg.rollout.agent, url, cfg.rollout.agent_kwargs), None


async def _replay_one(run: RunFiles, episode_id: str, episodes: Episodes, engine: RecordedEngine, rescore: Episodes | None) -> ReplayRow:
    """One episode replayed and settled: by the run's scoring, or ``rescore``'s function on its last reply."""
    record = run.records.get(episode_id, {})
    old = record.get("reward") if record.get("status") == "ok" else None
    why = run.unreplayable(episode_id)
    if why:
        n = len(run.trees.get(episode_id, []))
        return ReplayRow(episode_id, n, 0, old, None, "skipped", f"not replayed: {why}")
    calls, row = recorded_calls(run.trees[episode_id]), record["data"]
    engine.expect(episode_id, calls)
    outcome, session = await episodes.run(episode_id, row, run.config.rollout.temperature)
    divergence = engine.divergence.get(episode_id) or engine.missing(episode_id) or ""
    if rescore is not None and outcome.status == "ok":  # whatever the agent returned, as the run's function would
        outcome = await rescore.score(msgspec.structs.replace(outcome, reward=None, rewards_by_id={}), session, row)
    else:
        outcome = await episodes.settle(outcome, session, row)
    return ReplayRow(episode_id, len(calls), engine.matched(episode_id), old, total_reward(outcome), outcome.status, divergence)


def table(rows: list[ReplayRow]) -> str:
    """The rows as a plain-text table: episode, calls matched, old reward, new reward."""

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.4g}"

    lines = [("episode", "calls matched", "old reward", "new reward")]
    lines += [(r.episode_id, f"{r.calls_matched}/{r.calls_recorded}", num(r.old_reward), num(r.new_reward)) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def write_rows(run_dir: Path, rows: list[ReplayRow]) -> Path:
    """RUN_DIR/replay.jsonl, written whole (a temp name, renamed)."""
    path = run_dir / "replay.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json_line(dataclasses.asdict(r)) for r in rows))
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 when every episode replayed made its recorded calls, 1 when one diverged, 2
    when none could be replayed."""
    parser = argparse.ArgumentParser(prog="python -m areal.replay", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory of python -m areal.train")
    parser.add_argument("episode", nargs="?", help="the episode id to replay (episodes.jsonl's episode_id)")
    parser.add_argument("--all", action="store_true", help="replay every recorded episode of the run")
    parser.add_argument("--reward", default="", help="MODULE:ATTR or file.py:name: re-score with this reward function")
    args = parser.parse_args(argv)
    if bool(args.episode) == args.all:
        parser.error("name one EPISODE, or --all")
    run = RunFiles(args.run_dir)
    ids = list(run.records) if args.all else [args.episode]
    if not args.all and (why := run.unreplayable(args.episode)):
        print(f"episode {args.episode} cannot be replayed: {why}", file=sys.stderr)
        return 2
    rows = asyncio.run(replay(run, ids, args.reward))
    for r in rows:
        if r.divergence:
            print(f"episode {r.episode_id}: {r.divergence}")
    print(table(rows))
    replayed = [r for r in rows if r.status != "skipped"]
    matched = sum(r.ok for r in replayed)
    print(f"{matched}/{len(replayed)} replayed episodes made their recorded calls ({len(rows) - len(replayed)} skipped)")
    print(f"rows written to {write_rows(run.run_dir, rows)}")
    if not replayed:
        return 2
    return 0 if matched == len(replayed) else 1


if __name__ == "__main__":
    sys.exit(main())
