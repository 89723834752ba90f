"""A training script written as AReaL's OpenAI Agents guide writes one (its imports, its config
class, ``load_expr_config``, ``PPOTrainer``, ``StatsLogger``, ``stats_tracker``), run unchanged by
tests/e2e/test_areal_acceptance.py through ``python -m areal.launcher.local``.

Both workflow styles of AReaL: ``GroupPerCall`` samples the whole group in one ``arun_episode``
(n_samples ``ArealOpenAI`` clients, as the guide at the time); ``OneTrajectoryPerCall`` samples
one trajectory per call, as AReaL's workflows do now, and relies on the trainer calling it
n_samples times per prompt. ``one_trajectory_per_call`` picks one.
"""

import asyncio
import os
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerFast

from agents import Agent as OpenAIAgent
from agents import ModelSettings, OpenAIProvider, RunConfig
from agents import Runner as OpenAIRunner
from areal import workflow_context
from areal.api.cli_args import GenerationHyperparameters, GRPOConfig, load_expr_config
from areal.api.reward_api import AsyncRewardWrapper
from areal.api.workflow_api import RolloutWorkflow
from areal.dataset import get_custom_dataset
from areal.experimental.openai import ArealOpenAI
from areal.experimental.trainer import PPOTrainer
from areal.utils import stats_tracker
from areal.utils.dynamic_import import import_from_string
from areal.utils.hf_utils import load_hf_tokenizer
from areal.utils.stats_logger import StatsLogger


class AgentRunner:
    """Builds the agent, runs it on one client, scores its final output."""

    def __init__(self, agent_builder_path, agent_builder_kwargs, reward_fn_path, temperature=1.0, max_tokens=512):
        self.build = import_from_string(agent_builder_path)
        self.build_kwargs = agent_builder_kwargs
        self.reward = AsyncRewardWrapper(import_from_string(reward_fn_path))
        self.settings = ModelSettings(temperature=temperature, max_tokens=max_tokens)

    async def run_agent(self, data, client: ArealOpenAI):
        agent: OpenAIAgent = self.build(**self.build_kwargs)
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True, model_settings=self.settings)
        result = await OpenAIRunner.run(agent, input=data["messages"][-1]["content"], run_config=config)
        extra = {k: v for k, v in data.items() if k not in ("messages", "answer", "prompt", "prompt_ids", "completion_ids")}
        reward = await self.reward(
            completions=result.final_output,
            answer=data["answer"],
            prompt=data.get("prompt"),
            prompt_ids=data.get("prompt_ids"),
            completion_ids=data.get("completion_ids"),
            **extra,
        )
        client.set_final_reward(reward)
        return reward


class GroupPerCall(RolloutWorkflow):
    def __init__(self, config, tokenizer: PreTrainedTokenizerFast, dump_dir=None):
        self.gconfig: GenerationHyperparameters = config.gconfig.new_with_stop_and_pad_token_ids(tokenizer)
        self.tokenizer = tokenizer
        if dump_dir is not None:
            os.makedirs(dump_dir, exist_ok=True)
        self.agent = AgentRunner(
            config.agent_builder_path,
            config.agent_builder_kwargs,
            config.reward_fn_path,
            temperature=config.gconfig.temperature,
            max_tokens=config.gconfig.max_tokens,
        )

    async def arun_episode(self, engine, data):
        clients = [ArealOpenAI(engine=engine, tokenizer=self.tokenizer) for _ in range(self.gconfig.n_samples)]
        rewards = await asyncio.gather(*[self.agent.run_agent(data=data, client=c) for c in clients])
        for reward in rewards:
            stats_tracker.get("rollout").scalar(reward=reward)
        out = {}
        for client in clients:
            client.apply_reward_discount(turn_discount=0.9)
            out.update(client.export_interactions(style="individual"))
        return out


class OneTrajectoryPerCall(GroupPerCall):
    async def arun_episode(self, engine, data):
        client = ArealOpenAI(engine=engine, tokenizer=self.tokenizer)
        reward = await self.agent.run_agent(data=data, client=client)
        stats_tracker.get(workflow_context.stat_scope()).scalar(reward=reward)
        client.apply_reward_discount(turn_discount=0.9)
        return client.export_interactions(style="individual")


@dataclass
class AgentRLConfig(GRPOConfig):
    reward_fn_path: str = field(default="areal.reward.gsm8k.gsm8k_reward_fn", metadata={"help": "reward function, by import path"})
    agent_builder_path: str = field(
        default="areal.workflow.openai_agent.math_agent.build_math_agent", metadata={"help": "returns the Agent to train"}
    )
    agent_builder_kwargs: dict = field(default_factory=dict, metadata={"help": "arguments of the builder"})
    one_trajectory_per_call: bool = field(default=False, metadata={"help": "AReaL's current workflow style"})


def main(args):
    config, _ = load_expr_config(args, AgentRLConfig)
    tokenizer = load_hf_tokenizer(config.tokenizer_path)
    train_dataset = get_custom_dataset(split="train", dataset_config=config.train_dataset, tokenizer=tokenizer)
    valid_dataset = get_custom_dataset(split="test", dataset_config=config.valid_dataset, tokenizer=tokenizer)
    style = OneTrajectoryPerCall if config.one_trajectory_per_call else GroupPerCall
    with PPOTrainer(config, train_dataset=train_dataset, valid_dataset=valid_dataset) as trainer:
        log_path = StatsLogger.get_log_path(config.stats_logger)
        workflow = style(config, tokenizer, dump_dir=os.path.join(log_path, "generated"))
        eval_workflow = style(config, tokenizer, dump_dir=os.path.join(log_path, "generated-eval"))
        trainer.train(workflow, eval_workflow)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
