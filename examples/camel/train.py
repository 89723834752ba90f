"""The CAMEL guide's training script: a CAMEL ``ChatAgent`` on ``AReaLOpenAICompatibleModel``.

    python3 -m areal.launcher.local examples/camel/train.py --config examples/camel/config.yaml \\
        experiment_name=<your experiment name> trial_name=<your trial name>

Each trajectory gets its own ``ArealOpenAI`` client; CAMEL's model wrapper sends its calls
through it, so every call is recorded token by token and rewarded with ``set_final_reward``.
"""

import asyncio
import sys
from dataclasses import dataclass

from camel.agents import ChatAgent
from transformers import PreTrainedTokenizerFast

from areal.api.cli_args import GenerationHyperparameters, GRPOConfig, load_expr_config
from areal.api.reward_api import AsyncRewardWrapper
from areal.api.workflow_api import RolloutWorkflow
from areal.dataset import get_custom_dataset
from areal.experimental.camel.openai_model import AReaLOpenAICompatibleModel
from areal.experimental.openai import ArealOpenAI
from areal.experimental.trainer import PPOTrainer
from areal.reward.gsm8k import gsm8k_reward_fn
from areal.utils.hf_utils import load_hf_tokenizer


@dataclass
class AgentRLConfig(GRPOConfig):
    max_tokens_per_trajectory: int = 8192


def math_reward_fn(result: str, answer: str) -> float:
    """1.0 when the final answer equals the reference (math-verified, not string equality)."""
    return gsm8k_reward_fn(completions=result, answer=answer)


class CamelMathAgent:
    def __init__(self, tokenizer: PreTrainedTokenizerFast) -> None:
        self.tokenizer = tokenizer
        self.async_reward_fn = AsyncRewardWrapper(math_reward_fn)

    async def run_agent(self, data: dict, client: ArealOpenAI) -> float:
        # No system message: the embedded model was fine-tuned on the bare question.
        agent = ChatAgent(model=AReaLOpenAICompatibleModel(openai_client=client, tokenizer=self.tokenizer, model_type="areal"))
        response = await agent.astep(data["messages"][-1]["content"])
        reward = await self.async_reward_fn(result=response.msg.content, answer=data["answer"])
        client.set_final_reward(reward)
        return reward


class CamelRLVRWorkflow(RolloutWorkflow):
    def __init__(self, gconfig: GenerationHyperparameters, tokenizer: PreTrainedTokenizerFast, n_trajs: int = 2) -> None:
        self.gconfig = gconfig
        self.tokenizer = tokenizer
        self.n_trajs = n_trajs
        self.agent = CamelMathAgent(tokenizer=self.tokenizer)

    async def arun_episode(self, engine, data):
        clients = [ArealOpenAI(engine=engine, tokenizer=self.tokenizer) for _ in range(self.n_trajs)]
        await asyncio.gather(*[self.agent.run_agent(data=data, client=clients[i]) for i in range(self.n_trajs)])
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
        workflow = CamelRLVRWorkflow(gconfig=config.gconfig, tokenizer=tokenizer, n_trajs=config.gconfig.n_samples)
        summary = trainer.train(workflow)
    print(f"run directory: {summary['run_dir']}\nfinal model: {summary['final_model']}")


if __name__ == "__main__":
    main(sys.argv[1:])
