"""The agent-workflow guide's training script: an ``AgentWorkflow`` named by import path.

    python3 examples/agent_workflow/train.py --config examples/agent_workflow/config.yaml scheduler.type=local
    python3 -m areal.launcher.local examples/agent_workflow/train.py --config examples/agent_workflow/config.yaml \\
        experiment_name=my-exp trial_name=t0 workflow=areal.workflow.langchain.math_agent.MathToolAgent

``workflow`` is any ``areal.workflow.<sdk>.math_agent.*`` (or your own ``async run(data,
**extra_kwargs)`` class); it runs sandboxed (``rollout.openai.mode=subproc``) or inline.
"""

import sys
from dataclasses import dataclass

from areal.api.cli_args import GRPOConfig, load_expr_config
from areal.dataset import get_custom_dataset
from areal.experimental.trainer import PPOTrainer
from areal.utils.hf_utils import load_hf_tokenizer


@dataclass
class AgentWorkflowConfig(GRPOConfig):
    workflow: str = "areal.workflow.openai.math_agent.MathAgent"
    eval_workflow: str = "areal.workflow.openai.math_agent.MathAgent"


def main(args: list[str]) -> None:
    config, _ = load_expr_config(args, AgentWorkflowConfig)
    tokenizer = load_hf_tokenizer(config.tokenizer_path)
    train_dataset = get_custom_dataset(split="train", dataset_config=config.train_dataset, tokenizer=tokenizer)
    valid_dataset = (
        get_custom_dataset(split="test", dataset_config=config.valid_dataset, tokenizer=tokenizer) if config.valid_dataset else None
    )
    with PPOTrainer(config, train_dataset=train_dataset, valid_dataset=valid_dataset) as trainer:
        summary = trainer.train(workflow=config.workflow, eval_workflow=config.eval_workflow)
    print(f"run directory: {summary['run_dir']}\nfinal model: {summary['final_model']}")


if __name__ == "__main__":
    main(sys.argv[1:])
