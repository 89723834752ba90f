"""What the gateway, the controller and the evaluator need from an inference engine.

Every engine client implements ``InferenceEngine``: ``EngineClient`` (any server speaking
SGLang's native HTTP API: SGLang itself and the embedded CPU engine), ``VLLMClient`` (vLLM's
OpenAI-compatible completions with token ids), and ``EngineRouter`` (several servers behind one
client). Those that can load new weights and pause generation around it also implement
``WeightUpdatable``. ``tests/integration/engine/test_engine_interface.py`` checks each class against both.

Contract of ``generate`` / ``generate_stream``: ``input_ids`` are the whole prompt; the result
holds the new tokens with their logprobs and the policy version that produced each one; an
abort the caller did not ask for (a pause around a weight update) is recovered by the client
(``resubmit_aborted``), so callers never see it. No answer at all is ``EngineUnavailable``; an
error answer is ``EngineError`` (both in ``client.py``). ``session_key`` names the conversation
(the gateway passes the episode id): a router keeps one on one server, for its prefix cache.
Cancelling a ``generate`` task, or closing a ``generate_stream`` before its last result, aborts
the generation at the engine (a request not yet sent is never sent): the gateway ends a
session's work that way when its episode ends or its client goes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import msgspec

if TYPE_CHECKING:
    from areal.engine.client import GenerateResult


class GenerateRequest(msgspec.Struct):
    """The arguments of one ``generate`` / ``generate_stream`` call, as the interface takes them."""

    input_ids: list[int]
    sampling_params: dict
    return_logprob: bool = True
    rid: str | None = None
    top_logprobs_num: int = 0
    resubmit_aborted: bool = True
    session_key: str | None = None


@runtime_checkable
class InferenceEngine(Protocol):
    """Token-in, token-out generation with logprobs.

    A client that subclasses it gets ``generate`` and ``generate_stream`` as stated here, each
    call handed on as one ``GenerateRequest`` to its ``_generate(request)`` (a coroutine) and
    ``_generate_stream(request)`` (an async iterator); any other class with these two methods
    (and the rest) is an ``InferenceEngine`` too."""

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: dict,
        return_logprob: bool = True,
        rid: str | None = None,
        *,
        top_logprobs_num: int = 0,
        resubmit_aborted: bool = True,
        session_key: str | None = None,
    ) -> GenerateResult:
        request = GenerateRequest(input_ids, sampling_params, return_logprob, rid, top_logprobs_num, resubmit_aborted, session_key)
        return await self._generate(request)  # type: ignore[attr-defined]

    def generate_stream(
        self,
        input_ids: list[int],
        sampling_params: dict,
        return_logprob: bool = True,
        rid: str | None = None,
        *,
        top_logprobs_num: int = 0,
        resubmit_aborted: bool = True,
        session_key: str | None = None,
    ) -> AsyncIterator[GenerateResult]:
        request = GenerateRequest(input_ids, sampling_params, return_logprob, rid, top_logprobs_num, resubmit_aborted, session_key)
        return self._generate_stream(request)  # type: ignore[attr-defined]

    async def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None: ...

    async def health(self) -> bool: ...

    async def model_info(self) -> dict: ...

    async def close(self) -> None: ...


@runtime_checkable
class WeightUpdatable(Protocol):
    """An engine that loads new weights as a new policy version, pausing generation around it."""

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None: ...

    async def pause_generation(self, mode: str = "abort") -> None: ...

    async def continue_generation(self) -> None: ...
