"""The token-tracking gateway's request core: sessions, routing, completions, rewards.

    agent (sandbox relay, httpx ZmqTransport) --GatewayRequest--> ROUTER ipc:// ─┐  (server.py)
    anything else (inline agents, curl, ArealOpenAI in-process) --HTTP/httpx----─┤
                                                                                 ▼
      routes.route(Gateway, GatewayRequest) -> Reply (JSON body, or an SSE byte stream)
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
  elsewhere; a prompt over the context carries OpenAI's code ``context_length_exceeded``); an
  unreachable engine is a 503. Nothing raised while serving one request reaches
  the server loops, and a refused request records nothing.
- A session's work ends with it. ``close_session`` cancels the engine calls of its requests in
  flight, which aborts them at the engine (``areal.engine.interface``: one still waiting for a
  connection is never sent), and answers those requests 401; nothing is recorded into a session
  after it closed. A request whose client goes away (``server``) has its engine calls cancelled
  the same way.

``tool_choice`` "required" or a named function is honoured by a forced prefix and constrained
decoding: the opening of a tool call in the model's format (``parsers.forced_tool_prefix``; for
Qwen/Hermes ``<tool_call>\n``, or through ``"arguments": `` for a named function) is appended to
the prompt ids and the engine continues from it under a constraint that finishes exactly one call
with arguments valid under the tool's schema (``structured``; the JSON-bodied formats: for
qwen3_coder and gpt-oss the opening alone is forced). Those ids are recorded as the end of the
Interaction's prompt (not sampled: loss mask 0, no logprob); the text parsed and returned is the
forced text + the sampled text. A named function not in ``tools`` is a 400. A response format
(``response_format``, Responses' ``text.format``) is a constraint of the same kind
(``structured``), sent as SGLang's ``json_schema`` / ``structural_tag`` sampling params.

A prefill (the last message an assistant turn to continue) and a reasoning effort (on the
template's thinking switch) are ``assistant_turn``'s: a prefill's turn is written after the
prompt like a forced opening, recorded as prompt, but neither parsed nor returned.

``tool_choice`` "none" renders the prompt without the request's tools (the model is not offered
what it may not call; vLLM's default too) and parses no calls.

Deliberately not honoured: streaming needs an engine with ``generate_stream``; without one,
``stream`` is a 400.

Work a request may cost (an episode must not starve the gateway, which serves every episode from
one loop): the ZeroMQ door's budgets (connections, bytes held, requests in flight) are in
``server.serve_zmq`` and ``door``. Here, the budgets of a session's whole life, whatever door
its requests take: completions admitted (``max_calls_per_session``) and sampled tokens
(``max_sampled_tokens_per_session``: n x max_tokens charged at admission, what the engine did
not generate refunded as each choice ends, so the charge is the tokens generated plus those
still reserved; a stream cut at a stop string is refunded what it had received, so the few
tokens its abort takes to land go uncharged); over either, a 429 naming the field. A prompt
whose text already holds more characters than the context could hold tokens
(``PromptBuilder.min_tokens``) is a 400 before it is tokenised; text longer than ``tokenize_off_loop_chars`` is tokenised in a worker thread (the Rust
tokenizer releases the GIL), one such text per session at a time, so the loop goes on serving;
the shared render cache is bounded in bytes and a session's entries go when it closes or expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal.gateway import branching, families, tree
from areal.gateway.assistant_turn import apply_reasoning, check_prefill, continuation, history, leaves_reasoning_open
from areal.gateway.contract import Choice, ChoiceDelta, RequestError, Sampling, Turn, context_exceeded
from areal.gateway.generation import (
    all_or_none,
    check_sampling,
    choice_ids,
    engine_kwargs,
    engine_params,
    finish_choice,
    forced_text,
    prompt_choice,
    session_closed,
    stream_choices,
    validate_turn,
)
from areal.gateway.parsers import reasoning_parser_name, tool_parser_name
from areal.gateway.render import Prompt, PromptBuilder, PromptIndex
from areal.gateway.structured import engine_constraint
from areal.gateway.template import tool_template_path, tool_template_source
from areal.gateway.tree import Interaction

if TYPE_CHECKING:
    from areal.gateway.door import Door


@dataclass
class GatewayConfig:
    """Limits and names the gateway enforces on every request."""

    model_name: str = "areal"  # what /v1/models lists; the `model` field of requests is not checked
    # prompt + max_tokens must fit, else 400 naming the limit: the embedded models' positions; a run
    # caps it at its own model's (max_position_embeddings)
    context_length: int = 4096
    max_tokens_cap: int = 1024  # largest max_tokens a request may ask for
    default_max_tokens: int = 256  # used when a request names no max_tokens
    # AReaL's meaning of a limit (its engine_max_tokens): a request's max_tokens is cut to
    # max_tokens_cap and to what the context has left after the prompt, instead of refused
    fit_max_tokens: bool = False
    max_body_bytes: int = 4 << 20
    max_messages: int = 512
    max_n: int = 16  # largest n (choices per request)
    admin_key: str = ""  # controller operations over HTTP; "" draws a random one (Gateway.admin_key)
    session_idle_s: float = 3600.0  # a session unused this long expires (0 = never)
    # tool-call format of the model (parsers.TOOL_PARSERS, or SGLang's / vLLM's name for it); "auto":
    # read off the chat template of requests with tools, tool_template's when set (an error names the
    # field when it cannot be); None: no tool calls
    tool_parser: str | None = "qwen25"
    # the chat template of requests that offer tools, for a model whose own has no tool branch
    # (SmolLM2-Instruct's: without this, a request with tools is a 400 naming this field, never a
    # prompt that silently lacks them): a built-in name (template.TOOL_TEMPLATES: "chatml-tools",
    # tools as JSON in the system turn, calls as <tool_call> JSON for tool_parser qwen25/hermes,
    # results in a tool turn) or the path of a .jinja file. None: the model's own template.
    # Requests without tools always render with the model's own.
    tool_template: str | None = None
    reasoning_parser: str | None = "think"  # reasoning format (parsers.REASONING_PARSERS, or "qwen3", ...); None: all text is content
    # Budgets of the ZeroMQ door (the sandboxes' one way out; ``door.DoorLimits``). A connection
    # counts against its peer process (its pid) until a request on it carries a live session key,
    # then against that session. Over a budget: the connection is closed, or the request answered
    # 429, and a WARNING names the session (its episode id) or the process.
    max_connections: int = 0  # ZeroMQ connections open at once; 0: half the process's soft RLIMIT_NOFILE
    max_connections_per_session: int = 64  # a relay uses one per event loop
    max_buffered_bytes: int = 256 << 20  # partial frames + bodies of requests being served, all together
    max_buffered_bytes_per_session: int = 32 << 20  # the same for one session; at least one largest frame
    max_inflight_per_session: int = 64  # requests of one session being served at once; more: 429
    # Budgets of a session's whole life (any door): a session is one episode. Over one: a 429
    # naming the field. 0: no limit (benchmarks that drive one session without end).
    max_calls_per_session: int = 2048  # completions admitted (a request with n choices is one)
    # sampled tokens: n x max_tokens charged at admission, the unused part refunded as each choice
    # ends; bounds what the engine generates for one episode (512 calls at max_tokens 1024)
    max_sampled_tokens_per_session: int = 1 << 19
    # The door's memory guard (``door``): growth of the process's anonymous memory over its level when
    # the door opened, past which the door cuts the connections that may hold unfinished messages.
    # It must exceed max_buffered_bytes and what the rest of the process may grow by.
    door_memory_bytes: int = 1 << 30
    # Tokenising: text longer than this (characters) is tokenised in a worker thread, one text per
    # session at a time, so a huge prompt does not stall the loop that serves every episode.
    tokenize_off_loop_chars: int = 65536
    tokenize_threads: int = 2  # worker threads for that
    render_cache_bytes: int = 64 << 20  # full renders kept across the sessions that share them (ids at 36 B each)

    @property
    def zmq_frame_bytes(self) -> int:
        """The largest ZMTP frame the door reads: a body twice ``max_body_bytes`` (+ 1 MiB of
        headers) still arrives, to get its 413; past that the connection is dropped unread."""
        return 2 * self.max_body_bytes + (1 << 20)

    def __post_init__(self) -> None:
        for name in (
            "context_length",
            "max_tokens_cap",
            "default_max_tokens",
            "max_body_bytes",
            "max_messages",
            "max_n",
            "max_connections_per_session",
            "max_buffered_bytes",
            "max_buffered_bytes_per_session",
            "door_memory_bytes",
            "max_inflight_per_session",
            "tokenize_off_loop_chars",
            "tokenize_threads",
            "render_cache_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"gateway.{name} must be positive, got {getattr(self, name)}")
        if self.max_connections < 0:
            raise ValueError(f"gateway.max_connections must be >= 0 (0: half of RLIMIT_NOFILE), got {self.max_connections}")
        for name in ("max_calls_per_session", "max_sampled_tokens_per_session"):
            if getattr(self, name) < 0:
                raise ValueError(f"gateway.{name} must be >= 0 (0: no limit), got {getattr(self, name)}")
        if self.max_buffered_bytes_per_session < self.zmq_frame_bytes:
            raise ValueError(
                f"gateway.max_buffered_bytes_per_session ({self.max_buffered_bytes_per_session}) must hold one "
                f"largest frame, 2 * gateway.max_body_bytes + 1 MiB = {self.zmq_frame_bytes} bytes"
            )
        if self.door_memory_bytes < self.max_buffered_bytes:
            raise ValueError(
                f"gateway.door_memory_bytes ({self.door_memory_bytes}) must be at least "
                f"gateway.max_buffered_bytes ({self.max_buffered_bytes}): requests being served count in it"
            )
        if self.max_buffered_bytes < self.max_buffered_bytes_per_session:
            raise ValueError(
                f"gateway.max_buffered_bytes ({self.max_buffered_bytes}) must be at least "
                f"gateway.max_buffered_bytes_per_session ({self.max_buffered_bytes_per_session})"
            )
        if self.default_max_tokens > self.max_tokens_cap:
            raise ValueError("gateway.default_max_tokens must not exceed gateway.max_tokens_cap")
        if self.session_idle_s < 0:
            raise ValueError(f"gateway.session_idle_s must be >= 0, got {self.session_idle_s}")
        # SGLang's and vLLM's names (qwen3, deepseek-r1, llama3_json, ...) become this gateway's own
        self.tool_parser = tool_parser_name(self.tool_parser)
        self.reasoning_parser = reasoning_parser_name(self.reasoning_parser)
        if self.tool_template is not None:
            tool_template_path(self.tool_template)  # a ValueError naming the field
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
    # every request's sampling temperature when set, whatever the agent asks (the run's held-out
    # evaluation of its agent samples at data.eval_temperature, or greedily)
    temperature: float | None = None
    tokenizing: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)  # one off-loop tokenisation at a time
    closed: bool = False  # by close_session: its requests still in flight are answered 401
    # tasks awaiting the engine for it (requests, stream pumps): close_session cancels them
    engine_tasks: set[asyncio.Task] = field(default_factory=set, repr=False)
    calls_made: int = 0  # completions admitted over its life (gateway.max_calls_per_session)
    tokens_charged: int = 0  # generated + still reserved (gateway.max_sampled_tokens_per_session)

    def refund(self, reserved: int, generated: int) -> None:
        """A choice charged ``reserved`` tokens at admission has ended with ``generated``."""
        self.tokens_charged -= max(0, reserved - generated)

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
        config = config or GatewayConfig()
        tool_template = tool_template_source(config.tool_template)  # the text requests with tools render with, or None
        # tool_parser=auto read off the template of requests with tools; stop ids and decoding per model family (families.py)
        self.config = families.resolve(config, tokenizer, tool_template)
        self.admin_key = self.config.admin_key or "sk-admin-" + secrets.token_urlsafe(24)
        self.sessions: dict[str, Session] = {}
        self.expired: dict[str, Session] = {}  # expired, not yet collected by close_session
        self.stop_token_ids = families.stop_token_ids(tokenizer)
        self.prompts = PromptBuilder(
            tokenizer, self.stop_token_ids, cache_bytes=self.config.render_cache_bytes, tool_template=tool_template
        )
        # ids -> text without special tokens (what clients see), but for the markers the parsers read
        self.decode_text = families.text_decoder(tokenizer, self.config.tool_parser, self.config.reasoning_parser)
        self.doors: list[Door] = []  # the ZeroMQ ROUTERs serving this gateway (server.serve_zmq), for metrics
        self.online: Any = None  # a run's external sessions (areal/controller/online.py): its /rl/ routes
        self.branching: Any = None  # a BranchConfig: where episodes branch (areal/gateway/branching.py); None: never
        self._n_calls = 0
        self._next_sweep = 0.0
        self._tokenize_pool: ThreadPoolExecutor | None = None  # started at the first large text
        self._tokenizing = 0  # texts being tokenised off the loop now
        self._tokenized_off_loop = 0

    # ---- sessions (controller side, in-process) -------------------------------------------

    def open_session(self, episode_id: str, temperature: float | None = None, key: str | None = None) -> str:
        """A new session's key; ``temperature``: the one its requests are sampled at (None: theirs).
        ``key``: reuse a key whose session was closed (an online client's refresh), else a new one."""
        if key is None:
            key = "sk-areal-" + secrets.token_urlsafe(24)
        elif key in self.sessions or key in self.expired:
            raise ValueError("a session with this key is still open")
        self.sessions[key] = Session(key=key, episode_id=episode_id, temperature=temperature)
        return key

    def close_session(self, key: str) -> Session:
        """Remove and return a session, live or expired; KeyError if neither. Its engine calls
        in flight are cancelled, which aborts them at the engine: its episode is over, and what
        it still asked for would only keep other episodes waiting."""
        session = self.sessions.pop(key, None) or self.expired.pop(key)
        self.prompts.release(session.index)
        session.closed = True
        for task in session.engine_tasks:
            task.cancel()
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
            self.prompts.release(s.index)  # it serves no more requests: its cached renders go now
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
            "render_cache_entries": len(self.prompts.cache),
            "render_cache_bytes": self.prompts.cache_bytes,
            "tokenizing_off_loop": self._tokenizing,
            "tokenized_off_loop": self._tokenized_off_loop,
            "awaiting_engine": sum(len(s.engine_tasks) for s in live),  # requests and stream choices
            "zmq_connections": sum(d.open for d in self.doors),
            "zmq_inflight_bytes": sum(d.inflight_bytes for d in self.doors),
            "zmq_cut_off": sum(d.cut for d in self.doors),
            "zmq_cut_for_memory": sum(d.memory_cuts for d in self.doors),
        }

    def session_for(self, key: str) -> Session:
        now = time.monotonic()
        if now >= self._next_sweep:  # sweeping is O(sessions): at most once a second
            self.expire_idle(now)
            self._next_sweep = now + 1.0
        session = self.sessions.get(key)
        if session is None:
            expired = key in self.expired
            raise RequestError(
                401, "session expired (idle too long)" if expired else "unknown or expired API key", kind="authentication_error"
            )
        session.last_used = now
        return session

    # ---- completions (what the front-ends call) ---------------------------------------------

    async def _prepare(self, session: Session, turn: Turn) -> tuple[Prompt, dict, str]:
        """(prompt, engine params, forced text); a forced tool-call opening's ids end the prompt.
        A prompt that cannot fit is refused before its text is tokenised when its characters
        alone show it, else once its ids are counted."""
        s, context, fit = turn.sampling, self.config.context_length, self.config.fit_max_tokens
        if fit and type(s.max_tokens) is int:
            s.max_tokens = min(s.max_tokens, self.config.max_tokens_cap)
        tools = self._validate(turn)
        plan = self.prompts.plan(session.index, session.interactions, history(turn), tools, turn.chat_template_kwargs)
        floor = plan.known + self.prompts.min_tokens(plan.text)
        if floor + (1 if fit else s.max_tokens) > context:
            raise context_exceeded(
                f"prompt of {len(plan.text)} characters to tokenise after {plan.known} tokens (at least {floor} tokens: "
                f"no token stands for more than {self.prompts.chars_per_token} characters) plus max_tokens {s.max_tokens} "
                f"exceeds the context length of {context}"
            )
        tail = await self._tokenize(session, plan.text) if plan.text else []
        forced = forced_text(turn, self.config)
        # what the gateway writes after the prompt: a forced tool-call opening, or a prefill's turn (assistant_turn)
        written = continuation(self.prompts, turn, tools) if turn.continue_final else forced
        forced_ids = self.prompts.encode(written) if written else []
        size = plan.known + len(tail) + len(forced_ids)
        if fit and size < context:
            s.max_tokens = min(s.max_tokens, context - size)
        # kept for the sessions sharing it only if accepted, and for a session still open (one closed
        # or expired meanwhile has had its entries released already)
        keep = size + s.max_tokens <= context and self.sessions.get(session.key) is session
        prompt = self.prompts.finish(plan, tail, session.index, cache=keep)
        if written:  # not sampled: recorded as prompt (loss mask 0), so a follow-up extends it exactly
            prompt.ids = prompt.ids + forced_ids  # a new list: finish's may be cached
        if turn.continue_final:
            prompt.reasoning_open = leaves_reasoning_open(prompt.reasoning_open, written)
        if len(prompt.ids) + s.max_tokens > context:
            raise context_exceeded(
                f"prompt of {len(prompt.ids)} tokens plus max_tokens {s.max_tokens} exceeds the context length of {context}"
            )
        params = self._engine_sampling(session, s)
        params.update(engine_constraint(turn, self.config, forced, prompt.reasoning_open))  # structured.py
        return prompt, params, forced

    def _engine_sampling(self, session: Session, s: Sampling) -> dict[str, Any]:
        """The engine's sampling params of one request (the session's temperature wins when set)."""
        params: dict[str, Any] = {
            "max_new_tokens": s.max_tokens,
            "temperature": s.temperature if session.temperature is None else session.temperature,
            "top_p": s.top_p,
            "stop_token_ids": self.stop_token_ids,
        }
        if s.stop:  # the engine stops early; the gateway still cuts (generation.py), idempotently
            params["stop"] = list(s.stop)
        for key, off in (("top_k", -1), ("min_p", 0.0), ("repetition_penalty", 1.0)):  # sent only when set
            if getattr(s, key) != off:
                params[key] = getattr(s, key)
        return params

    def _validate(self, turn: Turn) -> list[dict] | None:
        """Validate ``turn`` (``validate_turn``: in place, ``developer`` messages become system
        ones where the chat template has no developer branch; a reasoning effort becomes the
        template's thinking switch, a prefill is checked: ``assistant_turn``) and return the tools
        its prompt offers: none under ``tool_choice`` "none", so the model is not shown what it may not call."""
        tools = None if turn.tool_choice == "none" else turn.tools
        validate_turn(turn, self.config, renders_developer=self.prompts.template.renders_developer[bool(tools)])
        check_prefill(turn)
        apply_reasoning(turn, self.prompts.template.thinking_switch[bool(tools)])
        return tools

    async def count_prompt_tokens(self, session: Session, turn: Turn) -> int:
        """The prompt ids a completion of ``turn`` would send: a full render of its messages and
        tools, plus a forced tool-call opening or a prefill's turn (``usage``'s prompt tokens count
        them too). Nothing is recorded and the session's prompt index is untouched (no parent
        matched, no drift)."""
        tools = self._validate(turn)
        text = self.prompts.full_text(history(turn), tools, turn.chat_template_kwargs)
        forced = continuation(self.prompts, turn, tools) if turn.continue_final else forced_text(turn, self.config)
        return len(await self._tokenize(session, text)) + (len(self.prompts.encode(forced)) if forced else 0)

    async def _tokenize(self, session: Session, text: str) -> list[int]:
        """ids(text): on the loop when short; else in a worker thread, one text per session at a
        time (a session's next large text waits for its last), so one episode's huge prompts hold
        at most one thread and the loop keeps serving the others."""
        if len(text) <= self.config.tokenize_off_loop_chars:
            return self.prompts.encode(text)
        async with session.tokenizing:
            if self._tokenize_pool is None:
                self._tokenize_pool = ThreadPoolExecutor(self.config.tokenize_threads, thread_name_prefix="gateway-tokenize")
            self._tokenizing += 1
            try:
                ids = await asyncio.get_running_loop().run_in_executor(self._tokenize_pool, self.prompts.encode_large, text)
            finally:
                self._tokenizing -= 1
        self._tokenized_off_loop += 1
        return ids

    def _admit(self, session: Session, s: Sampling) -> None:
        """Charge one completion to its session's lifetime budgets, or refuse it (429 naming the
        field). A session closed while its prompt was prepared is refused as its key now is."""
        if session.closed:
            raise session_closed()
        c, who = self.config, f"session {session.episode_id!r}"
        if c.max_calls_per_session and session.calls_made >= c.max_calls_per_session:
            raise RequestError(
                429,
                f"{who} has made {session.calls_made} completion calls, its budget "
                f"(gateway.max_calls_per_session={c.max_calls_per_session})",
                kind="rate_limit_error",
            )
        cost = s.n * s.max_tokens
        if c.max_sampled_tokens_per_session and session.tokens_charged + cost > c.max_sampled_tokens_per_session:
            raise RequestError(
                429,
                f"{who} has been charged {session.tokens_charged} sampled tokens (generated, or reserved by calls in flight); "
                f"n x max_tokens = {s.n} x {s.max_tokens} more exceed its budget "
                f"(gateway.max_sampled_tokens_per_session={c.max_sampled_tokens_per_session})",
                param="max_tokens",
                kind="rate_limit_error",
            )
        session.calls_made += 1
        session.tokens_charged += cost
        self._n_calls += 1

    async def complete(self, session: Session, turn: Turn, *, response_id: str | None = None) -> list[Choice]:
        """All n choices, recorded; choice 0's interaction id is ``response_id`` when given."""
        probe = branching.probe_of(session)
        prompt, params, forced = await self._prepare(session, turn)
        replayed = self._replayed(session, prompt.ids, turn.sampling)
        if replayed is not None:
            results, ids = replayed
        else:
            results = await self._sample_turn(session, turn, prompt, params, probe)
            ids = choice_ids(turn.sampling.n, response_id)
        return [finish_choice(self, session, turn, prompt, i, ids[i], r, forced) for i, r in enumerate(results)]

    def _replayed(self, session: Session, prompt_ids: list[int], s: Sampling, refund: bool = True) -> tuple[list[Any], list[str]] | None:
        """A replaying branch's call before its branch point, answered from its trunk's record and
        charged as sampled (branching.replayed; ``refund`` as in ``_sample_turn``); None for any other call."""
        answers = branching.replayed(session, prompt_ids, s.n)
        if answers is None:
            return None
        self._admit(session, s)
        for r, _ in answers if refund else ():
            session.refund(s.max_tokens, len(r.output_ids))
        return [r for r, _ in answers], [iid for _, iid in answers]

    async def _sample_turn(
        self, session: Session, turn: Turn, prompt: Prompt, params: dict, probe: branching.Probe | None, refund: bool = True
    ) -> list[Any]:
        """The engine's n results of a prepared turn, charged to its session (``refund``: each
        choice's unused reservation given back here; a stream gives it back at each choice's end);
        a candidate branch point (``probe``) is decided on them, and may raise the order instead
        (branching.decide)."""
        s = turn.sampling
        self._admit(session, s)
        kwargs = engine_kwargs(s, session)
        calls = [self.engine.generate(prompt.ids, engine_params(params, s.seed, i), return_logprob=True, **kwargs) for i in range(s.n)]
        results = await self._sampled(session, calls, s.max_tokens if refund else None)
        if probe is not None:  # the tokens this call holds of the session's budget: its reservation, or what it sampled
            held = sum(len(r.output_ids) for r in results) if refund else s.n * s.max_tokens
            try:
                branching.decide(self, session, probe, results, held)
            except branching.Resample:  # a branch point taken by replay: the trunk's sample drawn again, unselected
                return await self._sample_turn(session, turn, prompt, params, None, refund)
        return results

    async def complete_prompt(self, session: Session, ids: list[int], s: Sampling, *, response_id: str | None = None) -> list[Choice]:
        """All n choices of a prompt given as ids, no chat template (the Completions API, ``completions``),
        recorded with the session's call whose prompt and sampled ids ``ids`` extend as the parent."""
        check_sampling(s, self.config)
        context = self.config.context_length
        if self.config.fit_max_tokens and len(ids) < context:
            s.max_tokens = min(s.max_tokens, context - len(ids))
        if not ids or len(ids) + s.max_tokens > context:
            raise context_exceeded(f"prompt of {len(ids)} tokens plus max_tokens {s.max_tokens} exceeds the context length of {context}")
        params, kwargs = self._engine_sampling(session, s), engine_kwargs(s, session)
        parent = tree.extended_by(session.interactions.values(), ids)
        replayed = self._replayed(session, ids, s)
        if replayed is not None:
            results, cids = replayed
        else:
            self._admit(session, s)
            calls = [self.engine.generate(ids, engine_params(params, s.seed, i), return_logprob=True, **kwargs) for i in range(s.n)]
            results, cids = await self._sampled(session, calls, s.max_tokens), choice_ids(s.n, response_id)
        pid = parent.id if parent is not None else None
        return [prompt_choice(self, session, ids, pid, s, i, cid, r) for i, (cid, r) in enumerate(zip(cids, results))]

    async def _sampled(self, session: Session, calls: list[Any], reserved: int | None) -> list[Any]:
        """The engine's results of ``calls``, one request's choices, as the session's task: a
        close of the session cancels them (a 401). Each choice's unused reservation (of
        ``reserved`` tokens; None: refunded by the caller) is refunded."""
        # This request's task is the session's while it awaits the engine: close_session cancels
        # it, and the cancellation reaches the engine calls.
        task = asyncio.current_task()
        assert task is not None
        session.engine_tasks.add(task)
        try:
            # one choice: awaited directly, sparing gather's task (~10 µs of a ~100 µs request)
            results = [await calls[0]] if len(calls) == 1 else await all_or_none(calls)
        except asyncio.CancelledError:
            if session.closed and task.uncancel() == 0:  # cancelled by close_session alone: answered
                raise session_closed() from None
            raise  # the request itself was cancelled (its client went away, the server stops)
        finally:
            session.engine_tasks.discard(task)
        if session.closed:  # closed as the answers came in: nothing is recorded into a closed session
            raise session_closed()
        for r in results if reserved is not None else ():
            session.refund(reserved, len(r.output_ids))
        return results

    async def complete_stream(self, session: Session, turn: Turn, *, response_id: str | None = None) -> AsyncIterator[ChoiceDelta]:
        """Deltas as the engine produces tokens; each choice's "done" delta is its last. A request
        the core refuses raises at the first ``__anext__``, before anything is streamed."""
        if not hasattr(self.engine, "generate_stream"):
            raise RequestError(400, "stream is not supported: the inference engine client has no streaming", param="stream")
        probe = branching.probe_of(session)
        prompt, params, forced = await self._prepare(session, turn)
        # a candidate branch point is sampled whole first (its entropy decides), then streamed as one piece; so is a replayed call
        ready: tuple = ()
        ids = choice_ids(turn.sampling.n, response_id)
        replayed = self._replayed(session, prompt.ids, turn.sampling, refund=False)
        if replayed is not None:
            ready, ids = tuple(replayed[0]), replayed[1]
        elif probe is not None:
            ready = tuple(await self._sample_turn(session, turn, prompt, params, probe, refund=False))
        else:
            self._admit(session, turn.sampling)
        deltas = stream_choices(self, session, turn, prompt, params, ids, forced, ready)
        async with contextlib.aclosing(deltas):  # closing this stream closes the engine streams at once
            async for delta in deltas:
                yield delta
