"""ArealOpenAI: a drop-in ``openai.AsyncOpenAI`` that answers in-process from the gateway core.

    client.chat.completions.create(...) ─► openai SDK ─► httpx.AsyncClient(transport=InProcessTransport)
        ─► Gateway.dispatch (same routes, front-ends, prompt building and recording as over HTTP)
        ─► engine.generate / generate_stream (an EngineClient, or any object with its methods)

No socket and no second implementation: the SDK's requests become ``GatewayRequest``s handed to
the core, so ``chat.completions`` (streaming too) and ``responses`` work unchanged, and every
call is recorded as an Interaction in this client's own session (one client = one episode).

Invariants: the session never expires (``session_idle_s=0``); rewards and export act on this
client's interactions only (``set_reward``, ``set_final_reward`` / ``set_last_reward``,
``apply_reward_discount``, ``export_interactions``, all from ``areal.gateway.tree``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
from openai import AsyncOpenAI

from areal.agent import context as workflow_context
from areal.gateway.core import Gateway, GatewayConfig, Session
from areal.gateway.server import reply_frames
from areal.gateway.tree import Interaction, InteractionWithTokenLogpReward
from areal.protocol import GatewayRequest


class _ReplyStream(httpx.AsyncByteStream):
    def __init__(self, first_body: bytes, rest: AsyncIterator[Any]) -> None:
        self._first, self._rest = first_body, rest

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._first:
            yield self._first
        async for frame in self._rest:
            if frame.body:
                yield frame.body

    async def aclose(self) -> None:
        await self._rest.aclose()  # an abandoned stream cancels its engine requests


class InProcessTransport(httpx.AsyncBaseTransport):
    """httpx transport that hands each request to a Gateway in the same event loop."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._ids = itertools.count()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        req = GatewayRequest(
            request_id=next(self._ids),
            method=request.method,
            path=request.url.raw_path.decode("ascii"),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=await request.aread(),
        )
        frames = reply_frames(self.gateway, req)
        first = await anext(frames)
        return httpx.Response(first.status, headers=first.headers, stream=_ReplyStream(first.body, frames), request=request)


class ArealOpenAI(AsyncOpenAI):
    """``AsyncOpenAI`` over an in-process gateway; one instance records one episode."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        tool_call_parser: str | None = "qwen25",
        reasoning_parser: str | None = "think",
        gateway_config: GatewayConfig | None = None,
        episode_id: str = "areal-openai",
        engine_max_tokens: int | None = None,
        chat_template_type: str = "hf",
        **kwargs: Any,
    ) -> None:
        # AReaL's chat_template_type: "hf" renders each prompt with the chat template, "concat"
        # appends each turn's tokens to the previous prompt + reply. The gateway always appends to
        # the recorded tokens when the history is unchanged (and renders a new branch when it is
        # not), which is what both mean for training rows; export_interactions(style=) picks the rows.
        if chat_template_type not in ("hf", "concat"):
            raise ValueError(f"chat_template_type must be 'hf' or 'concat', got {chat_template_type!r}")
        # In a run's workflow call, the run's gateway settings: its context capped at what the
        # engine's model holds (areal.agent.context); AReaL's client cuts max_tokens to what fits.
        run = workflow_context.gateway_config()
        base = gateway_config or (dataclasses.replace(run, fit_max_tokens=True) if run else GatewayConfig(fit_max_tokens=True))
        config = dataclasses.replace(base, tool_parser=tool_call_parser, reasoning_parser=reasoning_parser, session_idle_s=0)
        if engine_max_tokens is not None:  # AReaL: prompt + sampled tokens of one call, within what the engine holds
            config = dataclasses.replace(config, context_length=min(engine_max_tokens, run.context_length) if run else engine_max_tokens)
        self.engine, self.tokenizer, self.chat_template_type = engine, tokenizer, chat_template_type
        self.gateway = Gateway(engine, tokenizer, config)
        key = self.gateway.open_session(episode_id)
        self.session: Session = self.gateway.sessions[key]
        workflow_context.register_client(self.session)
        http = httpx.AsyncClient(transport=InProcessTransport(self.gateway), base_url="http://areal.in-process/v1")
        kwargs.setdefault("max_retries", 0)
        super().__init__(api_key=key, base_url="http://areal.in-process/v1", http_client=http, **kwargs)
        # AReaL's client takes chat.completions.create(messages=...) without a model: the engine's.
        create = self.chat.completions.create

        async def create_for_the_engine(*args: Any, model: str = "default", **kw: Any) -> Any:
            return await create(*args, model=model, **kw)

        self.chat.completions.create = create_for_the_engine  # type: ignore[method-assign]
        # AReaL's responses.create takes chat's max_completion_tokens too: the Responses API's max_output_tokens.
        create_response = self.responses.create

        async def create_response_for_the_engine(*args: Any, model: str = "default", **kw: Any) -> Any:
            if "max_completion_tokens" in kw:
                limit = kw.pop("max_completion_tokens")
                if kw.get("max_output_tokens") is not None and limit is not None:
                    raise ValueError("max_output_tokens and max_completion_tokens cannot both be set")
                if limit is not None:
                    kw["max_output_tokens"] = limit
            return await create_response(*args, model=model, **kw)

        self.responses.create = create_response_for_the_engine  # type: ignore[method-assign]

    @property
    def interactions(self) -> dict[str, Interaction]:
        return self.session.interactions

    def get_interaction(self, interaction_id: str) -> Interaction:
        return self.session.interactions[interaction_id]

    def set_reward(self, interaction_id: str, reward: float) -> None:
        self.session.set_reward(interaction_id, reward)

    def set_final_reward(self, reward: float) -> str:
        return self.session.set_final_reward(reward)

    set_last_reward = set_final_reward

    def apply_reward_discount(self, turn_discount: float = 1.0) -> None:
        self.session.apply_reward_discount(turn_discount)

    def export_interactions(self, style: str = "individual") -> dict[str, InteractionWithTokenLogpReward]:
        return self.session.export_interactions(style)
