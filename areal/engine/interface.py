"""What the gateway, the controller and the evaluator need from an inference engine.

Every engine client implements ``InferenceEngine``: ``EngineClient`` (any server speaking
SGLang's native HTTP API: SGLang itself and the embedded CPU engine), ``VLLMClient`` (vLLM's
OpenAI-compatible completions with token ids), and ``EngineRouter`` (several servers behind one
client). Those that can load new weights and pause generation around it also implement
``WeightUpdatable``. ``tests/test_engine_interface.py`` checks each class against both.

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

if TYPE_CHECKING:
    from areal.engine.client import GenerateResult


@runtime_checkable
class InferenceEngine(Protocol):
    """Token-in, token-out generation with logprobs."""

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
    ) -> GenerateResult: ...

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
    ) -> AsyncIterator[GenerateResult]: ...

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
