"""The token-tracking gateway: one request core behind ZeroMQ and HTTP front doors.

    agent (sandbox relay, httpx ZmqTransport) --GatewayRequest--> ROUTER ipc:// ─┐
    anything else (inline agents, curl)       --HTTP----------->  aiohttp      ─┤
                                                                                ▼
                                     Gateway.handle(GatewayRequest) -> GatewayReply
                                       auth (session key) → route → chat template → input_ids
                                       → EngineClient.generate (SGLang /generate) → Interaction

Invariants:
- Every completion the gateway returns is recorded in its session as an ``Interaction`` holding
  the exact prompt ids sent to the engine, the exact output ids it sampled (stop token included,
  as SGLang returns them), the engine's logprob of each, and the policy version that sampled
  them. The trainer trains on these ids, never on re-tokenised text.
- A session is opened by the controller (in-process) and is the only thing a key unlocks; an
  unknown or closed key gets 401. Closing a session returns its interactions exactly once.
- Bad input is answered with a 4xx in the OpenAI error shape; an unreachable engine is a 503.
  Nothing raised while serving one request reaches the server loops.

Covered here: OpenAI Chat Completions without streaming or tools. Later work adds streaming,
tool-call parsing, the Responses and Anthropic APIs, and incremental multi-turn prompts.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from aiohttp import web

from areal.engine.client import EngineClient, EngineError, EngineUnavailable
from areal.protocol import GatewayMessage, GatewayReply, GatewayRequest


@dataclass
class GatewayConfig:
    """Limits and names the gateway enforces on every request."""

    model_name: str = "areal"  # what /v1/models lists; the `model` field of requests is not checked
    context_length: int = 2048  # prompt + max_tokens must fit, else 400 naming the limit
    max_tokens_cap: int = 1024  # largest max_tokens a request may ask for
    default_max_tokens: int = 256  # used when a request names no max_tokens
    max_body_bytes: int = 4 << 20
    max_messages: int = 512

    def __post_init__(self) -> None:
        for name in ("context_length", "max_tokens_cap", "default_max_tokens", "max_body_bytes", "max_messages"):
            if getattr(self, name) <= 0:
                raise ValueError(f"gateway.{name} must be positive, got {getattr(self, name)}")
        if self.default_max_tokens > self.max_tokens_cap:
            raise ValueError("gateway.default_max_tokens must not exceed gateway.max_tokens_cap")


class Interaction(msgspec.Struct):
    """One completion, token by token, as the engine produced it."""

    id: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    version: int  # policy version (the engine's weight_version) that sampled output_ids
    finish_reason: str
    created: float
    reward: float | None = None


@dataclass
class Session:
    key: str
    episode_id: str
    interactions: dict[str, Interaction] = field(default_factory=dict)  # insertion = call order


class RequestError(Exception):
    """A request the gateway refuses; becomes an error reply in the API's own shape."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


# Chat Completions parameters: the ones honoured, and the ones accepted because they change
# nothing for a single non-streamed choice. Anything else is a 400 rather than a silent ignore.
_HONOURED = {"messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p"}
_NEUTRAL = {"user", "metadata", "store", "n", "stream"}


def parse_version(weight_version: str) -> int:
    """SGLang reports weight_version as a string ('default' before any update)."""
    return int(weight_version) if weight_version.isdigit() else 0


class Gateway:
    """The request core. Not thread-safe: use it from one event loop."""

    def __init__(self, engine: EngineClient, tokenizer: Any, config: GatewayConfig | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config or GatewayConfig()
        self.sessions: dict[str, Session] = {}
        self.stop_token_ids = sorted(
            {t for t in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")) if isinstance(t, int) and t >= 0}
        )
        self._n_calls = 0

    # ---- sessions (controller side, in-process) -------------------------------------------

    def open_session(self, episode_id: str) -> str:
        key = "sk-areal-" + secrets.token_urlsafe(24)
        self.sessions[key] = Session(key=key, episode_id=episode_id)
        return key

    def close_session(self, key: str) -> Session:
        return self.sessions.pop(key)

    # ---- the request core -----------------------------------------------------------------

    async def handle(self, req: GatewayRequest) -> GatewayReply:
        try:
            status, payload = await self._route(req)
        except RequestError as e:
            status, payload = e.status, _openai_error(e.message, e.kind, e.param)
        except EngineUnavailable as e:
            status, payload = 503, _openai_error(f"inference engine unavailable: {e}", "engine_unavailable")
        except EngineError as e:
            status, payload = 502, _openai_error(f"inference engine error: {e}", "engine_error")
        return GatewayReply(
            request_id=req.request_id,
            status=status,
            headers={"content-type": "application/json"},
            body=json.dumps(payload).encode(),
        )

    async def _route(self, req: GatewayRequest) -> tuple[int, dict]:
        path = req.path.split("?", 1)[0].rstrip("/")
        if len(req.body) > self.config.max_body_bytes:
            raise RequestError(413, f"request body of {len(req.body)} bytes exceeds the limit of {self.config.max_body_bytes}")
        match (req.method, path):
            case ("POST", "/v1/chat/completions"):
                session = self._authenticate(req)
                return 200, await self._chat_completions(session, _json_object(req.body))
            case ("GET", "/v1/models"):
                self._authenticate(req)
                return 200, {"object": "list", "data": [{"id": self.config.model_name, "object": "model", "owned_by": "areal"}]}
            case ("GET", "/health"):
                return 200, {"status": "ok"}
            case _:
                raise RequestError(404, f"no route for {req.method} {path}", kind="not_found_error")

    def _authenticate(self, req: GatewayRequest) -> Session:
        auth = req.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else req.headers.get("x-api-key", "")
        session = self.sessions.get(key)
        if session is None:
            raise RequestError(401, "unknown or expired API key", kind="authentication_error")
        return session

    async def _chat_completions(self, session: Session, body: dict) -> dict:
        unknown = sorted(set(body) - _HONOURED - _NEUTRAL)
        if unknown:
            raise RequestError(400, f"unsupported parameter(s): {', '.join(unknown)}", param=unknown[0])
        if body.get("stream"):
            raise RequestError(400, "stream=true is not supported by this gateway yet", param="stream")
        if body.get("n", 1) != 1:
            raise RequestError(400, "only n=1 is supported", param="n")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError(400, "messages must be a non-empty list of message objects", param="messages")
        if len(messages) > self.config.max_messages:
            raise RequestError(400, f"{len(messages)} messages exceed the limit of {self.config.max_messages}", param="messages")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) or self.config.default_max_tokens
        temperature = body.get("temperature", 1.0)
        top_p = body.get("top_p", 1.0)
        _check_number("max_tokens", max_tokens, 1, self.config.max_tokens_cap, integer=True)
        _check_number("temperature", temperature, 0.0, 2.0)
        _check_number("top_p", top_p, 1e-9, 1.0)

        prompt_ids = self._render(messages)
        if len(prompt_ids) + max_tokens > self.config.context_length:
            raise RequestError(
                400,
                f"prompt of {len(prompt_ids)} tokens plus max_tokens {max_tokens} exceeds the context length "
                f"of {self.config.context_length}",
                param="messages",
            )
        self._n_calls += 1
        result = await self.engine.generate(
            prompt_ids,
            {"max_new_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "stop_token_ids": self.stop_token_ids},
            return_logprob=True,
        )
        interaction = Interaction(
            id=f"chatcmpl-{secrets.token_hex(12)}",
            prompt_ids=prompt_ids,
            output_ids=list(result.output_ids),
            output_logprobs=list(result.output_logprobs),
            version=parse_version(result.weight_version),
            finish_reason=result.finish_reason,
            created=time.time(),
        )
        session.interactions[interaction.id] = interaction
        text = self.tokenizer.decode(result.output_ids, skip_special_tokens=True)
        return {
            "id": interaction.id,
            "object": "chat.completion",
            "created": int(interaction.created),
            "model": body.get("model") or self.config.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length" if result.finish_reason == "length" else "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(result.output_ids),
                "total_tokens": len(prompt_ids) + len(result.output_ids),
            },
        }

    def _render(self, messages: list[dict]) -> list[int]:
        for i, m in enumerate(messages):
            if m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
                raise RequestError(400, f"messages[{i}].role must be system, user, assistant or tool", param=f"messages[{i}].role")
            if not isinstance(m.get("content", ""), (str, list, type(None))):
                raise RequestError(400, f"messages[{i}].content must be a string or a list of parts", param=f"messages[{i}].content")
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)


def _json_object(body: bytes) -> dict:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise RequestError(400, "request body must be a JSON object")
    return obj


def _check_number(name: str, value: Any, lo: float, hi: float, integer: bool = False) -> None:
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise RequestError(400, f"{name} must be {kind} in [{lo}, {hi}], got {value!r}", param=name)


def _openai_error(message: str, kind: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


# ---- front doors ---------------------------------------------------------------------------

_decoder = msgspec.msgpack.Decoder(GatewayMessage)
_encoder = msgspec.msgpack.Encoder()


async def serve_zmq(gateway: Gateway, address: str, ready: asyncio.Event | None = None) -> None:
    """Serve GatewayRequests on a ROUTER socket until cancelled.

    Receives are drained non-blocking after each poll (several times faster than one awaited
    recv per message); every request is handled in its own task so a slow engine call never
    blocks the socket.
    """
    ctx = zmq.asyncio.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    tasks: set[asyncio.Task] = set()

    async def answer(identity: bytes, payload: bytes) -> None:
        try:
            req = _decoder.decode(payload)
        except msgspec.DecodeError as e:
            reply = GatewayReply(request_id=-1, status=400, headers={}, body=json.dumps(_openai_error(f"bad frame: {e}", "invalid_request_error")).encode())
        else:
            if not isinstance(req, GatewayRequest):
                return
            reply = await gateway.handle(req)
        await sock.send_multipart([identity, _encoder.encode(reply)])

    if ready is not None:
        ready.set()
    try:
        while True:
            await sock.poll(zmq.POLLIN)
            while True:
                try:  # an asyncio socket's non-blocking recv resolves at once or raises Again
                    frames = await sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if len(frames) != 2:
                    continue  # not a DEALER with one payload frame; nothing to answer
                task = asyncio.ensure_future(answer(frames[0], frames[1]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
    finally:
        for t in tasks:
            t.cancel()
        sock.close(0)


async def serve_http(gateway: Gateway, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Start the HTTP front door; returns the runner (call ``cleanup()``) and its base URL."""
    counter = iter(range(1 << 62))

    async def any_route(request: web.Request) -> web.Response:
        body = await request.read()
        req = GatewayRequest(
            request_id=next(counter),
            method=request.method,
            path=request.path_qs,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
        )
        reply = await gateway.handle(req)
        return web.Response(status=reply.status, body=reply.body, headers=reply.headers)

    app = web.Application(client_max_size=gateway.config.max_body_bytes + 1024)
    app.router.add_route("*", "/{tail:.*}", any_route)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # aiohttp exposes no public accessor
    return runner, f"http://{host}:{bound}"
