"""The embedded engine's compute side: one worker thread, continuous batching over one KV cache.

    HTTP thread ── submit(item) ─► queue ─► worker loop (one thread owns the model)
                                             1. drain the queue: requests join ``waiting``;
                                                pause / continue / abort run at once;
                                                weight updates become pending
                                             2. pending update and (paused or nothing running):
                                                load it (SGLang's writer lock): from disk, or
                                                received over a weight-update process group
                                                (``init_weights_group``, areal/weights/collective.py)
                                             3. not paused: admit waiting rows (<= max_batch),
                                                prefill them as a group, merge into the running
                                                batch; one decode step for the running batch
                                             4. retire finished rows: resolve their futures

Invariants:
- Requests join the running batch between decode steps (continuous batching); a new prompt never
  waits for the batch in flight to finish. A pending weight update stops admission, lets the
  running rows finish, then loads, so a request sees one weight version unless it was paused
  (``mode="in_place"`` or ``"retract"``) across the update, as in SGLang.
- Two interchangeable batch layouts, chosen once per engine (``forward``): ``SlotBatch`` over the
  lean forward (areal/engine/model.py; the default wherever it covers the architecture): a
  preallocated KV cache with one slot per row, no padding, written in place; and
  ``DecodeBatch`` over HF's forward (any causal LM): left-padded, the KV cache is a
  DynamicCache (B, heads, L, dim) with an attention mask (B, L); merging a prefilled group
  left-pads the shorter cache; retiring rows drops their cache rows and then any leading columns
  no live row uses. Both answer the same logits to float noise (tests/unit/engine/test_engine_lean.py).
- Each row owns a ``RowRandom`` (a ``torch.Generator`` seeded by ``sampling_seed``) created at
  first admission and kept across retraction, so a seeded request samples the same tokens
  whatever shares the batch (up to float noise on exact near-ties).
- A retracted row keeps its output; on re-admission it is prefilled with prompt + output, so its
  tokens continue where they stopped.
- ``output_ids`` and logprobs include the matched EOS/stop token; ``completion_tokens`` counts it.
- Aborted rows finish with SGLang's abort reasons: "Aborted" when running, "Abort in waiting
  queue" (and no ``prompt_tokens`` in the answer) when not yet admitted.

Not covered: prefix caching across requests, chunked prefill, logprobs of prompt positions.
"""

from __future__ import annotations

import concurrent.futures
import glob
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from areal.engine.busy import BusySpans
from areal.engine.grammar import TOP_LOGPROB_FLOOR, Grammars, advance, mask_logits
from areal.engine.model import LeanForward, SlotBatch, lean_unsupported
from areal.engine.sampling import RequestError, RowRandom, SamplingParams, is_int, sample_next
from areal.jsonl import json_line

ABORT_RUNNING = "Aborted"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # what the engine can serve in
ABORT_WAITING = "Abort in waiting queue"
FORWARDS = ("auto", "lean", "hf")


def abort_reason(message: str) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


@dataclass
class GenerationRequest:
    """One sequence in flight; the worker fills the outputs and resolves ``future``."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    top_logprobs_num: int = 0
    arrival: float = field(default_factory=time.perf_counter)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    # Called from the worker thread after every new token and at finish (streaming wake-up).
    on_update: Callable[[], None] | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    weight_version: str = ""
    # (version, tokens it sampled) before each change of version mid-request (a pause across an
    # update): SGLang's weight_versions spans are these plus (weight_version, the rest)
    version_changes: list[tuple[str, int]] = field(default_factory=list)
    admitted: bool = False
    generator: RowRandom | None = None  # created at first admission, kept across retraction
    stops: frozenset[int] = frozenset()
    grammar: Any = None  # its constraint's llguidance matcher (grammar.py), kept across retraction

    def notify(self) -> None:
        if self.on_update is not None:
            self.on_update()


@dataclass
class WeightUpdate:
    model_path: str
    weight_version: str | None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class DistributedUpdate:
    """/update_weights_from_distributed: receive ``names`` from rank 0 of ``group_name``, in list order."""

    group_name: str
    names: list[str]
    dtypes: list[torch.dtype]
    shapes: list[list[int]]
    weight_version: str | None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class Control:
    """pause (mode abort|retract|in_place), continue, or abort (rid prefix or all)."""

    kind: str
    mode: str = "abort"
    rid: str = ""
    abort_all: bool = False
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class Counters:
    requests_served: int = 0
    batches_run: int = 0  # prefill groups admitted
    decode_steps: int = 0
    joined_running: int = 0  # rows admitted while other rows were mid-decode (continuous batching)
    max_batch_size_seen: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    weight_updates: int = 0
    aborted: int = 0
    retracted: int = 0
    # rows the worker took in: less requests_served, the rows it holds (waiting or running), exactly
    requests_received: int = 0
    # Worker seconds (wall) in each stage: where a served step's time goes (benchmarks/engine.py)
    prefill_s: float = 0.0  # prefill forwards
    decode_s: float = 0.0  # decode forwards
    sample_s: float = 0.0  # sampling, appending, stop checks, retiring rows


def _cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class DecodeBatch:
    """Rows decoding together. State after each step: cache of L positions, mask (B, L), and per
    row the last sampled token (not yet fed) and its position."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.rows: list[GenerationRequest] = []
        self.cache: Any = None
        self.mask = torch.zeros(0, 0, dtype=torch.long)  # (B, L)
        self.next_tok = torch.zeros(0, dtype=torch.long)  # (B,)
        self.next_pos = torch.zeros(0, dtype=torch.long)  # (B,)

    def prefill(self, model: torch.nn.Module, rows: list[GenerationRequest]) -> torch.Tensor:
        """Prefill ``rows`` (prompt + any output so far) as a group and merge them in; returns
        their next-token logits (b, V)."""
        seqs = [r.input_ids + r.output_ids for r in rows]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(rows), width, dtype=torch.long)  # (b, T); pad id is masked
        mask = torch.zeros(len(rows), width, dtype=torch.long)  # (b, T)
        for i, s in enumerate(seqs):
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (b, T)
        dev = model.device
        out = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=positions.to(dev), use_cache=True, logits_to_keep=1)
        self._merge(rows, out.past_key_values, mask, positions[:, -1] + 1)
        return out.logits[:, -1, :].float().cpu()

    def _merge(self, rows: list[GenerationRequest], cache: Any, mask: torch.Tensor, next_pos: torch.Tensor) -> None:
        if not self.rows:
            self.rows, self.cache, self.mask, self.next_pos = list(rows), cache, mask, next_pos
            self.next_tok = torch.zeros(len(rows), dtype=torch.long)
            return
        width = max(self.mask.shape[1], mask.shape[1])
        layers = [
            (torch.cat([_left_pad(k0, width, 2), _left_pad(k1, width, 2)]), torch.cat([_left_pad(v0, width, 2), _left_pad(v1, width, 2)]))
            for (k0, v0), (k1, v1) in zip(_cache_layers(self.cache), _cache_layers(cache))
        ]
        self.cache = DynamicCache(ddp_cache_data=layers, config=self.config)
        self.mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(mask, width, 1)])
        self.next_pos = torch.cat([self.next_pos, next_pos])
        self.next_tok = torch.cat([self.next_tok, torch.zeros(len(rows), dtype=torch.long)])
        self.rows += rows

    def decode(self, model: torch.nn.Module) -> torch.Tensor:
        """Feed every row's last sampled token; returns next-token logits (B, V)."""
        self.mask = torch.cat([self.mask, torch.ones(len(self.rows), 1, dtype=torch.long)], dim=1)
        dev = model.device  # the cache lives there; the row bookkeeping stays on the CPU
        out = model(
            input_ids=self.next_tok[:, None].to(dev),
            attention_mask=self.mask.to(dev),
            position_ids=self.next_pos[:, None].to(dev),
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache = out.past_key_values
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1, :].float().cpu()

    def set_next(self, first_row: int, tokens: list[int]) -> None:
        self.next_tok[first_row : first_row + len(tokens)] = torch.tensor(tokens)

    def remove(self, drop: Callable[[GenerationRequest], bool]) -> list[GenerationRequest]:
        """Take the rows matching ``drop`` out of the batch (and their KV rows); return them."""
        gone = [r for r in self.rows if drop(r)]
        if not gone:
            return []
        keep = [i for i, r in enumerate(self.rows) if not drop(r)]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache, self.mask = None, torch.zeros(0, 0, dtype=torch.long)
            self.next_tok = self.next_pos = torch.zeros(0, dtype=torch.long)
            return gone
        idx = torch.tensor(keep)
        self.mask, self.next_tok, self.next_pos = self.mask[idx], self.next_tok[idx], self.next_pos[idx]
        # Leading columns that no remaining row attends to are dead weight in every later step.
        start = int(self.mask.any(0).nonzero()[0])
        self.mask = self.mask[:, start:]
        layers = [(k[idx.to(k.device), :, start:], v[idx.to(v.device), :, start:]) for k, v in _cache_layers(self.cache)]
        self.cache = DynamicCache(ddp_cache_data=layers, config=self.config)
        return gone


class Engine:
    """The model and its single generation worker thread."""

    def __init__(
        self,
        model_path: str,
        max_batch: int,
        weight_version: str,
        request_log: str | None = None,
        forward: str = "auto",
        device: str = "cpu",
        dtype: str = "float32",
        busy_log: str | None = None,
    ) -> None:
        if forward not in FORWARDS:
            raise ValueError(f"forward: must be one of {FORWARDS}, got {forward!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {tuple(DTYPES)}, got {dtype!r}")
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} asked for, and this machine's torch sees no CUDA GPU; use device 'cpu'")
        self.model_path = model_path
        # Optional audit trail: one JSON line per finished generation (ids, logprobs, version), so
        # tests and debugging sessions can check that recorded tokens are the tokens generated.
        self.request_log = open(request_log, "a", buffering=1) if request_log else None
        self.busy = BusySpans(busy_log) if busy_log else None  # when it computes (areal/engine/busy.py)
        self._held: list[GenerationRequest] | None = None  # rows finished in the current tick, answered at its end
        self.max_batch = max_batch
        self.weight_version = weight_version
        # Served on ``device`` in ``dtype``; sampling and the rows' bookkeeping stay on the CPU
        # (the forward hands back fp32 logits there), so a seeded request samples alike anywhere.
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype]).to(device).eval()
        self.device, self.dtype = str(self.model.device), dtype
        self.config = self.model.config
        has_tokenizer = any(os.path.exists(os.path.join(model_path, f)) for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
        self.tokenizer = AutoTokenizer.from_pretrained(model_path) if has_tokenizer else None
        eos: set[int] = set()
        for src in (self.model.generation_config.eos_token_id, self.config.eos_token_id):
            eos.update([src] if is_int(src) else (src or []))
        self.eos_ids = frozenset(eos)
        self.vocab_size = int(self.config.vocab_size)
        self.context_len = int(getattr(self.config, "max_position_embeddings", 32768))
        self.grammars = Grammars(self.tokenizer, self.vocab_size)  # constrained rows' matchers
        self.counters = Counters()
        self.paused = False
        self._queue: queue.Queue[GenerationRequest | WeightUpdate | DistributedUpdate | Control | None] = queue.Queue()
        self._waiting: list[GenerationRequest] = []
        self._updates: list[WeightUpdate | DistributedUpdate] = []
        # Weight-update process groups by name, with the device they receive on; the lock keeps a
        # destroy from racing a receive.
        self._groups: dict[str, tuple[Any, torch.device]] = {}
        self._groups_lock = threading.Lock()
        # The lean forward (model.py) where it covers the architecture, HF's forward otherwise.
        unsupported = lean_unsupported(self.model)
        if forward == "lean" and unsupported is not None:
            raise ValueError(f"forward: 'lean' cannot serve {model_path!r}: {unsupported}")
        self._lean: LeanForward | None = None
        self._batch: DecodeBatch | SlotBatch
        if forward == "hf" or unsupported is not None:
            self.forward = f"hf ({unsupported})" if forward == "auto" else "hf"
            self._batch = DecodeBatch(self.config)
        else:
            self.forward = "lean"
            self._lean = LeanForward(self.model, max_batch)
            self._batch = SlotBatch(self._lean)
        self._worker = threading.Thread(target=self._work, name="generation-worker", daemon=True)
        self._worker.start()

    def alive(self) -> bool:
        return self._worker.is_alive()

    def num_waiting(self) -> int:
        """Requests queued or waiting for admission (a racy snapshot, for reporting only)."""
        return self._queue.qsize() + len(self._waiting)

    def submit(self, item: GenerationRequest | WeightUpdate | DistributedUpdate | Control) -> concurrent.futures.Future:
        """Queue ``item`` for the worker; its future is already running, so cancelling an asyncio
        wrapper of it (a handler whose client went away, a timed-out health probe) leaves it to
        the worker: a cancelled future would raise in the worker's ``set_result`` and fail the
        whole batch. Work is stopped with an abort ``Control``, never by cancelling a future."""
        item.future.set_running_or_notify_cancel()
        self._queue.put(item)
        return item.future

    def init_weights_group(
        self, backend: str, master_address: str, master_port: int, rank: int, world_size: int, group_name: str, timeout_s: float
    ) -> str:
        """Join a weight-update group (blocks until every rank joined; call it off the event loop).

        Generation keeps running meanwhile: joining touches no model state."""
        from areal.weights.collective import join_weight_group  # torch.distributed: only engines that sync this way

        with self._groups_lock:
            if group_name in self._groups:
                raise RequestError(f"weight update group {group_name!r} already exists")
        group = join_weight_group(backend, master_address, master_port, rank, world_size, group_name, timeout_s)
        # NCCL moves CUDA tensors only: receive on the GPU, then copy into the (CPU) model.
        device = torch.device("cuda") if backend == "nccl" else torch.device("cpu")
        with self._groups_lock:
            self._groups[group_name] = (group, device)
        return f"Succeeded to initialize group {group_name!r} as rank {rank} of {world_size} ({backend})."

    def destroy_weights_group(self, group_name: str) -> str:
        from areal.weights.collective import leave_weight_group

        with self._groups_lock:
            if group_name not in self._groups:
                raise RequestError(f"no weight update group named {group_name!r}")
            leave_weight_group(self._groups.pop(group_name)[0])
        return f"Succeeded to destroy group {group_name!r}."

    def shutdown(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=10)

    def decode_text(self, ids: list[int], finish_reason: dict[str, Any] | None) -> str:
        """``text`` as SGLang returns it: special tokens skipped, the matched stop trimmed."""
        if self.tokenizer is None:
            return ""
        matched = (finish_reason or {}).get("matched") if (finish_reason or {}).get("type") == "stop" else None
        if is_int(matched):
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if isinstance(matched, str) and matched in text:
            text = text[: text.index(matched)]
        return text

    # -- worker thread -----------------------------------------------------------------------

    def _has_work(self) -> bool:
        if self._updates and (self.paused or not self._batch.rows):
            return True
        return not self.paused and bool(self._batch.rows or (self._waiting and not self._updates))

    def _work(self) -> None:
        with torch.inference_mode():
            self._loop()

    def _loop(self) -> None:
        while True:
            if self.busy is not None and not self._has_work():
                self.busy.flush()  # about to block: the span so far is over
            item = self._queue.get() if not self._has_work() else self._next_nowait()
            while item is not False:
                if item is None:
                    self._fail_all(RuntimeError("engine is shutting down"))
                    if self.busy is not None:
                        self.busy.close()
                    return
                self._accept(item)
                item = self._next_nowait()
            # Worker boundary: a failure answers the affected requests with an error instead of
            # killing the thread; the batch is dropped (its cache may be inconsistent).
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 -- converted into error replies
                self._fail_all(exc)

    def _next_nowait(self) -> Any:
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return False

    def _accept(self, item: GenerationRequest | WeightUpdate | DistributedUpdate | Control) -> None:
        if isinstance(item, GenerationRequest):
            self.counters.requests_received += 1
            self._waiting.append(item)
        elif isinstance(item, (WeightUpdate, DistributedUpdate)):
            self._updates.append(item)
        elif item.kind == "pause":
            self.paused = True
            if item.mode == "abort":
                self._abort(lambda r: True)
            elif item.mode == "retract":
                retracted = self._batch.remove(lambda r: True)
                self.counters.retracted += len(retracted)
                self._waiting[:0] = retracted  # first in line after continue
            item.future.set_result(None)
        elif item.kind == "continue":
            self.paused = False
            item.future.set_result(None)
        elif item.kind == "abort":
            self._abort(lambda r: item.abort_all or r.rid.startswith(item.rid))
            item.future.set_result(None)
        else:
            raise ValueError(f"unknown control kind {item.kind!r}")

    def _abort(self, match: Callable[[GenerationRequest], bool]) -> None:
        for r in self._batch.rows:
            if match(r):
                r.finish_reason = abort_reason(ABORT_RUNNING)
        for r in [r for r in self._waiting if match(r)]:
            self._waiting.remove(r)
            r.finish_reason = abort_reason(ABORT_WAITING)
            self._finish(r)
        for r in self._batch.remove(lambda r: r.finish_reason is not None):
            self._finish(r)

    def _tick(self) -> None:
        """One step of work. What it finishes is answered only after its busy span is written, so a
        caller that got its answer finds the span that produced it already logged."""
        self._held = []
        try:
            self._step()
        finally:
            held, self._held = self._held, None
            for r in held:
                self._deliver(r)

    def _step(self) -> None:
        if self._updates and (self.paused or not self._batch.rows):
            for upd in self._updates:
                began = time.time()
                try:
                    load = self._load_weights if isinstance(upd, WeightUpdate) else self._receive_weights
                    answer, failure = load(upd), None
                except Exception as exc:  # noqa: BLE001 -- a failed load answers 400, the old weights keep serving
                    answer, failure = None, exc
                if self.busy is not None:
                    self.busy.add("load", began, time.time())
                if failure is None:
                    upd.future.set_result(answer)
                else:
                    upd.future.set_exception(failure)
            self._updates.clear()
        if self.paused:
            return
        c = self.counters
        room = self.max_batch - len(self._batch.rows)
        began = time.time()
        admitted = bool(self._waiting and room > 0 and not self._updates)
        if admitted:
            group, self._waiting = self._waiting[:room], self._waiting[room:]
            self._admit(group)
        if not self._batch.rows:
            if admitted and self.busy is not None:  # the prefill finished every row it admitted
                self.busy.add("generate", began, time.time())
            return
        start = time.perf_counter()
        logits = self._batch.decode(self.model)
        forwarded = time.perf_counter()
        c.decode_steps += 1
        self._sample_into(logits, 0, self._batch.rows)
        for r in self._batch.remove(lambda r: r.finish_reason is not None):
            self._finish(r)
        c.decode_s += forwarded - start
        c.sample_s += time.perf_counter() - forwarded
        if self.busy is not None:
            self.busy.add("generate", began, time.time())

    def _admit(self, group: list[GenerationRequest]) -> None:
        c = self.counters
        live = []
        for r in group:
            if not r.admitted:
                r.admitted = True
                r.stops = r.params.stop_token_ids | (frozenset() if r.params.ignore_eos else self.eos_ids)
                r.generator = RowRandom(r.params.sampling_seed)
                c.prompt_tokens += len(r.input_ids)
            if len(r.output_ids) >= r.params.max_new_tokens:  # max_new_tokens == 0
                r.weight_version = self.weight_version
                r.finish_reason = {"type": "length", "length": r.params.max_new_tokens}
                self._finish(r)
            else:
                live.append(r)
        if not live:
            return
        c.batches_run += 1
        c.joined_running += len(live) if self._batch.rows else 0
        first = len(self._batch.rows)
        start = time.perf_counter()
        logits = self._batch.prefill(self.model, live)
        c.prefill_s += time.perf_counter() - start
        c.max_batch_size_seen = max(c.max_batch_size_seen, len(self._batch.rows))
        self._sample_into(logits, first, live)
        # A row whose first token already stopped it leaves now: the decode step that follows
        # must not sample a token after its stop token.
        for r in self._batch.remove(lambda r: r.finish_reason is not None):
            self._finish(r)

    def _sample_into(self, logits: torch.Tensor, first: int, rows: list[GenerationRequest]) -> None:
        """Sample one token for ``rows`` (batch rows first..), append it, check stopping."""
        top_n = max(r.top_logprobs_num for r in rows)
        if any(r.grammar is not None for r in rows):  # sampled from the masked distribution (grammar.py)
            mask_logits(logits, [r.grammar for r in rows], [r.stops for r in rows], self.grammars.eos_ids)
        s = sample_next(logits, [r.params for r in rows], [r.generator.draw() for r in rows], top_n)
        self._batch.set_next(first, s.tokens)
        for i, r in enumerate(rows):
            tok = s.tokens[i]
            r.output_ids.append(tok)
            r.logprobs.append(s.logprobs[i])
            if r.top_logprobs_num:
                top = [max(v, TOP_LOGPROB_FLOOR) for v in s.top_logprobs[i][: r.top_logprobs_num]]  # a masked token's -inf
                r.top_logprobs.append(list(zip(top, s.top_ids[i][: r.top_logprobs_num])))
            if r.weight_version != self.weight_version and len(r.output_ids) > 1:
                r.version_changes.append((r.weight_version, len(r.output_ids) - 1))
            r.weight_version = self.weight_version
            self.counters.tokens_generated += 1
            matched = self._matched_stop_string(r)
            if tok in r.stops:
                r.finish_reason = {"type": "stop", "matched": tok}
            elif matched is not None:
                r.finish_reason = {"type": "stop", "matched": matched}
            elif r.grammar is not None and (ended := advance(r.grammar, tok, r.stops)) is not None:
                r.finish_reason = ended
            elif len(r.output_ids) >= r.params.max_new_tokens:
                r.finish_reason = {"type": "length", "length": r.params.max_new_tokens}
            r.notify()

    def _matched_stop_string(self, r: GenerationRequest) -> str | None:
        if not r.params.stop or self.tokenizer is None:
            return None
        # Like SGLang: decode a tail long enough to hold the longest stop string.
        tail = self.tokenizer.decode(r.output_ids[-(max(len(s) for s in r.params.stop) + 1) :])
        return next((s for s in r.params.stop if s in tail), None)

    def _finish(self, r: GenerationRequest) -> None:
        c = self.counters
        c.requests_served += 1
        c.aborted += (r.finish_reason or {}).get("type") == "abort"
        if self.request_log is not None:
            self.request_log.write(
                json_line(
                    {
                        "rid": r.rid,
                        "input_ids": r.input_ids,
                        "output_ids": r.output_ids,
                        "output_logprobs": r.logprobs,
                        "weight_version": r.weight_version,
                    }
                )
            )
        if self._held is not None:  # inside a tick: answered when its span is written
            self._held.append(r)
        else:
            self._deliver(r)

    @staticmethod
    def _deliver(r: GenerationRequest) -> None:
        r.future.set_result(r)
        r.notify()

    def _fail_all(self, exc: BaseException) -> None:
        rows = self._batch.remove(lambda r: True) + self._waiting
        self._waiting = []
        for r in rows:
            if not r.future.done():
                r.future.set_exception(exc)
                r.notify()

    def _load_weights(self, upd: WeightUpdate) -> str:
        files = sorted(glob.glob(os.path.join(upd.model_path, "*.safetensors")))
        if not files:
            raise RequestError(f"no *.safetensors weights in {upd.model_path!r}")
        loaded: dict[str, torch.Tensor] = {}
        for f in files:
            loaded.update(load_file(f))
        self._copy_weights(loaded, f"weights in {upd.model_path!r}", partial=False)
        self.model_path = upd.model_path
        if upd.weight_version is not None:
            self.weight_version = upd.weight_version
        self.counters.weight_updates += 1
        return f"Succeeded to update model weights from {upd.model_path}."

    def _receive_weights(self, upd: DistributedUpdate) -> str:
        """Receive every broadcast in list order (all of them, so the group stays in step with the
        sender even when a name turns out to be wrong), then check and load, as from disk."""
        import torch.distributed as dist

        with self._groups_lock:
            if upd.group_name not in self._groups:
                raise RequestError(f"no weight update group named {upd.group_name!r}")
            group, device = self._groups[upd.group_name]
            loaded: dict[str, torch.Tensor] = {}
            for name, dtype, shape in zip(upd.names, upd.dtypes, upd.shapes):
                t = torch.empty(shape, dtype=dtype, device=device)
                dist.broadcast(t, src=0, group=group)
                loaded[name] = t
        # A subset is fine (SGLang loads whatever names arrive); unknown names and shapes are not.
        self._copy_weights(loaded, f"weights broadcast over {upd.group_name!r}", partial=True)
        if upd.weight_version is not None:
            self.weight_version = upd.weight_version
        self.counters.weight_updates += 1
        return f"Succeeded to update parameter online from {upd.group_name!r} ({len(loaded)} tensors)."

    def _copy_weights(self, loaded: dict[str, torch.Tensor], source: str, partial: bool) -> None:
        state = self.model.state_dict()
        # Check everything before copying anything, so bad weights leave the old weights serving.
        missing = [] if partial else [n for n, _ in self.model.named_parameters() if n not in loaded]
        unknown = [n for n in loaded if n not in state]
        bad_shape = [n for n, t in loaded.items() if n in state and t.shape != state[n].shape]
        if missing or unknown or bad_shape:
            raise RequestError(
                f"{source} do not match the served architecture: missing={missing[:5]} unknown={unknown[:5]} shape_mismatch={bad_shape[:5]}"
            )
        with torch.no_grad():
            for name, tensor in loaded.items():
                state[name].copy_(tensor)  # in place (and cast to the served dtype): no re-init, same storage
        if self._lean is not None:
            self._lean.refresh()  # its fused projections are copies of the old weights
