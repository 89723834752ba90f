"""The OpenAI Agents guide's training script: a generic ``RolloutWorkflow`` over any agent builder.

    python3 -m areal.launcher.local examples/openai-agents/train_agents.py \\
        --config examples/openai-agents/config.yaml experiment_name=my_agent_experiment trial_name=trial0

``agent_builder_path`` / ``agent_builder_kwargs`` / ``reward_fn_path`` come from the config. Each
trajectory gets its own ``ArealOpenAI`` client (an ``AsyncOpenAI`` whose calls are recorded token
by token); the SDK talks to it through its default Responses API.
"""

import asyncio
import sys

from transformers import PreTrainedTokenizerFast

from agents import ModelSettings, OpenAIProvider, RunConfig
from agents import Runner as OpenAIRunner
from areal.api.cli_args import AgentRLConfig, GenerationHyperparameters, load_expr_config
from areal.api.reward_api import AsyncRewardWrapper
from areal.api.workflow_api import RolloutWorkflow
from areal.dataset import get_custom_dataset
from areal.experimental.openai import ArealOpenAI
from areal.experimental.trainer import PPOTrainer
from areal.utils.dynamic_import import import_from_string
from areal.utils.hf_utils import load_hf_tokenizer


class OpenAIAgentWrapper:
    def __init__(
        self, agent_builder_path: str, agent_builder_kwargs: dict, reward_fn_path: str, temperature: float = 1.0, max_tokens: int = 512
    ) -> None:
        self.agent_builder = import_from_string(agent_builder_path)
        self.agent_builder_kwargs = agent_builder_kwargs
        self.async_reward_fn = AsyncRewardWrapper(import_from_string(reward_fn_path))
        self.temperature = temperature
        self.max_tokens = max_tokens

    async def run_agent(self, data: dict, client: ArealOpenAI) -> float:
        agent = self.agent_builder(**self.agent_builder_kwargs)
        run_config = RunConfig(
            model_provider=OpenAIProvider(openai_client=client),
            tracing_disabled=True,
            model_settings=ModelSettings(temperature=self.temperature, max_tokens=self.max_tokens),
        )
        result = await OpenAIRunner.run(agent, input=data["messages"][-1]["content"], run_config=run_config, max_turns=4)
        reward = await self.async_reward_fn(
            completions=str(result.final_output), answer=data["answer"], prompt=None, prompt_ids=None, completion_ids=None
        )
        client.set_final_reward(reward)
        return reward


class OpenAIAgentWorkflow(RolloutWorkflow):
    def __init__(
        self,
        agent_builder_path: str,
        agent_builder_kwargs: dict,
        reward_fn_path: str,
        gconfig: GenerationHyperparameters,
        tokenizer: PreTrainedTokenizerFast,
    ) -> None:
        self.gconfig = gconfig.new_with_stop_and_pad_token_ids(tokenizer)
        self.tokenizer = tokenizer
        self.agent = OpenAIAgentWrapper(
            agent_builder_path, agent_builder_kwargs, reward_fn_path, temperature=gconfig.temperature, max_tokens=gconfig.max_new_tokens
        )

    async def arun_episode(self, engine, data):
        clients = [ArealOpenAI(engine=engine, tokenizer=self.tokenizer) for _ in range(self.gconfig.n_samples)]
        await asyncio.gather(*[self.agent.run_agent(data=data, client=c) for c in clients])
        interactions_with_reward = {}
        for client in clients:
            client.apply_reward_discount(turn_discount=0.9)
            interactions_with_reward.update(client.export_interactions(style="individual"))
        return interactions_with_reward


def main(args: list[str]) -> None:
    config, _ = load_expr_config(args, AgentRLConfig)
    tokenizer = load_hf_tokenizer(config.tokenizer_path)
    train_dataset = get_custom_dataset(split="train", dataset_config=config.train_dataset, tokenizer=tokenizer)
    valid_dataset = get_custom_dataset(split="test", dataset_config=config.valid_dataset, tokenizer=tokenizer)
    with PPOTrainer(config, train_dataset=train_dataset, valid_dataset=valid_dataset) as trainer:

        def make() -> OpenAIAgentWorkflow:
            return OpenAIAgentWorkflow(
                agent_builder_path=config.agent_builder_path,
                agent_builder_kwargs=config.agent_builder_kwargs,
                reward_fn_path=config.reward_fn_path,
                gconfig=config.gconfig,
                tokenizer=tokenizer,
            )

        summary = trainer.train(make(), make())
    print(f"run directory: {summary['run_dir']}\nfinal model: {summary['final_model']}")


if __name__ == "__main__":
    main(sys.argv[1:])
