"""The token-tracking gateway's request core: sessions, routing, completions, rewards.

    agent (sandbox relay, httpx ZmqTransport) --GatewayRequest--> ROUTER ipc:// ─┐  (server.py)
    anything else (inline agents, curl, ArealOpenAI in-process) --HTTP/httpx----─┤
                                                                                 ▼
      Gateway.dispatch(GatewayRequest) -> Reply (JSON body, or an SSE byte stream)
        auth (session key | admin key) → route → front-end (chat.py, responses.py, anthropic.py)
        → Turn → Gateway.complete / complete_stream → PromptBuilder (render.py) → input_ids
        → engine.generate / generate_stream (SGLang /generate) → parse → Interaction (tree.py)

Invariants:
- Every choice the gateway returns is recorded in its session as an ``Interaction`` holding the
  exact prompt ids sent to the engine, the exact output ids it sampled (stop token included, as
  SGLang returns them; cut after a stop string when the gateway applies one), the engine's
  logprob of each, the policy version, and the parent interaction whose tokens it extends.
- A session key unlocks that session only: one session can neither read nor reward another's
  interactions. Controller operations over HTTP need the admin key. A closed key gets 401; an
  idle session expires after ``session_idle_s`` and is kept in ``expired`` until the controller
  collects it with ``close_session`` (reported, never silently dropped).
- Bad input is a 4xx in the API's own error shape (Anthropic's on /v1/messages, OpenAI's
  elsewhere); an unreachable engine is a 503. Nothing raised while serving one request reaches
  the server loops, and a refused request records nothing.

``tool_choice`` "required" or a named function is honoured by a forced prefix, not by constrained
decoding: the opening of a tool call in the model's format (``parsers.forced_tool_prefix``; for
Qwen/Hermes ``<tool_call>\n``, or through ``"arguments": `` for a named function) is appended to
the prompt ids and the engine continues from it. Those ids are recorded as the end of the
Interaction's prompt (not sampled: loss mask 0, no logprob); the text parsed and returned is the
forced text + the sampled text. What the model writes inside the call is not constrained: a call
that does not parse comes back as text. A named function not in ``tools`` is a 400.

Deliberately not honoured: streaming needs an engine with ``generate_stream``; without one,
``stream`` is a 400.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from areal.gateway import tree
from areal.gateway.contract import Choice, ChoiceDelta, Reply, RequestError, Turn
from areal.gateway.generation import (choice_ids, engine_kwargs, engine_params, finish_choice, forced_text,
                                      stream_choices, text_decoder, validate_turn)
from areal.gateway.parsers import REASONING_PARSERS, TOOL_PARSERS
from areal.gateway.render import Prompt, PromptBuilder, PromptIndex
from areal.gateway.tree import Interaction
from areal.protocol import GatewayRequest


@dataclass
class GatewayConfig:
    """Limits and names the gateway enforces on every request."""

    model_name: str = "areal"  # what /v1/models lists; the `model` field of requests is not checked
    context_length: int = 2048  # prompt + max_tokens must fit, else 400 naming the limit
    max_tokens_cap: int = 1024  # largest max_tokens a request may ask for
    default_max_tokens: int = 256  # used when a request names no max_tokens
    max_body_bytes: int = 4 << 20
    max_messages: int = 512
    max_n: int = 16  # largest n (choices per request)
    admin_key: str = ""  # controller operations over HTTP; "" draws a random one (Gateway.admin_key)
    session_idle_s: float = 3600.0  # a session unused this long expires (0 = never)
    tool_parser: str | None = "qwen25"  # tool-call format of the model (parsers.TOOL_PARSERS); None: no tool calls
    reasoning_parser: str | None = "think"  # reasoning format (parsers.REASONING_PARSERS); None: all text is content

    def __post_init__(self) -> None:
        for name in ("context_length", "max_tokens_cap", "default_max_tokens", "max_body_bytes", "max_messages", "max_n"):
            if getattr(self, name) <= 0:
                raise ValueError(f"gateway.{name} must be positive, got {getattr(self, name)}")
        if self.default_max_tokens > self.max_tokens_cap:
            raise ValueError("gateway.default_max_tokens must not exceed gateway.max_tokens_cap")
        if self.session_idle_s < 0:
            raise ValueError(f"gateway.session_idle_s must be >= 0, got {self.session_idle_s}")
        if self.tool_parser is not None and self.tool_parser not in TOOL_PARSERS:
            raise ValueError(f"gateway.tool_parser must be one of {TOOL_PARSERS} or None, got {self.tool_parser!r}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"gateway.reasoning_parser must be one of {REASONING_PARSERS} or None, got {self.reasoning_parser!r}")
        if self.admin_key and len(self.admin_key) < 16:
            raise ValueError("gateway.admin_key must be at least 16 characters (or empty for a random one)")


@dataclass
class Session:
    key: str
    episode_id: str
    interactions: dict[str, Interaction] = field(default_factory=dict)  # insertion = call order
    store: dict[str, Any] = field(default_factory=dict)  # scratch space for front-ends
    index: PromptIndex = field(default_factory=PromptIndex)
    last_used: float = field(default_factory=time.monotonic)
    expired: bool = False

    @property
    def drift(self) -> int:
        """Follow-up calls whose history matched no recorded reply (each started a new branch)."""
        return self.index.drift

    def set_reward(self, interaction_id: str, reward: float) -> None:
        tree.set_reward(self.interactions, interaction_id, reward)

    def set_final_reward(self, reward: float) -> str:
        return tree.set_final_reward(self.interactions, reward)

    set_last_reward = set_final_reward

    def apply_reward_discount(self, turn_discount: float = 1.0) -> None:
        tree.apply_reward_discount(self.interactions, turn_discount)

    def export_interactions(self, style: str = "individual") -> dict[str, tree.InteractionWithTokenLogpReward]:
        return tree.export_interactions(self.interactions, style)


class Gateway:
    """The request core. Not thread-safe: use it from one event loop."""

    def __init__(self, engine: Any, tokenizer: Any, config: GatewayConfig | None = None):
        self.engine = engine  # an EngineClient, or anything with its generate (and generate_stream)
        self.tokenizer = tokenizer
        self.config = config or GatewayConfig()
        self.admin_key = self.config.admin_key or "sk-admin-" + secrets.token_urlsafe(24)
        self.sessions: dict[str, Session] = {}
        self.expired: dict[str, Session] = {}  # expired, not yet collected by close_session
        self.stop_token_ids = sorted(
            {t for t in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")) if isinstance(t, int) and t >= 0}
        )
        self.prompts = PromptBuilder(tokenizer, self.stop_token_ids)
        self.decode_text = text_decoder(tokenizer)  # ids -> text without special tokens (what clients see)
        self._n_calls = 0
        self._next_sweep = 0.0

    # ---- sessions (controller side, in-process) -------------------------------------------

    def open_session(self, episode_id: str) -> str:
        key = "sk-areal-" + secrets.token_urlsafe(24)
        self.sessions[key] = Session(key=key, episode_id=episode_id)
        return key

    def close_session(self, key: str) -> Session:
        """Remove and return a session, live or expired; KeyError if neither."""
        session = self.sessions.pop(key, None) or self.expired.pop(key)
        return session

    def expire_idle(self, now: float | None = None) -> list[Session]:
        """Move sessions idle for longer than ``session_idle_s`` to ``expired``; returns them."""
        if self.config.session_idle_s <= 0:
            return []
        now = time.monotonic() if now is None else now
        gone = [s for s in self.sessions.values() if now - s.last_used > self.config.session_idle_s]
        for s in gone:
            s.expired = True
            self.expired[s.key] = self.sessions.pop(s.key)
        return gone

    def metrics(self) -> dict[str, float]:
        live = list(self.sessions.values())
        return {
            "sessions": len(live),
            "expired_sessions": len(self.expired),
            "calls": self._n_calls,
            "drift": sum(s.index.drift for s in live),
            "incremental_prompts": sum(s.index.incremental for s in live),
            "full_prompts": sum(s.index.full for s in live),
        }

    def session_for(self, key: str) -> Session:
        now = time.monotonic()
        if now >= self._next_sweep:  # sweeping is O(sessions): at most once a second
            self.expire_idle(now)
            self._next_sweep = now + 1.0
        session = self.sessions.get(key)
        if session is None:
            expired = key in self.expired
            raise RequestError(401, "session expired (idle too long)" if expired else "unknown or expired API key",
                               kind="authentication_error")
        session.last_used = now
        return session

    # ---- completions (what the front-ends call) ---------------------------------------------

    def _prepare(self, session: Session, turn: Turn) -> tuple[Prompt, dict, str]:
        """(prompt, engine params, forced text); a forced tool-call opening's ids end the prompt."""
        validate_turn(turn, self.config)
        prompt = self.prompts.build(session.index, session.interactions, turn.messages, turn.tools)
        forced = forced_text(turn, self.config)
        if forced:  # not sampled: recorded as prompt (loss mask 0), so a follow-up extends it exactly
            prompt.ids = prompt.ids + self.prompts.encode(forced)  # a new list: build's may be cached
        s = turn.sampling
        if len(prompt.ids) + s.max_tokens > self.config.context_length:
            raise RequestError(
                400,
                f"prompt of {len(prompt.ids)} tokens plus max_tokens {s.max_tokens} exceeds the context length "
                f"of {self.config.context_length}",
                param="messages",
            )
        params: dict[str, Any] = {"max_new_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p,
                                  "stop_token_ids": self.stop_token_ids}
        if s.stop:  # the engine stops early; the gateway still cuts (generation.py), idempotently
            params["stop"] = list(s.stop)
        return prompt, params, forced

    async def complete(self, session: Session, turn: Turn, *, response_id: str | None = None) -> list[Choice]:
        """All n choices, recorded; choice 0's interaction id is ``response_id`` when given."""
        prompt, params, forced = self._prepare(session, turn)
        s = turn.sampling
        self._n_calls += 1
        calls = [self.engine.generate(prompt.ids, engine_params(params, s.seed, i), return_logprob=True, **engine_kwargs(turn))
                 for i in range(s.n)]
        # one choice: awaited directly, sparing gather's task (~10 µs of a ~100 µs request)
        results = [await calls[0]] if s.n == 1 else await asyncio.gather(*calls)
        ids = choice_ids(s.n, response_id)
        return [finish_choice(self, session, turn, prompt, i, ids[i], r, forced) for i, r in enumerate(results)]

    def complete_stream(self, session: Session, turn: Turn, *, response_id: str | None = None) -> AsyncIterator[ChoiceDelta]:
        """Deltas as the engine produces tokens; each choice's "done" delta is its last."""
        if not hasattr(self.engine, "generate_stream"):
            raise RequestError(400, "stream is not supported: the inference engine client has no streaming", param="stream")
        prompt, params, forced = self._prepare(session, turn)
        self._n_calls += 1
        return stream_choices(self, session, turn, prompt, params, choice_ids(turn.sampling.n, response_id), forced)

    # ---- routing --------------------------------------------------------------------------

    async def dispatch(self, req: GatewayRequest) -> Reply:
        """Answer one HTTP exchange; never raises for anything a client can send."""
        from areal.gateway.routes import route  # deferred: routes imports the front-ends, which import this module

        return await route(self, req)

    async def handle(self, req: GatewayRequest) -> Any:
        """One ``GatewayReply`` with the whole body (a stream is collected): for callers that want one."""
        from areal.gateway.server import reply_frames

        frames = [f async for f in reply_frames(self, req)]
        return msgspec.structs.replace(frames[0], body=b"".join(f.body for f in frames), more=False)
