"""Client for SGLang's native HTTP API: ``EngineClient``, its typed errors, and ``request_json``.

One client serves both back ends: a real SGLang server on GPUs and ``areal.engine.server`` on
CPU speak the same protocol (tests/integration/sglang/test_sglang_protocol.py pins its shapes, and runs against a
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
- ``request_json`` is the one blocking request to an engine (the trainer's weight pushes, the
  fleet's catch-up, vLLM's reload routes, the collective's control routes): standard library
  only, with the same typed errors as ``EngineClient``.

The HTTP/1.1 pool is ``http1``; starting servers is ``launch``; loading a version from disk is
``areal.weights.disk`` (its body and its check are ``update_body`` and ``check_update`` here,
which ``EngineClient.update_weights_from_disk`` sends over the pool).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import msgspec

from areal.engine.http1 import Pool
from areal.engine.interface import GenerateRequest, InferenceEngine

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


class EngineClient(InferenceEngine):
    """Async client for one engine URL (``generate`` and ``generate_stream``: ``InferenceEngine``'s,
    which hand each call here as one ``GenerateRequest``; one server: ``session_key`` has nothing to
    route, ``EngineRouter`` keeps a session on one)."""

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

    async def _generate(self, req: GenerateRequest) -> GenerateResult:
        """One generation. An abort the caller did not ask for (a pause around a weight update)
        is recovered by resubmitting prompt + tokens so far with ``max_new_tokens`` reduced.

        One plain coroutine per call (no async generators: each call would pay their hooks and
        frames); the resubmission rules are shared with ``generate_stream`` (``_segment``, ``_settle``).
        """
        rid = req.rid if req.rid is not None else self._new_rid()
        abort_all_seen = self._abort_all_count
        budget = req.sampling_params.get("max_new_tokens", 128)
        done: GenerateResult | None = None  # tokens of finished (aborted) segments
        sent = False

        def on_send() -> None:
            nonlocal sent
            sent = True

        try:
            while True:
                body = _segment(req, done, budget, rid, False)
                resp = _response_decoder.decode(await self._request("POST", "/generate", body, on_send))
                if resp.meta_info.finish_reason is None:
                    raise EngineError(200, "the engine ended the stream without a final chunk")
                final = _stitch(done, resp, len(req.input_ids))
                result = self._settle(final, rid, abort_all_seen, budget, req.resubmit_aborted)
                if result is not None:
                    return result
                done = msgspec.structs.replace(final, resubmits=final.resubmits + 1)
        except asyncio.CancelledError:
            if sent:
                self._abort_abandoned(rid)
            raise
        finally:
            self._aborted.discard(rid)

    async def _generate_stream(self, req: GenerateRequest) -> AsyncIterator[GenerateResult]:
        """Stream a generation: a cumulative ``GenerateResult`` per chunk, ``finish_reason`` ""
        until the last one. Aborts are recovered as in ``generate``, invisibly to the reader."""
        rid = req.rid if req.rid is not None else self._new_rid()
        abort_all_seen = self._abort_all_count
        budget = req.sampling_params.get("max_new_tokens", 128)
        done: GenerateResult | None = None
        try:
            while True:
                body = _segment(req, done, budget, rid, True)
                final = None
                async for resp in self._stream(body):
                    result = _stitch(done, resp, len(req.input_ids))
                    if resp.meta_info.finish_reason is None:
                        yield result
                    else:
                        final = result
                if final is None:
                    raise EngineError(200, "the engine ended the stream without a final chunk")
                settled = self._settle(final, rid, abort_all_seen, budget, req.resubmit_aborted)
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
        """``areal.weights.disk.update_weights_from_disk_sync``'s request, over this client's pool."""
        check_update(json.loads(await self._request("POST", "/update_weights_from_disk", update_body(model_path, weight_version))))

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


def request_json(
    url: str,
    path: str,
    body: Any = None,
    timeout_s: float = 600,
    *,
    method: str = "POST",
    api_key: str | None = None,
    server: str = "engine",
    needs: str = "",
) -> Any:
    """One blocking JSON request to a server, standard library only (for the trainer process and
    threads): ``body`` sent as JSON (no body if None), the answer parsed ({} when empty). An error
    answer raises ``EngineError`` with the server's own message (a 404 names the route and
    ``needs``, what the server must be started with, when given); no answer at all (refused,
    reset, timed out) raises ``EngineUnavailable``, the ``OSError`` under it as its cause."""
    base = url.rstrip("/")
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            answer = resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and needs:
            raise EngineError(404, f"{server} at {base} has no {path.split('?')[0]}: {needs}") from exc
        raise EngineError(exc.code, _error_message(exc.read())) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise EngineUnavailable(None, f"{server} at {base} unavailable: {exc!r}") from exc
    return json.loads(answer) if answer else {}


def update_body(model_path: str | os.PathLike, weight_version: str | int | None) -> dict[str, Any]:
    """The ``/update_weights_from_disk`` request: load ``model_path`` as ``weight_version``."""
    body = {"model_path": str(model_path)}
    if weight_version is not None:
        body["weight_version"] = str(weight_version)
    return body


def check_update(answer: Any) -> None:
    """A weight update's answer: ``EngineError`` unless it says ``success``."""
    if not answer.get("success", False):
        raise EngineError(200, str(answer.get("message", answer)))


def _segment(req: GenerateRequest, done: GenerateResult | None, budget: int | None, rid: str, stream: bool) -> dict[str, Any]:
    """The ``/generate`` body of one segment: the prompt plus the tokens of earlier segments, with
    the budget that is left."""
    if done is None:
        ids: Any = req.input_ids if type(req.input_ids) is list else list(req.input_ids)  # msgspec encodes a list as is
        remaining = budget
    else:
        ids = list(req.input_ids) + done.output_ids
        remaining = None if budget is None else budget - len(done.output_ids)
    body: dict[str, Any] = {
        "input_ids": ids,
        "rid": rid,
        "return_logprob": req.return_logprob,
        "sampling_params": dict(req.sampling_params, max_new_tokens=remaining),
    }
    if req.top_logprobs_num:
        body["top_logprobs_num"] = req.top_logprobs_num
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
