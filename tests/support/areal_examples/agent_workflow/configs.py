"""The config class of the agent-workflow script, beside it as in AReaL's example."""

from dataclasses import dataclass, field

from areal.api.cli_args import PPOConfig


@dataclass
class AgentConfig(PPOConfig):
    workflow: str = field(default="areal.workflow.openai.math_agent.MathAgent", metadata={"help": "the agent class to train"})
    eval_workflow: str = field(default="areal.workflow.openai.math_agent.MathAgent", metadata={"help": "the agent class to evaluate"})
    max_turns: int = field(default=4, metadata={"help": "turns of multi-turn agents"})
