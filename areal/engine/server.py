"""Embedded CPU inference engine: SGLang's native HTTP API in front of ``areal.engine.batch``.

A real engine, not a stand-in: an HF causal LM (fp32, ``torch.inference_mode``) decoded with
continuous batching and a KV cache (``batch.py``; a lean forward over a slot cache, ``model.py``,
for Qwen2/Llama-family models, HF's forward otherwise: ``--forward``, ``forward`` in
/get_server_info), sampled as SGLang does (``sampling.py``),
behind an aiohttp app that answers exactly as SGLang does (tests/integration/sglang/test_sglang_protocol.py), so the
one ``EngineClient`` drives this process on CPU and a real SGLang server on GPUs.

    POST /generate ── parse + validate ─► Engine.submit ─► worker thread (batch.py)
         ▲   stream=false: await every row's future, answer one JSON (array for a batch)
         └── stream=true: SSE ``data: {cumulative}`` as the worker reports each token
             (``on_update`` -> call_soon_threadsafe -> asyncio.Event), then ``data: [DONE]``
    /pause_generation /continue_generation /abort_request ─► control items, same queue
    /update_weights_from_disk ─► pending until the running rows finish (or at once if paused)
    /init_weights_update_group ─► join the group in a thread (generation goes on meanwhile)
    /begin_weight_update, /end_weight_update ─► the session a distributed update must run in
    /update_weights_from_distributed ─► pending like a disk update; the worker receives the
         broadcasts in list order and loads them; /destroy_weights_update_group leaves the group

Invariants:
- Streaming chunks are cumulative (SGLang's default): full ``output_ids``, ``text`` and logprobs
  so far, ``finish_reason`` null until the last chunk; a batch stream adds ``"index"``. An error
  after the stream started arrives as ``data: {"error": {...}}``.
- ``n`` > 1 fans each prompt out into n rows (prompt-major order); copy j of a seeded request
  uses ``sampling_seed + j`` so the copies differ but stay reproducible.
- Protocol errors are 400 ``{"error": msg}``; anything unexpected is 500; the server never dies
  on a bad request.
- A request is aborted (``/abort_request``, by rid prefix) in the waiting queue or mid-decode,
  and so is one whose client hangs up, streamed or not (SGLang aborts both): the engine never
  generates for nobody.
- Weight endpoints answer ``{"success", "message"}``: 200 on success, 400 on any failure (as
  SGLang). ``backend="nccl"`` without CUDA is refused with a 400 that says to use gloo.
- ``text`` needs a tokenizer: it is decoded when the model dir holds tokenizer files, else "";
  ``stop`` strings need one too (400 otherwise), and so does a constraint (``json_schema``,
  ``regex``, ``ebnf``, ``structural_tag``: ``grammar.py``), whose grammar is compiled before the
  rows are queued, so one the grammar library refuses is a 400 naming the key.

Not covered: ``text`` prompts, ``input_embeds``, prompt logprobs (``logprob_start_len`` >= 0),
``token_ids_logprob``, incremental (delta) streaming.

Run: ``python -m areal.engine.server --model-path DIR [--port 0] [--ready-file F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import torch
from aiohttp import web

from areal.aio import run as run_loop
from areal.engine.batch import DTYPES, FORWARDS, Control, DistributedUpdate, Engine, GenerationRequest, WeightUpdate
from areal.engine.sampling import RequestError, SamplingParams, is_int, parse_sampling_params

PAUSE_MODES = ("abort", "retract", "in_place")
GROUP_BACKENDS = ("gloo", "nccl")
GROUP_TIMEOUT_S = 300.0  # rendezvous and per-collective timeout of a weight-update group


_REQUIRED = object()


def _field(body: Any, key: str, kind: type | tuple[type, ...], default: Any = _REQUIRED) -> Any:
    """``body[key]`` checked against ``kind`` (a bool is not an int); absent or null gives ``default``.

    RequestError names the field."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    value = body.get(key)
    if value is None:
        if default is _REQUIRED:
            raise RequestError(f"{key} is required")
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise RequestError(f"{key} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def parse_distributed_update(body: Any) -> DistributedUpdate:
    """Validate an /update_weights_from_distributed body into a DistributedUpdate."""
    names = _field(body, "names", list)
    dtypes = _field(body, "dtypes", list)
    shapes = _field(body, "shapes", list)
    if not (len(names) == len(dtypes) == len(shapes)):
        raise RequestError(f"names, dtypes and shapes differ in length ({len(names)}, {len(dtypes)}, {len(shapes)})")
    if not all(isinstance(n, str) for n in names):
        raise RequestError("names must be strings")
    parsed = []
    for d in dtypes:
        dtype = getattr(torch, d, None) if isinstance(d, str) else None
        if not isinstance(dtype, torch.dtype):
            raise RequestError(f"dtypes: {d!r} is not a torch dtype name (like 'bfloat16')")
        parsed.append(dtype)
    if not all(isinstance(s, list) and all(is_int(x) and x >= 0 for x in s) for s in shapes):
        raise RequestError("shapes must be lists of non-negative ints")
    if _field(body, "load_format", str, None) is not None:
        raise RequestError("load_format: only null (one broadcast per tensor) is supported")
    version = _field(body, "weight_version", (str, int), None)
    return DistributedUpdate(
        group_name=_field(body, "group_name", str, "weight_update_group"),
        names=names,
        dtypes=parsed,
        shapes=shapes,
        weight_version=None if version is None else str(version),
    )


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(obj), status=status, content_type="application/json")


def parse_generate(body: Any, engine: Engine) -> tuple[list[GenerationRequest], bool]:
    """Turn a /generate body into rows (n rows per prompt); returns (rows, answer_is_a_list)."""
    prompts, is_batch = _prompts(body)
    count = len(prompts)
    sps, lps, tops = (_per_row(body, key, default, is_batch, count) for key, default in _PER_ROW)
    rids = _rids(body.get("rid"), is_batch, count)
    rows = []
    for prompt, sp, lp, top, rid in zip(prompts, sps, lps, tops, rids):
        rows += _rows(prompt, sp, lp, top, rid, engine)
    return rows, is_batch or len(rows) > 1


_PER_ROW = (("sampling_params", {}), ("return_logprob", False), ("top_logprobs_num", 0))  # fields a batch may give per prompt


def _prompts(body: Any) -> tuple[list[Any], bool]:
    """The prompts of a /generate body, and whether it is a batch (a list of prompts)."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    if body.get("text") is not None or body.get("input_embeds") is not None:
        raise RequestError("the embedded engine takes input_ids only (text/input_embeds are not supported)")
    if body.get("logprob_start_len", -1) not in (-1, None) or body.get("token_ids_logprob") is not None:
        raise RequestError("prompt and token-id logprobs are not supported; only output (and top) logprobs")
    ids = body.get("input_ids")
    if ids is None:
        raise RequestError("Either text, input_ids or input_embeds should be provided.")
    if not isinstance(ids, list) or not ids:
        raise RequestError("input_ids cannot be empty.")
    is_batch = isinstance(ids[0], list)
    return (ids if is_batch else [ids]), is_batch


def _per_row(body: dict[str, Any], key: str, default: Any, is_batch: bool, count: int) -> list[Any]:
    """``body[key]`` for each of ``count`` prompts: a batch may give a list, one entry per prompt."""
    value = body.get(key, default)
    if is_batch and isinstance(value, list):
        if len(value) != count:
            raise RequestError(f"{key} has {len(value)} entries for a batch of {count}")
        return value
    return [value] * count


def _rids(rid: Any, is_batch: bool, count: int) -> list[str]:
    """One rid per prompt: the given list, ``rid_i`` for a batch under one rid, or fresh ones."""
    if isinstance(rid, list):
        if not is_batch or len(rid) != count or len(set(rid)) != count:
            raise RequestError("rid list must match the batch size and be unique")
        return [str(r) for r in rid]
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    return [f"{rid}_{i}" for i in range(count)] if is_batch else [str(rid)]


def _rows(prompt: Any, sp: Any, lp: Any, top: Any, rid: str, engine: Engine) -> list[GenerationRequest]:
    """One prompt's rows, validated: n of them (copy j of a seeded request seeded ``seed + j``)."""
    if not isinstance(prompt, list) or not prompt:
        raise RequestError("input_ids cannot be empty.")
    if not all(is_int(t) and 0 <= t < engine.vocab_size for t in prompt):
        raise RequestError(f"input_ids must be ints in [0, {engine.vocab_size})")
    if len(prompt) >= engine.context_len:
        raise RequestError(f"The input ({len(prompt)} tokens) is longer than the model's context length ({engine.context_len} tokens).")
    if not is_int(top or 0) or (top or 0) < 0:
        raise RequestError(f"top_logprobs_num must be a non-negative int, got {top!r}")
    params = parse_sampling_params(sp if sp is not None else {}, len(prompt), engine.context_len)
    if params.stop and engine.tokenizer is None:
        raise RequestError("sampling_params.stop needs a tokenizer in the model directory")
    return [
        GenerationRequest(
            rid=rid if params.n == 1 else f"{rid}_{j}",
            input_ids=list(prompt),
            params=replace(params, sampling_seed=None if params.sampling_seed is None else params.sampling_seed + j),
            return_logprob=bool(lp),
            top_logprobs_num=int(top or 0),
        )
        for j in range(params.n)
    ]


def format_generate(row: GenerationRequest, engine: Engine, upto: int | None = None) -> dict[str, Any]:
    """SGLang's answer for one row; ``upto`` = a streaming snapshot of the first ``upto`` tokens."""
    final = upto is None
    n = len(row.output_ids) if final else upto
    ids = row.output_ids[:n]
    reason = row.finish_reason if final else None
    meta: dict[str, Any] = {"id": row.rid, "finish_reason": reason}
    if row.admitted:  # SGLang leaves prompt_tokens out for requests aborted in the waiting queue
        meta["prompt_tokens"] = len(row.input_ids)
    version = row.weight_version or engine.weight_version
    meta.update(completion_tokens=n, cached_tokens=0, weight_version=version, num_retractions=0, reasoning_tokens=0)
    if final:  # SGLang's per-token version spans come with the final answer
        ends = [*row.version_changes, (version, n)]
        meta["weight_versions"] = [{"version": v, "start": ends[i - 1][1] if i else 0, "end": end} for i, (v, end) in enumerate(ends)]
        meta["e2e_latency"] = time.perf_counter() - row.arrival
    if row.return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(row.logprobs[:n], ids)]
        meta["output_token_logprobs_length"] = n
        meta["input_token_logprobs"] = []
        if row.top_logprobs_num:
            meta["output_top_logprobs"] = [[[lp, t, None] for lp, t in pos] for pos in row.top_logprobs[:n]]
            meta["input_top_logprobs"] = []
    return {"text": engine.decode_text(ids, reason), "output_ids": ids, "meta_info": meta}


def _sse(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


async def stream_generate(request: web.Request, rows: list[GenerationRequest], is_batch: bool, engine: Engine) -> web.StreamResponse:
    """SSE: one cumulative chunk per row whenever it has new tokens, its final chunk, [DONE]."""
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    for r in rows:
        r.on_update = lambda: loop.call_soon_threadsafe(wake.set)
    futures = [asyncio.wrap_future(engine.submit(r)) for r in rows]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    sent = [0] * len(rows)
    done = [False] * len(rows)
    try:
        while not all(done):
            await wake.wait()
            wake.clear()
            for i, (r, fut) in enumerate(zip(rows, futures)):
                if done[i]:
                    continue
                if fut.done():
                    done[i] = True
                    fut.result()  # a worker failure raises here and becomes an error chunk
                    chunk = format_generate(r, engine)
                elif len(r.output_ids) > sent[i]:
                    sent[i] = len(r.output_ids)
                    chunk = format_generate(r, engine, upto=sent[i])
                else:
                    continue
                if is_batch:
                    chunk["index"] = i
                await resp.write(_sse(chunk))
    except (ConnectionResetError, asyncio.CancelledError):
        # The client went away: stop generating for it, as SGLang aborts on disconnect.
        for r in rows:
            engine.submit(Control("abort", rid=r.rid))
        raise
    except Exception as exc:  # noqa: BLE001 -- errors after the headers went out travel in-band
        await resp.write(
            _sse(
                {
                    "error": {
                        "message": str(exc),
                        "type": "invalid_request_error",
                        "code": 400 if isinstance(exc, RequestError) else 500,
                        "retryable": False,
                    }
                }
            )
        )
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def build_app(engine: Engine, api_key: str | None = None) -> web.Application:
    routes = Routes(engine, api_key)
    app = web.Application(middlewares=[routes.boundary], client_max_size=256 * 1024 * 1024)
    app.router.add_route("POST", "/generate", routes.generate)
    app.router.add_route("PUT", "/generate", routes.generate)
    for path in ("/health", "/health_generate", "/get_model_info", "/model_info", "/get_server_info", "/server_info"):
        app.router.add_get(path, getattr(routes, path.strip("/").removeprefix("get_")))
    for path in (
        "/update_weights_from_disk",
        "/init_weights_update_group",
        "/begin_weight_update",
        "/end_weight_update",
        "/update_weights_from_distributed",
        "/destroy_weights_update_group",
        "/pause_generation",
        "/continue_generation",
        "/abort_request",
    ):
        app.router.add_post(path, getattr(routes, path.strip("/")))
    return app


async def read_json(request: web.Request, required: bool = False) -> Any:
    raw = await request.read()
    if not raw and required:
        raise RequestError("a JSON body is required")
    try:
        return json.loads(raw or b"{}")
    except json.JSONDecodeError as exc:
        raise RequestError(f"invalid JSON body: {exc}") from exc


def _outcome(success: bool, message: str) -> web.Response:
    """A weight endpoint's answer, as SGLang's: 200 on success, 400 on any failure."""
    return _json({"success": success, "message": message}, 200 if success else 400)


class Routes:
    """The HTTP handlers of one engine (``build_app`` maps each route to the method of its name)."""

    def __init__(self, engine: Engine, api_key: str | None) -> None:
        self.engine = engine
        self.api_key = api_key
        # SGLang's weight-update session (0.5.23): /update_weights_from_distributed is refused outside
        # /begin_weight_update ... /end_weight_update; the messages are SGLang's.
        self.session_open = False

    @web.middleware
    async def boundary(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # Like SGLang's API-key middleware, health probes need no key.
        key = self.api_key
        if key is not None and not request.path.startswith("/health") and request.headers.get("Authorization") != f"Bearer {key}":
            return _json({"error": "Unauthorized"}, 401)
        # HTTP boundary: protocol errors become 400, anything else 500, never a crashed server.
        try:
            return await handler(request)
        except RequestError as exc:
            return _json({"error": str(exc)}, 400)
        except web.HTTPException:
            raise
        except Exception as exc:  # noqa: BLE001 -- converted into an error reply
            return _json({"error": f"{type(exc).__name__}: {exc}"}, 500)

    async def _submit(self, item: Any) -> Any:
        """Queue ``item`` for the worker and wait for its result."""
        return await asyncio.wrap_future(self.engine.submit(item))

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        rows, is_batch = parse_generate(body, self.engine)
        if any(r.params.constraint is not None for r in rows):  # compiling a grammar may take a while: off the loop
            await asyncio.to_thread(self.engine.grammars.attach, rows)
        if body.get("stream", False):
            return await stream_generate(request, rows, is_batch, self.engine)
        futures = [asyncio.wrap_future(self.engine.submit(r)) for r in rows]
        try:
            await asyncio.gather(*futures)
        except asyncio.CancelledError:  # the client went away (the handler is cancelled): as SGLang, stop generating for it
            for r in rows:
                self.engine.submit(Control("abort", rid=r.rid))
            raise
        out = [format_generate(r, self.engine) for r in rows]
        return _json(out if is_batch else out[0])

    async def health(self, request: web.Request) -> web.Response:
        return _json({}, 200 if self.engine.alive() else 503)

    async def health_generate(self, request: web.Request) -> web.Response:
        # Like SGLang: a real 1-token generation proves the worker loop is serving.
        probe = GenerationRequest(
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            input_ids=[0],
            params=SamplingParams(max_new_tokens=1, temperature=0.0),
            return_logprob=False,
        )
        if not self.engine.alive():
            return _json({}, 503)
        await asyncio.wait_for(self._submit(probe), timeout=20)
        return _json({})

    async def model_info(self, request: web.Request) -> web.Response:
        engine = self.engine
        return _json(
            {
                "model_path": engine.model_path,
                "served_model_name": engine.model_path,
                "tokenizer_path": engine.model_path if engine.tokenizer is not None else None,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": engine.weight_version,
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": engine.config.model_type,
                "architectures": list(engine.config.architectures or []),
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        engine = self.engine
        return _json(
            {
                "model_path": engine.model_path,
                "max_batch": engine.max_batch,
                "threads": torch.get_num_threads(),
                "context_length": engine.context_len,
                "forward": engine.forward,
                "device": engine.device,
                "dtype": engine.dtype,
                "weight_version": engine.weight_version,
                "version": "areal-embedded-0.1",
                "paused": engine.paused,
                "num_waiting": engine.num_waiting(),
                "internal_states": [dataclasses.asdict(engine.counters)],
                **vars(engine.counters),
            }
        )

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        path = body.get("model_path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path:
            raise RequestError("model_path is required")
        if body.get("abort_all_requests", False):
            await self._submit(Control("abort", abort_all=True))
        version = body.get("weight_version")
        update = WeightUpdate(path, None if version is None else str(version))
        try:
            message = await self._submit(update)
        except Exception as exc:  # noqa: BLE001 -- SGLang answers any failed load with 400
            return _json({"success": False, "message": f"Failed to update weights: {exc}", "num_paused_requests": 0}, 400)
        return _json({"success": True, "message": message, "num_paused_requests": 0})

    async def begin_weight_update(self, request: web.Request) -> web.Response:
        selector = _field(await read_json(request, required=True), "selector", str, "all")
        if selector not in ("target", "draft", "all"):
            raise RequestError(f"selector must be one of target, draft, all, got {selector!r}")
        if self.session_open:
            return _outcome(False, "a weight-update session is already open; call end_weight_update() first")
        self.session_open = True
        return _outcome(True, "Success")

    async def end_weight_update(self, request: web.Request) -> web.Response:
        _field(await read_json(request, required=True), "selector", str, "all")  # a JSON object is required
        if not self.session_open:
            return _outcome(False, "no weight-update session is open; call begin_weight_update() first")
        self.session_open = False
        return _outcome(True, "Success")

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            backend = _field(body, "backend", str, "nccl")
            address, port = _field(body, "master_address", str), _field(body, "master_port", int)
            offset, world = _field(body, "rank_offset", int), _field(body, "world_size", int)
            name = _field(body, "group_name", str, "weight_update_group")
            if backend not in GROUP_BACKENDS:
                raise RequestError(f"backend must be one of {GROUP_BACKENDS}, got {backend!r}")
            if backend == "nccl" and not torch.cuda.is_available():
                raise RequestError("backend 'nccl' needs CUDA and this engine runs on CPU; use backend 'gloo'")
            if not 1 <= offset < world:  # rank 0 is the trainer; this engine is one rank (tp 1)
                raise RequestError(f"rank_offset must be in [1, world_size), got {offset} of {world}")
            message = await asyncio.to_thread(self.engine.init_weights_group, backend, address, port, offset, world, name, GROUP_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 -- SGLang answers any failed init with 400 + message
            return _outcome(False, f"Failed to init group: {exc}")
        return _outcome(True, message)

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            update = parse_distributed_update(body)
            if not self.session_open:
                return _outcome(False, "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()")
            if body.get("abort_all_requests", False):
                await self._submit(Control("abort", abort_all=True))
            message = await self._submit(update)
        except Exception as exc:  # noqa: BLE001 -- a failed receive or load answers 400; old weights keep serving
            return _outcome(False, f"Failed to update parameter online: {exc}")
        return _outcome(True, message)

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            message = await asyncio.to_thread(self.engine.destroy_weights_group, _field(body, "group_name", str, "weight_update_group"))
        except Exception as exc:  # noqa: BLE001 -- answered as SGLang does
            return _outcome(False, f"Failed to destroy group: {exc}")
        return _outcome(True, message)

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await read_json(request, required=True)
        mode = body.get("mode", "abort") if isinstance(body, dict) else None
        if mode not in PAUSE_MODES:
            raise RequestError(f"mode must be one of {PAUSE_MODES}, got {mode!r}")
        await self._submit(Control("pause", mode=mode))
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        await read_json(request, required=True)
        await self._submit(Control("continue"))
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        rid, abort_all = body.get("rid") or "", bool(body.get("abort_all", False))
        if not abort_all and not rid:  # SGLang ignores it (an empty prefix would match every request)
            return web.Response(status=200)
        await self._submit(Control("abort", rid=str(rid), abort_all=abort_all))
        return web.Response(status=200)


@dataclass
class ServerConfig:
    """Command-line configuration of the embedded engine server."""

    model_path: str
    host: str = "127.0.0.1"
    port: int = 0  # 0: the kernel picks a free port; the ready file says which
    ready_file: str | None = None
    threads: int = 1  # torch intra-op threads
    max_batch: int = 32  # most requests decoded together
    weight_version: str = "default"
    api_key: str | None = None
    request_log: str | None = None  # append every finished generation as a JSON line here
    forward: str = "auto"  # lean (areal/engine/model.py) | hf (HF's forward) | auto: lean where it covers the model
    device: str = "cpu"  # where the model runs: cpu, cuda, cuda:N
    dtype: str = "float32"  # what it is served in: float32 | bfloat16
    busy_log: str | None = None  # append each span of computing (generating, loading weights) as a JSON line here

    def __post_init__(self) -> None:
        if not os.path.isdir(self.model_path):
            raise ValueError(f"model_path: {self.model_path!r} is not a directory")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port: {self.port} is out of range")
        if self.threads < 1:
            raise ValueError(f"threads: must be >= 1, got {self.threads}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch: must be >= 1, got {self.max_batch}")
        if self.forward not in FORWARDS:
            raise ValueError(f"forward: must be one of {FORWARDS}, got {self.forward!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise ValueError(f"device: must be cpu, cuda or cuda:N, got {self.device!r}")


async def serve(cfg: ServerConfig) -> None:
    """Load the model, bind, announce readiness, serve until SIGTERM/SIGINT."""
    torch.set_num_threads(cfg.threads)
    logs = {"request_log": cfg.request_log, "busy_log": cfg.busy_log}
    engine = Engine(cfg.model_path, cfg.max_batch, cfg.weight_version, forward=cfg.forward, device=cfg.device, dtype=cfg.dtype, **logs)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((cfg.host, cfg.port))
    # handler_cancellation: a client that hangs up cancels its handler, which aborts its rows
    runner = web.AppRunner(build_app(engine, cfg.api_key), access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    url = f"http://{cfg.host}:{sock.getsockname()[1]}"
    if cfg.ready_file:
        tmp = f"{cfg.ready_file}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(url)
        os.replace(tmp, cfg.ready_file)  # readers never see a half-written URL
    print(f"READY {url} (forward: {engine.forward}, {engine.device}, {engine.dtype})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    engine.shutdown()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready-file", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--weight-version", default="default")
    p.add_argument("--api-key", default=None)
    p.add_argument("--request-log", default=None, help="append every finished generation as JSON lines to this file")
    p.add_argument("--forward", default="auto", choices=FORWARDS, help="lean forward, HF's, or lean where it applies")
    p.add_argument("--device", default="cpu", help="where the model runs: cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="float32", choices=tuple(DTYPES), help="what the model is served in")
    p.add_argument(
        "--busy-log", default=None, help="append each span of computing (generating, loading weights) as JSON lines to this file"
    )
    run_loop(serve(ServerConfig(**vars(p.parse_args(argv)))))


if __name__ == "__main__":
    main()
