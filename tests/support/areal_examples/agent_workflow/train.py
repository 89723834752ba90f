"""A training script written as AReaL's examples/agent_workflow/train.py is (its imports, the config
class from configs.py beside it, the workflow kwargs it builds), run unchanged by
tests/e2e/test_areal_acceptance.py through ``python -m areal.launcher.local``."""

import pathlib
import sys

sys.path.append(str(pathlib.Path(__file__).parent))
from configs import AgentConfig

from areal import PPOTrainer
from areal.api.cli_args import load_expr_config
from areal.dataset import get_custom_dataset
from areal.utils.hf_utils import load_hf_tokenizer


def main(args):
    config, _ = load_expr_config(args, AgentConfig)
    tokenizer = load_hf_tokenizer(config.tokenizer_path)
    train_dataset = get_custom_dataset(split="train", dataset_config=config.train_dataset, tokenizer=tokenizer)
    valid_dataset = get_custom_dataset(split="test", dataset_config=config.valid_dataset, tokenizer=tokenizer)
    g = config.gconfig
    workflow_kwargs = dict(
        temperature=g.temperature,
        top_p=g.top_p,
        max_tokens=g.max_tokens,  # Anthropic-style agents: a budget for the whole trajectory
        max_completion_tokens=g.max_new_tokens,  # OpenAI-style agents: one call's limit
        max_turns=config.max_turns,
    )
    eval_workflow_kwargs = {**workflow_kwargs, "temperature": 0.6}
    with PPOTrainer(config, train_dataset=train_dataset, valid_dataset=valid_dataset) as trainer:
        trainer.train(
            workflow=config.workflow,
            eval_workflow=config.eval_workflow,
            workflow_kwargs=workflow_kwargs,
            eval_workflow_kwargs=eval_workflow_kwargs,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
