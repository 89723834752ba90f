"""``RLVRWorkflow``: AReaL's single-turn workflow with a verifiable reward, one trajectory per call.

    data["messages"] ─► apply_chat_template (enable_thinking) ─► engine.agenerate(ModelRequest)
        ─► reward_fn(prompt, completion, prompt_ids, completion_ids, **data) in a process pool
        ─► AReaL's tensor dict of one row: input_ids, loss_mask, logprobs, versions,
           attention_mask (1, T), rewards (1,)

AReaL's signature: ``reward_fn`` and ``tokenizer`` may be import paths / a model path,
``get_input_ids_fn`` and ``data_extract_prompt_fn`` replace how a row becomes prompt ids. Run by
this system, ``engine`` is an ``areal.api.engine_api.GatewayEngine``: the call is recorded by the
gateway's structures and the row returned names which recording is trained. The controller calls
it ``gconfig.n_samples`` times per prompt (one trajectory per call, as AReaL does now).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from areal import workflow_context
from areal.api.cli_args import GenerationHyperparameters
from areal.api.engine_api import InferenceEngine
from areal.api.io_struct import ModelRequest
from areal.api.reward_api import AsyncRewardWrapper
from areal.api.workflow_api import RolloutWorkflow
from areal.utils import stats_tracker
from areal.utils.dynamic_import import import_from_string
from areal.utils.hf_utils import apply_chat_template, load_hf_tokenizer


def default_get_input_ids_fn(data: Any, tokenizer: Any, enable_thinking: bool) -> list[int]:
    return apply_chat_template(tokenizer, data, tokenize=True, add_generation_prompt=True, enable_thinking=enable_thinking)


def default_data_extract_prompt_fn(data: dict[str, Any]) -> Any:
    return data["messages"]


class RLVRWorkflow(RolloutWorkflow):
    """Single-turn reward learning, optionally with thinking tokens (``enable_thinking``)."""

    def __init__(
        self,
        reward_fn: Callable[..., Any] | str,
        gconfig: GenerationHyperparameters,
        tokenizer: Any,
        enable_thinking: bool = False,
        get_input_ids_fn: Callable[[Any, Any, bool], list[int]] | str = default_get_input_ids_fn,
        data_extract_prompt_fn: Callable[[dict[str, Any]], Any] | str = default_data_extract_prompt_fn,
    ) -> None:
        self.tokenizer = load_hf_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.reward_fn = import_from_string(reward_fn) if isinstance(reward_fn, str) else reward_fn
        self.async_reward_fn = AsyncRewardWrapper(self.reward_fn)
        self.gconfig = gconfig.new_with_stop_and_pad_token_ids(self.tokenizer)
        self.enable_thinking = enable_thinking
        self.get_input_ids_fn = import_from_string(get_input_ids_fn) if isinstance(get_input_ids_fn, str) else get_input_ids_fn
        self.data_extract_prompt_fn = (
            import_from_string(data_extract_prompt_fn) if isinstance(data_extract_prompt_fn, str) else data_extract_prompt_fn
        )

    async def arun_episode(self, engine: InferenceEngine, data: dict[str, Any]) -> dict[str, Any]:
        import torch  # deferred: the controller imports this module's package without torch

        input_ids = self.get_input_ids_fn(self.data_extract_prompt_fn(data), self.tokenizer, self.enable_thinking)
        req = ModelRequest(rid=uuid.uuid4().hex, input_ids=list(input_ids), gconfig=self.gconfig.new(n_samples=1), tokenizer=self.tokenizer)
        resp = await engine.agenerate(req)
        prompt_str, completion_str = self.tokenizer.decode(input_ids), self.tokenizer.decode(resp.output_tokens)
        reward = await self.async_reward_fn(prompt_str, completion_str, resp.input_tokens, resp.output_tokens, **data)
        stats_tracker.get(workflow_context.stat_scope()).scalar(reward=reward)

        seq = resp.input_tokens + resp.output_tokens
        res = {
            "input_ids": torch.tensor(seq, dtype=torch.int32),
            "loss_mask": torch.tensor([0] * resp.input_len + [1] * resp.output_len, dtype=torch.int32),
            "logprobs": torch.tensor([0.0] * resp.input_len + resp.output_logprobs, dtype=torch.float32),
            "versions": torch.tensor([-1] * resp.input_len + resp.output_versions, dtype=torch.int32),
            "attention_mask": torch.ones(len(seq), dtype=torch.bool),
            "rewards": torch.tensor(reward, dtype=torch.float32),
        }
        return {k: v.unsqueeze(0) for k, v in res.items()}  # a batch of one row
