"""Embedded CPU inference engine serving SGLang's native HTTP API (the subset the gateway uses).

A real engine, not a stand-in: an HF causal LM (fp32, ``torch.inference_mode``) decoded in
batches with a KV cache, behind an aiohttp app that answers exactly as SGLang does, so the one
``EngineClient`` drives this process on CPU and a real SGLang server on GPUs.

    HTTP (event loop thread)                       generation worker (one thread)
    POST /generate ── parse + validate ─► queue ─► take every waiting request (<= max_batch)
          ▲                              (FIFO)    left-pad, prefill, decode with the KV cache,
          └──────── concurrent Future ◄────────────  per-row sampling and stopping
    POST /update_weights_from_disk ───► queue ─► runs between batches (SGLang's writer lock)

Invariants:
- One worker thread owns the model; requests and weight updates are served in arrival order, so
  an update waits for the batch in flight and every request sees one weight version throughout.
- Requests that arrive while a batch runs wait for the next batch. ``DecodeBatch`` holds the
  per-row state (cache rows, mask, positions, outputs) and retires finished rows after each
  step; continuous batching (admitting new rows between decode steps) slots into
  ``Engine._run_batch`` without touching sampling or the HTTP side.
- Logprobs are ``log_softmax(logits / temperature)`` over the full vocabulary, i.e. temperature
  scaled and taken *before* top-p/top-k truncation; for temperature < 1e-6 (greedy) they are
  ``log_softmax(logits)``. The trainer computes the same quantity for its behaviour logprobs.
- ``output_ids`` and ``output_token_logprobs`` include the matched EOS/stop token and
  ``completion_tokens`` counts it; ``text`` has it trimmed and special tokens skipped.
- ``text`` needs a tokenizer: it is decoded when the model dir holds tokenizer files, else "".
- ``sampling_seed`` seeds a per-request generator, so a seeded request samples the same tokens
  whatever else shares its batch (up to float noise from padding on exact near-ties).
- SGLang sampling keys that are valid but unsupported here are accepted only at their SGLang
  default value (a no-op, so clients written for SGLang work); any other value is a 400 naming
  the key. Unknown keys: 400. ``stream=true``: 400 "stream is not supported yet".

This module is ~600 lines because it holds the whole engine (validation, batching, sampling,
weight loading, HTTP); the split point, if it grows, is batching/sampling vs HTTP.

Run: ``python -m areal.engine.server --model-path DIR [--port 0] [--ready-file F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import glob
import json
import os
import queue
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec
import torch
from aiohttp import web
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

GREEDY_EPS = 1e-6
TOP_K_ALL = 1 << 30
SUPPORTED_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids",
                  "ignore_eos", "sampling_seed"}
# Valid SGLang sampling keys we do not implement, with the values that make them a no-op.
UNSUPPORTED_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "stop": (None, "", []), "stop_regex": (None, "", []), "min_p": (0, 0.0),
    "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "repetition_penalty": (1, 1.0),
    "min_new_tokens": (0,), "n": (1,), "json_schema": (None,), "regex": (None,), "ebnf": (None,),
    "structural_tag": (None,), "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,), "no_stop_trim": (False,),
    "stream_interval": (None,), "logit_bias": (None, {}), "custom_params": (None, {}),
    "beam_width": (None, 0, 1), "watermark": (None, False), "choice": (None,),
}


class RequestError(ValueError):
    """A request that violates the protocol; answered with HTTP 400."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL  # -1 and 2^30 both mean the whole vocabulary
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    sampling_seed: int | None = None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_sampling_params(raw: Any, prompt_len: int, context_len: int) -> SamplingParams:
    """Validate one ``sampling_params`` dict as SGLang does; raises RequestError naming the key."""
    if not isinstance(raw, dict):
        raise RequestError("sampling_params must be an object")
    for key, value in raw.items():
        if key in UNSUPPORTED_DEFAULTS:
            if value not in UNSUPPORTED_DEFAULTS[key]:
                raise RequestError(f"sampling_params.{key} is not supported by the embedded engine")
        elif key not in SUPPORTED_KEYS:
            raise RequestError(f"Unknown sampling parameter: {key}")
    room = context_len - prompt_len
    max_new = raw.get("max_new_tokens", 128)
    max_new = room if max_new is None else max_new  # null means "until the context is full"
    if not _is_int(max_new) or max_new < 0:
        raise RequestError(f"sampling_params.max_new_tokens must be a non-negative int, got {max_new!r}")
    temperature = raw.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise RequestError(f"sampling_params.temperature must be >= 0, got {temperature!r}")
    top_p = raw.get("top_p", 1.0)
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise RequestError(f"sampling_params.top_p must be in (0, 1], got {top_p!r}")
    top_k = raw.get("top_k", TOP_K_ALL)
    if not _is_int(top_k) or (top_k < 1 and top_k != -1):
        raise RequestError(f"sampling_params.top_k must be -1 or >= 1, got {top_k!r}")
    stop_ids = raw.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(_is_int(t) for t in stop_ids):
        raise RequestError("sampling_params.stop_token_ids must be a list of ints")
    ignore_eos = raw.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError("sampling_params.ignore_eos must be a bool")
    seed = raw.get("sampling_seed")
    if seed is not None and not _is_int(seed):
        raise RequestError("sampling_params.sampling_seed must be an int")
    return SamplingParams(
        max_new_tokens=min(max_new, room),  # SGLang clamps to the context as well
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=TOP_K_ALL if top_k == -1 else top_k,
        stop_token_ids=frozenset(stop_ids),
        ignore_eos=ignore_eos,
        sampling_seed=seed,
    )


@dataclass
class GenerationRequest:
    """One prompt in flight; the worker fills the outputs and resolves ``future``."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    arrival: float = field(default_factory=time.perf_counter)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    weight_version: str = ""


@dataclass
class WeightUpdate:
    model_path: str
    weight_version: str | None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class Counters:
    requests_served: int = 0
    batches_run: int = 0
    max_batch_size_seen: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    weight_updates: int = 0


def sample_next(
    logits: torch.Tensor, rows: list[GenerationRequest], generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row sampling, vectorised over the batch. logits: (B, V) fp32 -> tokens, logprobs (B,)."""
    temps = torch.tensor([r.params.temperature for r in rows])
    greedy = temps < GREEDY_EPS
    logprobs = torch.log_softmax(logits / torch.where(greedy, 1.0, temps)[:, None], dim=-1)  # (B, V)
    choice = logits.argmax(dim=-1)
    if not bool(greedy.all()):
        vocab = logits.shape[-1]
        top_p = torch.tensor([r.params.top_p for r in rows])
        top_k = torch.tensor([min(r.params.top_k, vocab) for r in rows])
        sorted_lp, order = logprobs.sort(dim=-1, descending=True)  # (B, V)
        probs = sorted_lp.exp()
        # Same truncation as SGLang's torch sampler: top-p on the untruncated cumulative mass,
        # then top-k by rank; the most likely token always survives.
        keep = (probs.cumsum(-1) - probs) <= top_p[:, None]
        keep &= torch.arange(vocab)[None, :] < top_k[:, None]
        masked = torch.full_like(logprobs, -float("inf")).scatter(1, order, sorted_lp.masked_fill(~keep, -float("inf")))
        # Gumbel-max with one generator per request: reproducible whatever shares the batch.
        noise = torch.stack([torch.rand(vocab, generator=g) for g in generators]).clamp_(min=1e-20)
        sampled = (masked - torch.log(-torch.log(noise))).argmax(dim=-1)
        choice = torch.where(greedy, choice, sampled)
    return choice, logprobs.gather(1, choice[:, None]).squeeze(1)


class DecodeBatch:
    """Rows decoding together: left-padded prompts, one KV cache, rows retired as they finish."""

    def __init__(self, rows: list[GenerationRequest], eos_ids: frozenset[int]) -> None:
        self.rows = rows
        self.stops = [r.params.stop_token_ids | (frozenset() if r.params.ignore_eos else eos_ids) for r in rows]
        self.generators = []
        for r in rows:
            g = torch.Generator()
            g.manual_seed(r.params.sampling_seed if r.params.sampling_seed is not None else torch.seed())
            self.generators.append(g)
        width = max(len(r.input_ids) for r in rows)
        self.input_ids = torch.zeros(len(rows), width, dtype=torch.long)  # (B, T); pad id is masked
        self.mask = torch.zeros(len(rows), width, dtype=torch.long)  # (B, T)
        for i, r in enumerate(rows):
            self.input_ids[i, width - len(r.input_ids):] = torch.tensor(r.input_ids)
            self.mask[i, width - len(r.input_ids):] = 1
        self.positions = (self.mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        self.cache: Any = None

    def step(self, model: torch.nn.Module) -> None:
        """One forward pass (prefill if no cache yet), then sample and append one token per row."""
        out = model(input_ids=self.input_ids, attention_mask=self.mask, position_ids=self.positions,
                    past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.cache = out.past_key_values
        tokens, logprobs = sample_next(out.logits[:, -1, :].float(), self.rows, self.generators)
        for row, tok, lp, stop in zip(self.rows, tokens.tolist(), logprobs.tolist(), self.stops):
            row.output_ids.append(tok)
            row.logprobs.append(lp)
            if tok in stop:
                row.finish_reason = {"type": "stop", "matched": tok}
            elif len(row.output_ids) >= row.params.max_new_tokens:
                row.finish_reason = {"type": "length", "length": row.params.max_new_tokens}
        self.input_ids = tokens[:, None]  # (B, 1)
        self.positions = self.positions[:, -1:] + 1  # (B, 1)
        self.mask = torch.cat([self.mask, torch.ones(len(self.rows), 1, dtype=torch.long)], dim=1)

    def retire_finished(self) -> list[GenerationRequest]:
        """Drop finished rows from the batch (and their KV cache rows); return them."""
        done = [r for r in self.rows if r.finish_reason is not None]
        if done:
            keep = [i for i, r in enumerate(self.rows) if r.finish_reason is None]
            if keep:
                idx = torch.tensor(keep)
                self.cache.batch_select_indices(idx)
                self.input_ids, self.mask, self.positions = self.input_ids[idx], self.mask[idx], self.positions[idx]
            self.rows = [self.rows[i] for i in keep]
            self.stops = [self.stops[i] for i in keep]
            self.generators = [self.generators[i] for i in keep]
        return done


class Engine:
    """The model and its single generation worker thread."""

    def __init__(self, model_path: str, max_batch: int, weight_version: str, request_log: str | None = None) -> None:
        self.model_path = model_path
        # Optional audit trail: one JSON line per finished generation (ids, logprobs, version), so
        # tests and debugging sessions can check that recorded tokens are the tokens generated.
        self.request_log = open(request_log, "a", buffering=1) if request_log else None
        self.max_batch = max_batch
        self.weight_version = weight_version
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.config = self.model.config
        has_tokenizer = any(os.path.exists(os.path.join(model_path, f))
                            for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
        self.tokenizer = AutoTokenizer.from_pretrained(model_path) if has_tokenizer else None
        eos: set[int] = set()
        for src in (self.model.generation_config.eos_token_id, self.config.eos_token_id):
            eos.update([src] if _is_int(src) else (src or []))
        self.eos_ids = frozenset(eos)
        self.vocab_size = int(self.config.vocab_size)
        self.context_len = int(getattr(self.config, "max_position_embeddings", 32768))
        self.counters = Counters()
        self._queue: queue.Queue[GenerationRequest | WeightUpdate | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="generation-worker", daemon=True)
        self._worker.start()

    def alive(self) -> bool:
        return self._worker.is_alive()

    def submit(self, item: GenerationRequest | WeightUpdate) -> concurrent.futures.Future:
        self._queue.put(item)
        return item.future

    def shutdown(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=10)

    def _work(self) -> None:
        with torch.inference_mode():
            carry: GenerationRequest | WeightUpdate | None = None
            while True:
                item, carry = carry or self._queue.get(), None
                if item is None:
                    return
                if isinstance(item, WeightUpdate):
                    self._serve(self._load_weights, [item])
                    continue
                batch = [item]
                while len(batch) < self.max_batch:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if not isinstance(nxt, GenerationRequest):
                        carry = nxt  # an update or shutdown runs after this batch, in order
                        break
                    batch.append(nxt)
                self._serve(self._run_batch, batch)

    def _serve(self, fn: Callable[[list[Any]], None], items: list[Any]) -> None:
        # Worker boundary: a failure answers its requests with an error instead of killing the thread.
        try:
            fn(items)
        except Exception as exc:  # noqa: BLE001 -- converted into an error reply
            for it in items:
                if not it.future.done():
                    it.future.set_exception(exc)

    def _run_batch(self, rows: list[GenerationRequest]) -> None:
        c = self.counters
        c.batches_run += 1
        c.max_batch_size_seen = max(c.max_batch_size_seen, len(rows))
        for r in rows:
            r.weight_version = self.weight_version
            c.prompt_tokens += len(r.input_ids)
            if r.params.max_new_tokens == 0:
                r.finish_reason = {"type": "length", "length": 0}
        batch = DecodeBatch(rows, self.eos_ids)
        while True:
            for r in batch.retire_finished():
                c.requests_served += 1
                c.tokens_generated += len(r.output_ids)
                if self.request_log is not None:
                    self.request_log.write(json.dumps({"rid": r.rid, "input_ids": r.input_ids, "output_ids": r.output_ids,
                                                       "output_logprobs": r.logprobs, "weight_version": r.weight_version}) + "\n")
                r.future.set_result(r)
            if not batch.rows:
                return
            batch.step(self.model)

    def _load_weights(self, items: list[WeightUpdate]) -> None:
        (upd,) = items
        files = sorted(glob.glob(os.path.join(upd.model_path, "*.safetensors")))
        if not files:
            raise RequestError(f"no *.safetensors weights in {upd.model_path!r}")
        loaded: dict[str, torch.Tensor] = {}
        for f in files:
            loaded.update(load_file(f))
        state = self.model.state_dict()
        # Check everything before copying anything, so a bad checkpoint leaves the old weights serving.
        missing = [n for n, _ in self.model.named_parameters() if n not in loaded]
        unknown = [n for n in loaded if n not in state]
        bad_shape = [n for n, t in loaded.items() if n in state and t.shape != state[n].shape]
        if missing or unknown or bad_shape:
            raise RequestError(f"weights in {upd.model_path!r} do not match the served architecture: "
                               f"missing={missing[:5]} unknown={unknown[:5]} shape_mismatch={bad_shape[:5]}")
        with torch.no_grad():
            for name, tensor in loaded.items():
                state[name].copy_(tensor)  # in place: no re-init, same storage
        self.model_path = upd.model_path
        if upd.weight_version is not None:
            self.weight_version = upd.weight_version
        self.counters.weight_updates += 1
        upd.future.set_result(f"Succeeded to update model weights from {upd.model_path}.")

    def decode(self, row: GenerationRequest) -> str:
        if self.tokenizer is None:
            return ""
        ids = row.output_ids
        if row.finish_reason and row.finish_reason["type"] == "stop":
            ids = ids[:-1]  # SGLang trims the matched stop token from text
        return self.tokenizer.decode(ids, skip_special_tokens=True)


# ------------------------------------------------------------------------------------------
# HTTP: SGLang's routes and response shapes.
# ------------------------------------------------------------------------------------------


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(obj), status=status, content_type="application/json")


def parse_generate(body: Any, engine: Engine) -> tuple[list[GenerationRequest], bool]:
    """Turn a /generate body into requests; returns (requests, is_batch)."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    if body.get("stream", False):
        raise RequestError("stream is not supported yet")
    if body.get("text") is not None or body.get("input_embeds") is not None:
        raise RequestError("the embedded engine takes input_ids only (text/input_embeds are not supported)")
    if body.get("logprob_start_len", -1) not in (-1, None) or body.get("top_logprobs_num") or \
            body.get("token_ids_logprob") is not None:
        raise RequestError("input/top/token-id logprobs are not supported; only output_token_logprobs")
    ids = body.get("input_ids")
    if ids is None:
        raise RequestError("Either text, input_ids or input_embeds should be provided.")
    if not isinstance(ids, list) or not ids:
        raise RequestError("input_ids cannot be empty.")
    is_batch = isinstance(ids[0], list)
    prompts = ids if is_batch else [ids]
    n = len(prompts)

    def per_row(key: str, default: Any, is_list: Any) -> list[Any]:
        value = body.get(key, default)
        if is_batch and is_list(value):
            if len(value) != n:
                raise RequestError(f"{key} has {len(value)} entries for a batch of {n}")
            return value
        return [value] * n

    sps = per_row("sampling_params", {}, lambda v: isinstance(v, list))
    lps = per_row("return_logprob", False, lambda v: isinstance(v, list))
    rid = body.get("rid")
    if isinstance(rid, list):
        if not is_batch or len(rid) != n or len(set(rid)) != n:
            raise RequestError("rid list must match the batch size and be unique")
        rids = rid
    elif rid is None:
        rids = [uuid.uuid4().hex for _ in range(n)]
    else:
        rids = [f"{rid}_{i}" for i in range(n)] if is_batch else [str(rid)]
    reqs = []
    for prompt, sp, lp, r in zip(prompts, sps, lps, rids):
        if not isinstance(prompt, list) or not prompt:
            raise RequestError("input_ids cannot be empty.")
        if not all(_is_int(t) and 0 <= t < engine.vocab_size for t in prompt):
            raise RequestError(f"input_ids must be ints in [0, {engine.vocab_size})")
        if len(prompt) >= engine.context_len:
            raise RequestError(f"The input ({len(prompt)} tokens) is longer than the model's "
                               f"context length ({engine.context_len} tokens).")
        params = parse_sampling_params(sp if sp is not None else {}, len(prompt), engine.context_len)
        reqs.append(GenerationRequest(rid=str(r), input_ids=prompt, params=params, return_logprob=bool(lp)))
    return reqs, is_batch


def format_generate(row: GenerationRequest, engine: Engine) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": row.rid,
        "finish_reason": row.finish_reason,
        "prompt_tokens": len(row.input_ids),
        "completion_tokens": len(row.output_ids),
        "cached_tokens": 0,
        "weight_version": row.weight_version,
        "e2e_latency": time.perf_counter() - row.arrival,
    }
    if row.return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(row.logprobs, row.output_ids)]
        meta["input_token_logprobs"] = []
    return {"text": engine.decode(row), "output_ids": row.output_ids, "meta_info": meta}


def build_app(engine: Engine, api_key: str | None = None) -> web.Application:
    @web.middleware
    async def boundary(request: web.Request, handler: Any) -> web.StreamResponse:
        # Like SGLang's API-key middleware, health probes need no key.
        if api_key is not None and not request.path.startswith("/health") and \
                request.headers.get("Authorization") != f"Bearer {api_key}":
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

    async def read_json(request: web.Request) -> Any:
        try:
            return json.loads(await request.read() or b"{}")
        except json.JSONDecodeError as exc:
            raise RequestError(f"invalid JSON body: {exc}") from exc

    async def generate(request: web.Request) -> web.Response:
        reqs, is_batch = parse_generate(await read_json(request), engine)
        await asyncio.gather(*(asyncio.wrap_future(engine.submit(r)) for r in reqs))
        out = [format_generate(r, engine) for r in reqs]
        return _json(out if is_batch else out[0])

    async def health(request: web.Request) -> web.Response:
        return _json({}, 200 if engine.alive() else 503)

    async def health_generate(request: web.Request) -> web.Response:
        # Like SGLang: a real 1-token generation proves the worker loop is serving.
        probe = GenerationRequest(rid=f"HEALTH_CHECK_{uuid.uuid4().hex}", input_ids=[0],
                                  params=SamplingParams(max_new_tokens=1, temperature=0.0), return_logprob=False)
        if not engine.alive():
            return _json({}, 503)
        await asyncio.wait_for(asyncio.wrap_future(engine.submit(probe)), timeout=20)
        return _json({})

    async def model_info(request: web.Request) -> web.Response:
        return _json({
            "model_path": engine.model_path, "served_model_name": engine.model_path,
            "tokenizer_path": engine.model_path if engine.tokenizer is not None else None,
            "is_generation": True, "preferred_sampling_params": None,
            "weight_version": engine.weight_version, "load_format": "auto",
            "reasoning_parser": None, "tool_call_parser": None, "disaggregation_mode": "null",
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": engine.config.model_type,
            "architectures": list(engine.config.architectures or []),
        })

    async def server_info(request: web.Request) -> web.Response:
        return _json({
            "model_path": engine.model_path, "max_batch": engine.max_batch,
            "threads": torch.get_num_threads(), "context_length": engine.context_len,
            "weight_version": engine.weight_version, "version": "areal-embedded-0.1",
            "internal_states": [dataclasses.asdict(engine.counters)],
            **vars(engine.counters),
        })

    async def update_weights_from_disk(request: web.Request) -> web.Response:
        body = await read_json(request)
        path = body.get("model_path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path:
            raise RequestError("model_path is required")
        version = body.get("weight_version")
        update = WeightUpdate(path, None if version is None else str(version))
        try:
            message = await asyncio.wrap_future(engine.submit(update))
        except Exception as exc:  # noqa: BLE001 -- SGLang answers any failed load with 400
            return _json({"success": False, "message": f"Failed to update weights: {exc}", "num_paused_requests": 0}, 400)
        return _json({"success": True, "message": message, "num_paused_requests": 0})

    app = web.Application(middlewares=[boundary], client_max_size=256 * 1024 * 1024)
    app.router.add_route("POST", "/generate", generate)
    app.router.add_route("PUT", "/generate", generate)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/model_info", model_info)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/server_info", server_info)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    return app


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

    def __post_init__(self) -> None:
        if not os.path.isdir(self.model_path):
            raise ValueError(f"model_path: {self.model_path!r} is not a directory")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port: {self.port} is out of range")
        if self.threads < 1:
            raise ValueError(f"threads: must be >= 1, got {self.threads}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch: must be >= 1, got {self.max_batch}")


async def serve(cfg: ServerConfig) -> None:
    """Load the model, bind, announce readiness, serve until SIGTERM/SIGINT."""
    torch.set_num_threads(cfg.threads)
    engine = Engine(cfg.model_path, cfg.max_batch, cfg.weight_version, cfg.request_log)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((cfg.host, cfg.port))
    runner = web.AppRunner(build_app(engine, cfg.api_key), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    url = f"http://{cfg.host}:{sock.getsockname()[1]}"
    if cfg.ready_file:
        tmp = f"{cfg.ready_file}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(url)
        os.replace(tmp, cfg.ready_file)  # readers never see a half-written URL
    print(f"READY {url}", flush=True)
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
    asyncio.run(serve(ServerConfig(**vars(p.parse_args(argv)))))


if __name__ == "__main__":
    main()
