"""A verifiers environment as the agent (``rollout.agent=verifiers:TASKSET``), run unchanged in
verifiers' own private venv; both ends of that process boundary live here.

    rollout.agent=verifiers:reverse-text              a taskset, played by verifiers' SingleAgentEnv
    rollout.agent=verifiers:best-of-n+reverse-text    an env paired with a taskset (verifiers' env_id)
    '+rollout.agent_kwargs={agent: {harness: {id: "null"}}}'   the env's config (verifiers' [env] block)

    episode process (sandbox or inline)         private venv's interpreter (python -P this file --inside episode)
    ───────────────────────────────────         ──────────────────────────────────────────────────────────
    verifiers_agent(spec).run(row) ── stdin: {config, row} ──► vf.load_environment(config); the row as a Task
                                                               env.run_episode(task, ctx): its harness, its
                                                                 interception server, its tools, its rubric
                                                                 ctx's client ──► call log (loopback relay) ──► gateway
    float, or {completion_id: reward} ◄── stdout: one JSON line {reward | rewards | error}

Why a second interpreter: verifiers 0.4.0 needs ``openai>=2.54`` and ``pydantic>=2.12.3``; this
project's agent SDKs pin ``openai==2.44.0`` and ``pydantic==2.12.0`` (openai-agents and camel-ai
cap them). So verifiers lives in its own venv (``make verifiers-venv``: ``verifiers_venv_dir()``),
and this file runs there too: its top level imports only the standard library, and the private
side imports verifiers (and aiohttp, one of its dependencies) inside its functions. The wire is
JSON, not msgspec: the private venv has no msgspec, and the exchange is one request, one reply.

The row becomes a verifiers Task: ``row["verifiers_task"]`` is the taskset's TaskData as JSON (what
``python -m areal.agent.verifiers_env rows SPEC N`` writes from the taskset itself); without it, the
TaskData is built from the row's fields that the taskset's TaskData declares (``answer``, ...),
the prompt from ``prompt``, else the row's conversation, else ``question``.

Rewards: verifiers scores each agent run (a trace) with the task's ``@vf.reward`` functions, the
config's plugged rewards and what the env records. One trace: its reward is the episode's float.
Several (multi-agent envs, best-of-n): each trace's reward goes to the calls that trace made, a
``{completion_id: reward}`` dict. The calls are told apart by the call log, a loopback relay
between verifiers' client and the gateway that reads verifiers' own per-trace ``X-Session-ID``
header and each reply's id. An env that fails to import, an episode verifiers reports failed, a
taskset that scores nothing and a reward that is missing or not finite are errors naming the env.

What is covered: tasksets and envs importable in the private venv (installed there, or on this
process's code paths: they are handed over on PYTHONPATH), verifiers' ``null`` and ``bash``
harnesses (one chat loop, with MCP tools), the ``subprocess`` runtime (forced for every role: the
episode's sandbox is the isolation), Chat Completions, Responses and Messages dialects.
What is not: harnesses that install a third-party program (codex, claude_code, mini_swe_agent, ...:
they download it), container and Prime runtimes, tasksets whose ``load()`` or tools need the
network (no episode has any), verifiers' train client (the gateway records tokens itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

PREFIX = "verifiers:"
VERIFIERS_PIN = "verifiers==0.4.0"
OPENAI_PIN = "openai==2.54.0"  # the newest openai verifiers 0.4.0 resolved to when it was tested
SESSION_HEADER = "X-Session-ID"  # verifiers' per-trace routing header (verifiers.v1.clients.client)
MODEL = "policy"  # the name verifiers' client asks for; the gateway serves its one policy whatever the name


class VerifiersError(RuntimeError):
    """A verifiers environment failed: it did not load, its episode failed, or its rewards are unusable."""


def is_taskset_spec(path: str) -> bool:
    """Whether a data path (data.train, data.eval) names a verifiers taskset, whose tasks are the rows."""
    return path.startswith(PREFIX)


def verifiers_venv_dir() -> Path:
    """The private venv (``make verifiers-venv``): ``$AREAL_VERIFIERS_VENV``, else
    ``$AREAL_CACHE/verifiers-venv`` (``~/.cache/areal/verifiers-venv``)."""
    from areal.agent import private_venv

    return private_venv.venv_dir("AREAL_VERIFIERS_VENV", "verifiers-venv")


def verifiers_python(spec: str = "") -> Path:
    """The private venv's interpreter; a ``VerifiersError`` saying how to build it when absent."""
    from areal.agent import private_venv

    what = f"{spec or 'a verifiers agent'}: verifiers"
    return private_venv.interpreter(verifiers_venv_dir(), what, "verifiers-venv", "AREAL_VERIFIERS_VENV", VERIFIERS_PIN, VerifiersError)


def parse_spec(spec: str) -> tuple[str, str]:
    """(env id, taskset id) of ``verifiers:[ENV+]TASKSET`` (verifiers' own ``env_id`` form)."""
    body = spec[len(PREFIX) :] if spec.startswith(PREFIX) else spec
    env_id, plus, taskset_id = body.rpartition("+")
    if not taskset_id or (plus and not env_id):
        raise ValueError(f"rollout.agent={spec!r}: write verifiers:TASKSET or verifiers:ENV+TASKSET (e.g. verifiers:reverse-text)")
    return env_id, taskset_id


def read_paths(spec: str) -> list[str]:
    """What a sandboxed episode of ``spec`` must read besides Python's own paths: the private venv."""
    root = verifiers_venv_dir()
    return [str(root)] if spec.startswith(PREFIX) and root.is_dir() else []


def verifiers_agent(spec: str, kwargs: dict[str, Any] | None = None) -> Callable[..., Awaitable[Any]]:
    """The agent run of ``spec`` (module docstring); ``kwargs`` (``rollout.agent_kwargs``) is
    merged over the env config. Checks now, where the host is visible (the zygote, before any
    fork), that the venv exists and verifiers loads the env: a ``VerifiersError`` naming it."""
    from areal.agent import private_venv

    config = _config(spec, kwargs)
    python = str(verifiers_python(spec))  # resolved here: a sandboxed episode has another HOME
    environment = {"PYTHONPATH": os.pathsep.join(_code_paths())}
    what = f"verifiers environment {spec!r}"
    reply = private_venv.call(python, __file__, "check", _request(spec, config), what, env={**os.environ, **environment})
    if "error" in reply:
        raise VerifiersError(reply["error"])

    async def run(data: dict, **_: Any) -> float | dict[str, float]:
        # cancelled (the episode's deadline, inline): the private side stops verifiers' own processes first
        request = _request(spec, config, row=data)
        reply = await private_venv.call_async(python, __file__, "episode", request, what, env={**os.environ, **environment})
        if "error" in reply:
            raise VerifiersError(reply["error"])
        return reply["rewards"] if "rewards" in reply else reply["reward"]

    return run


def taskset_rows(spec: str, n: int, offset: int = 0, kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """``n`` dataset rows from the taskset's own ``load()`` (from task ``offset`` on): ``question``
    (its prompt's text), ``answer`` (its ``answer`` field, else ""), ``verifiers_task`` (its TaskData)."""
    request = _request(spec, _config(spec, kwargs), n=n, offset=offset)
    from areal.agent import private_venv

    python = str(verifiers_python(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(_code_paths())}
    reply = private_venv.call(python, __file__, "rows", request, f"verifiers environment {spec!r}", env=env)
    if "error" in reply:
        raise VerifiersError(reply["error"])
    return reply["rows"]


def _config(spec: str, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    env_id, taskset_id = parse_spec(spec)
    config = {"id": env_id, "taskset": {"id": taskset_id}, **(kwargs or {})}
    taskset = config["taskset"]
    if not isinstance(taskset, dict) or taskset.setdefault("id", taskset_id) != taskset_id:
        raise ValueError(f"rollout.agent={spec!r}: agent_kwargs.taskset names another taskset ({taskset!r})")
    return config


def _request(spec: str, config: dict[str, Any], **fields: Any) -> bytes:
    return json.dumps({"spec": spec, "config": config, **fields}).encode()


def _code_paths() -> list[str]:
    """This process's import paths outside its interpreter's prefixes (the project, PYTHONPATH):
    where the user's tasksets live. The project venv's site-packages stays out: its openai and
    pydantic are what verifiers cannot use."""
    prefixes = [os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}]
    out = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if os.path.isdir(path) and not any(path == p or path.startswith(p + os.sep) for p in prefixes) and path not in out:
            out.append(path)
    return out


# ---- the private side: runs in the verifiers venv, imports verifiers ---------------------------


def _inside(command: str) -> int:
    request = json.loads(sys.stdin.read())
    reply_fd = os.dup(1)  # the reply channel; fd 1 becomes stderr, for verifiers and its processes
    os.dup2(2, 1)
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s verifiers %(levelname)s %(message)s")
    # Its warning that a code-running harness on the subprocess runtime is not isolated: the episode's sandbox is.
    logging.getLogger("verifiers.v1.env").setLevel(logging.ERROR)
    try:
        if command == "check":
            _load_env(request)
            reply: dict[str, Any] = {"ok": True}
        elif command == "rows":
            reply = {"rows": _rows(_load_env(request), request["n"], request["offset"])}
        else:
            reply = _run_episode(request)
    except _Refused as e:
        reply = {"error": str(e)}
    with os.fdopen(reply_fd, "w") as out:
        out.write(json.dumps(reply) + "\n")
    return 0


class _Refused(Exception):
    """What the reply reports: the env does not load, the episode failed, its rewards are unusable."""


def _load_env(request: dict[str, Any]) -> Any:
    """verifiers' own Env for the request's config, every role on the subprocess runtime."""
    spec, config = request["spec"], request["config"]
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise _Refused(f"{spec!r}: verifiers does not import in {sys.executable} ({e}): rebuild it with `make verifiers-venv`") from None
    try:
        config_cls = vf.env_config_type(config["taskset"]["id"], config.get("id", ""))
        roles = [name for name, field in config_cls.model_fields.items() if isinstance(field.default, vf.AgentConfig)]
        merged = {**config, **{r: _merged({"runtime": {"type": "subprocess"}}, config.get(r) or {}) for r in roles}}
        return vf.load_environment(vf.resolve_env_config(merged))
    except Exception as e:  # the env's own import or config failing: the reply names it
        raise _Refused(f"verifiers environment {spec!r} failed to load: {type(e).__name__}: {e}") from None


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _task_of(env: Any, row: dict[str, Any]) -> Any:
    task_cls = type(env.taskset).task_type()
    data_cls = task_cls.data_type()
    if "verifiers_task" in row:
        return task_cls(data_cls.model_validate(row["verifiers_task"]), env.taskset.config.task)
    fields = {k: v for k, v in row.items() if k in data_cls.model_fields}
    if "prompt" not in fields:
        messages = row.get("messages") or []
        plain = len(messages) == 1 and messages[0].get("role") == "user"
        fields["prompt"] = row.get("question") if plain or not messages else messages
    return task_cls(data_cls.model_validate(fields), env.taskset.config.task)


def _rows(env: Any, n: int, offset: int) -> list[dict[str, Any]]:
    import itertools

    rows = []
    for task in itertools.islice(env.taskset, offset, offset + n):  # its own read path: idx and system prompt set
        data = task.data
        answer = str(getattr(data, "answer", ""))
        rows.append({"question": data.prompt_text, "answer": answer, "verifiers_task": data.model_dump(mode="json", exclude_none=True)})
    return rows


def _offline_chat_program() -> None:
    """verifiers' ``null`` and ``bash`` harnesses run one chat program, a PEP 723 script that
    verifiers prepares with uv (downloading its dependencies into a venv of its own). An episode
    has no network, and this venv already holds every package the script declares (openai, mcp,
    httpx, httpx2, tenacity, certifi: verifiers' own dependencies), so the script is put where
    verifiers looks for it and noted as prepared, with this interpreter. Pinned to
    ``VERIFIERS_PIN``: a verifiers that moved these names fails here, by name."""
    import hashlib

    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    prepared = getattr(SubprocessRuntime, "_interpreters", None)
    if not isinstance(prepared, dict):
        raise _Refused(f"verifiers' SubprocessRuntime has no prepared-script table: this adapter needs {VERIFIERS_PIN}")
    data = CHAT_PROGRAM_SOURCE.encode()
    path = Path(SubprocessRuntime.scripts_dir) / f"{hashlib.sha256(data).hexdigest()}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    prepared[str(path)] = sys.executable


class _CallLog:
    """A loopback relay between verifiers' client and the gateway: forwards every request as it
    came, and notes each answered call's completion id under the trace that made it (verifiers'
    ``X-Session-ID``). Replies are read whole before they are passed on; verifiers reads a
    streamed reply whole too before its interception server answers the harness."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.ids: dict[str, list[str]] = {}
        self.url = ""

    async def __aenter__(self) -> _CallLog:
        import aiohttp
        from aiohttp import web

        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()
        await self.http.close()

    async def forward(self, request: Any) -> Any:
        from aiohttp import web

        hop = {"host", "content-length", "transfer-encoding", "connection"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        body = await request.read()
        url = f"{self.upstream}/{request.match_info['tail']}"
        async with self.http.request(request.method, url, params=request.query, data=body, headers=headers) as reply:
            payload = await reply.read()
            content_type = reply.headers.get("Content-Type", "application/json")
            status = reply.status
        trace = request.headers.get(SESSION_HEADER)
        if status == 200 and trace and (cid := _completion_id(payload)):
            self.ids.setdefault(trace, []).append(cid)
        return web.Response(body=payload, status=status, headers={"Content-Type": content_type})


def _completion_id(payload: bytes) -> str | None:
    """The id of a reply: a JSON body's (Chat Completions, Responses, Messages), or a stream's
    first event's (its ``id``, or its ``message``/``response`` object's)."""
    text = payload.decode(errors="replace").lstrip()
    if text.startswith("{"):
        return json.loads(text).get("id")
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            event = json.loads(line[5:])
            inner = event.get("message") or event.get("response") or {}
            found = event.get("id") or (inner.get("id") if isinstance(inner, dict) else None)
            if found:
                return found
    return None


def _run_episode(request: dict[str, Any]) -> dict[str, Any]:
    env = _load_env(request)
    try:
        task = _task_of(env, request["row"])
    except Exception as e:  # pydantic's validation of the row: the reply names the fields
        raise _Refused(f"verifiers environment {request['spec']!r}: the dataset row is not one of its tasks: {e}") from None
    _offline_chat_program()

    async def episode() -> tuple[Any, dict[str, list[str]]]:
        import verifiers.v1 as vf
        from verifiers.v1.clients import EvalClientConfig

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)  # type: ignore[union-attr]
        async with _CallLog(os.environ["OPENAI_BASE_URL"]) as log:
            client = EvalClientConfig(base_url=log.url, api_key_var="OPENAI_API_KEY")
            async with env.serving():
                result = await env.run_episode(task, vf.ModelContext(model=MODEL, client=client))
            return result, log.ids

    result, ids = asyncio.run(episode())
    return _reply(request["spec"], result, ids)


def _reply(spec: str, episode: Any, ids: dict[str, list[str]]) -> dict[str, Any]:
    """The episode's rewards as the agent's result, or the error naming what is wrong."""
    errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
    if errors:
        said = "; ".join(f"{e.type}: {e.message}" for e in errors)
        raise _Refused(f"verifiers environment {spec!r}: its episode failed: {said[:4000]}")
    scored = [t for t in episode.traces if t.rewards]
    if not scored:
        raise _Refused(
            f"verifiers environment {spec!r} gave no reward: its taskset has no scorer (a @vf.reward method on its Task, "
            "an env.taskset.task.rewards entry in its config, or a reward its env records)"
        )
    for trace in scored:
        for name, reward in trace.rewards.items():
            value = None if reward is None else reward.value
            if value is None or not math.isfinite(value):
                what = "did not run" if value is None else f"is {value!r}, not a finite number"
                raise _Refused(f"verifiers environment {spec!r}: its reward {name!r} {what}")
    if len(episode.traces) == 1:
        return {"reward": float(scored[0].reward)}
    return {"rewards": {cid: float(t.reward) for t in scored for cid in ids.get(t.id, [])}}


def _main(argv: list[str]) -> int:
    """``rows SPEC N [OFFSET]``: the taskset's first tasks as JSONL dataset rows on stdout."""
    if len(argv) not in (3, 4) or argv[0] != "rows":
        print("usage: python -m areal.agent.verifiers_env rows verifiers:TASKSET N [OFFSET] > rows.jsonl", file=sys.stderr)
        return 2
    for row in taskset_rows(argv[1], int(argv[2]), int(argv[3]) if len(argv) == 4 else 0):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(_inside(sys.argv[2]) if sys.argv[1:2] == ["--inside"] else _main(sys.argv[1:]))
