"""AReaL's ``areal.experimental.openai.types``: the interaction a workflow builds itself.

    resp = await engine.agenerate(ModelRequest(...))                 (areal/api/engine_api.py)
    row = InteractionWithTokenLogpReward(model_response=resp, reward=1.0, messages=[...])
    cache[row_id] = row                                               (cache.py: parents by messages)
    return cache.export_interactions("individual")  or  row.to_tensor_dict()
        ─► RecordedWorkflow: each row's tokens ─► the recorded row the engine served (or an error)

AReaL's workflows that trace their own calls (its scaffolding examples' controllers, for one)
make these from a ``ModelResponse`` and return them, or their ``to_tensor_dict()``. This class
has AReaL's constructor and fields; what a run trains is still the gateway's record: the
engine-level facade matches each row's tokens to a sequence the engine served in the episode and
trains that recorded row (``GatewayEngine.rows``), so a row built from tokens the engine did not
sample is an error, never trained.

Not the same class as ``areal.gateway.tree.InteractionWithTokenLogpReward``, the rows that
``ArealOpenAI.export_interactions`` and the gateway return: those are built from the record,
these by the workflow. Both have ``reward`` and ``to_tensor_dict()``, and a workflow may return
either. Not covered: AReaL's serialisation helpers and ``concat_string_interactions`` (for
external API mode, which has no tokens to train here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from areal.api.io_struct import ModelResponse

__all__ = ["ApiType", "InputName", "InteractionWithTokenLogpReward"]


class ApiType(StrEnum):
    """Which OpenAI API an interaction answered."""

    COMPLETION = "completion"
    RESPONSE = "response"
    NONE = "none"


class InputName(StrEnum):
    """The name of an interaction's input, for messages."""

    MESSAGES = "messages"
    INPUT_DATA = "input_data"
    NONE = "none"


@dataclass
class InteractionWithTokenLogpReward:
    """One model call of a workflow's own trace: its ``ModelResponse``, reward and place in the
    conversation (``parent``: the call whose messages and reply this call's messages extend)."""

    model_response: ModelResponse | None = None
    reward: float | None = None
    parent: InteractionWithTokenLogpReward | None = None
    chat_template_type: str = "hf"  # "concat": the row holds the parent's tokens too (to_tensor_dict)
    messages: list[dict] = field(default_factory=list)
    output_message_list: list[dict] | None = None
    completion: Any = None  # an openai ChatCompletion, when the call was one
    response: Any = None  # an openai Response, when the call was one
    input_data: Any = ""
    _interaction_id: str | None = None

    @property
    def api_type(self) -> ApiType:
        if self.completion is not None:
            return ApiType.COMPLETION
        return ApiType.RESPONSE if self.response is not None else ApiType.NONE

    @property
    def input_name_for_logging(self) -> InputName:
        return {ApiType.COMPLETION: InputName.MESSAGES, ApiType.RESPONSE: InputName.INPUT_DATA}.get(self.api_type, InputName.NONE)

    @property
    def current_data(self) -> Any:
        return {ApiType.COMPLETION: self.messages, ApiType.RESPONSE: self.input_data}.get(self.api_type)

    @property
    def parent_data(self) -> Any:
        return None if self.parent is None else self.parent.current_data

    @property
    def has_tensor_data(self) -> bool:
        return self.model_response is not None

    @property
    def interaction_id(self) -> str | None:
        """The completion's or response's id, else the one set, else the recorded call's id."""
        if self.completion is not None:
            return self.completion.id
        if self.response is not None:
            return self.response.id
        if self._interaction_id is not None:
            return self._interaction_id
        return (self.model_response.interaction_id or None) if self.model_response is not None else None

    @interaction_id.setter
    def interaction_id(self, value: str) -> None:
        if self.completion is not None or self.response is not None:
            raise ValueError("the id of an interaction holding a completion or a response is that object's id")
        self._interaction_id = value

    @property
    def created_at(self) -> float | None:
        if self.completion is not None:
            return float(self.completion.created)
        return float(self.response.created_at) if self.response is not None else None

    @property
    def remaining_messages(self) -> list[dict]:
        """The messages this call added after its parent's messages and reply."""
        if self.parent is None:
            return self.messages
        if self.parent.output_message_list is None:
            raise ValueError("the parent interaction's output_message_list is not set")
        return self.messages[len(self.parent.messages) + len(self.parent.output_message_list) :]

    def to_tensor_dict(self) -> dict[str, Any]:
        """AReaL's row, batch dim 1: ``input_ids``, ``loss_mask``, ``logprobs``, ``versions``,
        ``attention_mask`` (1, T) and ``rewards`` (1,). The prompt is masked out (logprob 0,
        version -1). With ``chat_template_type="concat"`` and a parent whose tokens this prompt
        starts with, the row is the parent's row extended: the parent's sampled tokens stay trained.
        An unset reward is 0."""
        import torch  # deferred: the module imports without torch

        resp = self.model_response
        if resp is None:
            raise ValueError("this interaction has no model_response: nothing to turn into tokens")
        ids = list(resp.input_tokens) + list(resp.output_tokens)
        prompt, out = resp.input_len, resp.output_len
        versions_out = list(resp.output_versions) or [-1] * out
        mask, logprobs, versions = [0] * prompt, [0.0] * prompt, [-1] * prompt
        if self.chat_template_type == "concat" and self.parent is not None and self.parent.model_response is not None:
            above = self.parent.to_tensor_dict()
            parent_ids = above["input_ids"][0].tolist()
            if len(parent_ids) < prompt and ids[: len(parent_ids)] == parent_ids:
                n = len(parent_ids)
                mask[:n] = above["loss_mask"][0].tolist()
                logprobs[:n] = above["logprobs"][0].tolist()
                versions[:n] = above["versions"][0].tolist()
        return {
            "input_ids": torch.tensor([ids], dtype=torch.long),
            "loss_mask": torch.tensor([mask + [1] * out], dtype=torch.int32),
            "logprobs": torch.tensor([logprobs + list(resp.output_logprobs)], dtype=torch.float32),
            "versions": torch.tensor([versions + versions_out], dtype=torch.int32),
            "attention_mask": torch.ones((1, len(ids)), dtype=torch.bool),
            "rewards": torch.tensor([float(self.reward or 0.0)], dtype=torch.float32),
        }
