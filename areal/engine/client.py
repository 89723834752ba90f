"""Client for SGLang's native HTTP API, and the launcher of the embedded CPU engine.

One client serves both back ends: a real SGLang server on GPUs and ``areal.engine.server`` on
CPU speak the same protocol (tests/test_sglang_protocol.py pins its shapes, and runs against a
real server when ``AREAL_SGLANG_URL`` is set). This module imports no torch,
so the gateway and controller stay light.

Invariants:
- ``EngineClient`` creates its connections lazily inside the running loop, and new ones if it is
  later awaited from a different loop (a connection is bound to its loop).
- Non-streamed requests (``/generate`` and the control routes) go over ``http1.Pool``:
  persistent HTTP/1.1 keep-alive connections on raw asyncio protocols, bodies encoded with
  msgspec; streams (SSE, chunked) stay on aiohttp.
- ``generate`` is one plain coroutine per call (no async generators), with one watchdog timer per
  pool instead of a timer per request, and rids from a per-client random prefix + counter (no
  system call): each removes work done once per call.
- Errors are typed: an HTTP error answer raises ``EngineError(status, message)`` with the
  server's own message; no answer at all (refused, reset, timed out) raises ``EngineUnavailable``.
- Cancelling a ``generate`` (or closing a ``generate_stream`` before its end) aborts it at the
  engine: a request still waiting for a pool connection is never sent, and one that was sent is
  aborted with ``/abort_request`` by its rid (SGLang matches a known rid exactly), from a task
  of its own. Dropping the connection alone is not enough: the embedded engine finished a
  non-streamed request for nobody, and SGLang notices a gone client only at its next check.
- ``launch_embedded_engine`` runs the server as a real subprocess in its own session (process
  group); ``EngineProcess.stop`` signals that group only, never anything found by name.

The module is past 600 lines because the stream parser belongs to this one client and the
embedded engine's launcher shares its error types; the HTTP/1.1 pool is ``http1``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from areal.engine.http1 import Pool
from areal.process import die_with_parent, log_tail, owned_temp_dir, stop_group

log = logging.getLogger(__name__)


class EngineError(Exception):
    """The engine answered with an error (``status`` is the HTTP status, None if it never answered)."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(f"engine error {status}: {message}" if status is not None else message)
        self.status = status
        self.message = message


class EngineUnavailable(EngineError):
    """The engine could not be reached (connection refused or reset, or the request timed out)."""


class GenerateResult(msgspec.Struct):
    """One generation, parsed from SGLang's ``/generate`` answer (or a cumulative stream chunk).

    After an abort-and-resubmit the segments are stitched: ``output_ids`` and every per-token
    list cover the whole generation, ``output_versions[i]`` is the weight version that served
    token i, ``prompt_tokens`` is the caller's prompt length.
    """

    output_ids: list[int]
    output_logprobs: list[float]  # empty unless return_logprob; aligned with output_ids
    finish_reason: str  # "stop" | "length" | "abort"; "" on a stream chunk before the last
    weight_version: str
    prompt_tokens: int
    completion_tokens: int
    text: str = ""
    output_versions: list[str] = []  # aligned with output_ids
    # (logprob, token id) pairs per output position; empty unless top_logprobs_num was asked
    output_top_logprobs: list[list[tuple[float, int]]] = []
    resubmits: int = 0  # how many times an abort was recovered by resubmitting


class _MetaInfo(msgspec.Struct):
    finish_reason: dict[str, Any] | None
    completion_tokens: int
    prompt_tokens: int = 0  # absent on requests aborted in the waiting queue
    weight_version: str = "default"
    output_token_logprobs: list[tuple[float | None, int, str | None]] = []
    output_top_logprobs: list[list[tuple[float | None, int, str | None]] | None] = []


class _GenerateResponse(msgspec.Struct):
    output_ids: list[int]
    meta_info: _MetaInfo
    text: str = ""


_response_decoder = msgspec.json.Decoder(_GenerateResponse)
_json_encoder = msgspec.json.Encoder()


def _error_message(body: bytes) -> str:
    """SGLang has three error shapes: {"error": str}, {"error": {"message"}}, {"message"}."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    return str(data)


class EngineClient:
    """Async client for one engine URL."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600, max_connections: int = 256) -> None:
        self.base_url = base_url.rstrip("/")
        # non-streamed requests on the wire at once; more wait in this client (FIFO), unsent
        self.max_connections = max_connections
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None  # streams only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: Pool | None = None  # everything else, when the URL is plain http
        url = urllib.parse.urlsplit(self.base_url)
        self._plain = url.scheme == "http" and url.hostname is not None
        self._host, self._port, self._prefix = url.hostname or "", url.port or 80, url.path
        self._pool_headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_s = timeout_s
        self._aborted: set[str] = set()  # rid prefixes the caller aborted: not resubmitted
        self._abort_all_count = 0
        self._rid_prefix = os.urandom(8).hex()  # rids of this client: prefix + counter (``_new_rid``)
        self._rid_count = 0
        self._aborting: set[asyncio.Task] = set()  # aborts of cancelled generations, on their way

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
            self._loop = loop
        return self._session

    def _get_pool(self) -> Pool:
        loop = asyncio.get_running_loop()
        if self._pool is None or self._pool.loop is not loop:
            self._pool = Pool(self._host, self._port, self._pool_headers, self._timeout_s, self.max_connections)
        return self._pool

    async def _request(self, method: str, path: str, body: Any = None, on_send: Callable[[], None] | None = None) -> bytes:
        """One non-streamed exchange; ``on_send`` as in ``Pool.request`` (over aiohttp it is
        called before the request: whether it left is not known there)."""
        if self._plain:
            try:
                status, data = await self._get_pool().request(
                    method, self._prefix + path, b"" if body is None else _json_encoder.encode(body), on_send
                )
            except (TimeoutError, OSError) as exc:  # refused, reset, unreachable, timed out
                raise EngineUnavailable(None, f"engine at {self.base_url} unavailable: {exc!r}") from exc
            if status >= 400:
                raise EngineError(status, _error_message(data))
            return data
        if on_send is not None:
            on_send()
        try:
            async with self._get_session().request(method, self.base_url + path, json=body) as resp:
                data = await resp.read()
                if resp.status >= 400:
                    raise EngineError(resp.status, _error_message(data))
                return data
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            raise EngineUnavailable(None, f"engine at {self.base_url} unavailable: {exc!r}") from exc

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: dict,
        return_logprob: bool = True,
        rid: str | None = None,
        *,
        top_logprobs_num: int = 0,
        resubmit_aborted: bool = True,
        session_key: str | None = None,  # one server: nothing to route (EngineRouter keeps a session on one)
    ) -> GenerateResult:
        """One generation. An abort the caller did not ask for (a pause around a weight update)
        is recovered by resubmitting prompt + tokens so far with ``max_new_tokens`` reduced.

        One plain coroutine per call (no async generators: each call would pay their hooks and
        frames); the resubmission rules are shared with ``generate_stream`` (``_segment``, ``_settle``).
        """
        rid = rid if rid is not None else self._new_rid()
        abort_all_seen = self._abort_all_count
        budget = sampling_params.get("max_new_tokens", 128)
        done: GenerateResult | None = None  # tokens of finished (aborted) segments
        sent = False

        def on_send() -> None:
            nonlocal sent
            sent = True

        try:
            while True:
                body = _segment(input_ids, done, sampling_params, budget, rid, return_logprob, top_logprobs_num, False)
                resp = _response_decoder.decode(await self._request("POST", "/generate", body, on_send))
                if resp.meta_info.finish_reason is None:
                    raise EngineError(200, "the engine ended the stream without a final chunk")
                final = _stitch(done, resp, len(input_ids))
                result = self._settle(final, rid, abort_all_seen, budget, resubmit_aborted)
                if result is not None:
                    return result
                done = msgspec.structs.replace(final, resubmits=final.resubmits + 1)
        except asyncio.CancelledError:
            if sent:
                self._abort_abandoned(rid)
            raise
        finally:
            self._aborted.discard(rid)

    async def generate_stream(
        self,
        input_ids: list[int],
        sampling_params: dict,
        return_logprob: bool = True,
        rid: str | None = None,
        *,
        top_logprobs_num: int = 0,
        resubmit_aborted: bool = True,
        session_key: str | None = None,  # one server: nothing to route (EngineRouter keeps a session on one)
    ) -> AsyncIterator[GenerateResult]:
        """Stream a generation: a cumulative ``GenerateResult`` per chunk, ``finish_reason`` ""
        until the last one. Aborts are recovered as in ``generate``, invisibly to the reader."""
        rid = rid if rid is not None else self._new_rid()
        abort_all_seen = self._abort_all_count
        budget = sampling_params.get("max_new_tokens", 128)
        done: GenerateResult | None = None
        try:
            while True:
                body = _segment(input_ids, done, sampling_params, budget, rid, return_logprob, top_logprobs_num, True)
                final = None
                async for resp in self._stream(body):
                    result = _stitch(done, resp, len(input_ids))
                    if resp.meta_info.finish_reason is None:
                        yield result
                    else:
                        final = result
                if final is None:
                    raise EngineError(200, "the engine ended the stream without a final chunk")
                settled = self._settle(final, rid, abort_all_seen, budget, resubmit_aborted)
                if settled is not None:
                    break
                done = msgspec.structs.replace(final, resubmits=final.resubmits + 1)
        except (asyncio.CancelledError, GeneratorExit):  # cancelled, or closed by its reader before the end
            self._abort_abandoned(rid)
            raise
        finally:
            self._aborted.discard(rid)
        yield settled  # the engine is done with it: a reader that stops here leaves nothing to abort

    def _abort_abandoned(self, rid: str) -> None:
        """Abort at the engine a generation its caller cancelled, so that it stops sampling for
        nobody. In a task of its own: the cancelled caller cannot wait for it."""
        task = asyncio.get_running_loop().create_task(self._abort_quietly(rid))
        self._aborting.add(task)
        task.add_done_callback(self._aborting.discard)

    async def _abort_quietly(self, rid: str) -> None:
        try:
            await self._request("POST", "/abort_request", {"rid": rid})
        except EngineError as e:  # nobody waits for this answer: an engine that cannot take it is logged
            log.warning("engine at %s: abort of cancelled request %s failed: %s", self.base_url, rid, e)

    def _new_rid(self) -> str:
        """32 hex digits, as uuid4().hex: this client's random prefix + a fixed-width counter, so no
        rid is a prefix of another (aborts match rids by prefix) and no syscall is made per call."""
        self._rid_count += 1
        return "%s%016x" % (self._rid_prefix, self._rid_count)

    def _settle(
        self, final: GenerateResult, rid: str, abort_all_seen: int, budget: int | None, resubmit_aborted: bool
    ) -> GenerateResult | None:
        """The result to hand back for a finished segment, or None when it is to be resubmitted
        (an abort the caller did not ask for, with tokens still to sample)."""
        caller_aborted = self._abort_all_count != abort_all_seen or any(rid.startswith(prefix) for prefix in self._aborted)
        if final.finish_reason != "abort" or caller_aborted or not resubmit_aborted:
            return final
        if budget is not None and len(final.output_ids) >= budget:
            return msgspec.structs.replace(final, finish_reason="length")
        return None

    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[_GenerateResponse]:
        """SGLang SSE: ``data: {json}`` lines, ``data: [DONE]`` at the end, errors in-band."""
        try:
            async with self._get_session().post(self.base_url + "/generate", json=body) as resp:
                if resp.status >= 400:
                    raise EngineError(resp.status, _error_message(await resp.read()))
                async for line in resp.content:
                    if not line.startswith(b"data: "):
                        continue  # blank separators (and SSE comments)
                    data = line[6:].strip()
                    if data == b"[DONE]":
                        return
                    if data.startswith(b'{"error"'):
                        err = json.loads(data)["error"]
                        raise EngineError(err.get("code") if isinstance(err, dict) else None, _error_message(data))
                    yield _response_decoder.decode(data)
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            raise EngineUnavailable(None, f"engine at {self.base_url} unavailable: {exc!r}") from exc

    async def pause_generation(self, mode: str = "abort") -> None:
        """Pause: ``abort`` aborts everything in flight, ``retract`` re-queues running requests,
        ``in_place`` keeps them; new requests wait until ``continue_generation``."""
        await self._request("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> None:
        await self._request("POST", "/continue_generation", {})

    async def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None:
        """Abort requests whose rid starts with ``rid`` (or all). The caller asked, so the
        aborted generations return finish_reason "abort" instead of being resubmitted."""
        if abort_all:
            self._abort_all_count += 1
        elif rid:
            self._aborted.add(rid)
        else:
            raise ValueError("abort_request: give a rid or abort_all=True")
        await self._request("POST", "/abort_request", {"rid": rid or "", "abort_all": abort_all})

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        body: dict[str, Any] = {"model_path": model_path}
        if weight_version is not None:
            body["weight_version"] = weight_version
        answer = json.loads(await self._request("POST", "/update_weights_from_disk", body))
        if not answer.get("success", False):
            raise EngineError(200, str(answer.get("message", answer)))

    async def health(self) -> bool:
        try:
            await self._request("GET", "/health")
        except EngineError:
            return False
        return True

    async def model_info(self) -> dict:
        return json.loads(await self._request("GET", "/get_model_info"))

    async def server_info(self) -> dict:
        return json.loads(await self._request("GET", "/get_server_info"))

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def update_weights_from_disk_sync(
    base_url: str,
    model_path: str,
    weight_version: str | None,
    *,
    api_key: str | None = None,
    timeout_s: float = 600,
) -> None:
    """Blocking weight update with the standard library only (for the trainer process)."""
    body = {"model_path": model_path}
    if weight_version is not None:
        body["weight_version"] = weight_version
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(
        base_url.rstrip("/") + "/update_weights_from_disk", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise EngineError(exc.code, _error_message(exc.read())) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise EngineUnavailable(None, f"engine at {base_url} unavailable: {exc!r}") from exc
    if not answer.get("success", False):
        raise EngineError(200, str(answer.get("message", answer)))


def _segment(
    input_ids: list[int],
    done: GenerateResult | None,
    sampling_params: dict,
    budget: int | None,
    rid: str,
    return_logprob: bool,
    top_logprobs_num: int,
    stream: bool,
) -> dict[str, Any]:
    """The ``/generate`` body of one segment: the prompt plus the tokens of earlier segments, with
    the budget that is left."""
    if done is None:
        ids: Any = input_ids if type(input_ids) is list else list(input_ids)  # msgspec encodes a list as is
        remaining = budget
    else:
        ids = list(input_ids) + done.output_ids
        remaining = None if budget is None else budget - len(done.output_ids)
    body: dict[str, Any] = {
        "input_ids": ids,
        "rid": rid,
        "return_logprob": return_logprob,
        "sampling_params": dict(sampling_params, max_new_tokens=remaining),
    }
    if top_logprobs_num:
        body["top_logprobs_num"] = top_logprobs_num
    if stream:
        body["stream"] = True
    return body


def _stitch(done: GenerateResult | None, resp: _GenerateResponse, prompt_tokens: int) -> GenerateResult:
    """One answer (or cumulative chunk) as a result; after a resubmission, appended to the tokens
    of the segments before it (``done``)."""
    meta = resp.meta_info
    reason = "" if meta.finish_reason is None else meta.finish_reason.get("type", "abort")
    logprobs = [0.0 if lp is None else float(lp) for lp, _, _ in meta.output_token_logprobs]
    tops = [[(float(lp or 0.0), t) for lp, t, _ in (pos or [])] for pos in meta.output_top_logprobs] if meta.output_top_logprobs else []
    ids = resp.output_ids
    versions = [meta.weight_version] * len(ids)
    if done is None:
        return GenerateResult(
            output_ids=ids,
            output_logprobs=logprobs,
            finish_reason=reason,
            weight_version=meta.weight_version,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(ids),
            text=resp.text,
            output_versions=versions,
            output_top_logprobs=tops,
        )
    ids = done.output_ids + ids
    return GenerateResult(
        output_ids=ids,
        output_logprobs=done.output_logprobs + logprobs,
        finish_reason=reason,
        weight_version=meta.weight_version,
        prompt_tokens=done.prompt_tokens,
        completion_tokens=len(ids),
        text=done.text + resp.text,
        output_versions=done.output_versions + versions,
        output_top_logprobs=done.output_top_logprobs + tops,
        resubmits=done.resubmits,
    )


# ------------------------------------------------------------------------------------------
# The embedded engine as a subprocess.
# ------------------------------------------------------------------------------------------


def exit_status(returncode: int) -> str:
    """``exit status N``, or ``signal NAME`` for a negative return code."""
    return f"signal {signal.Signals(-returncode).name}" if returncode < 0 else f"exit status {returncode}"


class EngineProcess:
    """A running ``areal.engine.server`` subprocess, leader of its own process group."""

    def __init__(self, popen: subprocess.Popen, url: str, log_path: str, scratch_dir: str | None = None) -> None:
        self.popen = popen
        self.url = url
        self.log_path = log_path
        self.scratch_dir = scratch_dir  # ready file (and the log, unless one was named); removed by stop()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def exit_status(self) -> str:
        """How the exited server ended, for ``death_of``."""
        return exit_status(self.popen.returncode)

    def stop(self, timeout_s: float = 10) -> None:
        """SIGTERM the process group, then SIGKILL it if it has not exited in ``timeout_s``."""
        stop_group(self.popen, timeout_s)
        if self.scratch_dir is not None:
            shutil.rmtree(self.scratch_dir, ignore_errors=True)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_healthy(proc: EngineProcess, name: str, timeout_s: float) -> EngineProcess:
    """Poll ``GET /health`` of a just-started server until it answers 200; stop it and raise,
    with its log tail, if it exits or the deadline passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not proc.alive():
            raise RuntimeError(f"{name} exited with {proc.popen.returncode}; log tail:\n{log_tail(proc.log_path)}")
        try:
            with urllib.request.urlopen(proc.url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            pass  # not listening yet: poll again until the deadline
        if time.monotonic() > deadline:
            proc.stop()
            raise TimeoutError(f"{name} not healthy after {timeout_s}s; log tail:\n{log_tail(proc.log_path)}")
        time.sleep(0.25)


def launch_command(
    template: str,
    model_path: str,
    port: int,
    log_path: str,
    *,
    host: str = "127.0.0.1",
    timeout_s: float = 900,
    fields: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> EngineProcess:
    """Start an inference server from a command template (``{python}``, ``{model}``, ``{host}``,
    ``{port}`` and the extra ``fields`` filled in; e.g. ``python -m sglang.launch_server
    --model-path {model} --port {port}``) in its own process group, with ``env`` added to this
    process's environment, logging to ``log_path``, and wait until ``/health`` answers 200."""
    fields = {"python": sys.executable, "model": model_path, "host": host, "port": port, **(fields or {})}
    try:
        cmd = shlex.split(template.format(**fields))
    except (KeyError, IndexError, ValueError) as e:
        names = ", ".join(f"{{{k}}}" for k in fields)
        raise ValueError(f"engine.launch.command {template!r}: only {names} can be filled in ({e!r})") from None
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env} if env else None,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    return wait_healthy(EngineProcess(popen, f"http://{host}:{port}", log_path), cmd[0], timeout_s)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (bind(0)); the server started on it binds it itself."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def launch_embedded_engine(
    model_path: str,
    *,
    threads: int = 1,
    log_path: str | None = None,
    timeout_s: float = 120,
    max_batch: int = 32,
    weight_version: str = "default",
    api_key: str | None = None,
    request_log: str | None = None,
    port: int = 0,
    host: str = "127.0.0.1",
) -> EngineProcess:
    """Start the embedded engine and wait until it has written its URL to the ready file.
    ``port`` 0 takes a free one; a restarted engine is given its predecessor's. ``host``: the
    address it listens on (a node's own address when other nodes call it)."""
    run_dir = owned_temp_dir("engine")
    ready = os.path.join(run_dir, "ready")
    log_path = log_path or os.path.join(run_dir, "engine.log")
    cmd = [
        sys.executable,
        "-m",
        "areal.engine.server",
        "--model-path",
        model_path,
        "--ready-file",
        ready,
        "--threads",
        str(threads),
        "--max-batch",
        str(max_batch),
        "--weight-version",
        weight_version,
        "--port",
        str(port),
        "--host",
        host,
    ]
    if api_key:
        cmd += ["--api-key", api_key]
    if request_log:
        cmd += ["--request-log", request_log]
    env = dict(os.environ)
    # The child must import this very package even when it is not installed.
    repo_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH")) if p)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True, preexec_fn=die_with_parent
        )
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(ready):
        failure = None
        if popen.poll() is not None:
            failure = RuntimeError(f"embedded engine exited with {popen.returncode}; log tail:\n{log_tail(log_path)}")
        elif time.monotonic() > deadline:
            failure = TimeoutError(f"embedded engine not ready after {timeout_s}s; log tail:\n{log_tail(log_path)}")
        if failure is not None:  # the log tail is in the error, so the scratch dir can go
            EngineProcess(popen, "", log_path, scratch_dir=run_dir).stop()
            raise failure
        time.sleep(0.05)
    with open(ready) as f:
        url = f.read().strip()
    return EngineProcess(popen, url, log_path, scratch_dir=run_dir)
