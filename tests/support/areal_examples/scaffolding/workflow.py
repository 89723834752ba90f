"""A workflow in the shape of AReaL's examples/scaffolding (its GSM8K RLVR example): generation and
reward composed as controllers over a worker, the worker an OpenAI client of its own on
``engine.addresses[0]``, made at the first episode and kept, calling the Completions API with the
prompt it rendered itself and reading the sampled ``token_ids`` off the reply; the trajectory an
``InteractionWithTokenLogpReward`` built from a ``ModelResponse`` with placeholder logprobs (AReaL
sets ``recompute_logprob``), scored with ``AsyncRewardWrapper``, returned as its tensor dict.

Written here in that shape (the example vendors TensorRT-LLM's scaffolding framework, of which
this keeps the control flow: a controller yields task lists, the worker runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import openai

from areal.api.cli_args import GenerationHyperparameters
from areal.api.engine_api import InferenceEngine
from areal.api.io_struct import ModelResponse
from areal.api.reward_api import AsyncRewardWrapper
from areal.api.workflow_api import RolloutWorkflow
from areal.experimental.openai.types import InteractionWithTokenLogpReward
from areal.utils import logging
from areal.utils.dynamic_import import import_from_string
from areal.utils.hf_utils import apply_chat_template, load_hf_tokenizer

logger = logging.getLogger("ScaffoldingWorkflow @ test")


@dataclass
class GenerationTask:
    input_str: str
    input_tokens: list[int]
    max_tokens: int = 16
    temperature: float = 1.0
    stop: list[str] | None = None
    output_str: str = ""
    output_tokens: list[int] = field(default_factory=list)
    finish_reason: str = ""


class CompletionsWorker:
    """The scaffolding example's worker: the engine server's OpenAI API, text in, text and ids out."""

    def __init__(self, client: openai.AsyncOpenAI, model: str = "default") -> None:
        self.client, self.model = client, model

    async def run(self, task: GenerationTask) -> None:
        response = await self.client.completions.create(
            model=self.model, prompt=task.input_str, max_tokens=task.max_tokens, temperature=task.temperature, stop=task.stop
        )
        choice = response.choices[0]
        task.output_str, task.finish_reason = choice.text, choice.finish_reason
        if hasattr(choice, "token_ids"):  # the server's extension, read as the example reads it
            task.output_tokens = list(choice.token_ids)


class PipelineTrajectoryMaker:
    """Generation (yielded to the worker), then the reward, computed here; the interaction out."""

    def __init__(self, reward_fn: Any, sampling: dict[str, Any]) -> None:
        self.reward = AsyncRewardWrapper(reward_fn)
        self.sampling = sampling

    def process(self, task: GenerationTask):
        task.max_tokens, task.temperature = self.sampling["max_tokens"], self.sampling["temperature"]
        yield [task]  # the scaffolding LLM hands these to its worker

    async def finish(self, task: GenerationTask, data: dict[str, Any]) -> InteractionWithTokenLogpReward:
        n = len(task.output_tokens)
        response = ModelResponse(
            input_tokens=task.input_tokens, output_tokens=task.output_tokens, output_logprobs=[0.0] * n, output_versions=[-1] * n
        )
        interaction = InteractionWithTokenLogpReward(model_response=response)
        interaction.reward = await self.reward(task.input_str, task.output_str, task.input_tokens, task.output_tokens, **data)
        return interaction


class ScaffoldingWorkflow(RolloutWorkflow):
    def __init__(self, reward_fn: Any, gconfig: GenerationHyperparameters, tokenizer: Any, enable_thinking: bool = False):
        self.reward_fn = import_from_string(reward_fn) if isinstance(reward_fn, str) else reward_fn
        self.tokenizer = load_hf_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.gconfig = gconfig.new_with_stop_and_pad_token_ids(self.tokenizer)
        self.enable_thinking = enable_thinking
        self.worker: CompletionsWorker | None = None
        self.maker = PipelineTrajectoryMaker(
            self.reward_fn, {"max_tokens": self.gconfig.max_new_tokens, "temperature": self.gconfig.temperature or 1.0}
        )

    def _lazy_init_scaffolding(self, engine: InferenceEngine) -> None:
        base_url = f"http://{engine.addresses[0]}"
        if not base_url.endswith("/v1"):
            base_url = f"{base_url}/v1"
        self.worker = CompletionsWorker(openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY"))
        logger.info("Initialized scaffolding components with server at %s", engine.addresses[0])

    async def arun_episode(self, engine: InferenceEngine, data: dict[str, Any]):
        if self.worker is None:
            self._lazy_init_scaffolding(engine)
        input_ids = list(apply_chat_template(self.tokenizer, data["messages"], tokenize=True, add_generation_prompt=True))
        task = GenerationTask(input_str=self.tokenizer.decode(input_ids), input_tokens=input_ids)
        for batch in self.maker.process(task):
            for t in batch:
                await self.worker.run(t)
        interaction = await self.maker.finish(task, data)
        return interaction.to_tensor_dict()
