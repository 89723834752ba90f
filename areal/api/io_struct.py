"""AReaL's ``areal.api.io_struct``: ``ModelRequest`` and ``ModelResponse`` of an engine-level call.

    ModelRequest(input_ids=, gconfig=) ─► engine.agenerate(req) ─► ModelResponse(input_tokens,
        output_tokens, output_logprobs, output_versions, stop_reason)

AReaL's field names. What fills them is ``areal.api.engine_api.GatewayEngine``: the engine's
tokens, logprobs and versions exactly as recorded for training. Not covered: AReaL's vision fields
(``image_data``, ``processor``), which this system has no model for, and its timing statistics
(``latency``, ``ttft``, ``itl``), left at their defaults.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from typing import Any

from areal.api.cli_args import GenerationHyperparameters


@dataclass
class ModelRequest:
    """One generation: the whole prompt as token ids, sampled with ``gconfig`` (``n_samples`` 1)."""

    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    input_ids: list[int] = field(default_factory=list)
    gconfig: GenerationHyperparameters = field(default_factory=lambda: GenerationHyperparameters(n_samples=1))
    metadata: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None  # AReaL's; decoding stays the workflow's own here

    def copy(self) -> ModelRequest:
        return dataclasses.replace(self, input_ids=list(self.input_ids), gconfig=self.gconfig.new(), metadata=dict(self.metadata))


@dataclass
class ModelResponse:
    """What the engine sampled: ``output_versions[i]`` is the policy version of ``output_tokens[i]``."""

    input_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)
    stop_reason: str = "stop"  # "stop" | "length" | "abort"
    tokenizer: Any = None
    latency: float = float("inf")
    ttft: float = float("inf")
    itl: list[float] = field(default_factory=list)
    interaction_id: str = ""  # this system's: the recorded Interaction these tokens are

    @property
    def input_len(self) -> int:
        return len(self.input_tokens)

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)

    @property
    def end_with_stop(self) -> bool:
        if self.tokenizer is None:
            raise ValueError("tokenizer is None, cannot check end_with_stop")
        stops = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id} - {None}
        return bool(self.output_tokens) and self.output_tokens[-1] in stops

    @property
    def output_tokens_without_stop(self) -> list[int]:
        """``output_tokens`` without the trailing EOS / PAD tokens of a stopped generation."""
        if self.stop_reason in ("length", "abort") or not self.output_tokens:
            return self.output_tokens
        if self.tokenizer is None:
            raise ValueError("tokenizer is None, cannot get output_tokens_without_stop")
        stops = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id} - {None}
        end = len(self.output_tokens)
        while end > 0 and self.output_tokens[end - 1] in stops:
            end -= 1
        return self.output_tokens[:end]
