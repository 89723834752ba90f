"""A stand-in for vLLM's server as far as ``/inference/v1/generate``, ``/v1/models`` and ``/health``
go (aiohttp, on loopback), answering in vLLM's token-in token-out shape by a fixed rule
(``script``, ``script_logprob``), so every returned id, logprob and version can be checked exactly.
The vLLM client's tests and the vLLM run's tests (which add the dev routes) use it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from aiohttp import ClientConnectionResetError, web

from areal.engine.vllm import VLLMClient

MODEL = "stand-in"


_ALLOWED = {"model", "token_ids", "sampling_params", "stream", "request_id"}


_ALLOWED_PARAMS = {
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "seed",
    "min_tokens",
    "logprobs",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "spaces_between_special_tokens",
}


def script(prompt: list[int], i: int) -> int:
    """The stand-in's i-th output token for a prompt: deterministic, inside the tiny vocab."""
    return 20 + (sum(prompt) + 7 * i) % 900


def script_logprob(i: int) -> float:
    return -0.25 * (i + 1)


class StandIn:
    """vLLM's server as far as /inference/v1/generate, /v1/models and /health go (no dev routes).

    ``aborts``: for each of the next requests, the number of tokens after which it ends with
    finish_reason "abort" (what ``/pause?mode=abort`` does); the version then becomes
    ``version_after_abort``, as if the trainer had loaded new weights during the pause."""

    def __init__(self, token_delay_s: float = 0.0, version: str = "default") -> None:
        self.token_delay_s = token_delay_s
        self.version = version
        self.aborts: list[int] = []
        self.version_after_abort = version
        self.bodies: list[dict] = []
        self.disconnected: list[str] = []

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        params = body.get("sampling_params") or {}
        unknown = (set(body) - _ALLOWED) | (set(params) - _ALLOWED_PARAMS)
        if unknown or not isinstance(body.get("token_ids"), list) or not body["token_ids"]:
            return web.json_response(
                {"error": {"message": f"bad request: {sorted(unknown)}", "type": "BadRequestError", "param": None, "code": 400}}, status=400
            )
        prompt, k = body["token_ids"], params.get("logprobs")
        stops = set(params.get("stop_token_ids") or [])
        abort_at = self.aborts.pop(0) if self.aborts else None
        tokens, finish = [], "length"
        for i in range(params.get("max_tokens") or 64):
            if i == abort_at:
                finish = "abort"
                break
            tokens.append(script(prompt, i))
            if tokens[-1] in stops and not params.get("ignore_eos"):
                finish = "stop"  # like vLLM: the stop token is part of the output
                break
        version = self.version
        if finish == "abort":
            self.version = self.version_after_abort
        spans = [{"version": version, "start": 0, "end": len(tokens)}] if tokens else []

        def record(i: int) -> dict:
            tok = tokens[i]
            # Like vLLM: the sampled token first, then the rest of the top k, k + 1 entries.
            top = [{"token_id": tok + d, "logprob": script_logprob(i) - d, "rank": d + 1} for d in range((k or 0) + 1)]
            return {"token_id": tok, "logprob": script_logprob(i), "rank": 1, "top_logprobs": top}

        def choice(ids: range, last: bool) -> dict:
            return {
                "index": 0,
                "finish_reason": finish if last else None,
                "stop_reason": None,
                "token_ids": [tokens[i] for i in ids],
                "weight_versions": spans if last else None,
                "logprobs": {"content": [record(i) for i in ids]},
            }

        rid = body.get("request_id", "")
        if not body.get("stream"):
            await asyncio.sleep(self.token_delay_s * len(tokens))
            return web.json_response(
                {
                    "request_id": f"generate-tokens-{rid}",
                    "model": MODEL,
                    "output_mode": "tokens",
                    "choices": [choice(range(len(tokens)), True)],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens)},
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(len(tokens)):
                await asyncio.sleep(self.token_delay_s)
                last = i == len(tokens) - 1 and finish != "abort"
                chunk = {"request_id": f"generate-tokens-{rid}", "output_mode": "tokens", "choices": [choice(range(i, i + 1), last)]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if finish == "abort":  # like vLLM: a last chunk without tokens carries the reason
                chunk = {"request_id": f"generate-tokens-{rid}", "choices": [choice(range(0), True)]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, ClientConnectionResetError, asyncio.CancelledError):
            self.disconnected.append(rid)  # vLLM aborts the request when its client goes away
            raise
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "root": "/models/x", "max_model_len": 512}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def start(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_post("/inference/v1/generate", self.generate)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return runner, f"http://127.0.0.1:{port}"

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[VLLMClient]:
        """A ``VLLMClient`` of this stand-in, started here; on leaving, the client is closed and the
        server stopped."""
        runner, url = await self.start()
        client = VLLMClient(url)
        try:
            yield client
        finally:
            await client.close()
            await runner.cleanup()
