"""Workflows written as AReaL's newest examples write them, calling ``engine.agenerate`` themselves:
``CountDownWorkflow`` as examples/countdown/train.py (one trajectory per call, AReaL's tensor
dict) and ``TIRWorkflow`` in the shape of examples/tir/tir_workflow.py (the model's turn, a tool's
tokens appended, the model again; one row with the tool's tokens masked out); ``TracedWorkflow`` in
the shape of examples/scaffolding's controllers (its own call trace: AReaL's interaction type and
cache, its reward wrapper). The rewards are
arbitrary but vary, so groups have an advantage; what the tests check is the plumbing."""

import uuid

import torch

from areal import workflow_context
from areal.api import InferenceEngine, ModelRequest, RolloutWorkflow
from areal.api.cli_args import GenerationHyperparameters
from areal.api.reward_api import AsyncRewardWrapper
from areal.experimental.openai.cache import InteractionCache
from areal.experimental.openai.types import InteractionWithTokenLogpReward
from areal.utils import logging, stats_tracker
from areal.utils.hf_utils import apply_chat_template, load_hf_tokenizer

logger = logging.getLogger("CountDown @ test")


def _prompt(data):
    return data.get("messages") or [{"role": "user", "content": data["question"]}]


class CountDownWorkflow(RolloutWorkflow):
    def __init__(self, gconfig: GenerationHyperparameters, tokenizer):
        if isinstance(tokenizer, str):
            tokenizer = load_hf_tokenizer(tokenizer)
        self.gconfig = gconfig.new_with_stop_and_pad_token_ids(tokenizer)
        self.tokenizer = tokenizer

    async def arun_episode(self, engine: InferenceEngine, data):
        input_ids = apply_chat_template(self.tokenizer, _prompt(data), tokenize=True, add_generation_prompt=True)
        req = ModelRequest(rid=uuid.uuid4().hex, input_ids=input_ids, gconfig=self.gconfig.new(n_samples=1), tokenizer=self.tokenizer)
        resp = await engine.agenerate(req)

        seq = resp.input_tokens + resp.output_tokens
        logprobs = [0.0] * resp.input_len + resp.output_logprobs
        loss_mask = [0] * resp.input_len + [1] * resp.output_len
        versions = [-1] * resp.input_len + resp.output_versions
        reward = float(resp.output_len % 2)
        stats_tracker.get(workflow_context.stat_scope()).scalar(reward=reward)
        return {
            "input_ids": torch.tensor(seq).unsqueeze(0),
            "loss_mask": torch.tensor(loss_mask).unsqueeze(0),
            "logprobs": torch.tensor(logprobs).unsqueeze(0),
            "versions": torch.tensor(versions).unsqueeze(0),
            "attention_mask": torch.ones(len(seq), dtype=torch.bool).unsqueeze(0),
            "rewards": torch.tensor([reward]),
        }


class TIRWorkflow(RolloutWorkflow):
    """Two model turns with a tool's output between them, returned as one row."""

    def __init__(self, gconfig: GenerationHyperparameters, tokenizer, tool_text: str = "\n```output\n42\n```\n"):
        if isinstance(tokenizer, str):
            tokenizer = load_hf_tokenizer(tokenizer)
        self.gconfig = gconfig.new_with_stop_and_pad_token_ids(tokenizer)
        self.tokenizer, self.tool_text = tokenizer, tool_text

    async def arun_episode(self, engine: InferenceEngine, data):
        seq = apply_chat_template(self.tokenizer, _prompt(data), tokenize=True, add_generation_prompt=True)
        logprobs, loss_mask, versions = [0.0] * len(seq), [0] * len(seq), [-1] * len(seq)
        for turn in range(2):
            req = ModelRequest(input_ids=list(seq), gconfig=self.gconfig.new(n_samples=1, max_new_tokens=8), tokenizer=self.tokenizer)
            resp = await engine.agenerate(req)
            seq += resp.output_tokens
            logprobs += resp.output_logprobs
            loss_mask += [1] * resp.output_len
            versions += resp.output_versions
            if turn == 0:  # the tool's answer: prompt tokens of the next turn, not trained
                tool = self.tokenizer.encode(self.tool_text, add_special_tokens=False)
                seq += tool
                logprobs += [0.0] * len(tool)
                loss_mask += [0] * len(tool)
                versions += [-1] * len(tool)
        reward = float(len(seq) % 2)
        return {
            "input_ids": torch.tensor([seq]),
            "loss_mask": torch.tensor([loss_mask]),
            "logprobs": torch.tensor([logprobs]),
            "versions": torch.tensor([versions]),
            "attention_mask": torch.ones((1, len(seq)), dtype=torch.bool),
            "rewards": torch.tensor([reward]),
        }


def parity_reward(prompt, completions, prompt_ids, completion_ids, **data):
    """AReaL's reward signature; arbitrary but varying (a module-level function: the reward
    wrapper's process pool pickles it by name)."""
    return float(len(completion_ids) % 2)


def token_parity_reward(prompt, completions, prompt_ids, completion_ids, **data):
    """The parity of the sampled ids' sum: differs within a group whatever lengths the replies have."""
    return float(sum(completion_ids) % 2)


class TracedWorkflow(RolloutWorkflow):
    """In the shape of AReaL's scaffolding controllers: the workflow traces its own calls, each an
    ``InteractionWithTokenLogpReward`` built from the engine's ``ModelResponse`` and kept in an
    ``InteractionCache`` (which links the second turn to the first by their messages), scores the
    last with ``AsyncRewardWrapper`` and returns the cache's export, or one call's tensor dict."""

    def __init__(self, gconfig: GenerationHyperparameters, tokenizer, style: str = "concat"):
        if isinstance(tokenizer, str):
            tokenizer = load_hf_tokenizer(tokenizer)
        self.gconfig = gconfig.new_with_stop_and_pad_token_ids(tokenizer)
        self.tokenizer, self.style = tokenizer, style
        self.reward = AsyncRewardWrapper(parity_reward)

    async def arun_episode(self, engine: InferenceEngine, data):
        cache = InteractionCache()
        messages = list(_prompt(data))
        kind = "concat" if self.style == "concat" else "hf"
        for turn in range(2):
            input_ids = apply_chat_template(self.tokenizer, messages, tokenize=True, add_generation_prompt=True)
            if turn and kind == "concat":  # the next turn extends the last call's exact tokens
                last = next(reversed(cache.values())).model_response
                follow = self.tokenizer.encode("\nAgain?\n", add_special_tokens=False)
                input_ids = last.input_tokens + last.output_tokens + follow
            req = ModelRequest(input_ids=input_ids, gconfig=self.gconfig.new(n_samples=1, max_new_tokens=8), tokenizer=self.tokenizer)
            resp = await engine.agenerate(req)
            reply = [{"role": "assistant", "content": self.tokenizer.decode(resp.output_tokens, skip_special_tokens=True)}]
            row = InteractionWithTokenLogpReward(
                model_response=resp, messages=list(messages), output_message_list=reply, chat_template_type=kind
            )
            row.interaction_id = f"call-{turn}"
            cache[row.interaction_id] = row
            messages += [*reply, {"role": "user", "content": "Again?"}]
        last = next(reversed(cache.values())).model_response
        prompt = self.tokenizer.decode(last.input_tokens)
        score = await self.reward(prompt, self.tokenizer.decode(last.output_tokens), last.input_tokens, last.output_tokens, **data)
        cache.set_last_reward(score)
        if self.style == "tensor":
            return cache[cache.last_interaction_id].to_tensor_dict()
        return cache.export_interactions(self.style, reward_discount=0.5)
